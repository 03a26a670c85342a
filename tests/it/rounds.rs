//! Input rounds across protocol revisions: the testkit backend's `ask` needs the client's model
//! mid-call, asking with a sampling request (2025-11-25) or an input-required result
//! (2026-07-28). Each pair of client and backend revision gets the answers through, with real
//! rmcp clients and servers (the table is in `mcp::rounds`).

#![allow(deprecated, reason = "sampling is what the rounds carry")]

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CreateMessageResult, InputResponses, SamplingMessage};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice};

use crate::harness::*;
use crate::relay::Answering;

type Answerer = RunningService<RoleClient, Answering>;

async fn gateway_with(mode: &str, protocol: &str) -> (App, HttpBackend) {
    gateway_with_extra(mode, protocol, "").await
}

async fn gateway_with_extra(mode: &str, protocol: &str, extra: &str) -> (App, HttpBackend) {
    let kit = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n{extra}[[backends]]\nname = \"kit\"\nurl = \"{}\"\nprotocol = \"{protocol}\"\n",
        kit.url
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let stateless = app.gateway.upstream.get("kit").unwrap().is_stateless();
    assert_eq!(stateless, protocol == "2026-07-28", "the backend speaks {protocol}");
    (app, kit)
}

/// A 2025-11-25 client: a session, and it answers sampling requests.
async fn session_client(app: &App) -> Answerer {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    Answering::default().serve(rmcp::transport::StreamableHttpClientTransport::from_uri(url)).await.unwrap()
}

/// A 2026-07-28 client that answers sampling; `token` decides who it is.
async fn answering_stateless_client(app: &App, token: &str) -> Answerer {
    stateless_client(app, Answering::default(), Some(token)).await
}

fn ask(mode: &str, rounds: u64) -> CallToolRequestParams {
    let args = json!({"prompt": "what now", "rounds": rounds});
    match mode {
        "optimizer" => CallToolRequestParams::new("call_tool")
            .with_arguments(json!({"tool_name": "kit_ask", "parameters": args}).as_object().unwrap().clone()),
        _ => CallToolRequestParams::new("kit_ask").with_arguments(args.as_object().unwrap().clone()),
    }
}

fn result_text(r: &CallToolResponse) -> String {
    match r {
        CallToolResponse::Complete(r) => text(r),
        other => panic!("expected a complete result, got {other:?}"),
    }
}

/// The answer the test's model gives, as an input response.
fn answered(keys: impl IntoIterator<Item = String>) -> InputResponses {
    let answer = CreateMessageResult::new(SamplingMessage::assistant_text("echo of what now"), "test-model".into());
    keys.into_iter().map(|k| (k, serde_json::to_value(&answer).unwrap())).collect()
}

