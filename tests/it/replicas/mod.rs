//! Replicas sharing sessions through a real `redis-server` (`[sessions] store = "redis"`):
//! `toolmux serve` children behind a round-robin balancer of their own (`balancer.rs`), so that one session's
//! requests alternate between replicas.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::harness::*;
use crate::redis_server::{Redis, fixture_tls};

mod balancer;
mod state;

use balancer::Balancer;

/// What every replica of a test fronts: the testkit backend (one session per client) in a child
/// process, the echo backend (shared) in this one, and a folder for the replicas' files.
struct Backends {
    kit: ChildBackend,
    echo: HttpBackend,
    dir: tempfile::TempDir,
}

impl Backends {
    async fn start() -> Self {
        Self {
            kit: ChildBackend::start("testkit").await,
            echo: http_backend("echo").await,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A replica's configuration in `mode` over both backends, sessions in `redis`, with `extra`
    /// (more `[sessions]` keys).
    fn config(&self, mode: &str, redis: &Redis, extra: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(format!("toolmux-{mode}.toml"));
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\nshutdown_grace = \"20s\"\n\
             [optimizer]\ncache_dir = {cache:?}\n\
             [sessions]\nstore = \"redis\"\nredis_url = \"{url}\"\ntimeout = \"300ms\"\n{extra}\n\
             [[backends]]\nname = \"kit\"\nurl = \"{kit}\"\nsession = \"per_client\"\n\
             [[backends]]\nname = \"echo\"\nurl = \"{echo}\"\nsession = \"shared\"\n",
            cache = shared_cache_dir(),
            url = redis.url(),
            kit = self.kit.url(),
            echo = self.echo.url,
        );
        std::fs::write(&path, toml).unwrap();
        path
    }
}

/// The conformance server (resources to subscribe to, logging) on 127.0.0.1, and a folder for
/// configurations of replicas in front of it.
struct ConformanceBackend {
    url: String,
    dir: tempfile::TempDir,
}

impl ConformanceBackend {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(crate::conformance_server::serve(listener, false));
        Self { url, dir: tempfile::tempdir().unwrap() }
    }

    /// A passthrough replica's configuration, `name` in the folder, with sessions in the Redis
    /// at `redis_url`.
    fn config(&self, name: &str, redis_url: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(name);
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n\
             [sessions]\nstore = \"redis\"\nredis_url = \"{redis_url}\"\ntimeout = \"300ms\"\n{}",
            http_backend_toml("conformance", &self.url)
        );
        std::fs::write(&path, toml).unwrap();
        path
    }
}

/// A Redis, the backends, and two passthrough replicas of one configuration over them (the
/// backends must outlive the replicas: keep them).
async fn two_replicas() -> (Redis, Backends, Served, Served) {
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    let config = backends.config("passthrough", &redis, "");
    let (a, b) = (Served::start(&config).await, Served::start(&config).await);
    (redis, backends, a, b)
}

/// One tool call in `mode` through a session: the backend tool directly (passthrough), or
/// find_tool then call_tool with the name it found (optimizer).
async fn use_tools(c: &rmcp::service::RunningService<rmcp::service::RoleClient, Recorder>, mode: &str, input: &str) {
    let name = if mode == "optimizer" {
        let r = call(c, "find_tool", json!({"tool_description": "echo the input text back"})).await;
        let found = found(&r);
        assert!(found.iter().any(|n| n == "kit_echo" || n == "echo_echo"), "{found:?}");
        let r = call(c, "call_tool", json!({"tool_name": "echo_echo", "parameters": {"input": input}})).await;
        assert_eq!(text(&r), input);
        "kit_echo"
    } else {
        let r = call(c, "echo_echo", json!({"input": input})).await;
        assert_eq!(text(&r), input);
        "kit_echo"
    };
    let r = if mode == "optimizer" {
        call(c, "call_tool", json!({"tool_name": name, "parameters": {"input": input}})).await
    } else {
        call(c, name, json!({"input": input})).await
    };
    assert_eq!(text(&r), input, "a per-client backend answers on whichever replica serves the request");
}

