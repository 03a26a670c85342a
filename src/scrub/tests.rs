use super::*;

#[test]
fn every_built_in_rule_compiles() {
    let (rules, global, refused) = rules::compile();
    assert!(refused.is_empty(), "rules this regex engine refuses: {refused:?}");
    // gitleaks' 222 rules less its 5 for file paths and generic-api-key, and toolmux's 4.
    assert_eq!(rules.len(), 220, "{}", rules.len());
    assert!(!global.is_empty());
}

#[test]
fn a_secret_is_replaced_by_a_typed_marker_and_the_rest_kept() {
    let s = Scrubber::built_in();
    let text = "config:\n  aws_access_key_id = AKIAZ7VRSQ5EXAMPLEQF\n  region = eu-west-1\n";
    let (out, rules) = s.scrub(text);
    assert_eq!(rules, ["aws-access-token"], "{out}");
    assert_eq!(out, "config:\n  aws_access_key_id = [redacted: aws-access-token]\n  region = eu-west-1\n");
}

#[test]
fn toolmuxs_own_rules_find_passwords_in_urls_and_headers() {
    let s = Scrubber::built_in();
    for (text, rule, kept) in [
        ("DATABASE_URL=postgres://app:s3cr3t-Pa55@db.internal:5432/app", "url-password", "postgres://app:"),
        ("Server=db;User Id=app;Password=Tr0ub4dor&3;Encrypt=true", "secret-assignment", "Password="),
        ("{\"user\": \"ann\", \"password\": \"hunter2!\"}", "secret-assignment", "\"password\": \""),
        ("> Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l", "authorization-header", "Authorization: Basic "),
        ("curl -H 'x: Bearer 8f14e45fceea167a5a36dedd4bea2543'", "bearer-token", "Bearer "),
    ] {
        let (out, rules) = s.scrub(text);
        assert!(rules.contains(&rule.to_string()), "{text} → {out} ({rules:?})");
        assert!(out.contains(kept) && out.contains("[redacted: "), "{out}");
    }
}

#[test]
fn text_without_secrets_is_borrowed_as_it_is() {
    let s = Scrubber::built_in();
    for text in [
        "fn token_count(&self) -> usize { self.tokens.len() }",
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8\nAuthor: Ann <ann@example.org>",
        "{\"id\": \"3f2504e0-4f89-11d3-9a0c-0305e82c3301\", \"max_tokens\": 25000}",
        "password = os.environ[\"DB_PASSWORD\"]",
        "Authorization: required",
    ] {
        let (out, rules) = s.scrub(text);
        assert!(matches!(out, Cow::Borrowed(_)) && rules.is_empty(), "{text} → {out}");
    }
}

#[test]
fn overlapping_findings_are_replaced_once() {
    let s = Scrubber::with_extra(&[("whole-line".into(), "(?m)^token .*$".into())]).unwrap();
    let text = "token ghp_0123456789abcdefghijABCDEFGHIJ012345 end";
    let (out, rules) = s.scrub(text);
    assert_eq!(out, "[redacted: whole-line]", "{rules:?}");
    assert_eq!(rules.len(), 1);
}

#[test]
fn a_json_value_named_as_a_secret_is_one() {
    let scrubbing = Scrubbing::default();
    let mut r = rmcp::model::CallToolResult::structured(serde_json::json!({
        "user": "ann",
        "password": "hunter2!",
        "max_tokens": 25000,
        "nested": [{"client_secret": "abc123def"}],
    }));
    let n = scrubbing.result("db", &mut r);
    let v = r.structured_content.unwrap();
    assert_eq!(n, 2 + 2, "the structured content and its text copy: {v}");
    assert_eq!(v["password"], "[redacted: secret-field]");
    assert_eq!(v["nested"][0]["client_secret"], "[redacted: secret-field]");
    assert_eq!((v["user"].as_str(), v["max_tokens"].as_u64()), (Some("ann"), Some(25000)));
}

#[test]
fn a_backend_may_turn_scrubbing_off_or_add_rules() {
    let mut config = crate::config::ScrubConfig::default();
    config.backends.insert("raw".into(), crate::config::BackendScrub { on: Some(false), rules: vec![] });
    config.backends.insert(
        "acme".into(),
        crate::config::BackendScrub { on: None, rules: vec![("acme-key".into(), "ACME-[0-9A-F]{8}".into())] },
    );
    let scrubbing = Scrubbing::new(&config, Default::default());
    let text = |t: &str| rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(t)]);
    let mut r = text("key ACME-12AB34CD and AKIAZ7VRSQ5EXAMPLEQF");
    assert_eq!(scrubbing.result("raw", &mut r), 0);
    assert_eq!(scrubbing.result("other", &mut r), 1, "the built-in rules only");
    assert_eq!(scrubbing.result("acme", &mut r), 1, "its own rule too");
    let rows = scrubbing.redactions.rows();
    assert_eq!(
        rows.iter().map(|r| (r.backend.as_str(), r.rule.as_str(), r.count)).collect::<Vec<_>>(),
        [("acme", "acme-key", 1), ("other", "aws-access-token", 1)]
    );
}