#[tokio::test]
async fn session_client_and_session_backend() {
    let (app, _kit) = gateway_with("passthrough", "2025-11-25").await;
    let c = session_client(&app).await;
    let r = c.call_tool(ask("passthrough", 2)).await.unwrap();
    assert_eq!(text(&r), "echo of what now | echo of what now");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// The backend answers input-required; the gateway asks its session client and retries.
#[tokio::test]
async fn session_client_and_stateless_backend() {
    let (app, _kit) = gateway_with("passthrough", "2026-07-28").await;
    let c = session_client(&app).await;
    let r = c.peer().call_tool_once(ask("passthrough", 2)).await.unwrap();
    assert_eq!(result_text(&r), "echo of what now | echo of what now", "the client saw requests, not rounds");
    // The rounds are capped.
    let r = c.call_tool(ask("passthrough", 11)).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("more than 10 times"), "{}", text(&r));
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// The backend asks with a request the client cannot be sent: the gateway parks the call and
/// answers input-required; the retry's answers resume the backend's request.
async fn stateless_client_and_session_backend_in(mode: &str) {
    // Two authenticated callers: a parked call is its caller's alone.
    let (app, _kit) = gateway_with_extra(mode, "2025-11-25", &bearer_auth(&["alice", "mallory"])).await;
    let c = answering_stateless_client(&app, "alice").await;
    let mut params = ask(mode, 2);
    let mut rounds = 0;
    let mut used_states = Vec::new();
    let answer = loop {
        match c.peer().call_tool_once(params.clone()).await.unwrap() {
            CallToolResponse::InputRequired(r) => {
                rounds += 1;
                let requests = r.input_requests.expect("the backend's question");
                assert_eq!(requests.len(), 1);
                let request = serde_json::to_value(requests.values().next().unwrap()).unwrap();
                assert_eq!(request["method"], "sampling/createMessage", "{request}");
                let state = r.request_state.expect("a request state naming the parked call");
                used_states.push(state.clone());
                params.input_responses = Some(answered(requests.keys().cloned()));
                params.request_state = Some(state);
            }
            done => break result_text(&done),
        }
        assert!(rounds <= 2, "more rounds than the backend asked for");
    };
    assert_eq!(rounds, 2);
    assert_eq!(answer, "echo of what now | echo of what now");
    assert_eq!(app.gateway.parked.len(), 0, "nothing left waiting");

    // A state is good once, and only for the caller it was issued to.
    params.request_state = used_states.first().cloned();
    let replay = c.peer().call_tool_once(params.clone()).await;
    assert!(refused(&replay), "a used state: {replay:?}");
    let mut fresh = ask(mode, 1);
    let CallToolResponse::InputRequired(r) = c.peer().call_tool_once(fresh.clone()).await.unwrap() else {
        panic!("input required")
    };
    let keys = r.input_requests.unwrap().keys().cloned().collect::<Vec<_>>();
    fresh.input_responses = Some(answered(keys));
    fresh.request_state = r.request_state;
    let mallory = answering_stateless_client(&app, "mallory").await;
    let stolen = mallory.peer().call_tool_once(fresh.clone()).await;
    assert!(refused(&stolen), "another caller's state: {stolen:?}");
    let r = c.peer().call_tool_once(fresh).await.unwrap();
    assert_eq!(result_text(&r), "echo of what now", "still the owner's to resume");
    c.cancel().await.unwrap();
    mallory.cancel().await.unwrap();
    app.shutdown().await;
}

fn refused(r: &Result<CallToolResponse, rmcp::ServiceError>) -> bool {
    match r {
        Err(rmcp::ServiceError::McpError(e)) => e.message.contains("names no call waiting"),
        Ok(CallToolResponse::Complete(r)) => r.is_error == Some(true) && text(r).contains("names no call waiting"),
        _ => false,
    }
}

#[tokio::test]
async fn stateless_client_and_session_backend() {
    stateless_client_and_session_backend_in("passthrough").await;
}

#[tokio::test]
async fn stateless_client_and_session_backend_through_call_tool() {
    stateless_client_and_session_backend_in("optimizer").await;
}

/// Both speak 2026-07-28: the backend's input-required result reaches the client unchanged, and
/// the client's retry reaches the backend unchanged.
#[tokio::test]
async fn stateless_client_and_stateless_backend() {
    let (app, _kit) = gateway_with("passthrough", "2026-07-28").await;
    let c = answering_stateless_client(&app, "alice").await;
    let mut params = ask("passthrough", 1);
    let CallToolResponse::InputRequired(r) = c.peer().call_tool_once(params.clone()).await.unwrap() else {
        panic!("input required")
    };
    let requests = r.input_requests.unwrap();
    assert_eq!(requests.keys().collect::<Vec<_>>(), vec!["answer"], "the backend's own key");
    let state = r.request_state.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&state).unwrap(), json!([]), "the backend's own state");
    params.input_responses = Some(answered(["answer".to_string()]));
    params.request_state = Some(state);
    let r = c.peer().call_tool_once(params).await.unwrap();
    assert_eq!(result_text(&r), "echo of what now");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A client that declared no sampling is never asked for it: a 2025-11-25 backend's request is
/// refused with -32021, and a 2026-07-28 backend is told what the client declared (not what the
/// gateway could relay), so it refuses too.
#[tokio::test]
async fn a_client_that_cannot_sample_is_not_asked_to() {
    for protocol in ["2025-11-25", "2026-07-28"] {
        let (app, _kit) = gateway_with("passthrough", protocol).await;
        let c = stateless_client(&app, Recorder::default(), None).await;
        let r = c.peer().call_tool_once(ask("passthrough", 1)).await.unwrap();
        let CallToolResponse::Complete(r) = r else { panic!("{protocol}: no input round for it: {r:?}") };
        assert_eq!(r.is_error, Some(true), "{protocol}");
        assert!(
            text(&r).contains("did not declare"),
            "{protocol}: the backend learns the client cannot sample: {}",
            text(&r)
        );
        assert_eq!(app.gateway.parked.len(), 0);
        c.cancel().await.unwrap();
        app.shutdown().await;
    }
}