/// One rmcp client session through the balancer alternates between two replicas, in both modes;
/// after one replica is killed (SIGKILL) the session carries on, find_tool and call_tool
/// included. A 2026-07-28 caller without a session is served through the balancer too.
#[tokio::test]
async fn a_session_is_served_by_whichever_replica_its_request_reaches() {
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    for mode in ["passthrough", "optimizer"] {
        let config = backends.config(mode, &redis, "");
        let a = Served::start(&config).await;
        let b = Served::start(&config).await;
        let lb = Balancer::start(vec![a.base.clone(), b.base.clone()]).await;
        let c = rmcp::ServiceExt::serve(
            Recorder::default(),
            rmcp::transport::StreamableHttpClientTransport::from_uri(lb.url.clone()),
        )
        .await
        .expect("the client connects through the balancer");
        let tools = c.list_all_tools().await.unwrap();
        assert!(!tools.is_empty());
        for i in 0..4 {
            use_tools(&c, mode, &format!("{mode} {i}")).await;
        }
        assert!(lb.hits(&a.base) >= 3 && lb.hits(&b.base) >= 3, "{mode}: both replicas served the session");
        let restored = |s: Value| s["sessions"]["store"]["restored"].as_u64().unwrap_or(0);
        assert!(restored(a.status().await) + restored(b.status().await) >= 1, "{mode}: one replica rebuilt it");
        assert_eq!(b.status().await["sessions"]["store"]["state"], "up");

        // A replica dies: the next requests land on the survivor, which has (or rebuilds) the session.
        a.signal(nix::sys::signal::Signal::SIGKILL);
        for i in 0..3 {
            use_tools(&c, mode, &format!("{mode} after the kill {i}")).await;
        }
        let tools_after = c.list_all_tools().await.unwrap();
        assert_eq!(tools_after.len(), tools.len(), "{mode}: the same tools after the kill");
        c.cancel().await.unwrap();

        // A 2026-07-28 caller has no session to find: any replica serves it.
        lb.set_targets(vec![b.base.clone()]);
        let stateless = {
            use rmcp::{ClientLifecycleMode, ClientServiceExt, model::ProtocolVersion};
            Recorder::default()
                .serve_with_lifecycle(
                    rmcp::transport::StreamableHttpClientTransport::from_uri(lb.url.clone()),
                    ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
                )
                .await
                .expect("a 2026-07-28 client connects")
        };
        let r = if mode == "optimizer" {
            call(&stateless, "call_tool", json!({"tool_name": "echo_echo", "parameters": {"input": "stateless"}})).await
        } else {
            call(&stateless, "echo_echo", json!({"input": "stateless"})).await
        };
        assert_eq!(text(&r), "stateless");
    }
}

/// A session id presented by another principal is unknown on every replica (404), stored or
/// not; its owner's `DELETE` on one replica ends it on the others too.
#[tokio::test]
async fn a_stored_session_is_its_principals_alone_and_ends_everywhere() {
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    let auth = bearer_auth(&["alice", "bob"]);
    let config = backends.config("passthrough", &redis, "");
    // A short idle timeout: replicas check for sessions ended elsewhere every second.
    let text_of = std::fs::read_to_string(&config)
        .unwrap()
        .replace("shutdown_grace = \"20s\"\n", "shutdown_grace = \"20s\"\nsession_idle_timeout = \"4s\"\n")
        + &auth;
    std::fs::write(&config, text_of).unwrap();
    let a = Served::start(&config).await;
    let b = Served::start(&config).await;

    let alice = RawSession::open_as(&a.url, Some("alice")).await;
    alice.call("echo_echo", json!({"input": "hi"})).await;
    for (replica, url) in [("a", &a.url), ("b", &b.url)] {
        let bob = alice.presented(url, Some("bob"));
        let refused = bob.try_request("tools/list", json!({})).await.unwrap_err();
        assert!(refused.contains("404"), "bob on replica {replica}: {refused}");
    }
    let on_b = alice.presented(&b.url, Some("alice"));
    let r = on_b.call("echo_echo", json!({"input": "on b"})).await;
    assert_eq!(r["content"][0]["text"], "on b");
    // bob is refused on b now that b holds the session locally, too.
    let refused = alice.presented(&b.url, Some("bob")).try_request("tools/list", json!({})).await.unwrap_err();
    assert!(refused.contains("404"), "{refused}");

    assert_eq!(on_b.delete().await, 200);
    let ended_on_a = eventually(Duration::from_secs(10), || async {
        alice.try_request("tools/list", json!({})).await.is_err_and(|e| e.contains("404"))
    })
    .await;
    assert!(ended_on_a, "a session ended on b is ended on a");
    let gone = alice.presented(&b.url, Some("alice")).try_request("tools/list", json!({})).await.unwrap_err();
    assert!(gone.contains("404"), "{gone}");
}

