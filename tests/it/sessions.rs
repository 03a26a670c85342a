//! Many clients, one gateway: each client session's backend sessions are its own (`per_client`)
//! or everyone's (`shared`), what a backend sends reaches only the client it is for, and every
//! resource a client can make the gateway hold has a limit. Real rmcp clients, the testkit
//! backend in this process over HTTP and as child processes over stdio.

#![allow(deprecated, reason = "sampling and logging are what 2025-11-25 clients use")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ErrorData, ServiceExt};
use serde_json::json;
use toolmux::app::{App, EmbedderChoice};

use crate::harness::*;

/// A named client: answers sampling and elicitation with its name, and records the progress
/// messages and log lines it is sent.
#[derive(Clone)]
pub(crate) struct Who {
    name: String,
    pub(crate) progress: Arc<Mutex<Vec<String>>>,
    pub(crate) logs: Arc<Mutex<Vec<String>>>,
    /// Told when the client is asked for sampling; the answer waits until `release` is rung.
    asked: Option<Arc<tokio::sync::Notify>>,
    release: Option<Arc<tokio::sync::Notify>>,
}

impl Who {
    pub(crate) fn new(name: &str) -> Self {
        Self { name: name.into(), progress: Arc::default(), logs: Arc::default(), asked: None, release: None }
    }
}

impl ClientHandler for Who {
    fn get_info(&self) -> ClientConfig {
        let caps = ClientCapabilities::builder().enable_sampling().enable_elicitation().build();
        ClientConfig::new(caps, Implementation::new(self.name.clone(), "0"))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _c: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        if let (Some(asked), Some(release)) = (&self.asked, &self.release) {
            let released = release.notified();
            asked.notify_one();
            released.await;
        }
        let asked = serde_json::to_value(&params.messages[0].content).unwrap()["text"].as_str().unwrap().to_string();
        let answer = format!("{} answers {asked}", self.name);
        Ok(CreateMessageResult::new(SamplingMessage::assistant_text(answer), "m".into()))
    }

    async fn create_elicitation(
        &self,
        _p: ElicitRequestParams,
        _c: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(serde_json::from_value(json!({"action": "accept", "content": {"answer": self.name}})).unwrap())
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _c: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap().push(params.message.unwrap_or_default());
    }

    async fn on_logging_message(&self, params: LoggingMessageNotificationParam, _c: NotificationContext<RoleClient>) {
        self.logs.lock().unwrap().push(params.data.as_str().unwrap_or_default().to_string());
    }
}

pub(crate) type Session = RunningService<RoleClient, Who>;

async fn passthrough(backends: &str, server: &str) -> App {
    let toml = format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{server}\n{backends}");
    gateway(&toml, EmbedderChoice::None).await
}

pub(crate) async fn connect(app: &App, who: Who) -> Session {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    who.serve(rmcp::transport::StreamableHttpClientTransport::from_uri(url)).await.expect("client connects")
}

fn with_session(toml: String, mode: &str) -> String {
    format!("{toml}session = \"{mode}\"\n")
}

/// The testkit twice, both `per_client`: `web` over HTTP at `url` (the default mode) and `cli`
/// over stdio (configured so).
fn web_and_cli(url: &str) -> String {
    format!("{}{}", http_backend_toml("web", url), with_session(stdio_backend_toml("cli", "testkit"), "per_client"))
}

fn open_upstreams(app: &App, backend: &str) -> usize {
    app.gateway.upstream.get(backend).unwrap().client_sessions()
}

