//! The audit trail over MCP: every action (a session's start too) writes its line with who, what, the decision and how
//! it ended; arguments and request texts appear only when asked; the file is its owner's; the
//! chain verifies with `toolmux audit verify` and breaks where a line is edited.

use rmcp::model::{CallToolResponse, CancelTaskParams, GetPromptRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};
use toolmux::app::EmbedderChoice;

use crate::harness::*;

/// The trail's lines, parsed.
fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Waits until the trail holds a line that `f` accepts, and returns it.
async fn line_where(path: &std::path::Path, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let mut found = None;
    let ok = eventually(std::time::Duration::from_secs(10), || {
        found = lines(path).into_iter().find(&f);
        std::future::ready(found.is_some())
    })
    .await;
    assert!(ok, "no audit line for {what} in {:#?}", lines(path));
    found.unwrap()
}

fn config(mode: &str, kit: &str, audit: &str, extra: &str) -> String {
    let auth =
        bearer_tokens(&["alice", "bob"]).replace("mode = \"bearer\"\n", "mode = \"bearer\"\nadmins = [\"alice\"]\n");
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n{}{auth}\
         [[policy]]\nprincipals = [\"alice\"]\nbackends = [\"kit\"]\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"kit\"]\ntools = [\"echo\"]\n\
         [audit]\n{audit}\n{extra}",
        http_backend_toml("kit", kit)
    )
}