/// Redis killed: sessions a replica holds keep working and new ones are created, `/status` and
/// `/metrics` say the store is down, and a session this replica does not hold gets a quick 503.
/// Redis restarted empty: every replica writes its sessions through, and they move again.
#[tokio::test]
async fn a_store_outage_costs_only_moves_between_replicas() {
    let (mut redis, _backends, a, b) = two_replicas().await;
    let before = RawSession::open_url(&a.url).await;
    before.call("kit_remember", json!({"value": "kept"})).await;

    redis.kill().await;
    let r = before.call("kit_recall", json!({})).await;
    assert_eq!(r["content"][0]["text"], "kept", "a held session keeps its backend session");
    let during = RawSession::open_url(&a.url).await;
    during.call("echo_echo", json!({"input": "x"})).await;
    let started = std::time::Instant::now();
    let moved = during.presented(&b.url, None).try_request("tools/list", json!({})).await.unwrap_err();
    assert!(moved.contains("503"), "{moved}");
    assert!(started.elapsed() < Duration::from_secs(5), "no wait on a dead store: {:?}", started.elapsed());
    let status = a.status().await;
    assert_eq!(status["sessions"]["store"]["state"], "down", "{status}");
    assert!(status["sessions"]["store"]["pending_writes"].as_u64().unwrap() >= 1, "{status}");
    let metrics = a.get("/metrics").await.1;
    assert!(metrics.contains("toolmux_session_store_up 0"), "{metrics}");
    let table = std::process::Command::new(BIN).args(["status", "--url", &a.base]).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("session store redis: down") && table.contains("writes pending"), "{table}");

    redis.restart().await;
    let written = eventually(Duration::from_secs(15), || async {
        let s = a.status().await;
        s["sessions"]["store"]["state"] == "up" && s["sessions"]["store"]["pending_writes"] == 0
    })
    .await;
    assert!(written, "replica a writes its sessions through: {}", a.status().await);
    for s in [&before, &during] {
        let r = s.presented(&b.url, None).call("echo_echo", json!({"input": "moved"})).await;
        assert_eq!(r["content"][0]["text"], "moved");
    }
    assert!(a.get("/metrics").await.1.contains("toolmux_session_store_up 1"));
}

/// A Redis that stops answering for 10 s (DEBUG SLEEP) is a slow store: a session that must be
/// looked up gets 503 after `sessions.timeout` (300 ms here), long before Redis wakes (the bound
/// checked is loose, for a loaded machine); a held session does not wait for Redis at all.
#[tokio::test]
async fn a_slow_store_costs_a_request_at_most_its_timeout() {
    let (redis, _backends, a, b) = two_replicas().await;
    let s = RawSession::open_url(&a.url).await;

    let client = redis.client();
    let mut sleeper = client.get_multiplexed_async_connection().await.unwrap();
    // The client gives up on its own answer before Redis wakes; Redis sleeps on regardless.
    tokio::spawn(async move {
        let _: redis::RedisResult<String> = redis::cmd("DEBUG").arg("SLEEP").arg(10).query_async(&mut sleeper).await;
    });
    let stalled = eventually(Duration::from_secs(5), || {
        let client = client.clone();
        async move {
            let ping = async {
                let mut c = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut c).await
            };
            tokio::time::timeout(Duration::from_millis(100), ping).await.is_err()
        }
    })
    .await;
    assert!(stalled, "redis stops answering");

    let started = std::time::Instant::now();
    let moved = s.presented(&b.url, None).try_request("tools/list", json!({})).await.unwrap_err();
    let took = started.elapsed();
    assert!(moved.contains("503"), "{moved}");
    assert!(took < Duration::from_secs(5), "the lookup gave up at its deadline: {took:?}");
    let started = std::time::Instant::now();
    let r = s.call("echo_echo", json!({"input": "held"})).await;
    assert_eq!(r["content"][0]["text"], "held");
    assert!(started.elapsed() < Duration::from_secs(5), "a held session does not wait: {:?}", started.elapsed());
}