/// The corpora under tests/fixtures/scrub (see generate.py there) and real text of this
/// repository: every fake credential must be found (≥ 99 % overall, ≥ 96 % of each kind), and
/// at most 0.1 % of the results without one touched. `cargo test --lib scrub::tests::corpus --
/// --nocapture` prints the figures docs/security.md quotes.
#[test]
fn corpus_detection_and_false_positive_rates() {
    let s = Scrubber::built_in();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let lines = |name: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(root.join("tests/fixtures/scrub").join(name)).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };

    let mut by_kind: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for case in lines("secrets.jsonl") {
        let (text, secret) = (case["text"].as_str().unwrap(), case["secret"].as_str().unwrap());
        let (out, _) = s.scrub(text);
        let entry = by_kind.entry(case["kind"].as_str().unwrap().to_string()).or_default();
        entry.0 += 1;
        if !out.contains(secret) {
            entry.1 += 1;
        } else {
            println!("missed {}: {text}", case["kind"]);
        }
    }
    let (cases, found) = by_kind.values().fold((0, 0), |(c, f), (n, d)| (c + n, f + d));
    for (kind, (n, d)) in &by_kind {
        println!("{kind}: {d}/{n}");
        assert!(*d * 100 >= *n * 96, "{kind}: {d} of {n} found");
    }
    println!("detection: {found}/{cases} = {:.2} %", 100.0 * found as f64 / cases as f64);
    assert!(found * 100 >= cases * 99, "{found} of {cases} found");

    // Results without a credential: generated ones, and this repository's own source, docs and
    // tool catalogs, in pieces of about a tool result's size. The scrubber's own rules and tests
    // hold fake credentials on purpose, and so do the test fixtures.
    let mut clean: Vec<(String, String)> = lines("clean.jsonl")
        .iter()
        .map(|c| (c["kind"].as_str().unwrap().to_string(), c["text"].as_str().unwrap().to_string()))
        .collect();
    let generated = clean.len();
    let mut files = Vec::new();
    for dir in ["src", "docs", "eval/data", "scripts", "tests/it"] {
        walk(&root.join(dir), &mut files);
    }
    for path in files {
        let rel = path.strip_prefix(root).unwrap().to_string_lossy().to_string();
        if rel.starts_with("src/scrub") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let lines: Vec<&str> = text.lines().collect();
        for chunk in lines.chunks(60) {
            clean.push((rel.clone(), chunk.join("\n")));
        }
    }
    // Credentials this repository holds on purpose (tests of redaction and of credentials
    // handling, and a public tool catalog whose example default is a GitHub token): found as
    // they should be, and counted apart.
    const INTENDED: [(&str, &str); 14] = [
        ("src/audit/mod.rs", "url-password"),
        ("src/import/tests.rs", "secret-assignment"),
        ("src/import/tests.rs", "url-password"),
        ("src/redact.rs", "secret-assignment"),
        ("src/upstream/exchange.rs", "secret-assignment"),
        ("eval/data/toolret-apigen/tools.jsonl", "github-pat"),
        ("tests/it/auth/mod.rs", "authorization-header"),
        ("tests/it/cli.rs", "secret-assignment"),
        ("tests/it/health.rs", "aws-access-token"),
        ("tests/it/auth/mod.rs", "url-password"),
        ("tests/it/auth/mod.rs", "secret-assignment"),
        ("tests/it/login.rs", "secret-assignment"),
        ("tests/it/scrub.rs", "aws-access-token"),
        ("tests/it/scrub.rs", "url-password"),
    ];
    let mut intended = 0;
    let mut touched = Vec::new();
    for (origin, text) in &clean {
        let found = s.find(text);
        if !found.is_empty() && found.iter().all(|f| INTENDED.contains(&(origin.as_str(), f.rule.as_str()))) {
            intended += 1;
        } else if !found.is_empty() {
            let shown: Vec<String> = found
                .iter()
                .map(|f| format!("{} {:?}", f.rule, &text[f.start.saturating_sub(30)..(f.end + 10).min(text.len())]))
                .collect();
            touched.push(format!("{origin}: {}", shown.join("; ")));
        }
    }
    for t in &touched {
        println!("touched {t}");
    }
    let clean_results = clean.len() - intended;
    println!(
        "false positives: {} of {} results touched ({} generated, {} from this repository; {} more hold a credential on purpose) = {:.3} %",
        touched.len(),
        clean_results,
        generated,
        clean_results - generated,
        intended,
        100.0 * touched.len() as f64 / clean_results as f64
    );
    assert!(touched.len() * 1000 <= clean_results, "{} of {} touched", touched.len(), clean_results);
}

fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else if p
            .extension()
            .is_some_and(|e| ["rs", "md", "jsonl", "sh", "py", "toml"].contains(&e.to_str().unwrap_or("")))
        {
            out.push(p);
        }
    }
}

#[test]
fn a_backends_error_text_is_scrubbed_too() {
    let scrubbing = Scrubbing::default();
    let mut e = rmcp::ErrorData::internal_error(
        "connect to postgres://app:Xq9-vT7pL2wR@db:5432/app failed",
        Some(serde_json::json!({"detail": "token ghp_0123456789abcdefghijABCDEFGHIJ012345 refused"})),
    );
    assert_eq!(scrubbing.error("db", &mut e), 2);
    assert_eq!(e.message, "connect to postgres://app:[redacted: url-password]@db:5432/app failed");
    assert_eq!(e.data.unwrap()["detail"], "token [redacted: github-pat] refused");
}
