//! The `toolmux` binary's own commands, run as child processes: `find` and `demo`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use toolmux::config::Config;

use crate::harness::*;

#[test]
fn find_prints_what_find_tool_would_return() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_catalog_config(dir.path());
    let out = std::process::Command::new(BIN)
        .args(["find", "--config", config.to_str().unwrap(), "create a pull request on a code repository"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let names: Vec<&str> = answer["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"github_create_pull_request"), "{names:?}");
    assert_eq!(answer["search_mode"], "hybrid");
    assert!(answer["token_metrics"]["baseline_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn demo_serves_the_built_in_backends_in_optimizer_mode() {
    let cache = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0"])
        .env("XDG_CACHE_HOME", cache.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(cache.path().join("stderr.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the demo prints its URL")
        .unwrap()
        .unwrap();
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("{line}"));
    let c = rmcp::ServiceExt::serve(
        Recorder::default(),
        rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string()),
    )
    .await
    .expect("client connects");
    let tools = c.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, vec!["find_tool", "call_tool", "read_result"]);
    let r = call(&c, "find_tool", json!({"tool_description": "send a chat message to a channel"})).await;
    let found = found(&r);
    assert!(found.iter().take(3).any(|n| n == "slack_send_message"), "{found:?}");
    let r = call(
        &c,
        "call_tool",
        json!({"tool_name": "slack_send_message", "parameters": {"channel": "#general", "text": "hi"}}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    c.cancel().await.unwrap();
    // Ctrl-C: a quiet, clean stop (the demo's backends outlive the gateway's goodbyes).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGINT)
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("the demo stops").unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");

    // Logs a person can read: toolmux's own events, no dependency chatter, no colour codes in a file.
    let log = std::fs::read_to_string(cache.path().join("stderr.log")).unwrap();
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a log file:\n{log}");
    assert!(!log.lines().any(|l| l.contains(" INFO rmcp")), "dependencies log at info:\n{log}");
    let n = log.lines().count();
    assert!(n <= 25, "{n} log lines for a demo start:\n{log}");
    assert!(log.contains("ready"), "toolmux's own events are logged:\n{log}");
    assert!(!log.contains(" ERROR "), "a first stop ends quietly:\n{log}");
}

/// A gateway whose stdout is closed before it announces its URLs (a supervisor, or a script
/// that read the first line and went away) keeps serving: announcing used to panic on the
/// broken pipe and take the gateway down.
#[tokio::test]
async fn serve_keeps_serving_when_its_stdout_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = dir.path().join("toolmux.toml");
    std::fs::write(&config, format!("[server]\nlisten = \"127.0.0.1:{port}\"\nmode = \"passthrough\"\n")).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = tokio::process::Command::new(BIN)
        .args(["serve", "--config", config.to_str().unwrap()])
        .stdout(writer)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Ready, then a reload (SIGHUP is handled once the gateway has announced itself): each
    // awaited while checking that the gateway has not stopped.
    let base = format!("http://127.0.0.1:{port}");
    let reloaded = |v: &Value| !v["reload"]["at"].is_null();
    let mut status = Value::Null;
    for step in ["ready", "reloaded"] {
        if step == "reloaded" {
            let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
        }
        for _ in 0..300 {
            if let Some(exit) = child.try_wait().unwrap() {
                panic!("the gateway stopped before it was {step}: {exit:?}");
            }
            status = match reqwest::get(format!("{base}/status")).await {
                Ok(r) if r.status().is_success() => r.json().await.unwrap(),
                _ => Value::Null,
            };
            if status["ready"] == true && (step == "ready" || reloaded(&status)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(reloaded(&status), "no reload seen: {status}");
    assert!(child.try_wait().unwrap().is_none(), "the gateway stopped");
}

/// The gateway as a child process in optimizer mode over a small catalog (two stdio backends):
/// find_tool ranks a known tool first and call_tool runs one. `scripts/test-arm64.sh` runs this
/// under qemu too, where the catalog is embedded by the aarch64 build, so the index is waited
/// for rather than assumed (emulated, embedding takes minutes).
#[tokio::test]
async fn smoke_optimizer_over_stdio_finds_and_calls() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_catalog_config(dir.path());
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["serve", "--stdio", "--config", config.to_str().unwrap()]).stderr(Stdio::null());
    let transport = rmcp::transport::TokioChildProcess::new(cmd).unwrap();
    let c = rmcp::ServiceExt::serve(Recorder::default(), transport).await.expect("stdio gateway answers");
    let query = json!({"tool_description": "create a pull request on a code repository"});
    assert!(
        eventually(Duration::from_secs(900), || async {
            !found(&call(&c, "find_tool", query.clone()).await).is_empty()
        })
        .await,
        "the index is built"
    );
    let r = call(&c, "find_tool", query).await;
    assert_eq!(r.structured_content.as_ref().unwrap()["search_mode"], "hybrid", "the dense arm is on");
    assert_eq!(found(&r).first().map(String::as_str), Some("github_create_pull_request"), "{:?}", found(&r));
    let r = call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "smoke"}})).await;
    assert_eq!(text(&r), "smoke");
    c.cancel().await.unwrap();
}

/// `serve --stdio` reloads its configuration on SIGHUP as `serve` does: a backend added to the
/// file while a client is connected over stdin/stdout is listed to that client.
#[tokio::test]
async fn serve_over_stdio_reloads_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    let base = "[server]\nmode = \"passthrough\"\n".to_string() + &stdio_backend_toml("kit", "testkit");
    std::fs::write(&config, &base).unwrap();
    let (c, pid) = stdio_gateway(&config, "kit_echo").await;
    let names =
        || async { c.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect::<Vec<_>>() };
    assert!(!names().await.iter().any(|n| n.starts_with("more_")), "not configured yet");

    std::fs::write(&config, base + &stdio_backend_toml("more", "testkit")).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(60), || async { names().await.contains(&"more_echo".to_string()) }).await,
        "the added backend is listed after SIGHUP: {:?}",
        names().await
    );
    let r = call(&c, "more_echo", json!({"input": "after reload"})).await;
    assert_eq!(text(&r), "after reload");
    c.cancel().await.unwrap();
}

