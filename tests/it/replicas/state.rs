//! What replicas share beyond sessions, through the same real `redis-server`: task routes (a task
//! followed and cancelled through any replica, bounded per principal), results kept for a
//! principal, the tool ledger, and what find_tool learns.

use super::*;

/// A task made through one replica is followed and cancelled through another: the route to it
/// (backend, the backend's id, its owner) is in the store, under the gateway's id. Without the
/// store the other replica would answer "unknown task".
#[tokio::test]
async fn a_task_is_followed_through_any_replica() {
    use crate::tasks::{Tasking, get, settled};
    use rmcp::model::{CallToolRequestParams, CallToolResponse, CancelTaskParams, TaskStatus};
    use rmcp::{ClientLifecycleMode, ClientServiceExt, model::ProtocolVersion};
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    let config = backends.config("passthrough", &redis, "");
    let (a, b) = (Served::start(&config).await, Served::start(&config).await);
    let connect = |url: String| async move {
        Tasking
            .serve_with_lifecycle(
                rmcp::transport::StreamableHttpClientTransport::from_uri(url),
                ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
            )
            .await
            .expect("a 2026-07-28 client connects")
    };
    let (on_a, on_b) = (connect(a.url.clone()).await, connect(b.url.clone()).await);
    let call = CallToolRequestParams::new("kit_job")
        .with_arguments(json!({"ms": 60_000, "label": "far"}).as_object().unwrap().clone());
    let id = match on_a.peer().call_tool_once(call).await.unwrap() {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let got = get(&on_b, &id).await.expect("the other replica finds the task");
    assert_eq!((got.task.task.task_id.as_str(), got.task.status()), (id.as_str(), TaskStatus::Working));
    on_b.peer().cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
    assert_eq!(settled(&on_a, &id).await.task.status(), TaskStatus::Cancelled);
    let key = format!(
        "toolmux:task:{}",
        base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(id.as_bytes()))
    );
    let mut c = redis.client().get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut c).await.unwrap();
    assert!(ttl > 0, "the route is stored with an expiry ({ttl})");
}

/// Task routes in the store are bounded per principal: one principal past the bound gives up its
/// own routes that expire first, keys and all, and another's are untouched.
#[tokio::test]
async fn stored_task_routes_are_bounded_per_principal() {
    use toolmux::config::RedisConfig;
    let redis = Redis::start().await;
    let cfg = RedisConfig {
        url: redis.url(),
        key_prefix: "toolmux:".into(),
        timeout: Duration::from_secs(2),
        tls_ca: None,
        seal_key: None,
    };
    let store = toolmux::session::shared::SharedSessions::new(&cfg, Duration::from_secs(600)).unwrap();
    let bound = store.tasks_per_principal();
    store.put_task("tmx-alice", "{}", Duration::from_secs(3600), "alice").await.unwrap();
    for i in 0..bound + 10 {
        // Later ones live longer: the first ten expire first, and go.
        store.put_task(&format!("tmx-m{i}"), "{}", Duration::from_secs(60 + i as u64), "mallory").await.unwrap();
    }
    assert!(store.fetch_task("tmx-alice").await.unwrap().is_some(), "alice's route stays");
    assert!(store.fetch_task("tmx-m0").await.unwrap().is_none() && store.fetch_task("tmx-m9").await.unwrap().is_none());
    assert!(store.fetch_task("tmx-m10").await.unwrap().is_some());
    let mut c = redis.client().get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("toolmux:task:*").query_async(&mut c).await.unwrap();
    assert_eq!(keys.len(), bound + 1, "mallory's bound and alice's one");
}

