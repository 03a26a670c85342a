//! Tasks (SEP-2663) through the gateway, with the testkit's `job` (a task for a client that
//! supports tasks) behind it on both protocol revisions: the task reaches the client that made
//! the call under an id of the gateway's, only that client (its session, its principal) can
//! follow or cancel it, and a client that did not declare the extension gets a plain result.
//! The suite's own task scenarios run in tests/conformance.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, GetTaskParams,
    GetTaskResult, Implementation, TaskPayload, TaskStatus,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::json;
use toolmux::app::{App, EmbedderChoice};

use crate::harness::*;

/// A client that declares the tasks extension.
#[derive(Clone, Default)]
pub struct Tasking;

impl ClientHandler for Tasking {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::builder().enable_tasks().build(), Implementation::new("tasking", "1"))
    }
}

pub type TaskClient = RunningService<RoleClient, Tasking>;

/// A 2025-11-25 session that declares tasks, as `token`'s holder.
async fn session(app: &App, token: &str) -> TaskClient {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let cfg = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_string());
    Tasking.serve(StreamableHttpClientTransport::from_config(cfg)).await.expect("client connects")
}

async fn gateway_for(mode: &str, protocol: &str, kit: &HttpBackend, extra: &str) -> App {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n{extra}[[backends]]\nname = \"kit\"\nurl = \"{}\"\nprotocol = \"{protocol}\"\n",
        kit.url
    );
    gateway(&toml, EmbedderChoice::None).await
}

fn job(mode: &str, ms: u64, label: &str) -> CallToolRequestParams {
    let args = json!({"ms": ms, "label": label});
    match mode {
        "optimizer" => CallToolRequestParams::new("call_tool")
            .with_arguments(json!({"tool_name": "kit_job", "parameters": args}).as_object().unwrap().clone()),
        _ => CallToolRequestParams::new("kit_job").with_arguments(args.as_object().unwrap().clone()),
    }
}

pub async fn get(c: &TaskClient, id: &str) -> Result<GetTaskResult, ServiceError> {
    c.peer().get_task(GetTaskParams::new(id)).await
}

