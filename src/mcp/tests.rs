use serde_json::json;

use super::meta::*;

fn obj(v: serde_json::Value) -> rmcp::model::JsonObject {
    v.as_object().unwrap().clone()
}

#[test]
fn call_tool_takes_a_nested_name_and_removes_it() {
    let a = parse_call(Some(&obj(json!({"parameters": {"tool_name": "echo", "input": "hellonested"}})))).unwrap();
    assert_eq!(a.tool_name, "echo");
    assert_eq!(serde_json::Value::Object(a.parameters), json!({"input": "hellonested"}));
}

#[test]
fn call_tool_keys_are_case_insensitive_and_top_level_wins() {
    let a = parse_call(Some(&obj(json!({"Tool_Name": "a", "Parameters": {"tool_name": "b", "x": 1}})))).unwrap();
    assert_eq!(a.tool_name, "a");
    assert_eq!(a.parameters.get("tool_name"), Some(&json!("b")), "a different nested name is an argument");
    assert_eq!(a.parameters.get("x"), Some(&json!(1)));
}

#[test]
fn call_tool_missing_name_shows_the_shape_and_keys_never_values() {
    let e = parse_call(Some(&obj(json!({"name": "secret-value", "args": {}})))).unwrap_err();
    assert!(e.contains("\"tool_name\": \"<name from find_tool>\""), "{e}");
    assert!(e.contains("[args, name]") || e.contains("[name, args]"), "{e}");
    assert!(!e.contains("secret-value"), "{e}");
    let e = parse_call(None).unwrap_err();
    assert!(e.starts_with("tool_name is required"), "{e}");
}

#[test]
fn call_tool_non_object_parameters_say_so() {
    let e = parse_call(Some(&obj(json!({"tool_name": "x", "parameters": "input=1"})))).unwrap_err();
    assert!(e.contains("parameters must be an object") && e.contains("got a string"), "{e}");
}

#[test]
fn find_tool_requires_a_description() {
    assert_eq!(parse_find(Some(&obj(json!({"tool_description": "  "})))).unwrap_err(), "tool_description is required");
    assert_eq!(parse_find(None).unwrap_err(), "tool_description is required");
    let a = parse_find(Some(&obj(json!({"tool_description": "echo", "tool_keywords": ["a", "b"]})))).unwrap();
    assert_eq!(a.keywords, vec!["a", "b"]);
}

#[test]
fn token_metrics_savings() {
    let m = TokenMetrics::new(1000, 250);
    assert_eq!(m.savings_percent, 75.0);
    assert_eq!(TokenMetrics::new(0, 0).savings_percent, 0.0);
}

#[test]
fn find_result_carries_the_same_json_twice_and_tools_is_always_an_array() {
    let r = find_result(
        &[],
        &Match { verdict: crate::store::Verdict::None, scores: vec![], non_english: false },
        TokenMetrics::new(10, 0),
        "hybrid",
        vec![],
        vec![],
    );
    let sc = r.structured_content.clone().unwrap();
    assert_eq!(sc["tools"], json!([]));
    assert!(sc.get("needs_login").is_none(), "said only when a backend waits for a login");
    let text = r.content[0].as_text().unwrap().text.clone();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), sc);
}

#[test]
fn a_compact_tool_keeps_what_a_call_needs() {
    let schema = json!({"type": "object", "properties": {
        "repo": {"type": "string", "description": "owner/name of the repository"},
        "title": {"type": "string", "description": "The issue's title", "maxLength": 256},
        "labels": {"type": "array", "items": {"type": "string"}, "description": "Labels to add"},
        "draft": {"description": "no type here"}},
        "required": ["repo", "title"], "additionalProperties": false});
    let tool = rmcp::model::Tool::new(
        "github_create_issue",
        "Create an issue in a repository. Needs write access; labels must exist.\nMore text.",
        std::sync::Arc::new(schema.as_object().unwrap().clone()),
    )
    .with_annotations(rmcp::model::ToolAnnotations::new().read_only(false));
    let c = crate::mcp::meta::compact(&tool);
    assert_eq!(c.name, "github_create_issue");
    assert_eq!(c.description.as_deref(), Some("Create an issue in a repository."));
    let got = serde_json::to_value(&c).unwrap();
    assert_eq!(
        got["inputSchema"],
        json!({"type": "object", "properties": {
            "repo": {"type": "string", "description": "owner/name of the repository"},
            "title": {"type": "string", "description": "The issue's title", "maxLength": 256},
            "labels": {"type": "array"},
            "draft": {}},
            "required": ["repo", "title"]})
    );
    assert!(got.get("annotations").is_none());
    assert!(crate::catalog::token_weight(&c) < crate::catalog::token_weight(&tool));
}

#[test]
fn a_compact_description_is_one_bounded_sentence() {
    let long = "word ".repeat(100);
    let tool = |d: &str| rmcp::model::Tool::new("t", d.to_string(), std::sync::Arc::new(serde_json::Map::new()));
    let c = crate::mcp::meta::compact(&tool(&long));
    let d = c.description.unwrap();
    assert!(d.chars().count() <= 200 && d.ends_with('…'), "{d}");
    // A dot inside a word or number does not end the sentence.
    let c = crate::mcp::meta::compact(&tool("Reads v1.2 files, e.g. a.txt. Then more."));
    assert_eq!(c.description.as_deref(), Some("Reads v1.2 files, e.g. a.txt."));
    // No schema at all: none added.
    assert_eq!(serde_json::to_value(&c).unwrap()["inputSchema"], json!({}));
}

#[test]
fn describe_is_a_boolean() {
    let a = parse_find(Some(&obj(json!({"tool_description": "x", "describe": true})))).unwrap();
    assert!(a.describe);
    assert!(!parse_find(Some(&obj(json!({"tool_description": "x"})))).unwrap().describe);
    let e = parse_find(Some(&obj(json!({"tool_description": "x", "describe": 3})))).unwrap_err();
    assert_eq!(e, "describe must be true or false; got a number");
}

#[test]
fn a_compact_tool_keeps_the_link_to_its_app_and_no_other_meta() {
    let schema = std::sync::Arc::new(json!({"type": "object"}).as_object().unwrap().clone());
    let mut meta = rmcp::model::MetaObject::default();
    meta.0.insert("ui".into(), json!({"resourceUri": "ui://vanilla/get-time/app.html", "prefersBorder": true}));
    meta.0.insert("vendor/secret-ish".into(), json!("left out"));
    let tool = rmcp::model::Tool::new("vanilla_get-time", "Gets the time.", schema.clone()).with_meta(meta);
    let got = serde_json::to_value(crate::mcp::meta::compact(&tool)).unwrap();
    assert_eq!(
        got["_meta"],
        json!({"ui": {"resourceUri": "ui://vanilla/get-time/app.html", "prefersBorder": true},
               "ui/resourceUri": "ui://vanilla/get-time/app.html"})
    );
    let plain = rmcp::model::Tool::new("t", "T.", schema);
    assert!(serde_json::to_value(crate::mcp::meta::compact(&plain)).unwrap().get("_meta").is_none());
}
