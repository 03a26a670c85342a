//! What the gateway carries both ways during a call, with a real rmcp client: sampling and
//! elicitation round trips, progress, logging and resource updates; in passthrough mode and
//! through optimizer mode's call_tool.

#![allow(deprecated, reason = "sampling and logging are what 2025-11-25 clients use")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData, ServiceExt};
use serde_json::json;
use toolmux::app::{App, EmbedderChoice};

use crate::conformance_server;
use crate::harness::*;

/// A client that answers sampling and elicitation and records what it is sent.
#[derive(Clone, Default)]
pub struct Answering {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    logs: Arc<Mutex<Vec<String>>>,
    updated: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Answering {
    fn get_info(&self) -> ClientConfig {
        let caps = ClientCapabilities::builder().enable_sampling().enable_elicitation().build();
        ClientConfig::new(caps, Implementation::new("relay-tests", "0"))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _c: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let asked =
            serde_json::to_value(&params.messages[0].content).unwrap()["text"].as_str().unwrap_or_default().to_string();
        Ok(CreateMessageResult::new(SamplingMessage::assistant_text(format!("echo of {asked}")), "test-model".into()))
    }

    async fn create_elicitation(
        &self,
        _p: ElicitRequestParams,
        _c: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(serde_json::from_value(
            json!({"action": "accept", "content": {"username": "ana", "email": "ana@example.com"}}),
        )
        .unwrap())
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _c: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_logging_message(&self, params: LoggingMessageNotificationParam, _c: NotificationContext<RoleClient>) {
        self.logs.lock().unwrap().push(params.data.as_str().unwrap_or_default().to_string());
    }

    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _c: NotificationContext<RoleClient>) {
        self.updated.lock().unwrap().push(params.uri);
    }
}

async fn setup(mode: &str) -> (App, rmcp::service::RunningService<RoleClient, Answering>, Answering) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(conformance_server::serve(listener, false));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n[optimizer]\ncache_dir = \"{}\"\n\
         [aggregation]\nconflict_resolution = \"priority\"\n{}",
        shared_cache_dir(),
        http_backend_toml("conformance", &url)
    );
    let embedder = if mode == "optimizer" { EmbedderChoice::Given(model()) } else { EmbedderChoice::None };
    let app = gateway(&toml, embedder).await;
    let handler = Answering::default();
    let transport =
        rmcp::transport::StreamableHttpClientTransport::from_uri(format!("http://{}/mcp", app.addr.unwrap()));
    let c = handler.clone().serve(transport).await.unwrap();
    (app, c, handler)
}

fn args(v: serde_json::Value) -> JsonObject {
    v.as_object().unwrap().clone()
}

/// Calls a tool and returns its result with the progress token the client used.
async fn call_with_progress(
    c: &rmcp::service::RunningService<RoleClient, Answering>,
    name: &str,
    a: JsonObject,
) -> (CallToolResult, ProgressToken) {
    let req = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(name.to_string()).with_arguments(a),
    ));
    let handle = c.peer().send_request_with_option(req, PeerRequestOptions::no_options()).await.unwrap();
    let token = handle.progress_token.clone();
    match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(r) => (r, token),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn sampling_and_elicitation_round_trip_through_the_gateway() {
    let (app, c, _) = setup("passthrough").await;
    let r = call(&c, "test_sampling", json!({"prompt": "what is 2+2"})).await;
    assert_eq!(text(&r), "LLM response: echo of what is 2+2");
    let r = call(&c, "test_elicitation", json!({"message": "who are you?"})).await;
    assert!(text(&r).contains("accept") && text(&r).contains("ana@example.com"), "{}", text(&r));
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn progress_and_logging_reach_the_caller_under_its_own_token() {
    let (app, c, seen) = setup("passthrough").await;
    let (r, token) = call_with_progress(&c, "test_tool_with_progress", JsonObject::new()).await;
    assert_ne!(r.is_error, Some(true));
    let progress = seen.progress.lock().unwrap().clone();
    assert_eq!(progress.len(), 3, "{progress:?}");
    assert!(progress.iter().all(|p| p.progress_token == token), "the client's own token: {progress:?}");
    assert_eq!(progress.iter().map(|p| p.progress).collect::<Vec<_>>(), vec![0.0, 50.0, 100.0]);

    call(&c, "test_tool_with_logging", json!({})).await;
    let logs = seen.logs.lock().unwrap().clone();
    assert_eq!(logs, vec!["Tool execution started", "Tool processing data", "Tool execution completed"]);
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn resource_updates_reach_the_subscribed_session() {
    let (app, c, seen) = setup("passthrough").await;
    c.subscribe(SubscribeRequestParams::new("test://watched-resource")).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            seen.updated.lock().unwrap().contains(&"test://watched-resource".to_string())
        })
        .await,
        "notifications/resources/updated relayed"
    );
    c.unsubscribe(UnsubscribeRequestParams::new("test://watched-resource")).await.unwrap();
    let done = c.complete(CompleteRequestParams::new(
        Reference::for_prompt("test_prompt_with_arguments"),
        ArgumentInfo::new("arg1", "par"),
    ));
    let values = done.await.unwrap().completion.values;
    assert_eq!(values, vec!["paris", "park", "party"]);
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn optimizer_call_tool_relays_progress_and_sampling() {
    let (app, c, seen) = setup("optimizer").await;
    let (r, token) =
        call_with_progress(&c, "call_tool", args(json!({"tool_name": "test_tool_with_progress", "parameters": {}})))
            .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let progress = seen.progress.lock().unwrap().clone();
    assert_eq!(progress.len(), 3, "{progress:?}");
    assert!(progress.iter().all(|p| p.progress_token == token));
    let r = call(&c, "call_tool", json!({"tool_name": "test_sampling", "parameters": {"prompt": "hello"}})).await;
    assert_eq!(text(&r), "LLM response: echo of hello");
    call(&c, "call_tool", json!({"tool_name": "test_tool_with_logging", "parameters": {}})).await;
    assert_eq!(seen.logs.lock().unwrap().len(), 3);
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A client that answers sampling as itself. `B` holds its answer until released, so that
/// another session's call can be made while B's client is still answering.
#[derive(Clone)]
struct Named {
    name: &'static str,
    overlap: Overlap,
}

/// The events two overlapping calls are sequenced by.
#[derive(Clone, Default)]
struct Overlap {
    /// B's client was asked (and is answering until `release_b`).
    b_asked: Arc<tokio::sync::Notify>,
    release_b: Arc<tokio::sync::Notify>,
    b_answering: Arc<std::sync::atomic::AtomicBool>,
    /// A's client was asked while B's was answering.
    a_asked_meanwhile: Arc<std::sync::atomic::AtomicBool>,
}

impl ClientHandler for Named {
    fn get_info(&self) -> ClientConfig {
        let caps = ClientCapabilities::builder().enable_sampling().build();
        ClientConfig::new(caps, Implementation::new(self.name, "0"))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _c: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        use std::sync::atomic::Ordering::SeqCst;
        let o = &self.overlap;
        if self.name == "B" {
            o.b_answering.store(true, SeqCst);
            o.b_asked.notify_one();
            o.release_b.notified().await;
            o.b_answering.store(false, SeqCst);
        } else if o.b_answering.load(SeqCst) {
            o.a_asked_meanwhile.store(true, SeqCst);
        }
        let asked =
            serde_json::to_value(&params.messages[0].content).unwrap()["text"].as_str().unwrap_or_default().to_string();
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(format!("{} answers {asked}", self.name)),
            "m".into(),
        ))
    }
}