/// A gateway killed outright (SIGKILL) runs no stop, yet its stdio backends and what they started
/// end: its reaper, told each process group, ends them when the gateway's end of the pipe closes.
#[tokio::test]
async fn a_killed_gateway_leaves_no_stdio_backend_running() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 600 & echo $! > {}; exec {BIN} backend testkit --stdio", pidfile.display());
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[[backends]]\nname = \"kit\"\ncommand = \"sh\"\nargs = [\"-c\", {}]\n",
        serde_json::to_string(&script).unwrap()
    );
    let config = dir.path().join("toolmux.toml");
    std::fs::write(&config, toml).unwrap();
    let mut served = Served::start(&config).await;
    let grandchild: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let gone = |pid: i32| match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // Killed but not yet reaped by whoever adopted it.
        Ok(stat) => stat.rsplit(") ").next().is_some_and(|rest| rest.starts_with('Z')),
    };
    assert!(!gone(grandchild), "the backend's own child runs");
    served.signal(nix::sys::signal::Signal::SIGKILL);
    served.child.wait().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async { gone(grandchild) }).await,
        "process {grandchild}, started by a stdio backend, outlived the killed gateway"
    );
}

/// Every entry in docs/clients.md is exactly what `toolmux connect` prints for it.
#[test]
fn the_host_guide_shows_what_connect_prints() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/clients.md")).unwrap();
    let mut seen = 0;
    let mut rest = guide.as_str();
    while let Some(at) = rest.find("<!-- connect: ") {
        let after = &rest[at + "<!-- connect: ".len()..];
        let (marker, body) = after.split_once(" -->\n").unwrap();
        let mut words = marker.split_whitespace();
        let host = words.next().unwrap();
        let http = words.next() == Some("--url");
        let body = body.strip_prefix("```").unwrap();
        let (_, body) = body.split_once('\n').unwrap();
        let (snippet, _) = body.split_once("```\n").unwrap();
        let mut args = vec!["connect", host];
        if http {
            args.extend(["--url", "http://127.0.0.1:4483/mcp", "--token-env", "TOOLMUX_TOKEN"]);
        } else {
            args.extend(["--config", "/path/to/toolmux.toml", "--command", "/path/to/toolmux"]);
        }
        let out = std::process::Command::new(BIN).args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), snippet, "docs/clients.md, {marker}");
        seen += 1;
        rest = after;
    }
    // Nine hosts over stdio, eight of them over HTTP too (Claude Desktop's file takes stdio only).
    assert_eq!(seen, 17);
}

