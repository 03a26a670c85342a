use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

use super::cut::{head_tail, json_size, shrink};
use super::kept::{Kept, Miss, page_span, span};
use super::*;
use crate::config::{ResultLimit, ResultRule, ResultsConfig};

fn results(max_tokens: u64) -> Results {
    Results::new(&ResultsConfig { max_tokens, ..Default::default() })
}

/// [`Results::apply`], run to its end (nothing in it waits without a shared store).
fn apply(
    r: &Results,
    principal: &str,
    bound: Bound,
    schema: impl FnOnce() -> Option<Value>,
    result: &mut CallToolResult,
) -> usize {
    futures::executor::block_on(r.apply(principal, bound, schema, result))
}

fn text(r: &CallToolResult, i: usize) -> &str {
    match &r.content[i] {
        ContentBlock::Text(t) => &t.text,
        other => panic!("block {i} is not text: {other:?}"),
    }
}

/// The id the cut put in the result's `_meta`.
fn kept_id(r: &CallToolResult) -> String {
    r.meta.as_ref().unwrap().0[META_KEY]["id"].as_str().expect("kept").to_string()
}

/// Part `name` of `id`, read back as a client would: page after page until the end.
fn read_back(kept: &Kept, principal: &str, id: &str, name: &str, length: usize) -> String {
    let part = kept.read(principal, id, Some(name)).unwrap();
    let (mut out, mut offset) = (String::new(), 0);
    while offset < part.text.len() {
        let (start, end) = span(&part.text, offset, length);
        assert_eq!(start, offset, "each read starts where the last ended");
        out.push_str(&part.text[start..end]);
        offset = end;
    }
    out
}

#[test]
fn a_long_text_keeps_its_head_and_tail_and_reads_back_byte_for_byte() {
    // Multi-byte characters throughout, so that cuts and pages fall inside them.
    let whole: String = (0..20_000).map(|i| format!("line {i}: é€😀 data\n")).collect();
    let r = results(1_000);
    let mut result = CallToolResult::success(vec![ContentBlock::text(whole.clone())]);
    assert_eq!(apply(&r, "alice", r.bound(&Caller::named("alice", vec![]), "b", "t"), || None, &mut result), 1);
    let cut = text(&result, 0);
    assert!(cut.len() <= 4_000 + 700, "about max_tokens × 4 bytes: {}", cut.len());
    let marker = cut.find("\n[toolmux:").expect("a marker");
    let (head, tail) = (&cut[..marker], &cut[cut[marker..].find("]\n").unwrap() + marker + 2..]);
    assert!(whole.starts_with(head) && whole.ends_with(tail));
    let ratio = head.len() as f64 / tail.len() as f64;
    assert!((2.0..=4.5).contains(&ratio), "head to tail about 3:1, was {ratio}");
    assert!(head.ends_with('\n') && tail.starts_with("line "), "cut at line ends");
    let id = kept_id(&result);
    assert!(cut.contains(&format!("read_result {{\"id\": \"{id}\", \"part\": \"0\", \"offset\": {}}}", head.len())));
    for length in [1, 7, 4_096, 40_000] {
        assert_eq!(read_back(&r.kept(), "alice", &id, "0", length), whole, "pages of {length} bytes");
    }
    // Fixed pages tile the text too.
    let part = r.kept().read("alice", &id, Some("0")).unwrap();
    let pages: String = (1..).map_while(|p| page_span(&part.text, p, 999)).map(|(s, e)| &part.text[s..e]).collect();
    assert_eq!(pages, whole);
}

#[test]
fn another_principal_reads_nothing_and_an_unknown_id_reads_the_same() {
    let r = results(100);
    let mut result = CallToolResult::success(vec![ContentBlock::text("x".repeat(10_000))]);
    apply(&r, "alice", r.bound(&Caller::anonymous(), "b", "t"), || None, &mut result);
    let id = kept_id(&result);
    let kept = r.kept();
    assert!(kept.read("alice", &id, Some("0")).is_ok());
    assert_eq!(kept.read("bob", &id, Some("0")).unwrap_err(), Miss::Gone);
    let unknown = format!("{}-{:032x}", kept.replica(), 7);
    assert_eq!(kept.read("alice", &unknown, Some("0")).unwrap_err(), Miss::Gone);
    assert_eq!(kept.read("alice", &id, Some("9")).unwrap_err(), Miss::NoPart(vec!["0".into()]));
    let elsewhere = if kept.replica() == "000000" { "000001" } else { "000000" };
    assert_eq!(
        kept.read("alice", &format!("{elsewhere}-{:032x}", 7), Some("0")).unwrap_err(),
        Miss::Elsewhere(elsewhere.into())
    );
}

