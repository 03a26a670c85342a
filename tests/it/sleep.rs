//! `idle_stop`: a stdio backend unused that long is stopped (its child gone), stays in the
//! catalog as `dormant` (find_tool finds its tools, no probe wakes it), and the next call, through
//! call_tool or by the tool's name, starts it and answers; a start that fails says so.

use std::time::Duration;

use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice};

use crate::harness::*;

/// The processes whose environment holds `mark` (this test's stdio children), by pid.
#[cfg(target_os = "linux")]
fn children_marked(mark: &str) -> Vec<u32> {
    let needle = format!("TOOLMUX_TEST_MARK={mark}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
        })
        .collect()
}

async fn backend_status(app: &App, name: &str) -> Value {
    let status: Value =
        reqwest::get(format!("http://{}/status", app.addr.unwrap())).await.unwrap().json().await.unwrap();
    status["backends"].as_array().unwrap().iter().find(|b| b["name"] == name).cloned().unwrap_or_default()
}

async fn dormant(app: &App, name: &str) -> bool {
    eventually(Duration::from_secs(20), || async { backend_status(app, name).await["health"] == "dormant" }).await
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_idle_stdio_backend_sleeps_and_wakes_for_the_next_call() {
    for mode in ["optimizer", "passthrough"] {
        let mark = format!("{mode}-{}", std::process::id());
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n[health]\ninterval = \"200ms\"\n\
             [[backends]]\nname = \"kit\"\ncommand = \"{BIN}\"\nargs = [\"backend\", \"testkit\", \"--stdio\"]\n\
             idle_stop = \"1s\"\nenv = {{ TOOLMUX_TEST_MARK = \"{mark}\" }}\n"
        );
        let app = gateway(&toml, EmbedderChoice::None).await;
        let (c, _) = client(&app).await;
        let first = children_marked(&mark);
        assert_eq!(first.len(), 1, "{mode}: one child at start");
        assert!(dormant(&app, "kit").await, "{mode}: unused for its idle_stop, the backend sleeps");
        let gone = eventually(Duration::from_secs(10), || std::future::ready(children_marked(&mark).is_empty())).await;
        assert!(gone, "{mode}: its child (and process group) ended");
        let status = backend_status(&app, "kit").await;
        assert_eq!(
            (status["connected"].clone(), status["tools"].as_u64().unwrap() > 0),
            (json!(false), true),
            "{status}"
        );

        // Asleep, its tools are still found and listed.
        if mode == "optimizer" {
            let found = call(&c, "find_tool", json!({"tool_description": "echo a message back"})).await;
            assert!(found_names(&found).contains(&"kit_echo".to_string()), "{}", text(&found));
        } else {
            let listed = c.list_all_tools().await.unwrap();
            assert!(listed.iter().any(|t| t.name == "kit_echo"), "listed while dormant");
        }
        // Probes leave it asleep: still dormant a few health intervals later, no child.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(backend_status(&app, "kit").await["health"], "dormant");
        assert!(children_marked(&mark).is_empty(), "{mode}: a probe does not wake it");

        // The next call wakes it and answers.
        let answer = match mode {
            "optimizer" => {
                call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "awake"}})).await
            }
            _ => call(&c, "kit_echo", json!({"input": "awake"})).await,
        };
        assert_eq!((text(&answer), answer.is_error), ("awake".to_string(), Some(false)), "{mode}");
        assert_eq!(children_marked(&mark).len(), 1, "{mode}: a new child");
        assert_ne!(children_marked(&mark), first, "{mode}: started afresh");
        let healthy =
            eventually(Duration::from_secs(10), || async { backend_status(&app, "kit").await["health"] == "healthy" })
                .await;
        assert!(healthy, "{mode}: awake again");
        c.cancel().await.unwrap();
        app.shutdown().await;
    }
}

