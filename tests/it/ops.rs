//! Operating the gateway as a process: stop signals, reload, metrics and status.

use std::time::Duration;

use serde_json::json;

use toolmux::app::EmbedderChoice;

use crate::harness::*;

/// Whether process `pid` is alive (a zombie waiting for its parent to reap it is not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
    }
}

/// SIGTERM during a slow call: readiness turns 503 and new sessions are refused at once, the
/// call's result is still delivered, no process a stdio backend started survives, and the exit
/// code is 0.
#[tokio::test]
async fn sigterm_drains_running_calls_and_ends_every_child() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    // The backend starts a process of its own, as a wrapper script or a server with workers would.
    let script = format!("sleep 600 & echo $! > {}; exec {BIN} backend testkit --stdio", pidfile.display());
    let config = dir.path().join("toolmux.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\nshutdown_grace = \"30s\"\n\
             [[backends]]\nname = \"kit\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\n"
        ),
    )
    .unwrap();
    let mut served = Served::start(&config).await;
    let grandchild: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(alive(grandchild), "the backend's own child runs");

    let session = RawSession::open_url(&served.url).await;
    let (id, answer) = session.send("tools/call", json!({"name": "kit_sleep", "arguments": {"ms": 1500}})).await;
    served.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        eventually(Duration::from_secs(5), || async { served.get("/readyz").await.0 == 503 }).await,
        "readiness turns 503 while calls drain"
    );
    let late = reqwest::Client::new()
        .post(&served.url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "late", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 503, "no new session while stopping");

    let answer = RawSession::answer(answer, id).await;
    assert_eq!(answer["result"]["content"][0]["text"], "slept 1500 ms", "{answer}");
    let status = tokio::time::timeout(Duration::from_secs(20), served.child.wait()).await.expect("it exits").unwrap();
    assert_eq!(status.code(), Some(0), "a graceful stop exits 0");
    assert!(eventually(Duration::from_secs(5), || async { !alive(grandchild) }).await, "the backend's child was ended");
}

/// A reload under open sessions: `keep` stays, `gone` is removed, `moved` changes to another
/// server, `new` is added, and bob's policy takes in `new` and drops `keep`. Each session sees the new
/// set without reconnecting (passthrough: told by `tools/list_changed`), calls to what was
/// removed fail like unknown names, and only the new tools' texts are embedded.
#[tokio::test]
async fn reload_adds_removes_and_changes_backends_under_open_sessions() {
    for mode in ["passthrough", "optimizer"] {
        let (echo, kit, github, slack) = (
            http_backend("echo").await,
            http_backend("testkit").await,
            http_backend("github").await,
            http_backend("slack").await,
        );
        let cache = tempfile::tempdir().unwrap();
        let head = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n\
             [health]\ninterval = \"1s\"\n[optimizer]\ncache_dir = {:?}\n{}\
             [[policy]]\nprincipals = [\"alice\"]\nbackends = [\"*\"]\n",
            cache.path().display().to_string(),
            bearer_tokens(&["alice", "bob"]),
        );
        let bob_before = "[[policy]]\nprincipals = [\"bob\"]\nbackends = [\"keep\", \"moved\"]\n";
        let bob_after = "[[policy]]\nprincipals = [\"bob\"]\nbackends = [\"moved\", \"new\"]\n";
        let before = format!(
            "{head}{bob_before}{}{}{}",
            http_backend_toml("keep", &echo.url),
            http_backend_toml("gone", &kit.url),
            http_backend_toml("moved", &kit.url),
        );
        let after = format!(
            "{head}{bob_after}{}{}{}",
            http_backend_toml("keep", &echo.url),
            http_backend_toml("moved", &github.url),
            http_backend_toml("new", &slack.url),
        );
        let embedder = if mode == "optimizer" { EmbedderChoice::Given(model()) } else { EmbedderChoice::None };
        let app = gateway(&before, embedder).await;
        let (alice, alice_told) = client_with_auth(&app, Some("alice")).await;
        let (bob, _) = client_with_auth(&app, Some("bob")).await;
        let embedded = || app.gateway.store.counters.texts_embedded.load(std::sync::atomic::Ordering::Relaxed);
        let embedded_before = embedded();

        let done = app.reload(toolmux::config::Config::parse(&after).unwrap()).await;
        assert_eq!(done.added, ["new"], "{done}");
        assert_eq!(done.removed, ["gone"], "{done}");
        assert_eq!(done.changed, ["moved"], "{done}");
        assert!(done.policy && done.needs_restart.is_empty(), "{done}");

        assert!(
            eventually(Duration::from_secs(20), || async {
                let n = names(&alice, mode).await;
                n.iter().any(|t| t == "new_send_message")
                    && n.iter().any(|t| t == "moved_create_pull_request")
                    && !n.iter().any(|t| t.starts_with("gone_") || t == "moved_sleep")
            })
            .await,
            "{mode}: alice sees the new set: {:?}",
            names(&alice, mode).await
        );
        let bob_sees = names(&bob, mode).await;
        assert!(bob_sees.iter().any(|t| t == "new_send_message"), "{mode}: bob's grown policy: {bob_sees:?}");
        assert!(!bob_sees.iter().any(|t| t.starts_with("keep_")), "{mode}: bob's revoked right: {bob_sees:?}");
        let kept = names(&alice, mode).await;
        assert!(kept.iter().any(|t| t == "keep_echo"), "{mode}: unchanged backends stay: {kept:?}");
        let revoked = call_named(&bob, mode, "keep_echo", json!({"input": "x"})).await;
        assert!(revoked.contains("not found"), "{mode}: a revoked tool is unknown to bob now: {revoked}");
        if mode == "passthrough" {
            let told = || alice_told.tools_changed.load(std::sync::atomic::Ordering::SeqCst) > 0;
            assert!(eventually(Duration::from_secs(20), || async { told() }).await, "list_changed sent");
        }
        // A removed backend's tool is unknown now; a new one answers.
        let gone = call_named(&alice, mode, "gone_echo", json!({"input": "x"})).await;
        assert!(gone.contains("not found"), "{mode}: {gone}");
        let sent = call_named(&bob, mode, "new_send_message", json!({"channel": "#ops", "text": "hi"})).await;
        assert!(!sent.contains("not found"), "{mode}: {sent}");
        if mode == "optimizer" {
            let store = app.gateway.store.current();
            let fresh =
                store.catalog.tools().iter().filter(|t| ["moved", "new"].contains(&t.key.backend.as_ref())).count();
            assert_eq!(embedded() - embedded_before, fresh as u64, "only the new tools' texts were embedded");
        }
        alice.cancel().await.unwrap();
        bob.cancel().await.unwrap();
        app.shutdown().await;
    }
}