/// Two sessions call a tool that samples, on the same backend, one inside the other: B's call
/// asks its client, and while B's client is answering (held until A's call has returned), A's
/// call is made and asks too. Sequenced by those events, not by delays. Returns both results,
/// the gateway's metrics once they ended, and whether A's client was asked while B's answered.
async fn overlapping_asks(backend_toml: &str) -> (CallToolResult, CallToolResult, String, bool) {
    let toml = format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{backend_toml}");
    let app = gateway(&toml, EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let overlap = Overlap::default();
    let connect = |name| {
        let (url, overlap) = (url.clone(), overlap.clone());
        async move {
            Named { name, overlap }
                .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(url))
                .await
                .expect("client connects")
        }
    };
    let (a, b) = (connect("A").await, connect("B").await);
    let b_call = call(&b, "kit_ask", json!({"prompt": "from B"}));
    let a_call = async {
        overlap.b_asked.notified().await;
        let r = call(&a, "kit_ask", json!({"prompt": "from A"})).await;
        overlap.release_b.notify_one();
        r
    };
    let (ra, rb) = tokio::join!(a_call, b_call);
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    let metrics = app.gateway.render_metrics();
    app.shutdown().await;
    (ra, rb, metrics, overlap.a_asked_meanwhile.load(std::sync::atomic::Ordering::SeqCst))
}

#[tokio::test]
async fn sampling_goes_to_the_session_whose_call_asked() {
    let kit = http_backend("testkit").await;
    // On one connection shared by both sessions, the request's stream says whose call it is.
    let shared = format!("{}session = \"shared\"\n", http_backend_toml("kit", &kit.url));
    let (a, b, metrics, overlapped) = overlapping_asks(&shared).await;
    assert!(overlapped, "A's client was asked while B's was still answering");
    assert!(metrics.contains("toolmux_backend_requests_refused_total 0"), "{metrics}");
    assert_eq!(text(&a), "A answers from A", "session A's call is answered by A");
    assert_eq!(text(&b), "B answers from B");
}

#[tokio::test]
async fn sampling_with_no_link_to_its_call_is_refused_rather_than_guessed() {
    // Over stdio nothing says which call a backend request belongs to: with calls from two
    // sessions running, the gateway refuses instead of picking one.
    let (a, b, metrics, overlapped) = overlapping_asks(&stdio_backend_toml("kit", "testkit")).await;
    // B asked while its call was the only one: answered by B.
    assert_eq!(text(&b), "B answers from B");
    // A asks while B's call runs too: refused, and counted (never dropped in silence), and
    // A's client was never asked.
    assert_eq!(a.is_error, Some(true), "{}", text(&a));
    assert!(text(&a).contains("does not guess"), "{}", text(&a));
    assert!(!overlapped, "A's client was not asked");
    assert!(metrics.contains("toolmux_backend_requests_refused_total 1"), "{metrics}");
    // One session at a time, the only running call is the one that asked.
    let toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}", stdio_backend_toml("kit", "testkit"));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let a = Named { name: "A", overlap: Overlap::default() }
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
    assert_eq!(text(&call(&a, "kit_ask", json!({"prompt": "alone"})).await), "A answers alone");
    a.cancel().await.unwrap();
    app.shutdown().await;
}
