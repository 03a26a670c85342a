//! The session layer driven directly: its transport, streams, resumption and limits.

use futures::StreamExt;
use rmcp::model::{EmptyResult, ErrorData, ServerResult};
use serde_json::json;

use super::*;

fn sessions(idle_timeout: Duration) -> Sessions {
    let settings = Settings { idle_timeout, sse_retry: Some(Duration::from_secs(3)) };
    Sessions::new(settings, Arc::new(Registry::default()), None)
}

fn client(message: serde_json::Value) -> ClientJsonRpcMessage {
    serde_json::from_value(message).unwrap()
}

fn server(message: serde_json::Value) -> ServerJsonRpcMessage {
    serde_json::from_value(message).unwrap()
}

/// A request whose progress token is `p<id>`.
fn request(id: i64) -> ClientJsonRpcMessage {
    client(
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": {"progressToken": format!("p{id}")}}}),
    )
}

/// An answer to request `id`, told apart by `text`.
fn answer(id: i64, text: &'static str) -> ServerJsonRpcMessage {
    ServerJsonRpcMessage::error(ErrorData::internal_error(text, None), Some(RequestId::Number(id)))
}

fn progress(token: &str) -> ServerJsonRpcMessage {
    server(
        json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": 1}}),
    )
}

fn changed() -> ServerJsonRpcMessage {
    server(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
}

/// A session past its `initialize`, and the transport its service runs on.
async fn open(sessions: &Sessions) -> (SessionId, SessionTransport) {
    let (id, mut service) = sessions.create_session().await.unwrap();
    let initialize = client(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    let serve = async {
        let first = service.receive().await.unwrap();
        service
            .send(ServerJsonRpcMessage::response(ServerResult::EmptyResult(EmptyResult {}), RequestId::Number(0)))
            .await
            .unwrap();
        first
    };
    let (answered, first) = tokio::join!(sessions.initialize_session(&id, initialize), serve);
    assert!(matches!(answered.unwrap(), JsonRpcMessage::Response(r) if r.id == RequestId::Number(0)));
    assert!(matches!(first, JsonRpcMessage::Request(r) if r.id == RequestId::Number(0)));
    (id, service)
}

type Seen = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>>;

/// `<event id> <what>` for each event until the stream ends.
async fn all(stream: Seen) -> Vec<String> {
    stream.map(|e| said(&e)).collect().await
}

async fn next(stream: &mut Seen) -> String {
    said(&stream.next().await.expect("an event"))
}

fn said(event: &ServerSseMessage) -> String {
    let what = match &event.message {
        None => "prime".to_string(),
        Some(m) => {
            let m = serde_json::to_value(&**m).unwrap();
            match m.get("method") {
                Some(method) => {
                    format!("{} {}", method.as_str().unwrap(), m["params"]["progressToken"].as_str().unwrap_or(""))
                }
                None => format!("answer {} {}", m["id"], m["error"]["message"].as_str().unwrap()),
            }
        }
    };
    format!("{} {}", event.event_id.as_deref().unwrap_or("-"), what.trim_end())
}

async fn stream(sessions: &Sessions, id: &SessionId, message: ClientJsonRpcMessage) -> Seen {
    Box::pin(sessions.create_stream(id, message).await.unwrap())
}

async fn get(sessions: &Sessions, id: &SessionId) -> Seen {
    Box::pin(sessions.create_standalone_stream(id).await.unwrap())
}

async fn resume(sessions: &Sessions, id: &SessionId, last: &str) -> Result<Seen, SessionError> {
    Ok(Box::pin(sessions.resume(id, last.to_string()).await?))
}

#[tokio::test]
async fn each_request_s_stream_carries_its_own_progress_and_answer() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let one = stream(&sessions, &id, request(1)).await;
    let two = stream(&sessions, &id, request(2)).await;
    for want in [1, 2] {
        assert!(
            matches!(service.receive().await.unwrap(), JsonRpcMessage::Request(r) if r.id == RequestId::Number(want))
        );
    }
    for message in [progress("p2"), answer(2, "two"), progress("p1"), changed(), answer(1, "one")] {
        service.send(message).await.unwrap();
    }
    assert_eq!(all(one).await, ["0/0 prime", "1/0 notifications/progress p1", "2/0 answer 1 one"]);
    assert_eq!(all(two).await, ["0/1 prime", "1/1 notifications/progress p2", "2/1 answer 2 two"]);
    // Every event went out while the client listened: nothing is kept for a reconnection.
    assert!(matches!(resume(&sessions, &id, "1/1").await.err(), Some(SessionError::UnknownEvent(_))));
    // Sent while no one listened: the first GET gets it.
    let mut common = get(&sessions, &id).await;
    assert_eq!(next(&mut common).await, "1 notifications/tools/list_changed");
}

#[tokio::test]
async fn a_server_request_rides_the_stream_of_the_request_it_serves() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let mut one = stream(&sessions, &id, request(1)).await;
    let mut common = get(&sessions, &id).await;
    service.receive().await.unwrap();
    let roots = || server(json!({"jsonrpc": "2.0", "id": "s1", "method": "roots/list"}));
    let mut associated = roots();
    if let JsonRpcMessage::Request(r) = &mut associated {
        r.request.extensions_mut().insert(OriginatingRequestId(RequestId::Number(1)));
    }
    service.send(associated).await.unwrap();
    service.send(roots()).await.unwrap();
    assert_eq!(next(&mut one).await, "0/0 prime");
    assert_eq!(next(&mut one).await, "1/0 roots/list");
    assert_eq!(next(&mut common).await, "1 roots/list");
}