/// What `c` can use: the listed tools (passthrough) or what find_tool returns for a broad
/// query (optimizer, asking for every tool).
async fn names(c: &Client, mode: &str) -> Vec<String> {
    if mode == "passthrough" {
        return c.list_all_tools().await.unwrap().iter().map(|t| t.name.to_string()).collect();
    }
    let mut all = Vec::new();
    for q in ["send a chat message to a channel", "create a pull request", "echo back a message", "sleep for a while"] {
        all.extend(found(&call(c, "find_tool", json!({"tool_description": q})).await));
    }
    all
}

/// Calls `tool` directly (passthrough) or through call_tool (optimizer); the answer's text, or
/// the error's message.
async fn call_named(c: &Client, mode: &str, tool: &str, args: serde_json::Value) -> String {
    if mode == "optimizer" {
        return text(&call(c, "call_tool", json!({"tool_name": tool, "parameters": args})).await);
    }
    let params =
        rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(args.as_object().unwrap().clone());
    match c.call_tool(params).await {
        Ok(r) => text(&r),
        Err(e) => e.to_string(),
    }
}

/// `serve --watch`: an invalid file is refused with check-config's errors while the running
/// configuration keeps serving; a valid one is applied; `toolmux status` shows both.
#[tokio::test]
async fn watch_refuses_an_invalid_file_and_applies_a_valid_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    let head = "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n";
    std::fs::write(&config, format!("{head}{}", stdio_backend_toml("kit", "testkit"))).unwrap();
    let served = Served::start_with(&config, &["--watch"]).await;
    let session = RawSession::open_url(&served.url).await;
    let listed = |names: Vec<&'static str>| {
        let session = &session;
        async move {
            let tools = session.request("tools/list", json!({})).await;
            let tools: Vec<String> =
                tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
            names.iter().all(|n| tools.iter().any(|t| t == n))
        }
    };
    assert!(listed(vec!["kit_echo"]).await);

    std::fs::write(&config, format!("{head}[[backends]]\nname = \"more\"\n")).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async { served.status().await["reload"]["last_error"].is_string() })
            .await,
        "the invalid file is refused: {}",
        served.status().await
    );
    let error = served.status().await["reload"]["last_error"].as_str().unwrap().to_string();
    assert!(error.contains("backends[1]") || error.contains("url"), "names the key: {error}");
    assert!(listed(vec!["kit_echo"]).await, "the running configuration keeps serving");

    std::fs::write(
        &config,
        format!("{head}{}{}", stdio_backend_toml("kit", "testkit"), stdio_backend_toml("more", "echo")),
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async { listed(vec!["kit_echo", "more_echo"]).await }).await,
        "the added backend's tools are served: {}",
        served.status().await
    );
    let status = served.status().await;
    assert_eq!(status["reload"]["applied"], 1, "{status}");
    assert!(status["reload"]["last_error"].is_null(), "{status}");

    let out = std::process::Command::new(BIN).args(["status", "--url", &served.base]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.lines().any(|l| l.starts_with("more ") && l.contains("stdio")), "{table}");
    assert!(table.contains("last reload: added more"), "{table}");
}