/// A rolling restart of three replicas under 100 sessions that call tools without pause: each
/// replica in turn leaves the balancer, is stopped (SIGTERM: it finishes what it runs) and
/// started again; not one request fails, and every session keeps working to the end.
#[tokio::test]
async fn a_rolling_restart_under_load_fails_no_request() {
    const SESSIONS: usize = 100;
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    let config = backends.config("passthrough", &redis, "");
    let mut replicas = vec![Served::start(&config).await, Served::start(&config).await, Served::start(&config).await];
    let lb = Balancer::start(replicas.iter().map(|r| r.base.clone()).collect()).await;

    let stop = CancellationToken::new();
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut load = tokio::task::JoinSet::new();
    for i in 0..SESSIONS {
        let (url, stop, ok, failures) = (lb.url.clone(), stop.clone(), ok.clone(), failures.clone());
        load.spawn(async move {
            let s = RawSession::open_url(&url).await;
            let mut n = 0usize;
            while !stop.is_cancelled() {
                let input = format!("{i}.{n}");
                match s.try_request("tools/call", json!({"name": "echo_echo", "arguments": {"input": input}})).await {
                    Ok(r) if r["content"][0]["text"] == input.as_str() => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => failures.lock().unwrap().push(format!("session {i}: wrong answer {r}")),
                    Err(e) => failures.lock().unwrap().push(format!("session {i}: {e}")),
                }
                n += 1;
            }
            n
        });
    }
    // Every session is up and calling before the first replica goes.
    assert!(eventually(Duration::from_secs(60), || async { ok.load(Ordering::Relaxed) >= 2 * SESSIONS }).await);

    for i in 0..replicas.len() {
        let others: Vec<String> =
            replicas.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| r.base.clone()).collect();
        lb.set_targets(others.clone());
        replicas[i].signal(nix::sys::signal::Signal::SIGTERM);
        let exit = tokio::time::timeout(Duration::from_secs(30), replicas[i].child.wait()).await.unwrap().unwrap();
        assert_eq!(exit.code(), Some(0), "replica {i} stops cleanly");
        replicas[i] = Served::start(&config).await;
        let served_before = ok.load(Ordering::Relaxed);
        lb.set_targets(replicas.iter().map(|r| r.base.clone()).collect());
        assert!(
            eventually(Duration::from_secs(30), || async { ok.load(Ordering::Relaxed) >= served_before + SESSIONS })
                .await,
            "calls go on after replica {i} restarted"
        );
    }
    stop.cancel();
    let mut calls = 0;
    while let Some(n) = load.join_next().await {
        calls += n.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} of {calls} requests failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let restored: u64 = {
        let mut total = 0;
        for r in &replicas {
            total += r.status().await["sessions"]["store"]["restored"].as_u64().unwrap_or(0);
        }
        total
    };
    assert!(restored >= SESSIONS as u64, "the restarted replicas rebuilt the sessions ({restored})");
}