/// Passthrough, arguments and requests not asked for: a call (with its trace id), a call
/// outside the caller's scope (denied), a call over a limit (limited), a resource read, a prompt
/// get, a task followed and cancelled, a console accept and a reload each write one line; no
/// argument appears; the file is 0600; `toolmux audit verify` passes, then names an edited line.
#[tokio::test]
async fn every_action_writes_its_line_and_the_chain_shows_an_edit() {
    let kit = http_backend("testkit").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trail").join("audit.jsonl");
    let audit = format!("file = {:?}\n", file.display().to_string());
    let limit = "[[limits]]\nname = \"bobs\"\nprincipals = [\"bob\"]\ncalls_per_hour = 1\n";
    let app = gateway(&config("passthrough", &kit.url, &audit, limit), EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());

    // A call, with a trace context, whose argument holds a secret-looking value.
    let alice = RawSession::open_as(&url, Some("alice")).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = alice
        .request(
            "tools/call",
            json!({"name": "kit_echo", "arguments": {"input": "hunter2-secret"},
                   "_meta": {"traceparent": format!("00-{trace}-00f067aa0ba902b7-01")}}),
        )
        .await;
    assert_eq!(r["content"][0]["text"], "hunter2-secret");
    let line = line_where(&file, "alice's call", |l| l["action"] == "tools/call" && l["principal"] == "alice").await;
    assert_eq!((line["backend"].as_str(), line["tool"].as_str()), (Some("kit"), Some("echo")));
    assert_eq!((line["decision"].as_str(), line["status"].as_str()), (Some("allowed"), Some("ok")));
    assert_eq!(line["trace_id"], trace);
    assert_eq!(line["client"], "raw");
    assert_eq!(line["session"].as_str().unwrap().len(), 16);
    let digest =
        base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(br#"{"input":"hunter2-secret"}"#));
    assert_eq!(line["arguments_sha256"], digest.as_str());
    assert!(line["result_bytes"].as_u64().unwrap() > 0 && line["latency_ms"].as_f64().is_some(), "{line}");
    // The session's start, with the surface its client was given.
    let start =
        line_where(&file, "alice's session start", |l| l["action"] == "initialize" && l["client"] == "raw").await;
    assert_eq!((start["target"].as_str(), start["detail"].as_str()), (Some("passthrough"), Some("passthrough mode")));
    assert_eq!(start["session"], line["session"], "the same session");

    // bob: a tool outside his scope (denied), then his one call and one over his limit.
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let denied = bob.call_tool(rmcp::model::CallToolRequestParams::new("kit_recall")).await;
    assert!(denied.is_err(), "kit_recall is outside bob's scope: {denied:?}");
    call_ok(&bob, "kit_echo").await;
    assert_eq!(call(&bob, "kit_echo", json!({"input": "x"})).await.is_error, Some(true));
    let denied = line_where(&file, "bob's denied call", |l| l["decision"] == "denied").await;
    assert_eq!((denied["principal"].as_str(), denied["target"].as_str()), (Some("bob"), Some("kit_recall")));
    let limited = line_where(&file, "bob's limited call", |l| l["decision"] == "limited").await;
    assert_eq!(limited["detail"], "bobs calls_per_hour");

    // A read, a prompt, a task followed and cancelled (alice, a client that speaks tasks).
    let (alice_mcp, _) = client_with_auth(&app, Some("alice")).await;
    alice_mcp.read_resource(ReadResourceRequestParams::new("demo://testkit/about")).await.unwrap();
    let mut prompt = GetPromptRequestParams::new("kit_summarize");
    prompt.arguments = Some(json!({"topic": "x"}).as_object().unwrap().clone());
    alice_mcp.get_prompt(prompt).await.unwrap();
    let tasking = tasks_client(&url, "alice").await;
    let job = rmcp::model::CallToolRequestParams::new("kit_job")
        .with_arguments(json!({"ms": 60_000}).as_object().unwrap().clone());
    let CallToolResponse::Task(created) = tasking.peer().call_tool_once(job).await.unwrap() else { panic!("a task") };
    let id = created.task.task_id.clone();
    tasking.peer().cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
    line_where(&file, "the read", |l| l["action"] == "resources/read" && l["target"] == "demo://testkit/about").await;
    line_where(&file, "the prompt", |l| l["action"] == "prompts/get" && l["backend"] == "kit").await;
    line_where(&file, "the task's call", |l| l["status"] == "task").await;
    line_where(&file, "the cancel", |l| l["action"] == "tasks/cancel" && l["target"] == id.as_str()).await;

    // A console accept (nothing held: refused, still recorded) and a reload.
    let accept = reqwest::Client::new()
        .post(format!("http://{}/ui/api/tools/accept", app.addr.unwrap()))
        .bearer_auth("alice")
        .header("x-toolmux-console", "1")
        .json(&json!({"backend": "kit"}))
        .send()
        .await
        .unwrap();
    let _ = accept.status();
    line_where(&file, "the accept", |l| l["action"] == "console/accept" && l["principal"] == "alice").await;
    let next = toolmux::config::Config::parse(&config("passthrough", &kit.url, &audit, "")).unwrap();
    app.reload(next).await;
    line_where(&file, "the reload", |l| l["action"] == "config/reload" && l["detail"] == "limits changed").await;

    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("hunter2"), "arguments are not written unless asked");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let folder = std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(folder, 0o700, "the folder made for the trail is private");
    }
    app.shutdown().await;

    // The chain holds, and `toolmux audit verify` names the line an edit changed.
    let verify =
        |f: &std::path::Path| std::process::Command::new(BIN).args(["audit", "verify"]).arg(f).output().unwrap();
    let out = verify(&file);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && said.starts_with("ok: "), "{said}");
    // The summary counts by day, principal and backend.
    let out = std::process::Command::new(BIN).args(["audit", "summary", "--json"]).arg(&file).output().unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let bob = rows.iter().find(|r| r["principal"] == "bob" && r["backend"] == "kit").expect("bob's row");
    assert_eq!((bob["calls"].as_u64(), bob["refused"].as_u64()), (Some(2), Some(1)), "{rows:#?}");
    let n = lines(&file).len();
    let edited: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i == 2 { l.replacen("\"allowed\"", "\"denied\"", 1) } else { l.into() })
        .collect();
    std::fs::write(&file, edited.join("\n") + "\n").unwrap();
    let out = verify(&file);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("line 3: changed"), "{said} ({n} lines)");
}

async fn call_ok(c: &Client, name: &str) {
    let r = call(c, name, json!({"input": "x"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
}

async fn tasks_client(
    url: &str,
    token: &str,
) -> rmcp::service::RunningService<rmcp::service::RoleClient, crate::tasks::Tasking> {
    use rmcp::ServiceExt;
    let cfg = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url.to_string())
        .auth_header(token.to_string());
    crate::tasks::Tasking.serve(rmcp::transport::StreamableHttpClientTransport::from_config(cfg)).await.unwrap()
}

/// Optimizer, with `arguments` and `requests` asked for: find_tool's line holds its request and
/// the tokens served and saved; call_tool's holds its arguments.
#[tokio::test]
async fn asked_for_arguments_and_requests_are_written() {
    let kit = http_backend("testkit").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.jsonl");
    let audit = format!("file = {:?}\narguments = true\nrequests = true\n", file.display().to_string());
    let app = gateway(&config("optimizer", &kit.url, &audit, ""), EmbedderChoice::None).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let r = call(&alice, "find_tool", json!({"tool_description": "echo a message back"})).await;
    assert!(found(&r).contains(&"kit_echo".to_string()));
    call(&alice, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "visible"}})).await;
    alice.list_all_tools().await.unwrap();
    let list = line_where(&file, "tools/list", |l| l["action"] == "tools/list").await;
    assert!(list["definition_tokens"].as_u64().unwrap() > 0, "{list}");
    let find = line_where(&file, "find_tool", |l| l["action"] == "find_tool").await;
    assert_eq!(find["request"], "echo a message back");
    assert!(find["definition_tokens"].as_u64().unwrap() > 0 && find["saved_tokens"].as_u64().unwrap() > 0, "{find}");
    let call_line = line_where(&file, "call_tool", |l| l["action"] == "call_tool").await;
    assert_eq!(call_line["arguments"], json!({"input": "visible"}));
    assert_eq!(call_line["target"], "kit_echo");
    app.shutdown().await;
}

