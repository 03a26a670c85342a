//! Health-driven resync, end to end: real backend processes killed and restarted on the same
//! port, one client session held for the whole test.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use toolmux::app::EmbedderChoice;

use crate::harness::*;

const HEALTH: &str = "[health]\ninterval = \"1s\"\ntimeout = \"500ms\"\nunhealthy_threshold = 2\n";

/// `stable` (echo, in this process) and `unstable` (testkit, a child process to kill and restart)
/// behind a gateway configured by `head` (the TOML before the backends).
struct Pair {
    _stable: HttpBackend,
    unstable: ChildBackend,
    app: toolmux::app::App,
}

async fn pair(head: &str, embedder: EmbedderChoice) -> Pair {
    let stable = http_backend("echo").await;
    let unstable = ChildBackend::start("testkit").await;
    let toml =
        format!("{head}{}{}", http_backend_toml("stable", &stable.url), http_backend_toml("unstable", &unstable.url()));
    let app = gateway(&toml, embedder).await;
    Pair { _stable: stable, unstable, app }
}

async fn finds(c: &Client, name: &str) -> bool {
    found(&call(c, "find_tool", json!({"tool_description": "echo back a message"})).await).iter().any(|n| n == name)
}

const LIST_CHANGED: &str = "notifications/tools/list_changed";