/// What a session changes is stored field by field and comes back on the replica that rebuilds
/// it: a client that set its level to `error` on one replica hears no `info` log lines from a
/// tool it calls on another, while a fresh session there does; its subscription is in the
/// store until it unsubscribes, on the other replica.
#[tokio::test]
async fn a_rebuilt_session_keeps_its_level_and_subscriptions() {
    let redis = Redis::start().await;
    let backend = ConformanceBackend::start().await;
    let config = backend.config("toolmux.toml", &redis.url());
    let a = Served::start(&config).await;
    let b = Served::start(&config).await;

    let s = RawSession::open_url(&a.url).await;
    s.request("logging/setLevel", json!({"level": "error"})).await;
    s.request("resources/subscribe", json!({"uri": "test://watched-resource"})).await;
    let stored = || redis.record(&s.id);
    let fields = stored().await;
    assert_eq!(fields.get("principal").map(String::as_str), Some("anonymous"), "{fields:?}");
    assert_eq!(fields.get("level").map(String::as_str), Some("error"), "{fields:?}");
    assert!(fields.contains_key("sub:test://watched-resource"), "{fields:?}");
    assert!(!fields.values().chain(fields.keys()).any(|v| v.contains(&s.id)), "the session id is not stored");

    // Log lines the backend sends outside a call's stream reach the client on its GET stream. A
    // subscription made after the call is the marker: its update follows the call's log lines
    // on the same backend session, so every line let through has arrived before it.
    let logs = |session: &RawSession| {
        let session = session.presented(&b.url, None);
        async move {
            // The first request on b rebuilds the moved session there.
            session.call("conformance_test_simple_text", json!({})).await;
            let mut events = session.listen().await;
            session.call("conformance_test_tool_with_logging", json!({})).await;
            session.request("resources/subscribe", json!({"uri": "test://static-text"})).await;
            let mut lines = 0;
            loop {
                let m = tokio::time::timeout(Duration::from_secs(10), events.recv())
                    .await
                    .expect("the marker's update arrives")
                    .expect("the stream stays open");
                match m["method"].as_str() {
                    Some("notifications/message") => lines += 1,
                    Some("notifications/resources/updated") if m["params"]["uri"] == "test://static-text" => {
                        return lines;
                    }
                    _ => {}
                }
            }
        }
    };
    let fresh = RawSession::open_url(&b.url).await;
    assert_eq!(logs(&fresh).await, 3, "a session with no level hears the tool's info lines");
    assert_eq!(logs(&s).await, 0, "the moved session keeps its level");

    s.presented(&b.url, None).request("resources/unsubscribe", json!({"uri": "test://watched-resource"})).await;
    let fields = stored().await;
    assert!(!fields.contains_key("sub:test://watched-resource"), "{fields:?}");
    assert_eq!(fields.get("level").map(String::as_str), Some("error"));
}

/// A Redis that speaks only TLS (`rediss://`): sessions move between replicas through it.
#[tokio::test]
async fn sessions_move_through_a_redis_that_speaks_tls() {
    let redis = Redis::launch(None, true).await;
    let backends = Backends::start().await;
    let ca = format!("tls_ca_file = {:?}\n", fixture_tls("ca.pem"));
    let config = backends.config("passthrough", &redis, &ca);
    let a = Served::start(&config).await;
    let b = Served::start(&config).await;
    let s = RawSession::open_url(&a.url).await;
    let r = s.presented(&b.url, None).call("echo_echo", json!({"input": "over tls"})).await;
    assert_eq!(r["content"][0]["text"], "over tls");
    assert_eq!(b.status().await["sessions"]["store"]["restored"], 1);

    // Without the CA, the server's certificate is checked against the system's roots, and fails.
    let unverified = backends.config("passthrough", &redis, "");
    let c = Served::start(&unverified).await;
    RawSession::open_url(&c.url).await;
    let status = c.status().await;
    assert_eq!(status["sessions"]["store"]["state"], "down", "{status}");
    let error = status["sessions"]["store"]["last_error"].as_str().unwrap().to_lowercase();
    assert!(error.contains("certificate") || error.contains("issuer"), "{error}");
}

/// A Redis with a password: the right one in `redis_url` (from the environment, as an operator
/// would keep it) shares sessions; a wrong one shows in `/status` as an authentication failure,
/// without the password, and the replica still serves its own sessions.
#[tokio::test]
async fn redis_with_a_password_and_a_wrong_one() {
    let redis = Redis::start_with(Some("s3cret-pw")).await;
    let backends = Backends::start().await;
    let right = backends.config("passthrough", &redis, "");
    let text = std::fs::read_to_string(&right).unwrap();
    std::fs::write(&right, text.replace(":s3cret-pw@", ":${REDIS_PASSWORD}@")).unwrap();
    let env = [("REDIS_PASSWORD", "s3cret-pw")];
    let a = Served::start_env(&right, &[], &env).await;
    let b = Served::start_env(&right, &[], &env).await;
    let s = RawSession::open_url(&a.url).await;
    let r = s.presented(&b.url, None).call("echo_echo", json!({"input": "with a password"})).await;
    assert_eq!(r["content"][0]["text"], "with a password");

    let wrong = backends.dir.path().join("wrong.toml");
    std::fs::write(&wrong, text.replace(":s3cret-pw@", ":not-it@")).unwrap();
    let c = Served::start(&wrong).await;
    let own = RawSession::open_url(&c.url).await;
    own.call("echo_echo", json!({"input": "mine"})).await;
    let status = c.status().await;
    let store = &status["sessions"]["store"];
    assert_eq!(store["state"], "down", "{status}");
    let error = store["last_error"].as_str().unwrap().to_lowercase();
    assert!(error.contains("auth") || error.contains("password"), "{error}");
    assert!(!status.to_string().contains("not-it") && !status.to_string().contains("s3cret"), "{status}");
}