#[test]
fn a_million_entry_json_array_stays_json_and_says_what_it_left_out() {
    let rows: Vec<Value> = (0..1_000_000).map(|i| json!({"id": i, "name": format!("row {i}")})).collect();
    let whole = serde_json::to_string(&json!({"rows": rows, "total": 1_000_000})).unwrap();
    let r =
        Results::new(&ResultsConfig { max_tokens: 2_000, keep_bytes_per_principal: 64 << 20, ..Default::default() });
    let mut result = CallToolResult::success(vec![ContentBlock::text(whole.clone())]);
    apply(&r, "alice", r.bound(&Caller::anonymous(), "b", "t"), || None, &mut result);
    let cut: Value = serde_json::from_str(text(&result, 0)).expect("still JSON");
    let kept_rows = cut["rows"].as_array().unwrap();
    assert!(text(&result, 0).len() <= 8_000, "within the budget: {}", text(&result, 0).len());
    assert_eq!(kept_rows[0]["id"], 0, "the first entries kept");
    assert_eq!(kept_rows.last().unwrap()["id"], 999_999, "and the last");
    assert_eq!(cut["total"], 1_000_000);
    let note = text(&result, 1);
    assert!(note.contains("$.rows shortened from 1000000 to"), "{note}");
    let id = kept_id(&result);
    assert_eq!(read_back(&r.kept(), "alice", &id, "0", PAGE_BYTES), whole);
}

#[test]
fn structured_content_keeps_its_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "items": {"type": "array", "minItems": 50, "items": {"type": "object"}},
            "ids": {"type": "array", "items": {"type": "string", "pattern": "^[0-9]+$"}},
            "log": {"type": "string"},
            "tags": {"type": "array", "uniqueItems": true},
        },
        "required": ["items", "ids", "log", "tags"]
    });
    let value = json!({
        "items": (0..5_000).map(|i| json!({"n": i, "pad": "p".repeat(40)})).collect::<Vec<_>>(),
        "ids": (0..5_000).map(|i| format!("{i}{}", "0".repeat(30))).collect::<Vec<_>>(),
        "log": "l".repeat(100_000),
        "tags": ["a", "b", "c"],
    });
    let mut result = CallToolResult::structured(value.clone());
    let r = results(5_000);
    apply(&r, "alice", r.bound(&Caller::anonymous(), "b", "t"), || Some(schema.clone()), &mut result);
    let got = result.structured_content.as_ref().unwrap();
    assert!(got["items"].as_array().unwrap().len() >= 50, "minItems kept");
    assert!(got["ids"].as_array().unwrap().iter().all(|s| s.as_str().unwrap().chars().all(|c| c.is_ascii_digit())));
    assert_eq!(got["tags"], value["tags"], "uniqueItems arrays are not touched");
    assert!(got["log"].as_str().unwrap().len() < 100_000, "a free string is cut");
    assert!(json_size(got) <= 20_000, "fits: {}", json_size(got));
    let id = kept_id(&result);
    let whole: Value = serde_json::from_str(&r.kept().read("alice", &id, Some("structured")).unwrap().text).unwrap();
    assert_eq!(whole, value, "the whole structured content is kept");
}

#[test]
fn shrinking_never_goes_below_what_the_schema_requires() {
    let schema = json!({"type": "array", "minItems": 10});
    let mut v = json!((0..100).map(|i| "x".repeat(100 + i)).collect::<Vec<_>>());
    let (_, fits) = shrink(&mut v, 50, Some(&schema));
    assert!(!fits, "cannot fit in 50 bytes with 10 entries");
    assert_eq!(v.as_array().unwrap().len(), 10);
}

#[test]
fn an_image_over_the_byte_limit_becomes_a_link_to_its_kept_copy() {
    let data = "A".repeat(4_000);
    let r = Results::new(&ResultsConfig { max_bytes: 1_000, ..Default::default() });
    let mut result =
        CallToolResult::success(vec![ContentBlock::text("a chart"), ContentBlock::image(data.clone(), "image/png")]);
    apply(&r, "alice", r.bound(&Caller::anonymous(), "b", "t"), || None, &mut result);
    let ContentBlock::ResourceLink(link) = &result.content[1] else { panic!("{:?}", result.content[1]) };
    let id = kept_id(&result);
    assert_eq!(link.uri, format!("{URI_PREFIX}{id}/1"));
    assert_eq!(link.size, Some(3_000));
    let part = r.kept().read("alice", &id, Some("1")).unwrap();
    assert!(part.binary && *part.text == data && part.mime_type.as_deref() == Some("image/png"));
    assert_eq!(text(&result, 0), "a chart", "the text under the limit is untouched");
}