/// With tools frozen, the replicas share one ledger: a replica started after a backend changed
/// serves the version another replica accepted first (not what the backend says now), each
/// holds the change, and an operator's acceptance (`toolmux tools accept`, then a reload)
/// reaches every replica.
#[tokio::test]
async fn replicas_share_the_tool_ledger() {
    let redis = Redis::start().await;
    let kit = http_backend("testkit").await;
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str| {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n\
             [health]\ninterval = \"1s\"\nfreeze_tools = true\ntrust_first_listing = true\ntool_ledger = {:?}\n\
             [sessions]\nstore = \"redis\"\nredis_url = \"{}\"\n{}",
            dir.path().join(format!("{name}.ledger")),
            redis.url(),
            http_backend_toml("kit", &kit.url)
        );
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, &toml).unwrap();
        (toml, path)
    };
    let description = |peer: rmcp::service::Peer<rmcp::service::RoleClient>| async move {
        let tools = peer.list_all_tools().await.unwrap();
        tools.into_iter().find(|t| t.name == "kit_echo").and_then(|t| t.description).unwrap_or_default().to_string()
    };
    let (toml_a, path_a) = config("a");
    let a = gateway(&toml_a, toolmux::app::EmbedderChoice::None).await;
    let (on_a, _) = client(&a).await;
    let first = description(on_a.peer().clone()).await;
    call(&on_a, "kit_set_description", json!({"tool": "echo", "description": "Changed behind A's back"})).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            serde_json::to_value(a.gateway.status()).unwrap()["integrity"]["held"]
                .as_array()
                .is_some_and(|h| !h.is_empty())
        })
        .await
    );
    // B starts now, with a ledger file of its own that has never seen kit.
    let (toml_b, _) = config("b");
    let b = gateway(&toml_b, toolmux::app::EmbedderChoice::None).await;
    let (on_b, _) = client(&b).await;
    assert_eq!(description(on_b.peer().clone()).await, first, "B serves A's baseline, not the backend's change");
    let held = serde_json::to_value(b.gateway.status()).unwrap()["integrity"]["held"].clone();
    assert_eq!(held[0]["tool"], "echo", "{held}");
    // The operator accepts it once, in the shared ledger; a reload of each replica serves it.
    let out = std::process::Command::new(BIN)
        .args(["tools", "accept", "--config", path_a.to_str().unwrap(), "--backend", "kit"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (app, toml, c) in [(&a, &toml_a, &on_a), (&b, &toml_b, &on_b)] {
        app.reload(toolmux::config::Config::parse(toml).unwrap()).await;
        let served = eventually(Duration::from_secs(30), || async {
            description(c.peer().clone()).await == "Changed behind A's back"
        })
        .await;
        assert!(served, "accepted once, served by every replica");
    }
}

/// One label on `app` from `who`: a find_tool, then a successful call of what it found.
async fn teach(app: &toolmux::app::App, who: &str) {
    teach_as(app, who, "echo back a message").await
}

/// [`teach`] with another request.
async fn teach_as(app: &toolmux::app::App, who: &str, request: &str) {
    let (c, _) = client_with_auth(app, Some(who)).await;
    let found = found(&call(&c, "find_tool", json!({"tool_description": request})).await);
    assert!(found.contains(&"kit_echo".to_string()), "{found:?}");
    let r = call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": "hi"}})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    c.cancel().await.unwrap();
}

/// Replicas share what find_tool learns (real model): a label made on one replica (a call that
/// followed a find_tool) reaches the other, in the same order on both, so they rank alike.
#[tokio::test]
async fn replicas_learn_from_each_others_calls() {
    let redis = Redis::start().await;
    let kit = http_backend("testkit").await;
    let teachers: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
    let mut principals = vec!["alice", "bob"];
    principals.extend(teachers.iter().map(String::as_str));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n{}\
         [sessions]\nstore = \"redis\"\nredis_url = \"{}\"\n{}",
        bearer_auth(&principals),
        redis.url(),
        http_backend_toml("kit", &kit.url)
    );
    let a = gateway(&toml, toolmux::app::EmbedderChoice::Given(model())).await;
    let b = gateway(&toml, toolmux::app::EmbedderChoice::Given(model())).await;
    let learning = |app: &toolmux::app::App| serde_json::to_value(app.gateway.status()).unwrap()["learning"].clone();
    teach(&a, "alice").await;
    let both = |n: u64| {
        let (a, b) = (&a, &b);
        async move { learning(a)["labels"] == n && learning(b)["labels"] == n }
    };
    assert!(eventually(Duration::from_secs(10), || both(1)).await, "a: {} b: {}", learning(&a), learning(&b));
    teach(&b, "bob").await;
    assert!(eventually(Duration::from_secs(10), || both(2)).await, "a: {} b: {}", learning(&a), learning(&b));
    assert_eq!(learning(&a), learning(&b));
    // Enough principals for the query adapter: one replica fits it, the store numbers the
    // outcome, and both replicas hold that same version and decision.
    // (Requests differ, each teacher's its own: the guard holds back whole requests, so labels
    // of one request alone fit nothing.)
    let requests = ["echo back a message", "repeat what I say", "say this back to me", "return my words unchanged"];
    for (round, request) in requests.iter().enumerate() {
        for (i, t) in teachers.iter().enumerate() {
            let request = format!("{request}, {t}");
            teach_as(if (i + round) % 2 == 0 { &a } else { &b }, t, &request).await;
        }
    }
    let fitted = || {
        let (a, b) = (&a, &b);
        async move {
            let (x, y) = (learning(a)["adapter"].clone(), learning(b)["adapter"].clone());
            x["version"].as_u64().is_some() && x["version"] == y["version"] && x["last_fit"] == y["last_fit"]
        }
    };
    assert!(eventually(Duration::from_secs(60), fitted).await, "a: {} b: {}", learning(&a), learning(&b));
    let (x, y) = (learning(&a)["adapter"].clone(), learning(&b)["adapter"].clone());
    assert_eq!(
        (x["served"].clone(), x["last_fit"]["fitted"].as_u64()),
        (y["served"].clone(), y["last_fit"]["fitted"].as_u64())
    );
    // The fitter looks once 40 labels teach, while the last teachers may still be calling (on a
    // slow machine it looked at 45 of the 50): every label there was when it looked is fitted or
    // held back.
    let judged = x["last_fit"]["fitted"].as_u64().unwrap() + x["last_fit"]["held_out"].as_u64().unwrap();
    let looked_at = x["last_fit"]["at_labels"].as_u64().unwrap();
    assert!((40..=50).contains(&looked_at), "{x}");
    assert_eq!(judged, looked_at, "every label fitted or held back: {x}");
}