/// The value of the series `name{labels}` in a Prometheus text scrape, if present.
fn series(scrape: &str, name_and_labels: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `/metrics` moves with what clients do: requests by method and outcome, tool calls by
/// backend and outcome, find_tool searches by mode, and the states read at scrape time.
#[tokio::test]
async fn metrics_count_requests_calls_and_searches() {
    let kit = http_backend("testkit").await;
    let toml = format!("[server]\nlisten = \"127.0.0.1:0\"\n{}", http_backend_toml("kit", &kit.url));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let scrape = || async {
        let r = reqwest::get(format!("http://{}/metrics", app.addr.unwrap())).await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    };
    let before = scrape().await;
    assert_eq!(series(&before, "toolmux_tool_calls_total{backend=\"kit\",outcome=\"ok\"}"), None, "{before}");
    assert_eq!(series(&before, "toolmux_sessions{mode=\"optimizer\"}"), Some(0.0), "{before}");

    let (c, _) = client(&app).await;
    let found = call(&c, "find_tool", json!({"tool_description": "echo back a message"})).await;
    assert_ne!(found.is_error, Some(true));
    let r = call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "hi"}})).await;
    assert_eq!(text(&r), "hi");
    let r = call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"wrong": 1}})).await;
    assert_eq!(r.is_error, Some(true));

    let after = scrape().await;
    let value = |s: &str| series(&after, s).unwrap_or_else(|| panic!("{s} in:\n{after}"));
    assert_eq!(value("toolmux_requests_total{method=\"tools/call\",outcome=\"ok\"}"), 3.0);
    assert_eq!(value("toolmux_requests_total{method=\"initialize\",outcome=\"ok\"}"), 1.0);
    assert_eq!(value("toolmux_tool_calls_total{backend=\"kit\",outcome=\"ok\"}"), 1.0);
    assert_eq!(value("toolmux_tool_calls_total{backend=\"kit\",outcome=\"is_error\"}"), 1.0);
    assert_eq!(value("toolmux_tool_call_duration_seconds_count{backend=\"kit\"}"), 2.0);
    assert_eq!(value("toolmux_find_tool_searches_total{mode=\"keyword\",plan=\"none\",match=\"weak\"}"), 1.0);
    assert_eq!(value("toolmux_find_tool_stage_duration_seconds_count{stage=\"search\"}"), 1.0);
    assert_eq!(value("toolmux_sessions{mode=\"optimizer\"}"), 1.0);
    assert_eq!(value("toolmux_backend_health{backend=\"kit\",state=\"healthy\"}"), 1.0);
    assert!(value("toolmux_catalog_tools") >= 10.0);
    assert!(after.contains("# TYPE toolmux_request_duration_seconds histogram"), "{after}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A client's W3C trace context reaches the backend with the forwarded call (SEP-414 `_meta`).
#[tokio::test]
async fn a_clients_traceparent_reaches_the_backend() {
    let kit = http_backend("testkit").await;
    let toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}", http_backend_toml("kit", &kit.url));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let session = RawSession::open(&app).await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = session
        .request("tools/call", json!({"name": "kit_whoami", "arguments": {}, "_meta": {"traceparent": trace}}))
        .await;
    let said = r["content"][0]["text"].as_str().unwrap_or_default();
    assert!(said.ends_with(&format!("traceparent={trace}")), "{r}");
    let r = session.call("kit_whoami", json!({})).await;
    assert!(!r["content"][0]["text"].as_str().unwrap().contains("traceparent"), "none invented: {r}");
    app.shutdown().await;
}

/// A SIGTERM while a backend is still starting (here: a stdio backend that takes a minute to
/// list its tools) stops the gateway cleanly, exit status 0, as it does once ready.
#[tokio::test]
async fn a_stop_signal_before_ready_stops_cleanly() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[[backends]]\nname = \"slow\"\ncommand = \"{BIN}\"\n\
         args = [\"backend\", \"testkit\", \"--stdio\", \"--list-delay-ms\", \"60000\"]\n"
    );
    std::fs::write(&config, toml).unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(["serve", "--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().expect("serve prints its URL");
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().trim_end_matches("/mcp").to_string();
    // Listening, and not ready: the backend is still listing.
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap().status().as_u16();
    assert_eq!(ready, 503, "not ready while the backend lists");
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("it stops").unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}