#[tokio::test]
async fn a_client_that_reconnects_gets_what_it_missed_and_nothing_twice() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let mut one = stream(&sessions, &id, request(1)).await;
    service.receive().await.unwrap();
    service.send(progress("p1")).await.unwrap();
    assert_eq!(next(&mut one).await, "0/0 prime");
    assert_eq!(next(&mut one).await, "1/0 notifications/progress p1");
    drop(one);
    service.send(progress("p1")).await.unwrap();
    service.send(answer(1, "one")).await.unwrap();
    let again = resume(&sessions, &id, "1/0").await.unwrap();
    assert_eq!(all(again).await, ["2/0 notifications/progress p1", "3/0 answer 1 one"]);
    // The request is over: its stream can still be replayed, and ends after the replay.
    assert_eq!(all(resume(&sessions, &id, "3/0").await.unwrap()).await, Vec::<String>::new());
    assert!(matches!(resume(&sessions, &id, "0/7").await.err(), Some(SessionError::UnknownEvent(_))));
    assert!(matches!(resume(&sessions, &id, "seven").await.err(), Some(SessionError::UnknownEvent(_))));

    let mut common = get(&sessions, &id).await;
    service.send(changed()).await.unwrap();
    assert_eq!(next(&mut common).await, "1 notifications/tools/list_changed");
    drop(common);
    service.send(changed()).await.unwrap();
    service.send(changed()).await.unwrap();
    let mut common = resume(&sessions, &id, "1").await.unwrap();
    assert_eq!(next(&mut common).await, "2 notifications/tools/list_changed");
    assert_eq!(next(&mut common).await, "3 notifications/tools/list_changed");
}

#[tokio::test]
async fn a_second_get_is_kept_open_without_taking_the_notifications() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let mut first = get(&sessions, &id).await;
    let mut second = get(&sessions, &id).await;
    service.send(changed()).await.unwrap();
    assert_eq!(next(&mut first).await, "1 notifications/tools/list_changed");
    assert!(futures::FutureExt::now_or_never(second.next()).is_none(), "the shadow stream got an event");
    drop(first);
    service.send(changed()).await.unwrap();
    let mut third = get(&sessions, &id).await;
    assert_eq!(next(&mut third).await, "2 notifications/tools/list_changed");
    assert!(futures::FutureExt::now_or_never(second.next()).is_none(), "the shadow stream got an event");
}

#[tokio::test]
async fn two_sessions_never_see_each_other_s_messages() {
    let sessions = sessions(Duration::from_secs(60));
    let (a, mut service_a) = open(&sessions).await;
    let (b, mut service_b) = open(&sessions).await;
    // The same request id in both.
    let for_a = stream(&sessions, &a, request(1)).await;
    let for_b = stream(&sessions, &b, request(1)).await;
    let mut common_b = get(&sessions, &b).await;
    service_a.receive().await.unwrap();
    service_b.receive().await.unwrap();
    service_a.send(changed()).await.unwrap();
    service_a.send(answer(1, "for a")).await.unwrap();
    assert_eq!(all(for_a).await, ["0/0 prime", "1/0 answer 1 for a"]);
    // A ends; B goes on as before and has seen nothing of A's.
    sessions.close_session(&a).await.unwrap();
    assert!(service_a.receive().await.is_none(), "A's service is told its session ended");
    service_b.send(answer(1, "for b")).await.unwrap();
    assert_eq!(all(for_b).await, ["0/0 prime", "1/0 answer 1 for b"]);
    assert!(futures::FutureExt::now_or_never(common_b.next()).is_none(), "A's notification reached B");
    assert_eq!((sessions.count(), sessions.holds(&b), sessions.holds(&a)), (1, true, false));
}