/// Polls task `id` until it is terminal.
pub async fn settled(c: &TaskClient, id: &str) -> GetTaskResult {
    for _ in 0..400 {
        let got = get(c, id).await.expect("the owner's tasks/get");
        if got.task.status().is_terminal() {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("task {id} did not finish");
}

fn is_unknown_task(e: ServiceError) -> bool {
    matches!(e, ServiceError::McpError(ref d) if d.code.0 == -32602)
}

fn result_text(got: &GetTaskResult) -> String {
    match &got.task.payload {
        TaskPayload::Completed { result } => result["content"][0]["text"].as_str().unwrap_or_default().to_string(),
        other => panic!("expected a completed task, got {other:?}"),
    }
}

/// In both modes and on both backend revisions: a long job comes back as a task under an id of
/// the gateway's; its owner follows and cancels it; another principal, and another session of
/// the same principal, are told it does not exist, and their cancel reaches nothing.
#[tokio::test]
async fn a_task_is_its_creators_alone() {
    let kit = http_backend("testkit").await;
    for protocol in ["2025-11-25", "2026-07-28"] {
        for mode in ["passthrough", "optimizer"] {
            let app = gateway_for(mode, protocol, &kit, &bearer_auth(&["alice", "bob"])).await;
            let alice = session(&app, "alice").await;
            let info = alice.peer_info().expect("initialized");
            assert!(info.capabilities.supports_tasks(), "the gateway advertises the tasks extension");

            let created = match alice.peer().call_tool_once(job(mode, 60_000, "long")).await.unwrap() {
                CallToolResponse::Task(t) => t,
                other => panic!("{protocol} {mode}: expected a task, got {other:?}"),
            };
            let id = created.task.task_id.clone();
            assert!(id.starts_with("tmx-"), "{protocol} {mode}: the gateway's own id, not the backend's: {id}");
            let got = get(&alice, &id).await.unwrap();
            assert_eq!((got.task.task.task_id.as_str(), got.task.status()), (id.as_str(), TaskStatus::Working));

            // Someone else, and the same principal from another session: no such task.
            let bob = session(&app, "bob").await;
            let alice_again = session(&app, "alice").await;
            for (who, c) in [("bob", &bob), ("alice's other session", &alice_again)] {
                assert!(is_unknown_task(get(c, &id).await.unwrap_err()), "{protocol} {mode}: {who} sees the task");
                let cancel = c.peer().cancel_task(CancelTaskParams::new(id.clone())).await;
                assert!(is_unknown_task(cancel.unwrap_err()), "{protocol} {mode}: {who} cancels the task");
            }
            assert_eq!(get(&alice, &id).await.unwrap().task.status(), TaskStatus::Working, "still running");

            // Its owner cancels it; a short one runs to its result.
            alice.peer().cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
            assert_eq!(settled(&alice, &id).await.task.status(), TaskStatus::Cancelled);
            let short = match alice.peer().call_tool_once(job(mode, 50, "short")).await.unwrap() {
                CallToolResponse::Task(t) => t.task.task_id,
                other => panic!("{protocol} {mode}: expected a task, got {other:?}"),
            };
            assert_eq!(result_text(&settled(&alice, &short).await), "short done after 50 ms");
            for c in [alice, bob, alice_again] {
                c.cancel().await.unwrap();
            }
        }
    }
}

/// A client that did not declare the extension gets the job's result as a plain tool result:
/// from a 2026-07-28 backend that is told so and runs it inline, and from a 2025-11-25 backend
/// that learnt at initialize that the gateway takes tasks and makes one anyway (the gateway
/// follows it to its end). Its tasks/* requests are refused with -32021.
#[tokio::test]
async fn a_client_without_tasks_gets_a_plain_result() {
    let kit = http_backend("testkit").await;
    for protocol in ["2025-11-25", "2026-07-28"] {
        let app = gateway_for("passthrough", protocol, &kit, "").await;
        let (c, _) = client(&app).await;
        let r = call(&c, "kit_job", json!({"ms": 150, "label": "plain"})).await;
        assert_eq!(text(&r), "plain done after 150 ms", "{protocol}");
        let refused = c.peer().get_task(GetTaskParams::new("tmx-anything")).await.unwrap_err();
        assert!(
            matches!(refused, ServiceError::McpError(ref d) if d.code.0 == -32021),
            "{protocol}: tasks/get from a client without tasks: {refused:?}"
        );
        c.cancel().await.unwrap();
    }
}

/// A client without a session (2026-07-28) owns its tasks by principal: the same principal
/// follows it from another connection, another principal does not.
#[tokio::test]
async fn a_session_less_callers_task_is_its_principals() {
    let kit = http_backend("testkit").await;
    let app = gateway_for("passthrough", "2026-07-28", &kit, &bearer_auth(&["alice", "bob"])).await;
    let alice = stateless_client(&app, Tasking, Some("alice")).await;
    let created = match alice.peer().call_tool_once(job("passthrough", 60_000, "stateless")).await.unwrap() {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let alice_again = stateless_client(&app, Tasking, Some("alice")).await;
    assert_eq!(get(&alice_again, &created).await.unwrap().task.status(), TaskStatus::Working);
    let bob = stateless_client(&app, Tasking, Some("bob")).await;
    assert!(is_unknown_task(get(&bob, &created).await.unwrap_err()));
    alice_again.peer().cancel_task(CancelTaskParams::new(created.clone())).await.unwrap();
    assert_eq!(settled(&alice, &created).await.task.status(), TaskStatus::Cancelled);
    let status = serde_json::to_value(app.gateway.status()).unwrap();
    assert_eq!(status["tasks"]["relayed"], 1, "{status}");
}

/// Rights are checked on every use of a task, not once: a reload that denies alice the tool her
/// task came from makes the task unknown to her (as to anyone), and cancels it at the backend.
#[tokio::test]
async fn a_revoked_callers_task_is_cancelled() {
    let kit = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}[[backends]]\nname = \"kit\"\nurl = \"{}\"\n",
        bearer_auth(&["alice", "bob"]),
        kit.url
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let alice = session(&app, "alice").await;
    let long = match alice.peer().call_tool_once(job("passthrough", 60_000, "long")).await.unwrap() {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    assert_eq!(get(&alice, &long).await.unwrap().task.status(), TaskStatus::Working);
    let cancelled = || async { text(&call(&alice, "kit_cancelled_calls", json!({})).await) };
    assert_eq!(cancelled().await, "0");

    let deny = "[[policy]]\nprincipals = [\"alice\"]\nbackends = [\"kit\"]\ntools = [\"job\"]\neffect = \"deny\"\n";
    app.reload(toolmux::config::Config::parse(&(toml.clone() + deny)).unwrap()).await;
    assert!(is_unknown_task(get(&alice, &long).await.unwrap_err()), "a revoked caller's task is unknown");
    assert!(
        eventually(std::time::Duration::from_secs(10), || async { cancelled().await == "1" }).await,
        "the revoked caller's task was cancelled at the backend"
    );
    // Given the right back, the task stays forgotten: it was cancelled, not hidden.
    app.reload(toolmux::config::Config::parse(&toml).unwrap()).await;
    assert!(is_unknown_task(get(&alice, &long).await.unwrap_err()));
    alice.cancel().await.unwrap();
}

/// A task is its session's alone, so it ends with the session: closing the session cancels its
/// task at the backend (nobody could follow it any more), on the gateway's connection to a
/// `shared` backend, and on the session's own backend session of a `per_client` one before that
/// session closes (the backend's task would outlive it).
#[tokio::test]
async fn a_sessions_tasks_end_with_it() {
    for mode in ["shared", "per_client"] {
        let kit = http_backend("testkit").await;
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{}session = \"{mode}\"\n",
            bearer_auth(&["alice"]),
            http_backend_toml("kit", &kit.url)
        );
        let app = gateway(&toml, EmbedderChoice::None).await;
        let alice = session(&app, "alice").await;
        match alice.peer().call_tool_once(job("passthrough", 60_000, "orphan")).await.unwrap() {
            CallToolResponse::Task(_) => {}
            other => panic!("{mode}: expected a task, got {other:?}"),
        }
        let watcher = session(&app, "alice").await;
        let cancelled = || async { text(&call(&watcher, "kit_cancelled_calls", json!({})).await) };
        assert_eq!(cancelled().await, "0", "{mode}");
        alice.cancel().await.unwrap();
        assert!(
            eventually(std::time::Duration::from_secs(10), || async { cancelled().await == "1" }).await,
            "{mode}: the ended session's task was cancelled at the backend"
        );
        assert_eq!(app.gateway.tasks.len(), 0, "{mode}: and forgotten");
        watcher.cancel().await.unwrap();
        app.shutdown().await;
    }
}