/// With `sessions.secret`, a backend session (per-client) that one replica opened is taken over
/// by the replica the client moves to, so what the backend keeps for the session is still there:
/// while the first replica runs, after it stopped (it leaves such sessions open), and, when the
/// backend has restarted and no longer knows the session, a fresh one is opened instead. Without
/// a secret nothing is stored to take over, and the moved session starts a new backend session.
#[tokio::test]
async fn backend_sessions_are_taken_over_with_a_secret() {
    let redis = Redis::start().await;
    let mut backends = Backends::start().await;
    let secret = "secret = \"${TOOLMUX_TEST_SECRET}\"\n";
    let with = backends.config("passthrough", &redis, secret);
    let env = [("TOOLMUX_TEST_SECRET", "0123456789abcdef0123456789abcdef-test")];
    let recall = |s: &RawSession| {
        let s = s.presented(s.url(), None);
        async move { s.call("kit_recall", json!({})).await["content"][0]["text"].as_str().unwrap().to_string() }
    };

    let a = Served::start_env(&with, &[], &env).await;
    let b = Served::start_env(&with, &[], &env).await;
    let s = RawSession::open_url(&a.url).await;
    s.call("kit_remember", json!({"value": "kept across replicas"})).await;
    let on_b = s.presented(&b.url, None);
    assert_eq!(recall(&on_b).await, "kept across replicas", "taken over while a runs");

    // a stops (SIGTERM): it leaves the backend session open, and a third replica takes it over.
    a.signal(nix::sys::signal::Signal::SIGTERM);
    let c = Served::start_env(&with, &[], &env).await;
    let on_c = s.presented(&c.url, None);
    assert_eq!(recall(&on_c).await, "kept across replicas", "taken over after a stopped");

    // The backend restarts and forgets every session: the stored one is refused, a fresh one opened.
    backends.kit.restart().await;
    let d = Served::start_env(&with, &[], &env).await;
    let on_d = s.presented(&d.url, None);
    assert_eq!(recall(&on_d).await, "", "a fresh backend session where the stored one is gone");
    on_d.call("kit_remember", json!({"value": "after the restart"})).await;
    let e = Served::start_env(&with, &[], &env).await;
    assert_eq!(recall(&s.presented(&e.url, None)).await, "after the restart", "the fresh one is stored in turn");

    // No secret: nothing to take over.
    let without = backends.dir.path().join("without.toml");
    std::fs::write(
        &without,
        std::fs::read_to_string(&with).unwrap().replace("secret = \"${TOOLMUX_TEST_SECRET}\"\n", ""),
    )
    .unwrap();
    let f = Served::start(&without).await;
    let g = Served::start(&without).await;
    let t = RawSession::open_url(&f.url).await;
    t.call("kit_remember", json!({"value": "stays on f"})).await;
    assert_eq!(recall(&t.presented(&g.url, None)).await, "", "without a secret the backend session is not stored");
}