/// A trail that cannot be written (a full disk: /dev/full) is never silent: each line lost is
/// counted; with `on_failure = "refuse"` the next call is refused and says why, and with the
/// default the gateway serves on.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_full_disk_is_counted_and_refuses_when_asked() {
    let kit = http_backend("testkit").await;
    for (setting, refuses) in [("on_failure = \"refuse\"\n", true), ("", false)] {
        let audit = format!("file = \"/dev/full\"\n{setting}");
        let app = gateway(&config("passthrough", &kit.url, &audit, ""), EmbedderChoice::None).await;
        // The session's start is the first line lost.
        let (alice, _) = client_with_auth(&app, Some("alice")).await;
        let metrics = format!("http://{}/metrics", app.addr.unwrap());
        let lost = eventually(std::time::Duration::from_secs(10), || async {
            let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
            text.contains("toolmux_audit_lines_lost_total{reason=\"write\"} 1")
        })
        .await;
        assert!(lost, "the lost line is counted");
        let r = call(&alice, "kit_echo", json!({"input": "x"})).await;
        if refuses {
            assert_eq!(r.is_error, Some(true), "{r:?}");
            assert!(text(&r).contains("audit trail cannot be written"), "{}", text(&r));
        } else {
            assert_eq!(text(&r), "x", "the default serves on");
        }
        app.shutdown().await;
    }
}

/// Tokens are counted per principal and backend: definitions served (tools/list, find_tool),
/// results returned, and saved against listing the whole scope; `/metrics` has them, and the
/// console's Traffic view shows an admin everyone's and anyone else their own.
#[tokio::test]
async fn tokens_are_counted_by_principal_and_backend() {
    let kit = http_backend("testkit").await;
    let app = gateway(&config("optimizer", &kit.url, "", ""), EmbedderChoice::None).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    alice.list_all_tools().await.unwrap();
    call(&alice, "find_tool", json!({"tool_description": "echo a message back"})).await;
    let r = call(&alice, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "x".repeat(400)}})).await;
    let result_tokens = serde_json::to_vec(&r).unwrap().len() as u64 / 4;
    call(&bob, "find_tool", json!({"tool_description": "echo a message back"})).await;

    let m = reqwest::get(format!("http://{}/metrics", app.addr.unwrap())).await.unwrap().text().await.unwrap();
    let series = |labels: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("toolmux_tokens_total{{{labels}}} ")))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // The gateway counts the result as it sent it (with its `resultType` mark, which the client
    // drops): a few tokens more than the client's copy.
    let results = series("principal=\"alice\",backend=\"kit\",kind=\"results\"");
    assert!((result_tokens..=result_tokens + 8).contains(&results), "{results} vs {result_tokens}: {m}");
    assert!(series("principal=\"alice\",backend=\"kit\",kind=\"definitions\"") > 0, "{m}");
    assert!(series("principal=\"alice\",backend=\"(toolmux)\",kind=\"definitions\"") > 0, "the meta-tools listed: {m}");
    assert!(series("principal=\"alice\",backend=\"(scope)\",kind=\"saved\"") > 0, "{m}");
    assert!(series("principal=\"bob\",backend=\"kit\",kind=\"definitions\"") > 0, "{m}");
    assert_eq!(series("principal=\"bob\",backend=\"kit\",kind=\"results\""), 0, "bob called nothing");

    let traffic = |token: &'static str| {
        let url = format!("http://{}/ui/api/traffic", app.addr.unwrap());
        async move {
            reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap().json::<Value>().await.unwrap()
        }
    };
    let principals = |v: &Value| {
        let mut p: Vec<String> =
            v["tokens"].as_array().unwrap().iter().map(|r| r["principal"].as_str().unwrap().to_string()).collect();
        p.dedup();
        p
    };
    assert_eq!(principals(&traffic("bob").await), ["bob"], "bob sees his own tokens only");
    assert_eq!(principals(&traffic("alice").await), ["alice", "bob"], "the admin sees everyone's");
    app.shutdown().await;
}