/// A backend that cannot start again: the call that needed it gets an `isError` that says so,
/// and the operator reads why in `/status`.
#[tokio::test]
async fn a_wake_that_fails_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let once = dir.path().join("started-once");
    // Starts the first time; every later start fails.
    let script = format!(
        "if [ -e {once:?} ]; then echo 'cannot open the database' >&2; exit 3; fi; : > {once:?}; exec {BIN:?} backend testkit --stdio"
    );
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n[health]\ninterval = \"200ms\"\n\
         [[backends]]\nname = \"kit\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nidle_stop = \"1s\"\ntimeout = \"5s\"\n"
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    assert!(dormant(&app, "kit").await);
    let r = call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "x"}})).await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("stopped while unused and could not be started again"), "{}", text(&r));
    assert!(!text(&r).contains("database"), "what the backend said is the operator's: {}", text(&r));
    let status = backend_status(&app, "kit").await;
    assert!(status["last_error"].as_str().unwrap_or("").contains("exited with code 3"), "{status}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

fn found_names(r: &rmcp::model::CallToolResult) -> Vec<String> {
    r.structured_content.as_ref().map_or_else(Vec::new, |s| {
        s["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
    })
}

/// A SIGTERM while a dormant backend is being started for a call (its child up, still listing)
/// stops the gateway, and no child is left behind.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_stop_during_a_wake_leaves_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let once = dir.path().join("started-once");
    let mark = format!("wake-stop-{}", std::process::id());
    // The first start is quick; a wake's takes a minute to list its tools.
    let script = format!(
        "if [ -e {once:?} ]; then exec {BIN:?} backend testkit --stdio --list-delay-ms 60000; fi; : > {once:?}; exec {BIN:?} backend testkit --stdio"
    );
    let config = dir.path().join("toolmux.toml");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[health]\ninterval = \"200ms\"\n\
         [[backends]]\nname = \"kit\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nidle_stop = \"1s\"\n\
         env = {{ TOOLMUX_TEST_MARK = \"{mark}\" }}\n"
    );
    std::fs::write(&config, toml).unwrap();
    let mut served = Served::start(&config).await;
    let asleep = eventually(Duration::from_secs(20), || async {
        let status: Value = serde_json::from_str(&served.get("/status").await.1).unwrap_or_default();
        status["backends"][0]["health"] == "dormant"
    })
    .await;
    assert!(asleep && children_marked(&mark).is_empty(), "dormant, its child gone");
    let session = RawSession::open_url(&served.url).await;
    let call = tokio::spawn(async move {
        session.try_request("tools/call", json!({"name": "kit_echo", "arguments": {"input": "x"}})).await
    });
    let waking = eventually(Duration::from_secs(20), || std::future::ready(!children_marked(&mark).is_empty())).await;
    assert!(waking, "the call started the backend's child");
    served.signal(nix::sys::signal::Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(30), served.child.wait()).await.expect("it stops").unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let _ = call.await;
    let none = eventually(Duration::from_secs(10), || std::future::ready(children_marked(&mark).is_empty())).await;
    assert!(none, "no child left behind: {:?}", children_marked(&mark));
}

/// `per_client`: each client's own child sleeps on its own after `idle_stop`, while another
/// client's, in use, keeps running; the idle client's next call starts a child of its own again.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn each_clients_own_child_sleeps_on_its_own() {
    let mark = format!("per-client-{}", std::process::id());
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[health]\ninterval = \"200ms\"\n\
         [[backends]]\nname = \"kit\"\ncommand = \"{BIN}\"\nargs = [\"backend\", \"testkit\", \"--stdio\"]\n\
         session = \"per_client\"\nidle_stop = \"1s\"\nenv = {{ TOOLMUX_TEST_MARK = \"{mark}\" }}\n"
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (busy, _) = client(&app).await;
    let (idle, _) = client(&app).await;
    for c in [&busy, &idle] {
        assert_eq!(text(&call(c, "kit_echo", json!({"input": "x"})).await), "x");
    }
    // The gateway's own connection and both clients' children sleep unless used: only the busy
    // client's child is left.
    let one_left = eventually(Duration::from_secs(20), || async {
        assert_eq!(text(&call(&busy, "kit_echo", json!({"input": "still here"})).await), "still here");
        children_marked(&mark).len() == 1
    })
    .await;
    assert!(one_left, "the idle client's child slept, the busy one's did not: {:?}", children_marked(&mark));
    let before = children_marked(&mark);
    assert_eq!(text(&call(&idle, "kit_echo", json!({"input": "back"})).await), "back");
    let after = children_marked(&mark);
    assert_eq!(after.len(), 2, "the idle client has a child of its own again");
    assert!(before.iter().all(|p| after.contains(p)), "the busy client's child was not touched");
    for c in [busy, idle] {
        c.cancel().await.unwrap();
    }
    app.shutdown().await;
}