/// A TCP proxy to `target` on 127.0.0.1 that the test can cut: one replica's own way to Redis,
/// so that it alone loses the store while the others keep it.
struct Cuttable {
    port: u16,
    open: Arc<std::sync::atomic::AtomicBool>,
    /// Cancelled to drop every connection through it (a new one is made for each cut).
    conns: Arc<Mutex<CancellationToken>>,
    ct: CancellationToken,
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

impl Cuttable {
    async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = Arc::new(Mutex::new(CancellationToken::new()));
        let ct = CancellationToken::new();
        let (o, c, stop) = (open.clone(), conns.clone(), ct.clone());
        tokio::spawn(async move {
            loop {
                let mut inbound = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                };
                if !o.load(Ordering::Acquire) {
                    continue; // dropped: the connection closes at once
                }
                let cut = c.lock().unwrap().clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { return };
                    tokio::select! {
                        _ = cut.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Self { port, open, conns, ct }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::Release);
        let mut conns = self.conns.lock().unwrap();
        conns.cancel();
        *conns = CancellationToken::new();
    }

    fn mend(&self) {
        self.open.store(true, Ordering::Release);
    }
}

/// A replica that lost the store while another changed a session writes its own changes through
/// when the store is back, but only if no one wrote the record meanwhile: the other replica's
/// newer level stays, and the subscription it removed is not put back.
#[tokio::test]
async fn a_write_through_keeps_another_replicas_newer_changes() {
    let redis = Redis::start().await;
    let proxy = Cuttable::start(redis.port).await;
    let backend = ConformanceBackend::start().await;
    let config = |name: &str, redis_url: &str| backend.config(name, redis_url);
    // Replica a reaches Redis through the proxy; b directly.
    let a = Served::start(&config("a.toml", &format!("redis://127.0.0.1:{}/0", proxy.port))).await;
    let b = Served::start(&config("b.toml", &redis.url())).await;

    let s = RawSession::open_url(&a.url).await;
    s.request("resources/subscribe", json!({"uri": "test://watched-resource"})).await;
    s.request("logging/setLevel", json!({"level": "info"})).await;
    let stored = || redis.record(&s.id);
    assert!(stored().await.contains_key("sub:test://watched-resource"));

    // a loses the store and changes the level: its write waits.
    proxy.cut();
    s.request("logging/setLevel", json!({"level": "debug"})).await;
    let pending = |st: Value| st["sessions"]["store"]["pending_writes"].as_u64().unwrap_or(0);
    assert!(pending(a.status().await) >= 1, "a's change waits for the store: {}", a.status().await);
    // Meanwhile the session moves to b, which sets another level and drops the subscription.
    let on_b = s.presented(&b.url, None);
    on_b.request("logging/setLevel", json!({"level": "error"})).await;
    on_b.request("resources/unsubscribe", json!({"uri": "test://watched-resource"})).await;
    let newer = stored().await;
    assert_eq!(newer.get("level").map(String::as_str), Some("error"), "{newer:?}");

    // a gets the store back and writes through: b's record is newer, so it stays.
    proxy.mend();
    assert!(
        eventually(Duration::from_secs(10), || async { pending(a.status().await) == 0 }).await,
        "a writes through once the store answers: {}",
        a.status().await
    );
    let after = stored().await;
    assert_eq!(after.get("level").map(String::as_str), Some("error"), "b's newer level stays: {after:?}");
    assert!(!after.contains_key("sub:test://watched-resource"), "the removed subscription stays removed: {after:?}");
}

/// A `DELETE` on one replica ends the session on another that holds it within the bound
/// docs/operations.md states (5 s), though no request reaches that replica meanwhile.
#[tokio::test]
async fn a_session_ended_on_one_replica_ends_on_an_idle_one_within_the_bound() {
    let (_redis, _backends, a, b) = two_replicas().await;
    let s = RawSession::open_url(&a.url).await;
    s.call("echo_echo", json!({"input": "hi"})).await;
    let live = |st: Value| st["sessions"]["live"].as_u64().unwrap_or(u64::MAX);
    assert_eq!(live(a.status().await), 1);
    let on_b = s.presented(&b.url, None);
    on_b.call("echo_echo", json!({"input": "on b"})).await;
    let store = |st: Value| st["sessions"]["store"].clone();
    assert_eq!(store(a.status().await)["sweep_every_ms"], 5000, "a sweep every 5 s");
    assert_eq!(on_b.delete().await, 200);
    // The marker is set before the DELETE is answered: every sweep a starts from now on sees it.
    let started = store(a.status().await)["sweeps"].as_u64().unwrap();
    // Only /status is asked of a: it does not touch the session.
    let ended = eventually(Duration::from_secs(30), || async { live(a.status().await) == 0 }).await;
    assert!(ended, "the session is still held on a: {}", a.status().await);
    // Ended by the first sweep that started after the DELETE (one starts every 5 s), not by a
    // later one nor by the idle timeout (30 min): the 5 s bound, read from events, not a clock.
    let by = store(a.status().await)["last_sweep_that_ended"].as_u64().unwrap();
    assert!(by > 0 && by <= started + 1, "ended by sweep {by}; {started} had started at the DELETE");
}

/// The caller's groups follow each request's token on every replica: a session opened with a
/// wide token on one replica and presented with a narrower one on another loses the denied tool
/// there, and again on the first replica, which still held it with the wide groups.
#[tokio::test]
async fn a_shrunk_token_narrows_the_session_on_every_replica() {
    use crate::auth::{SigningKey, claims_in, now, serve_jwks};
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    let key = SigningKey::load(jsonwebtoken::Algorithm::RS256);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks_url = format!("http://{}/jwks", listener.local_addr().unwrap());
    serve_jwks(listener, vec![key.jwk()]).await;
    for mode in ["passthrough", "optimizer"] {
        let config = backends.config(mode, &redis, "");
        let auth = format!(
            "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"toolmux\"]\njwks_url = \"{jwks_url}\"\n\
             [[policy]]\ngroups = [\"dev\"]\nbackends = [\"echo\"]\n\
             [[policy]]\ngroups = [\"admin\"]\nbackends = [\"kit\"]\n"
        );
        std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + &auth).unwrap();
        let a = Served::start(&config).await;
        let b = Served::start(&config).await;
        let wide = key.sign(&claims_in("alice", &["dev", "admin"], now()));
        let narrow = key.sign(&claims_in("alice", &["dev"], now() - 1));
        let on_a = RawSession::open_as(&a.url, Some(&wide)).await;
        assert_eq!(tool_text(&on_a, mode, "kit_echo").await, Ok("x".to_string()), "{mode}: admin may, on a");
        let on_b = on_a.presented(&b.url, Some(&narrow));
        assert_eq!(tool_text(&on_b, mode, "echo_echo").await, Ok("x".to_string()), "{mode}: dev may, on b");
        let refused = tool_text(&on_b, mode, "kit_echo").await.unwrap_err();
        assert!(refused.contains("tool not found: kit_echo"), "{mode}: on b: {refused}");
        // Back on a, which holds the session from the wide token: the narrow one decides there too.
        let back = on_a.presented(&a.url, Some(&narrow));
        let refused = tool_text(&back, mode, "kit_echo").await.unwrap_err();
        assert!(refused.contains("tool not found: kit_echo"), "{mode}: back on a: {refused}");
    }
}

/// A tool's text through the mode's surface, or what refused it.
async fn tool_text(s: &RawSession, mode: &str, name: &str) -> Result<String, String> {
    let (tool, args) = match mode {
        "optimizer" => ("call_tool", json!({"tool_name": name, "parameters": {"input": "x"}})),
        _ => (name, json!({"input": "x"})),
    };
    let r = s.try_request("tools/call", json!({"name": tool, "arguments": args})).await?;
    let text = r["content"][0]["text"].as_str().unwrap_or_default().to_string();
    if r["isError"] == json!(true) { Err(text) } else { Ok(text) }
}

/// A record the store lost without an outage toolmux could see (evicted, or a Redis restarted
/// between two commands) comes back whole with the session's next change, not as that change
/// alone: the subscription made before it is still stored.
#[tokio::test]
async fn a_record_the_store_lost_comes_back_whole_with_the_next_change() {
    let redis = Redis::start().await;
    let backend = ConformanceBackend::start().await;
    let a = Served::start(&backend.config("a.toml", &redis.url())).await;
    let s = RawSession::open_url(&a.url).await;
    s.request("resources/subscribe", json!({"uri": "test://watched-resource"})).await;
    let mut c = redis.client().get_multiplexed_async_connection().await.unwrap();
    redis::cmd("DEL").arg(Redis::record_key(&s.id)).query_async::<()>(&mut c).await.unwrap();
    s.request("logging/setLevel", json!({"level": "error"})).await;
    let fields = redis.record(&s.id).await;
    assert_eq!(fields.get("level").map(String::as_str), Some("error"), "{fields:?}");
    assert!(fields.contains_key("sub:test://watched-resource"), "the whole record is back: {fields:?}");
    assert_eq!(fields.get("principal").map(String::as_str), Some("anonymous"), "{fields:?}");
}