/// A 2026-07-28 backend has no session to push list changes on: toolmux holds a
/// `subscriptions/listen` stream open, and a change there reaches the catalog.
#[tokio::test]
async fn a_stateless_backends_list_change_reaches_the_gateway() {
    let (app, _kit) = gateway_with("passthrough", "2026-07-28").await;
    let c = session_client(&app).await;
    let r = c
        .call_tool(
            CallToolRequestParams::new("kit_add_tool")
                .with_arguments(json!({"name": "fresh"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(text(&r), "added tool fresh");
    assert!(
        eventually(std::time::Duration::from_secs(10), || async {
            c.list_all_tools().await.unwrap().iter().any(|t| t.name == "kit_fresh")
        })
        .await,
        "the new tool is listed"
    );
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A parked call whose client never comes back is not left running at the backend: when its wait
/// expires (the backend's timeout), the backend gets `notifications/cancelled` for it.
#[tokio::test]
async fn an_abandoned_parked_call_is_cancelled_at_the_backend() {
    let kit = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[[backends]]\nname = \"kit\"\nurl = \"{}\"\ntimeout = \"1s\"\n",
        kit.url
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let c = answering_stateless_client(&app, "alice").await;
    let r = c.peer().call_tool_once(ask("passthrough", 1)).await.unwrap();
    assert!(matches!(r, CallToolResponse::InputRequired(_)), "parked: {r:?}");
    assert_eq!(app.gateway.parked.len(), 1);
    let observer = session_client(&app).await;
    let cancelled = || async { text(&call(&observer, "kit_cancelled_calls", json!({})).await) };
    assert_eq!(cancelled().await, "0", "still waiting for its client");
    // The client never retries.
    let ended = eventually(std::time::Duration::from_secs(10), || async {
        app.gateway.parked.is_empty() && cancelled().await == "1"
    })
    .await;
    assert!(ended, "the expired call was cancelled at the backend: {} cancelled", cancelled().await);
    c.cancel().await.unwrap();
    observer.cancel().await.unwrap();
    app.shutdown().await;
}

/// A caller without a session has `server.max_calls_per_session` calls at once, counted by
/// principal: with one place, alice's parked call (it waits for her answer) holds it, so her next
/// call is refused naming the key, while bob's goes through; her answer frees the place.
#[tokio::test]
async fn a_caller_without_a_session_has_a_bounded_number_of_calls() {
    let extra = format!("max_calls_per_session = 1\n{}", bearer_auth(&["alice", "bob"]));
    let (app, _kit) = gateway_with_extra("passthrough", "2025-11-25", &extra).await;
    let alice = answering_stateless_client(&app, "alice").await;
    let CallToolResponse::InputRequired(parked) = alice.peer().call_tool_once(ask("passthrough", 1)).await.unwrap()
    else {
        panic!("expected the backend's question");
    };
    let echo =
        || CallToolRequestParams::new("kit_echo").with_arguments(json!({"input": "x"}).as_object().unwrap().clone());
    let refused = alice.peer().call_tool_once(echo()).await.unwrap();
    let CallToolResponse::Complete(refused) = refused else { panic!("expected a tool error") };
    assert_eq!(refused.is_error, Some(true));
    assert!(text(&refused).contains("server.max_calls_per_session"), "{}", text(&refused));
    let bob = answering_stateless_client(&app, "bob").await;
    assert_eq!(
        result_text(&bob.peer().call_tool_once(echo()).await.unwrap()),
        "x",
        "another caller has places of his own"
    );
    // Alice answers: her call ends and frees its place.
    let mut retry = ask("passthrough", 1);
    retry.input_responses = Some(answered(parked.input_requests.unwrap().keys().cloned()));
    retry.request_state = parked.request_state;
    assert_eq!(result_text(&alice.peer().call_tool_once(retry).await.unwrap()), "echo of what now");
    assert_eq!(result_text(&alice.peer().call_tool_once(echo()).await.unwrap()), "x");
}