/// Tool names in a raw find_tool result.
fn found_raw(result: &Value) -> Vec<String> {
    let tools = result["structuredContent"]["tools"].as_array().unwrap_or_else(|| panic!("tools array: {result}"));
    tools.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

async fn finds_raw(s: &RawSession, name: &str) -> bool {
    found_raw(&s.call("find_tool", json!({"tool_description": "echo back a message"})).await).iter().any(|n| n == name)
}

async fn lists_raw(s: &RawSession, name: &str) -> bool {
    s.request("tools/list", json!({})).await["tools"].as_array().unwrap().iter().any(|t| t["name"] == name)
}

fn text_raw(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Waits up to `within` for a message with `method` on a GET stream.
async fn next_with_method(
    stream: &mut mpsc::UnboundedReceiver<Value>,
    method: &str,
    within: Duration,
) -> Option<Value> {
    tokio::time::timeout(within, async {
        while let Some(m) = stream.recv().await {
            if m["method"] == method {
                return Some(m);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

#[tokio::test]
async fn optimizer_session_follows_a_recovery_without_list_changed() {
    let Pair { _stable, mut unstable, app } = pair(
        &format!("[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\ncache_dir = \"{}\"\n{HEALTH}", shared_cache_dir()),
        EmbedderChoice::Given(model()),
    )
    .await;
    unstable.kill().await;
    assert!(
        eventually(Duration::from_secs(15), || async { !app.gateway.advertisable("unstable") }).await,
        "unstable is taken out"
    );

    // ONE session from here to the end, its GET event stream watched raw.
    let s = RawSession::open(&app).await;
    let r = s.call("find_tool", json!({"tool_description": "echo back a message"})).await;
    assert!(found_raw(&r).contains(&"stable_echo".to_string()), "{r}");
    assert!(!found_raw(&r).contains(&"unstable_echo".to_string()), "a down backend's tools are not offered: {r}");
    let unavailable = &r["structuredContent"]["unavailable"];
    assert!(unavailable.as_array().is_some_and(|u| u.iter().any(|t| t["name"] == "unstable_echo")), "{unavailable}");
    let mut stream = s.listen().await;

    let counters = &app.gateway.store.counters;
    let (generations, embedded) =
        (counters.generations.load(Ordering::Relaxed), counters.texts_embedded.load(Ordering::Relaxed));
    unstable.restart().await;
    assert!(
        eventually(Duration::from_secs(30), || finds_raw(&s, "unstable_echo")).await,
        "recovered on the same session"
    );
    let r =
        s.call("call_tool", json!({"tool_name": "unstable_echo", "parameters": {"input": "reindexedhello123"}})).await;
    assert_eq!(text_raw(&r), "reindexedhello123", "{r}");
    let seen = next_with_method(&mut stream, LIST_CHANGED, Duration::from_secs(5)).await;
    assert!(seen.is_none(), "optimizer sessions get no tools/list_changed: {seen:?}");
    assert_eq!(counters.generations.load(Ordering::Relaxed), generations, "a recovery builds no new generation");
    assert_eq!(counters.texts_embedded.load(Ordering::Relaxed), embedded, "a recovery embeds nothing");
    unstable.kill().await;
    app.shutdown().await;
}

#[tokio::test]
async fn passthrough_session_gets_list_changed_and_calls_the_recovered_tool() {
    let Pair { _stable, mut unstable, app } =
        pair(&format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{HEALTH}"), EmbedderChoice::None)
            .await;
    let s = RawSession::open(&app).await;
    let mut stream = s.listen().await;
    assert!(lists_raw(&s, "unstable_echo").await);

    unstable.kill().await;
    let dropped = next_with_method(&mut stream, LIST_CHANGED, Duration::from_secs(15)).await;
    assert!(dropped.is_some(), "tools/list_changed on the GET stream when it went away");
    assert!(!lists_raw(&s, "unstable_echo").await, "removed from tools/list");

    unstable.restart().await;
    let back = next_with_method(&mut stream, LIST_CHANGED, Duration::from_secs(30)).await;
    assert!(back.is_some(), "tools/list_changed on the GET stream when it came back");
    assert!(lists_raw(&s, "unstable_echo").await, "the same session lists it");
    let r = s.call("unstable_echo", json!({"input": "back"})).await;
    assert_eq!(text_raw(&r), "back", "{r}");
    unstable.kill().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_backend_that_dies_leaves_the_scope_and_its_breaker_fails_calls_fast() {
    let breaker = "[health.circuit_breaker]\nfailure_threshold = 2\ntimeout = \"2s\"\n";
    let head = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\ncache_dir = \"{}\"\n{HEALTH}{breaker}",
        shared_cache_dir()
    );
    let Pair { _stable, mut unstable, app } = pair(&head, EmbedderChoice::Given(model())).await;
    let (c, rec) = client(&app).await;
    assert!(finds(&c, "unstable_echo").await);

    unstable.kill().await;
    assert!(
        eventually(Duration::from_secs(15), || async { app.gateway.health.retry_in("unstable").is_some() }).await,
        "the breaker opens"
    );
    assert!(
        eventually(Duration::from_secs(3), || async { !finds(&c, "unstable_echo").await }).await,
        "gone from find_tool on the same session"
    );
    let started = std::time::Instant::now();
    let r = call(&c, "call_tool", json!({"tool_name": "unstable_echo", "parameters": {"input": "x"}})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(started.elapsed() < Duration::from_millis(500), "fails fast: {:?}", started.elapsed());
    // The stable backend is unaffected.
    let r = call(&c, "call_tool", json!({"tool_name": "stable_echo", "parameters": {"input": "ok"}})).await;
    assert_eq!(text(&r), "ok");

    unstable.restart().await;
    assert!(eventually(Duration::from_secs(30), || finds(&c, "unstable_echo")).await, "half-open probe closes it");
    assert!(app.gateway.health.retry_in("unstable").is_none());
    assert_eq!(rec.tools_changed.load(Ordering::SeqCst), 0);
    c.cancel().await.unwrap();
    unstable.kill().await;
    app.shutdown().await;
}

#[tokio::test]
async fn flapping_causes_a_bounded_number_of_resyncs() {
    let Pair { _stable, mut unstable, app } =
        pair(&format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{HEALTH}"), EmbedderChoice::None)
            .await;
    let (c, _) = client(&app).await;
    let told = || app.gateway.counters.list_changed_sent.load(Ordering::Relaxed);
    let before = told();
    let flap = Duration::from_secs(20);
    let start = std::time::Instant::now();
    let mut calls = 0;
    while start.elapsed() < flap {
        unstable.kill().await;
        let r = call(&c, "stable_echo", json!({"input": "steady"})).await;
        assert_eq!(text(&r), "steady", "the stable backend never errs");
        tokio::time::sleep(Duration::from_millis(300)).await;
        unstable.restart().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        calls += 1;
    }
    let notices = told() - before;
    // Scopes follow every flip at once, but the client is told at most a leading and a trailing
    // change per interval (1 s).
    assert!(notices <= 2 * flap.as_secs() + 4, "{notices} list_changed in {flap:?} of flapping ({calls} cycles)");
    assert!(
        eventually(Duration::from_secs(15), || async {
            c.list_all_tools().await.unwrap().iter().any(|t| t.name == "unstable_echo")
        })
        .await,
        "ends up, as the backend is"
    );
    eprintln!("flapping: {calls} cycles, {notices} list_changed notices");
    c.cancel().await.unwrap();
    unstable.kill().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_backends_own_list_changed_reaches_the_same_session() {
    let stable = http_backend("echo").await;
    let kit = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{HEALTH}{}{}",
        http_backend_toml("stable", &stable.url),
        http_backend_toml("kit", &kit.url),
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, rec) = client(&app).await;
    let r = call(&c, "kit_add_tool", json!({"name": "fresh"})).await;
    assert_eq!(text(&r), "added tool fresh");
    assert!(
        eventually(Duration::from_secs(10), || async {
            c.list_all_tools().await.unwrap().iter().any(|t| t.name == "kit_fresh")
        })
        .await,
        "the new tool is listed"
    );
    assert!(
        eventually(Duration::from_secs(5), || async { rec.tools_changed.load(Ordering::SeqCst) >= 1 }).await,
        "and announced"
    );
    let r = call(&c, "kit_fresh", json!({"input": "new"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn stateless_passthrough_listeners_get_list_changed() {
    use rmcp::model::{ServerNotification, SubscriptionFilter};
    let Pair { _stable, mut unstable, app } =
        pair(&format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{HEALTH}"), EmbedderChoice::None)
            .await;
    let c = stateless_client(&app, Recorder::default(), None).await;
    let mut sub = c.peer().listen(SubscriptionFilter::builder().tools_list_changed().build()).await.unwrap();
    unstable.kill().await;
    let got = tokio::time::timeout(Duration::from_secs(15), sub.next()).await.expect("a notification in time").unwrap();
    assert!(matches!(got, Some(ServerNotification::ToolListChangedNotification(_))), "{got:?}");
    let tools = c.list_all_tools().await.unwrap();
    assert!(!tools.iter().any(|t| t.name == "unstable_echo"), "the next request sees the new scope");
    drop(sub);
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A backend that connects last, with a slow `tools/list` (what a probe used to wait for), is
/// listed and callable by a session opened the moment `/readyz` turns 200, over HTTP, and by a
/// stdio client, which always starts inside that moment. Health runs at its default interval.
#[tokio::test]
async fn a_slow_backend_is_usable_the_moment_the_gateway_is_ready() {
    let fast = http_backend("echo").await;
    let mut slow = ChildBackend::start_with("testkit", &["--list-delay-ms", "800"]).await;
    let backends = format!("{}{}", http_backend_toml("fast", &fast.url), http_backend_toml("slow", &slow.url()));

    let config = toolmux::config::Config::parse(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{backends}"
    ))
    .unwrap();
    let app = toolmux::app::App::start(
        config,
        toolmux::app::Options { embedder: EmbedderChoice::None, ..Default::default() },
    )
    .await
    .unwrap();
    let ready = format!("http://{}/readyz", app.addr.unwrap());
    // Poll as a load balancer would; the assertion is on what a session sees right after.
    while reqwest::get(&ready).await.unwrap().status() != 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (c, _) = client(&app).await;
    let tools = c.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "slow_echo"), "listed at once over HTTP");
    let r = call(&c, "slow_echo", json!({"input": "at once"})).await;
    assert_eq!(text(&r), "at once");
    c.cancel().await.unwrap();
    app.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolmux.toml");
    std::fs::write(&path, format!("[server]\nmode = \"passthrough\"\n{backends}")).unwrap();
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["serve", "--stdio", "--config", path.to_str().unwrap()]).stderr(std::process::Stdio::null());
    let transport = rmcp::transport::TokioChildProcess::new(cmd).unwrap();
    let c = rmcp::ServiceExt::serve(Recorder::default(), transport).await.expect("stdio gateway answers");
    let tools = c.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "slow_echo"), "listed at once over stdio");
    let r = call(&c, "slow_echo", json!({"input": "stdio"})).await;
    assert_eq!(text(&r), "stdio");
    c.cancel().await.unwrap();
    slow.kill().await;
}

/// Once health has marked a backend down, no find_tool answer offers its tools, even when the
/// flip falls inside the debounce window (here: right after start-up, with a 5 s interval), and
/// no answer ever names a tool both in `tools` and in `unavailable`.
#[tokio::test]
async fn no_answer_uses_a_scope_health_has_ruled_out() {
    let head = "[server]\nlisten = \"127.0.0.1:0\"\n[health]\ninterval = \"5s\"\ntimeout = \"500ms\"\nunhealthy_threshold = 1\n";
    let Pair { _stable, mut unstable, app } = pair(head, EmbedderChoice::None).await;
    let s = RawSession::open(&app).await;
    let killer = RawSession::open(&app).await;
    assert!(finds_raw(&s, "unstable_echo").await, "offered while up");

    // The backend exits in the middle of a call: a passive signal, then a failed probe.
    let querying = async {
        let (mut after_down, mut wrong, mut overlaps, mut named_unavailable) = (0, 0, 0, 0);
        let mut down_since = None;
        while down_since.is_none_or(|t: std::time::Instant| t.elapsed() < Duration::from_secs(2)) && after_down < 400 {
            let marked_down = app.gateway.health.status("unstable") == toolmux::health::Status::Unhealthy;
            if marked_down && down_since.is_none() {
                down_since = Some(std::time::Instant::now());
            }
            let r = s.call("find_tool", json!({"tool_description": "echo back a message"})).await;
            let tools = found_raw(&r);
            let unavailable: Vec<&str> = r["structuredContent"]["unavailable"]
                .as_array()
                .map(|u| u.iter().filter_map(|t| t["name"].as_str()).collect())
                .unwrap_or_default();
            overlaps += tools.iter().filter(|t| unavailable.contains(&t.as_str())).count();
            if marked_down {
                after_down += 1;
                wrong += tools.iter().filter(|t| t.starts_with("unstable_")).count().min(1);
                named_unavailable += usize::from(unavailable.contains(&"unstable_echo"));
            }
        }
        (after_down, wrong, overlaps, named_unavailable)
    };
    let kill = killer.call("call_tool", json!({"tool_name": "unstable_exit", "parameters": {}}));
    let ((after_down, wrong, overlaps, named_unavailable), _) = tokio::join!(querying, kill);
    assert!(after_down >= 10, "answers after the backend was marked down: {after_down}");
    assert!(named_unavailable > 0, "its tools are named as unavailable");
    assert_eq!(wrong, 0, "{wrong} of {after_down} answers after it was marked down still offered its tools");
    assert_eq!(overlaps, 0, "a tool named both in tools and in unavailable");
    unstable.kill().await;
    app.shutdown().await;
}

/// A credential-shaped AWS access key id, made up.
const AWS_KEY: &str = "AKIAZ7Q4N2LXR5T3W6YK";

/// A backend that cannot be reached says why in words a user acts on, the same in `/status`,
/// `toolmux status` and the log: the URL that refused, the status a server answered with and
/// what to do, the command that exited, with its code and last stderr lines, or that was not
/// found. The log names no Rust types, and a failure that repeats is said once at warn.
#[tokio::test]
async fn a_backend_that_cannot_be_reached_says_why_in_words() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // A server that wants credentials at /mcp and has nothing at any other path.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    let routes = axum::Router::new()
        .route(
            "/mcp",
            axum::routing::any(|| async {
                (axum::http::StatusCode::UNAUTHORIZED, [("www-authenticate", "Bearer realm=\"mcp\"")], "")
            }),
        )
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "no such page") });
    tokio::spawn(async move { axum::serve(listener, routes).await });
    // A child that says what is wrong and exits, counting its starts.
    let starts = dir.path().join("starts");
    let dies = format!(
        "echo started >> '{}'; echo 'using key {AWS_KEY}' >&2; echo 'fatal: no configuration at /etc/weather.yaml' >&2; exit 3",
        starts.display()
    );
    let config = dir.path().join("toolmux.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n\
             [[backends]]\nname = \"down\"\nurl = \"http://{refused}/mcp\"\n\
             [[backends]]\nname = \"locked\"\nurl = \"http://{http}/mcp\"\n\
             [[backends]]\nname = \"astray\"\nurl = \"http://{http}/wrong\"\n\
             [[backends]]\nname = \"dies\"\ncommand = \"sh\"\nargs = [\"-c\", {dies:?}]\n\
             [[backends]]\nname = \"missing\"\ncommand = \"toolmux-no-such-server\"\n"
        ),
    )
    .unwrap();
    let log = dir.path().join("toolmux.log");
    let mut served = Served::start_logging(&config, &log).await;
    let errors = || async {
        let status = served.status().await;
        let mut errors = std::collections::BTreeMap::new();
        for b in status["backends"].as_array().into_iter().flatten() {
            if let Some(e) = b["last_error"].as_str() {
                errors.insert(b["name"].as_str().unwrap().to_string(), e.to_string());
            }
        }
        errors
    };
    assert!(eventually(Duration::from_secs(20), || async { errors().await.len() == 5 }).await, "{:?}", errors().await);
    let errors = errors().await;
    let says = |name: &str, words: &[&str]| {
        let error = &errors[name];
        for w in words {
            assert!(error.contains(w), "{name}: {error:?} says {w:?}");
        }
        assert!(!error.contains("::") && !error.contains("Transport ["), "{name}: no type names in {error:?}");
    };
    says("down", &[&format!("nothing is listening at http://{refused}/mcp"), "connection refused"]);
    says("locked", &["401 Unauthorized", "toolmux login locked", "`headers`"]);
    says("astray", &["HTTP 404", "check the path"]);
    says("dies", &["`sh` exited with code 3", "“fatal: no configuration at /etc/weather.yaml”"]);
    // What the child printed by accident is scrubbed, in /status and in the log.
    says("dies", &["“using key [redacted: aws-access-token]”"]);
    says("missing", &["`toolmux-no-such-server` was not found", "PATH"]);

    // `toolmux status` prints the same words.
    let table = std::process::Command::new(BIN).args(["status", "--url", &served.base]).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("`sh` exited with code 3"), "{table}");

    // The child failed again and again (started three times at least: an event, not a clock).
    assert!(
        eventually(Duration::from_secs(20), || async {
            std::fs::read_to_string(&starts).unwrap_or_default().lines().count() >= 3
        })
        .await
    );
    served.child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("rmcp::") && !log.contains("WorkerTransport"), "no type names in the log:\n{log}");
    let warned = log.lines().filter(|l| l.contains("WARN") && l.contains("backend=\"dies\"")).count();
    assert_eq!(warned, 1, "a failure that repeats is said once at warn:\n{log}");
    assert!(log.contains("line=fatal: no configuration at /etc/weather.yaml"), "the child's stderr is logged:\n{log}");
    assert!(!log.contains(AWS_KEY) && log.contains("[redacted: aws-access-token]"), "and scrubbed:\n{log}");
}

/// A stdio backend's child that exits while connected is said to have exited, with its code, in
/// `/status`'s last error; the backend is started again.
#[tokio::test]
async fn a_child_that_exits_while_connected_says_how_it_ended() {
    let app = gateway(
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}",
            stdio_backend_toml("kit", "testkit")
        ),
        EmbedderChoice::None,
    )
    .await;
    let kit = app.gateway.upstream.get("kit").unwrap();
    let (client, _) = client(&app).await;
    // The call ends with the child: its answer is an error.
    let ended = client.call_tool(rmcp::model::CallToolRequestParams::new("kit_exit")).await;
    assert!(ended.as_ref().map_or(true, |r| r.is_error == Some(true)), "{ended:?}");
    assert!(eventually(Duration::from_secs(20), || async { kit.last_error().is_some() }).await, "the exit is recorded");
    let (error, _) = kit.last_error().unwrap();
    assert!(error.contains("exited with code 3"), "{error}");
    assert!(!error.contains("::"), "no type names: {error}");
    assert!(
        eventually(Duration::from_secs(20), || async { app.gateway.advertisable("kit") }).await,
        "the backend is started again"
    );
}
