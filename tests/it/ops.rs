//! Operating the gateway as a process: stop signals, reload, metrics and status.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncBufReadExt;

use crate::harness::*;

/// A running `toolmux serve` child and the URL it printed.
struct Served {
    child: tokio::process::Child,
    url: String,
    base: String,
}

impl Served {
    async fn start(config: &std::path::Path) -> Self {
        let mut child = tokio::process::Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("serve prints its URL")
            .unwrap()
            .expect("a line");
        let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
        let base = url.trim_end_matches("/mcp").to_string();
        let s = Served { child, url, base };
        assert!(
            eventually(Duration::from_secs(60), || async { s.get("/readyz").await.0 == 200 }).await,
            "the gateway gets ready"
        );
        s
    }

    async fn get(&self, path: &str) -> (u16, String) {
        match reqwest::get(format!("{}{path}", self.base)).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }
}

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
