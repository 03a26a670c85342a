//! The request path in both modes: naming, aggregation, forwarding and its errors.

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, GetPromptRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};
use toolmux::app::EmbedderChoice;

use crate::harness::*;

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

#[tokio::test]
async fn passthrough_prefixes_sorts_and_forwards_over_http_and_stdio() {
    let fetch = http_backend("fetch").await;
    let osv = http_backend("osv").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}{}",
        http_backend_toml("web", &fetch.url),
        http_backend_toml("osv", &osv.url),
        stdio_backend_toml("diag", "echo"),
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let tools = c.list_all_tools().await.unwrap();
    let n = names(&tools);
    let mut sorted = n.clone();
    sorted.sort();
    assert_eq!(n, sorted, "sorted by name");
    assert!(
        n.contains(&"web_fetch_url".into())
            && n.contains(&"osv_query_vulnerabilities".into())
            && n.contains(&"diag_echo".into()),
        "{n:?}"
    );
    assert_eq!(n.len(), 4 + 4 + 2);
    // The backend's tool object is kept whole but for the name.
    let fetch_url = tools.iter().find(|t| t.name == "web_fetch_url").unwrap();
    assert_eq!(Value::Object((*fetch_url.input_schema).clone())["required"], json!(["url"]));

    let r = call(&c, "diag_echo", json!({"input": "over stdio"})).await;
    assert_eq!(text(&r), "over stdio");
    let r = call(&c, "web_fetch_url", json!({"url": "https://example.com"})).await;
    assert_ne!(r.is_error, Some(true));
    assert_eq!(r.structured_content.unwrap()["request"]["url"], "https://example.com");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn priority_filter_and_overrides() {
    let a = http_backend("echo").await;
    let b = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}\
         [aggregation]\nconflict_resolution = \"priority\"\n\
         [[aggregation.tools]]\nbackend = \"second\"\nfilter = [\"echo\", \"sleep\"]\n\
         overrides = {{ sleep = {{ name = \"nap\", description = \"Wait a while\" }} }}\n",
        http_backend_toml("first", &a.url),
        http_backend_toml("second", &b.url),
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let tools = c.list_all_tools().await.unwrap();
    assert_eq!(names(&tools), vec!["echo", "get_current_time", "nap"]);
    assert_eq!(tools.iter().find(|t| t.name == "nap").unwrap().description.as_deref(), Some("Wait a while"));
    // `echo` clashes; the first listed backend wins, which answers the same either way, so
    // check the owner through the gateway's catalog.
    let g = app.gateway.store.current();
    let echo = &g.catalog.tools()[g.catalog.position("echo").unwrap()];
    assert_eq!(&*echo.key.backend, "first");
    let r = call(&c, "nap", json!({"ms": 1})).await;
    assert_eq!(text(&r), "slept 1 ms");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn manual_resolution_reports_an_unsettled_clash_naming_both_tools() {
    let a = http_backend("echo").await;
    let b = http_backend("testkit").await;
    let base = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}[aggregation]\nconflict_resolution = \"manual\"\n",
        http_backend_toml("first", &a.url),
        http_backend_toml("second", &b.url),
    );
    let app = gateway(&base, EmbedderChoice::None).await;
    let clashes = app.clashes();
    assert_eq!(clashes.len(), 1, "{clashes:?}");
    let msg = clashes[0].to_string();
    assert!(msg.contains("first/echo") && msg.contains("second/echo"), "{msg}");
    app.shutdown().await;

    let settled =
        format!("{base}[[aggregation.tools]]\nbackend = \"second\"\noverrides = {{ echo = {{ name = \"echo2\" }} }}\n");
    let app = gateway(&settled, EmbedderChoice::None).await;
    assert!(app.clashes().is_empty());
    let (c, _) = client(&app).await;
    let n = names(&c.list_all_tools().await.unwrap());
    assert!(n.contains(&"echo".into()) && n.contains(&"echo2".into()), "{n:?}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn resources_and_prompts_are_aggregated() {
    let a = http_backend("github").await;
    let b = http_backend("slack").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}",
        http_backend_toml("github", &a.url),
        http_backend_toml("slack", &b.url)
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let resources = c.list_all_resources().await.unwrap();
    let uris: Vec<_> = resources.iter().map(|r| r.uri.clone()).collect();
    assert!(uris.contains(&"demo://github/about".into()) && uris.contains(&"demo://slack/about".into()), "{uris:?}");
    let templates = c.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 2);
    let r = c.read_resource(ReadResourceRequestParams::new("demo://slack/items/42")).await.unwrap();
    let body = serde_json::to_value(&r.contents[0]).unwrap();
    assert!(body["text"].as_str().unwrap().contains("\"backend\":\"slack\""), "{body}");
    let err = c.read_resource(ReadResourceRequestParams::new("demo://nowhere/x")).await.unwrap_err();
    assert!(err.to_string().contains("resource not found"), "{err}");

    let prompts = c.list_all_prompts().await.unwrap();
    let pn: Vec<_> = prompts.iter().map(|p| p.name.clone()).collect();
    assert_eq!(pn, vec!["github_summarize", "slack_summarize"]);
    let mut args = serde_json::Map::new();
    args.insert("topic".into(), json!("releases"));
    let p = c.get_prompt(GetPromptRequestParams::new("slack_summarize").with_arguments(args)).await.unwrap();
    let msg = serde_json::to_value(&p.messages[0]).unwrap();
    assert!(msg.to_string().contains("Summarise releases using the slack tools"), "{msg}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn call_errors_are_clear_and_the_session_survives_a_dying_backend() {
    let stable = http_backend("echo").await;
    let mut flaky = ChildBackend::start("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}timeout = \"500ms\"\n",
        http_backend_toml("stable", &stable.url),
        http_backend_toml("flaky", &flaky.url()),
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;

    // Unknown tool: a JSON-RPC invalid-params error.
    let err = c.call_tool(CallToolRequestParams::new("nope")).await.unwrap_err();
    assert!(err.to_string().contains("tool not found: nope"), "{err}");
    // Bad arguments: the backend's tool error, passed on.
    let r = call(&c, "stable_echo", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("missing required argument `input`"), "{}", text(&r));
    // Timeout: an isError result naming the backend, not a hang.
    let started = std::time::Instant::now();
    let r = call(&c, "flaky_sleep", json!({"ms": 5000})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("backend `flaky` did not answer within 500ms"), "{}", text(&r));
    assert!(started.elapsed() < Duration::from_secs(4));
    // Killed mid-call: an isError naming the backend; the session and other backends go on.
    let r = call(&c, "flaky_exit", json!({})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("flaky"), "{}", text(&r));
    let r = call(&c, "stable_echo", json!({"input": "still here"})).await;
    assert_eq!(text(&r), "still here");
    flaky.kill().await;
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn optimizer_meta_tools_match_the_golden_schemas() {
    let app = gateway("[server]\nlisten = \"127.0.0.1:0\"\n", EmbedderChoice::Given(model())).await;
    let (c, _) = client(&app).await;
    let tools = c.list_all_tools().await.unwrap();
    assert_eq!(names(&tools), vec!["find_tool", "call_tool", "read_result"]);
    let got = serde_json::to_value(&tools).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/meta_tools.json");
    if std::env::var_os("TOOLMUX_UPDATE_GOLDEN").is_some() {
        std::fs::write(path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
    }
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("golden file (TOOLMUX_UPDATE_GOLDEN=1 writes it)"))
            .unwrap();
    assert_eq!(got, want, "meta-tool schemas changed; if on purpose, rerun with TOOLMUX_UPDATE_GOLDEN=1");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn optimizer_find_and_call_with_leniency_and_errors() {
    let echo = http_backend("echo").await;
    let github = http_backend("github").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\nmax_tools_to_return = 3\ncache_dir = \"{}\"\n{}{}",
        shared_cache_dir(),
        http_backend_toml("stable", &echo.url),
        http_backend_toml("github", &github.url),
    );
    let app = gateway(&toml, EmbedderChoice::Given(model())).await;
    let (c, _) = client(&app).await;

    let r = call(&c, "find_tool", json!({"tool_description": "echo back a message"})).await;
    assert_ne!(r.is_error, Some(true));
    let sc = r.structured_content.clone().unwrap();
    assert_eq!(found(&r)[0], "stable_echo");
    assert_eq!(found(&r).len(), 3, "max_tools_to_return");
    assert_eq!(sc["search_mode"], "hybrid");
    let m = &sc["token_metrics"];
    assert!(m["baseline_tokens"].as_u64().unwrap() > m["returned_tokens"].as_u64().unwrap());
    assert!(m["savings_percent"].as_f64().unwrap() > 0.0);
    assert_eq!(serde_json::from_str::<Value>(&text(&r)).unwrap(), sc, "text and structuredContent agree");
    assert!(sc["tools"][0]["inputSchema"]["properties"]["input"].is_object(), "full tool objects");

    let r = call(&c, "find_tool", json!({"tool_description": ""})).await;
    assert_eq!((r.is_error, text(&r).as_str()), (Some(true), "tool_description is required"));

    let r = call(&c, "call_tool", json!({"tool_name": "stable_echo", "parameters": {"input": "hello"}})).await;
    assert_eq!(text(&r), "hello");
    let r = call(&c, "call_tool", json!({"parameters": {"tool_name": "stable_echo", "input": "hellonested"}})).await;
    assert_eq!(text(&r), "hellonested");
    let r = call(&c, "call_tool", json!({"Tool_Name": "stable_echo", "Parameters": {"input": "mixed case"}})).await;
    assert_eq!(text(&r), "mixed case");
    let r = call(&c, "call_tool", json!({"parameters": {"input": "x"}})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("tool_name is required") && text(&r).contains("[parameters]"), "{}", text(&r));
    let r = call(&c, "call_tool", json!({"tool_name": "nope", "parameters": {}})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).starts_with("tool not found: nope"), "{}", text(&r));
    let r = call(&c, "call_tool", json!({"tool_name": "stable_echo", "parameters": []})).await;
    assert!(text(&r).contains("parameters must be an object"), "{}", text(&r));
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn a_backend_down_at_start_does_not_stop_the_gateway() {
    let echo = http_backend("echo").await;
    // Nothing listens on this port (it was just free).
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}",
        http_backend_toml("up", &echo.url),
        http_backend_toml("down", &format!("http://{dead}/mcp")),
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    assert_eq!(names(&c.list_all_tools().await.unwrap()), vec!["up_echo", "up_get_current_time"]);
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn optimizer_works_for_stateless_2026_07_28_clients() {
    let echo = http_backend("echo").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\ncache_dir = \"{}\"\n{}",
        shared_cache_dir(),
        http_backend_toml("stable", &echo.url)
    );
    let app = gateway(&toml, EmbedderChoice::Given(model())).await;
    let c = stateless_client(&app, Recorder::default(), None).await;
    let tools = c.list_all_tools().await.unwrap();
    assert_eq!(names(&tools), vec!["find_tool", "call_tool", "read_result"]);
    let r = call(&c, "find_tool", json!({"tool_description": "echo back a message"})).await;
    assert_eq!(found(&r)[0], "stable_echo");
    let r = call(&c, "call_tool", json!({"tool_name": "stable_echo", "parameters": {"input": "stateless"}})).await;
    assert_eq!(text(&r), "stateless");
    assert_eq!(app.gateway.session_count(), 0, "no session was created");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn serve_stdio_fronts_the_backends_for_a_launching_client() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    std::fs::write(&config, format!("[server]\nmode = \"passthrough\"\n{}", stdio_backend_toml("diag", "echo")))
        .unwrap();
    let (c, _) = stdio_gateway(&config, "diag_echo").await;
    let r = call(&c, "diag_echo", json!({"input": "through two stdio hops"})).await;
    assert_eq!(text(&r), "through two stdio hops");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_clients_cancellation_reaches_the_backend() {
    let kit = http_backend("testkit").await;
    let toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}", http_backend_toml("kit", &kit.url));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    // Dropping the call future makes the rmcp client send notifications/cancelled.
    let mut p = CallToolRequestParams::new("kit_sleep");
    p = p.with_arguments(json!({"ms": 10_000}).as_object().unwrap().clone());
    assert!(tokio::time::timeout(Duration::from_millis(300), c.call_tool(p)).await.is_err());
    assert!(
        eventually(Duration::from_secs(5), || async { text(&call(&c, "kit_cancelled_calls", json!({})).await) == "1" })
            .await,
        "the backend saw the cancellation"
    );
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// The 2026-07-28 schema requires `resultType` on every result; a backend speaking 2025-11-25
/// sends none, so the gateway must add it to what it relays (and rmcp drops it again for older
/// clients).
#[tokio::test]
async fn relayed_results_carry_result_type_for_2026_07_28_clients() {
    use rmcp::model::ResultType;
    let github = http_backend("github").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}",
        http_backend_toml("github", &github.url)
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let modern = stateless_client(&app, Recorder::default(), None).await;
    let complete = Some(ResultType::COMPLETE);
    let r = call(&modern, "github_list_issues", json!({"owner": "o", "repo": "r"})).await;
    assert_eq!(r.result_type, complete, "tools/call");
    let r = modern.read_resource(ReadResourceRequestParams::new("demo://github/about")).await.unwrap();
    assert_eq!(r.result_type, complete, "resources/read");
    let mut p = GetPromptRequestParams::new("github_summarize");
    p.arguments = Some(json!({"topic": "t"}).as_object().unwrap().clone());
    let r = modern.get_prompt(p).await.unwrap();
    assert_eq!(r.result_type, complete, "prompts/get");
    modern.cancel().await.unwrap();

    // A 2025-11-25 session gets the same results without the field.
    let (legacy, _) = client(&app).await;
    let r = call(&legacy, "github_list_issues", json!({"owner": "o", "repo": "r"})).await;
    assert_eq!(r.result_type, None, "no resultType for an older revision");
    legacy.cancel().await.unwrap();
    app.shutdown().await;
}

/// call_tool with a misspelt name, or with words instead of the name, answers with the closest
/// names the caller may use, as a fix-it the model can act on.
#[tokio::test]
async fn an_unknown_tool_name_gets_the_closest_names() {
    let kit = http_backend("testkit").await;
    let app = gateway(&http_backend_toml("kit", &kit.url), EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let r = call(&c, "call_tool", json!({"tool_name": "kit_ehco", "parameters": {"input": "x"}})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).starts_with("tool not found: kit_ehco. Did you mean kit_echo"), "{}", text(&r));
    let r = call(&c, "call_tool", json!({"tool_name": "report_progress", "parameters": {}})).await;
    assert!(text(&r).contains("kit_progress"), "by the words of the name: {}", text(&r));
    let r = call(&c, "call_tool", json!({"tool_name": "zzz", "parameters": {}})).await;
    assert!(!text(&r).contains("Did you mean"), "nothing close, nothing suggested: {}", text(&r));
    c.cancel().await.unwrap();
    app.shutdown().await;
}