/// A user's machine with servers in three hosts: `import` with no path finds them, moves the
/// secrets out, never prints one; `connect --write` replaces them and `--undo` puts them back.
#[test]
fn import_then_connect_then_undo() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts");
    let place = |rel: &str, from: &str| {
        let to = home.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(fixtures.join(from), &to).unwrap();
        to
    };
    let cursor = place(".cursor/mcp.json", "cursor/.cursor/mcp.json");
    place(".codex/config.toml", "codex/.codex/config.toml");
    place(".claude.json", "claude-code/.claude.json");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(args)
            .current_dir(work.path())
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join(".config"))
            .env_remove("CODEX_HOME")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let (ok, report) = run(&["import"]);
    assert!(ok, "{report}");
    for host in ["Cursor", "Codex CLI", "Claude Code"] {
        assert!(report.contains(&format!("read {host}")), "{report}");
    }
    for secret in ["ntn_fixture000000", "ctx7-fixture", "sk-fixture-0000"] {
        assert!(!report.contains(secret), "a secret was printed: {report}");
    }
    assert!(report.contains("NOTION_TOKEN") && report.contains("off from Codex CLI"), "{report}");
    let config = work.path().join("toolmux.toml");
    // The gateway reads it (LINEAR_API_KEY is the one the host took from its environment).
    let check = std::process::Command::new(BIN)
        .args(["check-config", config.to_str().unwrap()])
        .env("LINEAR_API_KEY", "set")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    // A second import would replace it: refused, the file kept.
    let (ok, text) = run(&["import"]);
    assert!(!ok && text.contains("--into"), "{text}");

    let before = std::fs::read_to_string(&cursor).unwrap();
    let (ok, text) = run(&["connect", "cursor", "--config", config.to_str().unwrap(), "--write"]);
    assert!(ok, "{text}");
    assert!(text.contains("taken out (now served through toolmux): notion, puppeteer"), "{text}");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&cursor).unwrap()).unwrap();
    assert_eq!(written["mcpServers"].as_object().unwrap().keys().collect::<Vec<_>>(), ["toolmux"]);
    assert_eq!(written["mcpServers"]["toolmux"]["args"][3], config.to_str().unwrap());
    let (ok, text) = run(&["connect", "cursor", "--undo"]);
    assert!(ok, "{text}");
    assert_eq!(std::fs::read_to_string(&cursor).unwrap(), before);
}

/// A project folder's `.mcp.json` came with the project: `import` carries its servers only once
/// the user confirms them (no terminal here, so no), or with `--trust-project`.
#[test]
fn a_project_files_servers_wait_for_the_users_word() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts");
    std::fs::copy(fixtures.join("claude-code/.mcp.json"), project.path().join(".mcp.json")).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(args)
            .current_dir(project.path())
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join(".config"))
            .env_remove("CODEX_HOME")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (ok, held) = run(&["import", "--json"]);
    assert!(ok, "{held}");
    let held: Value = serde_json::from_str(&held).unwrap();
    assert_eq!(held["backends"].as_array().unwrap().len(), 0, "carried without asking: {held}");
    let skipped = held["skipped"].as_array().unwrap();
    assert!(!skipped.is_empty() && skipped.iter().all(|s| s["reason"].as_str().unwrap().contains("--trust-project")));
    let (ok, trusted) = run(&["import", "--json", "--trust-project"]);
    assert!(ok, "{trusted}");
    let trusted: Value = serde_json::from_str(&trusted).unwrap();
    assert_eq!(trusted["backends"].as_array().unwrap().len(), skipped.len(), "{trusted}");
    // A file the user names is their word already.
    let (ok, named) = run(&["import", "--json", ".mcp.json"]);
    assert!(ok, "{named}");
    let names = |v: &Value| v["backends"].as_array().unwrap().iter().map(|b| b["name"].clone()).collect::<Vec<_>>();
    assert_eq!(names(&serde_json::from_str(&named).unwrap()), names(&trusted));
}