#[tokio::test]
async fn per_client_backends_keep_each_clients_state_over_http_and_stdio() {
    let kit = http_backend("testkit").await;
    let backends = web_and_cli(&kit.url);
    let app = passthrough(&backends, "").await;
    let a = connect(&app, Who::new("A")).await;
    let b = connect(&app, Who::new("B")).await;
    for backend in ["web", "cli"] {
        call(&a, &format!("{backend}_remember"), json!({"value": "A's page"})).await;
        call(&b, &format!("{backend}_remember"), json!({"value": "B's page"})).await;
        assert_eq!(text(&call(&a, &format!("{backend}_recall"), json!({})).await), "A's page", "{backend}");
        assert_eq!(text(&call(&b, &format!("{backend}_recall"), json!({})).await), "B's page", "{backend}");
        assert_eq!(open_upstreams(&app, backend), 2, "{backend}: one upstream session per client session");
    }
    // A client that goes away takes its upstream sessions (and its child process) with it.
    a.cancel().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            open_upstreams(&app, "web") == 1 && open_upstreams(&app, "cli") == 1
        })
        .await,
        "A's upstream sessions closed: web {}, cli {}",
        open_upstreams(&app, "web"),
        open_upstreams(&app, "cli")
    );
    assert_eq!(text(&call(&b, "cli_recall", json!({})).await), "B's page");
    b.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn a_lost_upstream_session_is_reopened_on_the_next_request() {
    let mut web = ChildBackend::start("testkit").await;
    let backends = format!(
        "{}{}",
        http_backend_toml("web", &web.url()),
        with_session(stdio_backend_toml("cli", "testkit"), "per_client")
    );
    let app = passthrough(&backends, "").await;
    let a = connect(&app, Who::new("A")).await;
    let b = connect(&app, Who::new("B")).await;
    call(&a, "cli_remember", json!({"value": "A's folder"})).await;
    call(&b, "cli_remember", json!({"value": "B's folder"})).await;
    // A's child exits in the middle of a call: that call fails, and A's next one gets a new child.
    let died = a.call_tool(CallToolRequestParams::new("cli_exit")).await;
    assert!(died.is_err() || died.as_ref().unwrap().is_error == Some(true), "{died:?}");
    let recalled = call(&a, "cli_recall", json!({})).await;
    assert_ne!(recalled.is_error, Some(true), "{recalled:?}");
    assert_eq!(text(&recalled), "", "a new child remembers nothing");
    assert_eq!(text(&call(&b, "cli_recall", json!({})).await), "B's folder", "B's child is untouched");
    assert_eq!(open_upstreams(&app, "cli"), 2);

    // An HTTP backend that restarts forgets its sessions; A's next request opens a new one.
    call(&a, "web_remember", json!({"value": "A's page"})).await;
    web.restart().await;
    let backend = app.gateway.upstream.get("web").unwrap().clone();
    assert!(eventually(Duration::from_secs(20), || async { backend.is_connected() }).await);
    let recalled = call(&a, "web_recall", json!({})).await;
    assert_ne!(recalled.is_error, Some(true), "{recalled:?}");
    assert_eq!(text(&recalled), "", "the restarted backend's new session remembers nothing");
    call(&a, "web_remember", json!({"value": "A's new page"})).await;
    assert_eq!(text(&call(&a, "web_recall", json!({})).await), "A's new page");
    assert_eq!(open_upstreams(&app, "web"), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn shared_backends_are_one_backend_session_for_every_client() {
    let kit = http_backend("testkit").await;
    // Stdio backends are shared by default; an HTTP one is when configured so.
    let backends = format!(
        "{}{}",
        with_session(http_backend_toml("web", &kit.url), "shared"),
        stdio_backend_toml("cli", "testkit")
    );
    let app = passthrough(&backends, "").await;
    let a = connect(&app, Who::new("A")).await;
    let b = connect(&app, Who::new("B")).await;
    for backend in ["web", "cli"] {
        call(&a, &format!("{backend}_remember"), json!({"value": "A's page"})).await;
        let seen = text(&call(&b, &format!("{backend}_recall"), json!({})).await);
        assert_eq!(seen, "A's page", "{backend}: shared means B sees what A left");
        assert_eq!(open_upstreams(&app, backend), 0, "{backend}: no upstream session of their own");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn requests_unlinked_to_a_call_reach_the_client_whose_session_sent_them() {
    let kit = http_backend("testkit").await;
    let backends = web_and_cli(&kit.url);
    let app = passthrough(&backends, "").await;
    let names = ["A", "B", "C", "D", "E"];
    let mut clients = Vec::new();
    for n in names {
        clients.push(connect(&app, Who::new(n)).await);
    }
    // Five sessions at once, each call asking its client from outside the call's own stream
    // (the standalone stream over HTTP; nothing at all over stdio), by sampling and elicitation.
    let runs = clients.iter().zip(names).map(|(c, n)| async move {
        let mut seen = Vec::new();
        for backend in ["web", "cli"] {
            let tool = format!("{backend}_ask");
            let sampled = call(c, &tool, json!({"prompt": n, "unlinked": true, "delay_ms": 50})).await;
            seen.push((backend, "sampling", text(&sampled), format!("{n} answers {n}")));
            let elicited = call(c, &tool, json!({"prompt": n, "unlinked": true, "elicit": true})).await;
            seen.push((backend, "elicitation", text(&elicited), n.to_string()));
        }
        seen
    });
    for seen in futures::future::join_all(runs).await {
        for (backend, kind, got, want) in seen {
            assert_eq!(got, want, "{backend} {kind}");
        }
    }
    app.shutdown().await;
}

/// Calls `tool` asking for progress; returns the result.
pub(crate) async fn call_with_progress(c: &Session, tool: &str, args: serde_json::Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args.as_object().unwrap().clone());
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = c.peer().send_request_with_option(request, PeerRequestOptions::no_options()).await.unwrap();
    match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

async fn progress_stays_with_its_client(backends: &str) {
    let app = passthrough(backends, "").await;
    let (wa, wb) = (Who::new("A"), Who::new("B"));
    let (a, b) = (connect(&app, wa.clone()).await, connect(&app, wb.clone()).await);
    // Each backend numbers its progress tokens from the start, so both calls carry the same one.
    let (ra, rb) = tokio::join!(
        call_with_progress(&a, "one_progress", json!({"steps": 20, "label": "A"})),
        call_with_progress(&b, "two_progress", json!({"steps": 20, "label": "B"})),
    );
    assert_eq!((text(&ra), text(&rb)), ("A done".to_string(), "B done".to_string()));
    for (who, label) in [(&wa, "A"), (&wb, "B")] {
        let seen = who.progress.lock().unwrap().clone();
        assert_eq!(seen.len(), 20, "{label} got all its progress: {seen:?}");
        assert!(seen.iter().all(|m| m.starts_with(label)), "{label} got only its own progress: {seen:?}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn progress_with_the_same_token_numbers_stays_with_its_client() {
    let (one, two) = (http_backend("testkit").await, http_backend("testkit").await);
    progress_stays_with_its_client(&format!(
        "{}{}",
        http_backend_toml("one", &one.url),
        http_backend_toml("two", &two.url)
    ))
    .await;
    // Shared connections too: the key is (connection, token), not the token.
    progress_stays_with_its_client(&format!(
        "{}{}",
        stdio_backend_toml("one", "testkit"),
        stdio_backend_toml("two", "testkit")
    ))
    .await;
}

#[tokio::test]
async fn one_clients_log_level_does_not_change_what_another_hears() {
    let kit = http_backend("testkit").await;
    let backends = format!("{}{}", http_backend_toml("web", &kit.url), stdio_backend_toml("cli", "testkit"));
    let app = passthrough(&backends, "").await;
    let (wa, wb) = (Who::new("A"), Who::new("B"));
    let (a, b) = (connect(&app, wa.clone()).await, connect(&app, wb.clone()).await);
    // A opens its upstream session first, then asks for errors only.
    call(&a, "web_recall", json!({})).await;
    a.peer().set_level(SetLevelRequestParams::new(LoggingLevel::Error)).await.unwrap();
    for backend in ["web", "cli"] {
        for c in [&a, &b] {
            call(c, &format!("{backend}_log"), json!({"level": "info", "message": format!("{backend} info")})).await;
            call(c, &format!("{backend}_log"), json!({"level": "error", "message": format!("{backend} error")})).await;
        }
    }
    let (la, lb) = (wa.logs.lock().unwrap().clone(), wb.logs.lock().unwrap().clone());
    assert_eq!(la, vec!["web error", "cli error"], "A hears errors only");
    assert_eq!(lb, vec!["web info", "web error", "cli info", "cli error"], "B still hears everything");
    app.shutdown().await;
}

#[tokio::test]
async fn a_session_past_max_sessions_is_refused_and_the_others_carry_on() {
    let kit = http_backend("testkit").await;
    let app = passthrough(&http_backend_toml("web", &kit.url), "max_sessions = 2").await;
    let a = connect(&app, Who::new("A")).await;
    let _b = connect(&app, Who::new("B")).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "third", "version": "0"}}});
    let r = reqwest::Client::new()
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["id"], 1);
    assert_eq!(body["error"]["code"], -32000);
    assert!(body["error"]["message"].as_str().unwrap().contains("server.max_sessions"), "{body}");
    assert_eq!(text(&call(&a, "web_echo", json!({"input": "still here"})).await), "still here");
    app.shutdown().await;
}

/// One principal cannot take every session: past `server.max_sessions_per_principal` its next
/// `initialize` gets 429 naming the key, while another principal still connects and its own
/// sessions carry on; ending one of its sessions makes room again.
#[tokio::test]
async fn a_principal_past_its_own_session_limit_is_refused_and_no_one_else_is() {
    let kit = http_backend("testkit").await;
    let server = format!("max_sessions_per_principal = 2\n{}", bearer_auth(&["alice", "bob"]));
    let app = passthrough(&http_backend_toml("web", &kit.url), &server).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let open = |token: &'static str| {
        let (url, init) = (url.clone(), init.clone());
        async move {
            let r = reqwest::Client::new()
                .post(&url)
                .bearer_auth(token)
                .header("accept", "application/json, text/event-stream")
                .json(&init)
                .send()
                .await
                .unwrap();
            let id = r.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_string());
            (r.status().as_u16(), id, r.text().await.unwrap())
        }
    };
    let (first, second) = (open("alice").await, open("alice").await);
    assert_eq!((first.0, second.0), (200, 200));
    let (status, id, body) = open("alice").await;
    assert_eq!(status, 429, "{body}");
    assert!(id.is_none(), "no session was made");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((body["id"].clone(), body["error"]["code"].clone()), (json!(1), json!(-32000)));
    assert!(body["error"]["message"].as_str().unwrap().contains("server.max_sessions_per_principal"), "{body}");
    assert_eq!(open("bob").await.0, 200, "another principal is not held to alice's count");
    let ended = reqwest::Client::new()
        .delete(&url)
        .bearer_auth("alice")
        .header("mcp-session-id", first.1.unwrap())
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200);
    assert_eq!(open("alice").await.0, 200, "ending a session makes room");
    app.shutdown().await;
}