#[tokio::test]
async fn closing_a_session_ends_its_streams_and_refuses_more() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let one = stream(&sessions, &id, request(1)).await;
    let common = get(&sessions, &id).await;
    service.receive().await.unwrap();
    sessions.close_session(&id).await.unwrap();
    assert_eq!(all(one).await, ["0/0 prime"]);
    assert_eq!(all(common).await, Vec::<String>::new());
    assert!(service.receive().await.is_none());
    assert!(matches!(service.send(changed()).await, Err(SessionError::Ended(_))));
    assert!(!sessions.has_session(&id).await.unwrap());
    assert!(matches!(sessions.create_stream(&id, request(2)).await.err(), Some(SessionError::NotFound(_))));
    assert!(matches!(sessions.accept_message(&id, changed_by_client()).await, Err(SessionError::NotFound(_))));
}

fn changed_by_client() -> ClientJsonRpcMessage {
    client(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
}

#[tokio::test]
async fn a_cancelled_request_s_stream_ends() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let one = stream(&sessions, &id, request(1)).await;
    service.receive().await.unwrap();
    let cancel = client(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}));
    sessions.accept_message(&id, cancel).await.unwrap();
    assert_eq!(all(one).await, ["0/0 prime"]);
    assert!(matches!(service.receive().await.unwrap(), JsonRpcMessage::Notification(_)), "the service is told too");
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_ends_unless_a_request_is_running() {
    let idle = Duration::from_secs(10);
    let sessions = sessions(idle);
    let (_, mut quiet) = open(&sessions).await;
    let started = Instant::now();
    assert!(quiet.receive().await.is_none());
    assert!(started.elapsed() >= idle);

    let (id, mut busy) = open(&sessions).await;
    let one = stream(&sessions, &id, request(1)).await;
    busy.receive().await.unwrap();
    // An hour (of the paused clock) with the request running: the session stays.
    let waited = tokio::time::timeout(Duration::from_secs(3600), busy.receive()).await;
    assert!(waited.is_err(), "the session ended with a request running");
    busy.send(answer(1, "done")).await.unwrap();
    assert_eq!(all(one).await.len(), 2);
    let started = Instant::now();
    assert!(busy.receive().await.is_none());
    assert!(started.elapsed() >= idle);
}

/// A client that keeps its stream's connection open but stops reading: the session goes on
/// (each event waits at most SEND_WAIT, once), DELETE ends it, and the client can resume
/// what it missed.
#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_does_not_wedge_its_session() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, mut service) = open(&sessions).await;
    let stuck = stream(&sessions, &id, request(1)).await;
    service.receive().await.unwrap();
    let sent = async {
        for _ in 0..(3 * KEPT_EVENTS) {
            service.send(progress("p1")).await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), sent).await.expect("the service was held up by a stuck client");
    let from = format!("{}/0", 3 * KEPT_EVENTS - 2);
    let mut again = resume(&sessions, &id, &from).await.unwrap();
    assert_eq!(next(&mut again).await, format!("{}/0 notifications/progress p1", 3 * KEPT_EVENTS - 1));
    let closed = tokio::time::timeout(Duration::from_secs(10), sessions.close_session(&id)).await;
    assert!(closed.is_ok(), "DELETE waited on a client that stopped reading");
    drop(stuck);
}

#[tokio::test]
async fn a_last_event_id_at_the_end_of_the_counter_is_refused_not_wrapped() {
    let sessions = sessions(Duration::from_secs(60));
    let (id, _service) = open(&sessions).await;
    for last in [usize::MAX.to_string(), format!("{}/0", usize::MAX)] {
        assert!(matches!(resume(&sessions, &id, &last).await.err(), Some(SessionError::UnknownEvent(_))), "{last}");
    }
}

/// A finished request's stream kept for its client is forgotten after its minute even when
/// the session sees no other request.
#[tokio::test(start_paused = true)]
async fn a_finished_stream_is_forgotten_on_time_without_another_request() {
    let sessions = sessions(Duration::from_secs(3600));
    let (id, mut service) = open(&sessions).await;
    let one = stream(&sessions, &id, request(1)).await;
    service.receive().await.unwrap();
    drop(one);
    service.send(answer(1, "missed")).await.unwrap();
    let session = sessions.get(&id).unwrap();
    assert_eq!(session.state.lock().await.requests.len(), 1, "kept for its client to resume");
    let serving = tokio::spawn(async move { service.receive().await });
    tokio::time::sleep(COMPLETED_TTL + Duration::from_secs(1)).await;
    assert_eq!(session.state.lock().await.requests.len(), 0, "still kept past its minute");
    serving.abort();
}