/// A session on `url` presenting bearer token `token`.
async fn client_at(url: &str, token: &str) -> Client {
    use rmcp::ServiceExt;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let cfg = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token.to_string());
    Recorder::default().serve(rmcp::transport::StreamableHttpClientTransport::from_config(cfg)).await.unwrap()
}

/// Every piece of kept result `id`'s first part, read with read_result from `c`.
async fn read_kept(c: &Client, id: &str) -> String {
    let (mut whole, mut offset) = (String::new(), 0);
    loop {
        let r = call(c, "read_result", json!({"id": id, "offset": offset, "length": 6_000})).await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        whole += &text(&r);
        match r.meta.as_ref().unwrap().0["toolmux/read"]["next"].as_u64() {
            Some(next) => offset = next,
            None => return whole,
        }
    }
}

/// A result cut on one replica is kept in the store: its principal reads it on another, byte for
/// byte as on the first; another principal is told there is no such result.
#[tokio::test]
async fn a_kept_result_is_read_on_any_replica_by_its_principal_alone() {
    let redis = Redis::start().await;
    let backends = Backends::start().await;
    let extra = format!("[results]\nmax_tokens = 500\n{}", bearer_auth(&["alice", "bob"]));
    let config = backends.config("passthrough", &redis, &extra);
    let (a, b) = (Served::start(&config).await, Served::start(&config).await);
    let (alice_a, alice_b, bob_b) =
        (client_at(&a.url, "alice").await, client_at(&b.url, "alice").await, client_at(&b.url, "bob").await);
    let cut = call(&alice_a, "kit_big", json!({"kind": "text", "bytes": 20_000})).await;
    let id = cut.meta.as_ref().unwrap().0["toolmux/cut"]["id"].as_str().expect("kept").to_string();
    let here = read_kept(&alice_a, &id).await;
    assert!(here.len() >= 20_000 && here.starts_with("line 0: "), "{}", here.len());
    assert_eq!(read_kept(&alice_b, &id).await, here, "read whole on the other replica");
    let theirs = call(&bob_b, "read_result", json!({"id": id})).await;
    assert_eq!(theirs.is_error, Some(true));
    assert!(text(&theirs).contains("no kept result") && !text(&theirs).contains("line 0"), "{}", text(&theirs));
    let mut c = redis.client().get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(format!("toolmux:result:{id}")).query_async(&mut c).await.unwrap();
    assert!(ttl > 0 && ttl <= 600_000, "kept with an expiry ({ttl})");
    for c in [alice_a, alice_b, bob_b] {
        c.cancel().await.unwrap();
    }
}