#[tokio::test]
async fn calls_past_the_session_limit_and_children_past_max_instances_are_tool_errors() {
    let backends = format!(
        "{}{}max_instances = 1\n",
        stdio_backend_toml("kit", "testkit"),
        with_session(stdio_backend_toml("cli", "testkit"), "per_client")
    );
    let app = passthrough(&backends, "max_calls_per_session = 1").await;
    let (asked, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let wa = Who { asked: Some(asked.clone()), release: Some(release.clone()), ..Who::new("A") };
    let a = connect(&app, wa).await;
    // A's first call waits on A's own answer: it is running when A calls again.
    let first = tokio::spawn({
        let peer = a.peer().clone();
        async move {
            peer.call_tool(
                CallToolRequestParams::new("kit_ask")
                    .with_arguments(json!({"prompt": "hold"}).as_object().unwrap().clone()),
            )
            .await
        }
    });
    asked.notified().await;
    let second = call(&a, "kit_echo", json!({"input": "x"})).await;
    assert_eq!(second.is_error, Some(true));
    assert!(text(&second).contains("server.max_calls_per_session"), "{}", text(&second));
    release.notify_one();
    assert_eq!(text(&first.await.unwrap().unwrap()), "A answers hold");
    // One child for `cli`: A has it, so B is told why it cannot have one; once A leaves, B can.
    assert_eq!(text(&call(&a, "cli_echo", json!({"input": "a"})).await), "a");
    let b = connect(&app, Who::new("B")).await;
    let refused = call(&b, "cli_echo", json!({"input": "b"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(text(&refused).contains("max_instances"), "{}", text(&refused));
    a.cancel().await.unwrap();
    assert!(eventually(Duration::from_secs(10), || async { open_upstreams(&app, "cli") == 0 }).await);
    assert_eq!(text(&call(&b, "cli_echo", json!({"input": "b"})).await), "b");
    app.shutdown().await;
}

#[tokio::test]
async fn an_oversized_find_tool_query_is_a_tool_error_naming_the_limit() {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\nmax_query_chars = 100\n{}",
        stdio_backend_toml("kit", "testkit")
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let long = "find me a tool ".repeat(50);
    let r = call(&c, "find_tool", json!({"tool_description": long})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("optimizer.max_query_chars"), "{}", text(&r));
    let r = call(&c, "find_tool", json!({"tool_description": "echo", "tool_keywords": vec!["word"; 40]})).await;
    assert_eq!(r.is_error, Some(true), "keywords count too");
    let r = call(&c, "find_tool", json!({"tool_description": "echo a message back"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    app.shutdown().await;
}

#[tokio::test]
async fn an_idle_session_expires_with_its_upstream_sessions() {
    let kit = http_backend("testkit").await;
    let app = passthrough(&http_backend_toml("web", &kit.url), "session_idle_timeout = \"10m\"").await;
    let a = connect(&app, Who::new("A")).await;
    call(&a, "web_remember", json!({"value": "x"})).await;
    assert_eq!((app.gateway.session_count(), open_upstreams(&app, "web")), (1, 1));
    // Ten minutes pass in an instant; nothing is sent meanwhile.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(601)).await;
    tokio::time::resume();
    let gone = eventually(Duration::from_secs(10), || async {
        app.gateway.session_count() == 0 && open_upstreams(&app, "web") == 0
    })
    .await;
    assert!(gone, "sessions {}, upstream {}", app.gateway.session_count(), open_upstreams(&app, "web"));
    drop(a);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sessions_opened_and_closed_leave_nothing_behind() {
    let kit = http_backend("testkit").await;
    let app = passthrough(&http_backend_toml("web", &kit.url), "").await;
    let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    // One session first, so that pools and lazily started tasks exist before the baseline.
    let warm = RawSession::open(&app).await;
    warm.call("web_echo", json!({"input": "warm"})).await;
    assert_eq!(warm.delete().await, 200);
    assert!(eventually(Duration::from_secs(10), || async { app.gateway.session_count() == 0 }).await);
    let baseline = tasks();
    // A scope change wakes every resync worker, and a worker whose session is gone then exits
    // on its own; the check below must see them end with their sessions, so none may happen.
    let epoch = app.gateway.epoch();
    let cycle = |i: usize| {
        let app = &app;
        async move {
            let s = RawSession::open(app).await;
            let r = s.call("web_echo", json!({"input": i.to_string()})).await;
            assert_eq!(r["content"][0]["text"], i.to_string());
            assert_eq!(s.delete().await, 200);
        }
    };
    let mut done = 0;
    while done < 1000 {
        futures::future::join_all((done..done + 25).map(cycle)).await;
        done += 25;
    }
    let settled = eventually(Duration::from_secs(15), || async {
        app.gateway.session_count() == 0 && open_upstreams(&app, "web") == 0 && tasks() <= baseline
    })
    .await;
    assert_eq!(app.gateway.epoch(), epoch, "a scope change during the test hides leaked workers");
    assert!(
        settled,
        "after 1000 sessions: {} sessions, {} upstream sessions, {} tasks (baseline {baseline})",
        app.gateway.session_count(),
        open_upstreams(&app, "web"),
        tasks()
    );
    app.shutdown().await;
}

/// A principal's session-less client on a `per_client` backend: passthrough, bearer `token`.
async fn sessionless(app: &App, token: &str) -> RunningService<RoleClient, Recorder> {
    stateless_client(app, Recorder::default(), Some(token)).await
}

#[tokio::test]
async fn callers_without_a_session_get_their_principals_own_backend_sessions() {
    let kit = http_backend("testkit").await;
    let backends = web_and_cli(&kit.url);
    let app = passthrough(&backends, &bearer_auth(&["alice", "bob"])).await;
    for backend in ["web", "cli"] {
        let (remember, recall) = (format!("{backend}_remember"), format!("{backend}_recall"));
        let alice = sessionless(&app, "alice").await;
        call(&alice, &remember, json!({"value": "secret-of-alice"})).await;
        let bob = sessionless(&app, "bob").await;
        assert_eq!(text(&call(&bob, &recall, json!({})).await), "", "{backend}: bob sees nothing of alice's");
        call(&bob, &remember, json!({"value": "bob's"})).await;
        // Another session-less client of alice's is alice again: her backend session, reused.
        let alice_again = sessionless(&app, "alice").await;
        assert_eq!(text(&call(&alice_again, &recall, json!({})).await), "secret-of-alice", "{backend}");
        assert_eq!(text(&call(&bob, &recall, json!({})).await), "bob's", "{backend}");
    }
    assert_eq!(open_upstreams(&app, "web"), 2, "one backend session per principal");
    assert_eq!(open_upstreams(&app, "cli"), 2, "one child per principal");

    // With a session of alice's beside them: the session's backend session is its own.
    let (carol, _) = client_with_auth(&app, Some("alice")).await;
    assert_eq!(text(&call(&carol, "web_recall", json!({})).await), "", "a session starts afresh");
    call(&carol, "web_remember", json!({"value": "alice's session"})).await;
    let bob = sessionless(&app, "bob").await;
    assert_eq!(text(&call(&bob, "web_recall", json!({})).await), "bob's");
    let alice = sessionless(&app, "alice").await;
    assert_eq!(text(&call(&alice, "web_recall", json!({})).await), "secret-of-alice");
    assert_eq!(text(&call(&carol, "web_recall", json!({})).await), "alice's session");
    let metrics = app.gateway.render_metrics();
    assert!(metrics.contains("toolmux_sessionless_principals 2"), "{metrics}");
    app.shutdown().await;
}

#[tokio::test]
async fn session_less_principals_past_the_bound_take_the_place_of_idle_ones() {
    let kit = http_backend("testkit").await;
    let server = "max_sessionless_principals = 1\n";
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{server}{}{}",
        bearer_auth(&["alice", "bob"]),
        http_backend_toml("web", &kit.url)
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let alice = sessionless(&app, "alice").await;
    call(&alice, "web_remember", json!({"value": "secret-of-alice"})).await;
    // Bob takes alice's place: her backend session is closed, never lent to him.
    let bob = sessionless(&app, "bob").await;
    assert_eq!(text(&call(&bob, "web_recall", json!({})).await), "");
    assert!(eventually(Duration::from_secs(10), || async { open_upstreams(&app, "web") == 1 }).await);
    // While bob's call runs, alice cannot take his place: a clear tool error, nothing shared.
    let slow = {
        let bob = sessionless(&app, "bob").await;
        tokio::spawn(async move { call(&bob, "web_sleep", json!({"ms": 3000})).await })
    };
    assert!(eventually(Duration::from_secs(10), || async { app.gateway.sessionless.in_use() == 1 }).await);
    let refused = call(&alice, "web_recall", json!({})).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert!(text(&refused).contains("server.max_sessionless_principals"), "{refused:?}");
    let slept = slow.await.unwrap();
    assert_eq!(text(&slept), "slept 3000 ms", "bob's call was not disturbed");
    // Once it ends, alice takes the place again, with a backend session of her own.
    let r = call(&alice, "web_recall", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(text(&r), "", "alice's old backend session is gone");
    let metrics = app.gateway.render_metrics();
    let count = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(count("toolmux_sessionless_principals_evicted_total") >= 2, "{metrics}");
    assert!(count("toolmux_sessionless_principals_refused_total") >= 1, "{metrics}");
    app.shutdown().await;
}

/// A resource read its client gives up on is cancelled at the backend too, like a tool call:
/// for a session on its own backend session, and for a session-less caller on its principal's.
#[tokio::test]
async fn an_abandoned_resource_read_is_cancelled_at_the_backend() {
    let kit = http_backend("testkit").await;
    let app = passthrough(&http_backend_toml("web", &kit.url), &bearer_auth(&["alice"])).await;
    let (session, _) = client_with_auth(&app, Some("alice")).await;
    let sessionless = stateless_client(&app, Recorder::default(), Some("alice")).await;
    let cancelled = || async { text(&call(&session, "web_cancelled_calls", json!({})).await) };
    assert_eq!(cancelled().await, "0");
    for (n, peer) in [(1, session.peer().clone()), (2, sessionless.peer().clone())] {
        let read = peer.read_resource_once(ReadResourceRequestParams::new("demo://testkit/slow/20000"));
        assert!(tokio::time::timeout(Duration::from_millis(500), read).await.is_err(), "still reading");
        assert!(
            eventually(Duration::from_secs(10), || async { cancelled().await == n.to_string() }).await,
            "abandoned read {n} cancelled at the backend: {}",
            cancelled().await
        );
    }
    app.shutdown().await;
}