#[test]
fn a_result_under_every_limit_is_left_alone() {
    let r = results(1_000);
    let mut result = CallToolResult::success(vec![ContentBlock::text("short")]);
    let before = result.clone();
    assert_eq!(apply(&r, "alice", r.bound(&Caller::anonymous(), "b", "t"), || None, &mut result), 0);
    assert_eq!(result, before);
}

#[test]
fn keeping_is_bounded_per_principal_and_in_all_and_expires() {
    let kept = Kept::new(Duration::from_secs(600), 3_000, 2_000);
    let part = |n: usize| vec![Part { name: "0".into(), text: "x".repeat(n).into(), mime_type: None, binary: false }];
    let a1 = kept.keep("alice", part(1_000)).unwrap();
    let a2 = kept.keep("alice", part(1_000)).unwrap();
    let a3 = kept.keep("alice", part(1_000)).unwrap();
    assert_eq!(kept.read("alice", &a1, Some("0")).unwrap_err(), Miss::Gone, "alice's oldest made room");
    assert!(kept.read("alice", &a2, Some("0")).is_ok() && kept.read("alice", &a3, Some("0")).is_ok());
    let b1 = kept.keep("bob", part(1_000)).unwrap();
    assert_eq!(kept.bytes(), 3_000);
    let b2 = kept.keep("bob", part(1_000)).unwrap();
    assert_eq!(kept.read("alice", &a2, Some("0")).unwrap_err(), Miss::Gone, "the oldest of all made room");
    assert!(kept.read("bob", &b1, Some("0")).is_ok() && kept.read("bob", &b2, Some("0")).is_ok());
    let why = kept.keep("bob", part(2_001)).unwrap_err();
    assert!(why.contains("keep_bytes_per_principal"), "{why}");
    let brief = Kept::new(Duration::ZERO, 3_000, 2_000);
    let id = brief.keep("alice", part(10)).unwrap();
    assert_eq!(brief.read("alice", &id, Some("0")).unwrap_err(), Miss::Gone, "expired");
    assert_eq!(brief.bytes(), 0);
}

#[test]
fn a_result_too_large_to_keep_says_so_in_its_marker() {
    let r = Results::new(&ResultsConfig { max_tokens: 100, keep_bytes_per_principal: 1_000, ..Default::default() });
    let mut result = CallToolResult::success(vec![ContentBlock::text("y".repeat(5_000))]);
    apply(&r, "alice", r.bound(&Caller::anonymous(), "b", "t"), || None, &mut result);
    let cut = text(&result, 0);
    assert!(cut.contains("was not kept") && cut.contains("keep_bytes_per_principal"), "{cut}");
    assert!(!cut.contains("read_result"));
}

#[test]
fn the_first_policy_rule_then_the_tool_then_the_backend_set_the_limit() {
    let rule = |principals: &[&str], tokens: u64| ResultRule {
        principals: principals.iter().map(|s| s.to_string()).collect(),
        groups: vec![],
        backends: vec!["logs".into()],
        tools: vec!["*".into()],
        limit: ResultLimit { tokens: Some(tokens), bytes: None },
    };
    let config = ResultsConfig {
        max_tokens: 25_000,
        backends: [("logs".to_string(), ResultLimit { tokens: Some(5_000), bytes: Some(10) })].into(),
        tools: [(("logs".to_string(), "tail".to_string()), ResultLimit { tokens: Some(50_000), bytes: None })].into(),
        rules: vec![rule(&["ci-*"], 100_000), rule(&["*"], 1)],
        ..Default::default()
    };
    let r = Results::new(&config);
    let ci = Caller::named("ci-bot", vec![]);
    let alice = Caller::named("alice", vec![]);
    assert_eq!(r.bound(&ci, "logs", "tail"), Bound { tokens: 100_000, bytes: 10 });
    assert_eq!(r.bound(&alice, "logs", "tail"), Bound { tokens: 1, bytes: 10 });
    let plain = Results::new(&ResultsConfig { rules: vec![], ..config });
    assert_eq!(plain.bound(&alice, "logs", "tail"), Bound { tokens: 50_000, bytes: 10 });
    assert_eq!(plain.bound(&alice, "logs", "grep"), Bound { tokens: 5_000, bytes: 10 });
    assert_eq!(plain.bound(&alice, "db", "query").tokens, 25_000);
}

#[test]
fn head_and_tail_split_three_to_one_inside_multibyte_text() {
    let s = "é".repeat(1_000);
    let (h, t) = head_tail(&s, 400);
    assert!(s.is_char_boundary(h) && s.is_char_boundary(t));
    assert_eq!((h, s.len() - t), (300, 100));
}