#[test]
fn import_with_nothing_to_read_says_where_it_looked() {
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .arg("import")
        .current_dir(home.path())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env_remove("CODEX_HOME")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("looked in") && text.contains("claude_desktop_config.json"), "{text}");
    assert!(!home.path().join("toolmux.toml").exists());
}

/// An OAuth backend nobody has logged in to: find_tool says so, with the command that fixes it,
/// and `toolmux login` refuses what it cannot log in to, naming why.
#[test]
fn an_oauth_backend_without_a_grant_is_named_with_its_login_command() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_catalog_config(dir.path());
    let mut toml = std::fs::read_to_string(&config).unwrap();
    // Nothing listens there: without a grant toolmux does not even try.
    toml.push_str("\n[[backends]]\nname = \"tracker\"\nurl = \"http://127.0.0.1:9/mcp\"\nauth = \"oauth\"\n");
    std::fs::write(&config, toml).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["find", "--config", config.to_str().unwrap(), "open an issue in the tracker"])
        .env("TOOLMUX_CONFIG_DIR", dir.path().join("state"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let needs = answer["needs_login"].as_array().unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(needs.len(), 1, "{answer}");
    assert!(needs[0].as_str().unwrap().contains("run `toolmux login tracker"), "{answer}");
    // The other backends are searched as ever.
    assert!(!answer["tools"].as_array().unwrap().is_empty());

    let login = |backend: &str| {
        std::process::Command::new(BIN)
            .args(["login", backend, "--config", config.to_str().unwrap(), "--no-browser"])
            .env("TOOLMUX_CONFIG_DIR", dir.path().join("state"))
            .output()
            .unwrap()
    };
    let out = login("kit");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("set auth = \"oauth\""));
    let out = login("nope");
    assert!(String::from_utf8_lossy(&out.stderr).contains("it has: kit, github, tracker"));
}

/// A registry served from tests/fixtures/registry (answers recorded in the v0.1 API's shape, one
/// file per server named as its URL path segment): `GET /v0.1/servers/{name}/versions/latest`,
/// matched on the raw path as the registry does; 404 for any other. Serves until dropped.
struct Registry {
    url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Registry {
    fn start() -> Self {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/registry");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                // The rest of the head, unread, would be a reset to the client.
                let mut header = String::new();
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    header.clear();
                }
                let path = line.split_whitespace().nth(1).unwrap_or("");
                let body = path
                    .strip_prefix("/v0.1/servers/")
                    .and_then(|p| p.strip_suffix("/versions/latest"))
                    .filter(|name| !name.contains('/'))
                    .and_then(|name| std::fs::read(fixtures.join(format!("{name}.json"))).ok());
                let (status, body) = match body {
                    Some(b) => ("200 OK", b),
                    None => ("404 Not Found", br#"{"title":"Not Found","status":404}"#.to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&body));
            }
        });
        Self { url, stop }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

/// `import --registry URL NAME...`: each server from the registry becomes a backend (npm through
/// npx, PyPI through uvx, an OCI image through docker run with its variables passed by name, a
/// remote as its URL), every value the user supplies a `${VAR}` in the env file to fill in (its
/// default written when it has one), and what cannot be carried is said: an unknown name, a
/// server with only package kinds toolmux cannot run, a remote whose URL has holes.
#[test]
fn import_from_the_registry_says_what_it_carried_and_what_it_could_not() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let names = [
        "io.github.acme/weather",
        "io.github.github/github-mcp-server",
        "com.example/analytics",
        "io.github.someone/desktop-only",
        "io.github.pyco/sqlite",
        "io.github.nobody/missing",
    ];
    let out = std::process::Command::new(BIN)
        .args(["import", "--registry", &registry.url])
        .args(names)
        .current_dir(work.path())
        .output()
        .unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{report}");
    assert!(report.contains("read the MCP registry") && report.contains("4 servers"), "{report}");
    assert!(report.contains("io.github.nobody/missing: the registry has no server of that name"), "{report}");
    assert!(report.contains("io.github.someone/desktop-only") && report.contains("mcpb package"), "{report}");
    let config = Config::load(&work.path().join("toolmux.toml"));
    // Unset variables are the user's to fill in: the file names them, and says what each is.
    let err = config.unwrap_err().to_string();
    for var in ["WEATHER_API_KEY", "GITHUB_MCP_SERVER_TOKEN"] {
        assert!(err.contains(var), "{var} is to be filled in: {err}");
    }
    let env = std::fs::read_to_string(work.path().join("toolmux.env")).unwrap();
    assert!(env.contains("WEATHER_REGION=eu") && env.contains("# WEATHER_API_KEY="), "{env}");
    assert!(env.contains("A GitHub personal access token"), "{env}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(work.path().join("toolmux.env")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // Filled in, the configuration loads, each backend as the registry described it.
    let filled = "WEATHER_API_KEY=k\nGITHUB_MCP_SERVER_TOKEN=t\n";
    std::fs::write(work.path().join("toolmux.env"), env + filled).unwrap();
    let config = Config::load(&work.path().join("toolmux.toml")).unwrap();
    let backend = |name: &str| config.backends.iter().find(|b| b.name == name).unwrap_or_else(|| panic!("{name}"));
    let stdio = |name: &str| match &backend(name).transport {
        toolmux::config::Transport::Stdio { command, args, env, .. } => (command.clone(), args.clone(), env.clone()),
        other => panic!("{name}: {other:?}"),
    };
    let (command, args, env) = stdio("weather");
    assert_eq!(
        (command.as_str(), args),
        ("npx", vec!["-y".into(), "@acme/weather-mcp@1.4.2".into(), "--units".into(), "metric".into()])
    );
    assert_eq!((env["WEATHER_API_KEY"].as_str(), env["WEATHER_REGION"].as_str()), ("k", "eu"));
    let (command, args, env) = stdio("github-mcp-server");
    assert_eq!(command, "docker");
    assert_eq!(args.last().unwrap(), "ghcr.io/github/github-mcp-server:1.12.2", "the tag rides in the identifier");
    assert!(args.windows(2).any(|w| w == ["-e", "GITHUB_PERSONAL_ACCESS_TOKEN"]), "{args:?}");
    assert_eq!(env["GITHUB_PERSONAL_ACCESS_TOKEN"], "t", "the token reaches the container through toolmux's env");
    let (command, args, _) = stdio("sqlite");
    assert_eq!((command.as_str(), args[0].as_str()), ("uvx", "mcp-server-sqlite==0.9.1"));
    assert!(args.contains(&"<SQLITE_DB_PATH>".to_string()), "an argument toolmux cannot fill in is marked: {args:?}");
    match &backend("analytics").transport {
        toolmux::config::Transport::Http { url, .. } => assert_eq!(url, "https://analytics.example.com/sse"),
        other => panic!("analytics: {other:?}"),
    }
    let written = std::fs::read_to_string(work.path().join("toolmux.toml")).unwrap();
    assert!(written.contains("passed over: a streamable-http remote whose URL needs values"), "{written}");
    assert!(written.contains("transport = \"sse\""), "{written}");

    // Nothing named: a clear error, nothing written.
    let out = std::process::Command::new(BIN).args(["import", "--registry"]).current_dir(work.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("name the servers to add"), "{:?}", out);
}
