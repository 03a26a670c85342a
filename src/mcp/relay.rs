//! Traffic a backend starts during a client's call, carried to that client and back: sampling
//! and elicitation requests, progress and log notifications; and resource updates, carried to
//! the sessions that subscribed.
//!
//! A forwarded call registers itself ([`Hub::begin_call`]) with the connection it travels on, for
//! as long as it runs, and learns the id and progress token rmcp gives the forwarded request
//! ([`CallGuard::sent`]). Ids a backend sees are only unique on one connection, so everything
//! is keyed by (connection, id).
//!
//! A client session's own upstream sessions (`per_client` backends) route by construction: their
//! traffic comes through a [`SessionRelay`] bound to that session, and goes to its calls or,
//! with none running, to the session itself (its standalone stream). The rules below are for the
//! gateway's shared connections ([`Hub`]).
//!
//! - Progress is routed by (connection, token): the backend reports under the forwarded
//!   request's token, which maps back to the client's own, so two sessions using the same token
//!   never see each other's.
//! - A backend request (sampling, elicitation) that arrived on the response stream of one of our
//!   calls (streamable HTTP backends, SEP-2260) goes to exactly that call's client, and rides
//!   the stream of the client's own `tools/call` there too.
//! - A backend request with no such link (stdio backends, an HTTP backend's standalone stream),
//!   and every log line, goes to the one client session with calls running on that backend. If
//!   calls from several sessions are running, nothing on the wire says which one it belongs to:
//!   a request is refused with an error the backend sees, a log line is dropped. Sending one
//!   client's prompt to another client would be worse than either. (A `per_client` backend never
//!   meets this.) A log line is passed on only at or above the session's `logging/setLevel`.
//! - A client without a session (2026-07-28) cannot be sent a request at all: a backend request
//!   for such a call is handed to the call itself as an [`Ask`], which answers its client with an
//!   input-required result and the backend once the client retries (`mcp::rounds`).

#![expect(deprecated, reason = "sampling and logging are relayed as the backends use them")]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    ClientResult, InputRequest, LoggingMessageNotificationParam, NumberOrString, ProgressNotificationParam,
    ProgressToken, RequestId, ResourceUpdatedNotificationParam, ServerRequest,
};
use rmcp::service::{OriginatingRequestId, Peer, RoleServer};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::session::LogLevel;
use crate::upstream::{Relay, Source, request_name};

/// How long a backend request naming one of our calls waits for that call to finish registering
/// (the request can overtake [`CallGuard::sent`] by a scheduling step).
const REGISTRATION_GRACE: Duration = Duration::from_millis(100);

/// Notifications of one call (progress, log lines) waiting to be sent to its client. A backend
/// that sends faster than the client takes them loses the excess here rather than growing the
/// gateway's memory; the call's result is not a notification and is never lost.
const RELAY_QUEUE: usize = 256;

/// A backend's request for the client's input, handed to the call it belongs to.
pub struct Ask {
    pub request: InputRequest,
    /// The client's answer (a `CreateMessageResult`, `ElicitResult`, … as JSON), or why none.
    pub reply: oneshot::Sender<Result<Value, ErrorData>>,
}

struct Call {
    id: u64,
    /// The client session, or `None` for a stateless request (a client of its own).
    session: Option<u64>,
    peer: Peer<RoleServer>,
    /// The client's `tools/call` request id: backend requests ride its response stream.
    client_request: RequestId,
    /// The forwarded request's id on the backend connection, once sent.
    backend_request: Option<RequestId>,
    /// Notifications for the client, sent by the call's own request task (so that rmcp puts
    /// them on that request's response stream).
    tx: mpsc::Sender<Relayed>,
    /// For a client without a session: where backend requests go instead of to the client.
    asks: Option<mpsc::UnboundedSender<Ask>>,
    /// The session's chosen log level.
    level: Option<Arc<LogLevel>>,
}

/// A notification to pass to the client of a call.
#[derive(Debug)]
pub enum Relayed {
    Progress(ProgressNotificationParam),
    Log(LoggingMessageNotificationParam),
}

impl Relayed {
    /// Without the secrets `backend` put in it (`[results] scrub`): a log message's data, a
    /// progress message.
    pub fn scrubbed(mut self, scrubbing: &crate::scrub::Scrubbing, backend: &str) -> Self {
        match &mut self {
            Relayed::Progress(p) => {
                if let Some(m) = &mut p.message {
                    scrubbing.text(backend, m);
                }
            }
            Relayed::Log(l) => _ = scrubbing.value(backend, &mut l.data),
        }
        self
    }

    /// Sends it to the client, from the caller's task.
    pub async fn send(self, peer: &Peer<RoleServer>) {
        let _ = match self {
            Relayed::Progress(p) => peer.notify_progress(p).await,
            Relayed::Log(l) => peer.notify_logging_message(l).await,
        };
    }
}

/// Where one piece of backend traffic goes.
struct Target {
    peer: Peer<RoleServer>,
    client_request: RequestId,
    tx: mpsc::Sender<Relayed>,
    asks: Option<mpsc::UnboundedSender<Ask>>,
    level: Option<Arc<LogLevel>>,
}

/// Why backend traffic has nowhere to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unroutable {
    /// No call is running on the backend (or none with the id the request named).
    NoCall,
    /// Calls from this many client sessions are running, and nothing says which one it is for.
    Ambiguous(usize),
}

#[derive(Default)]
pub struct Hub {
    next: AtomicU64,
    /// Calls running, by connection, oldest first.
    calls: Mutex<HashMap<u64, Vec<Call>>>,
    /// (connection, forwarded request's progress token) → (the call's channel, the client's own token).
    progress: Mutex<HashMap<(u64, String), ProgressRoute>>,
    /// Resource URI → sessions subscribed to it.
    subscriptions: Mutex<HashMap<String, Vec<Peer<RoleServer>>>>,
    /// Backend requests refused because they could not be tied to exactly one client.
    pub refused: AtomicU64,
}

/// Where progress under one forwarded token goes: the call's channel, and the client's own token.
type ProgressRoute = (mpsc::Sender<Relayed>, ProgressToken);

/// Unregisters a call when it ends, however it ends.
pub struct CallGuard {
    hub: Arc<Hub>,
    conn: u64,
    id: u64,
    /// The backend-side progress token routed to this call.
    token: Mutex<Option<(u64, String)>>,
    client_token: Option<ProgressToken>,
    tx: mpsc::Sender<Relayed>,
}

impl CallGuard {
    /// Records the forwarded request's id and progress token on the backend connection, so that
    /// the backend's requests and progress for it find this call's client.
    pub fn sent(&self, backend_request: &RequestId, backend_token: &ProgressToken) {
        if let Some(call) = self
            .hub
            .calls
            .lock()
            .expect("relay lock")
            .get_mut(&self.conn)
            .and_then(|calls| calls.iter_mut().find(|c| c.id == self.id))
        {
            call.backend_request = Some(backend_request.clone());
        }
        let Some(original) = self.client_token.clone() else { return };
        let key = (self.conn, token_key(backend_token));
        self.hub.progress.lock().expect("relay lock").insert(key.clone(), (self.tx.clone(), original));
        *self.token.lock().expect("relay lock") = Some(key);
    }
}

fn token_key(t: &ProgressToken) -> String {
    match &t.0 {
        NumberOrString::String(s) => s.to_string(),
        NumberOrString::Number(n) => n.to_string(),
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut calls = self.hub.calls.lock().expect("relay lock");
        if let Some(on_conn) = calls.get_mut(&self.conn) {
            on_conn.retain(|c| c.id != self.id);
            if on_conn.is_empty() {
                calls.remove(&self.conn);
            }
        }
        drop(calls);
        if let Some(t) = self.token.lock().expect("relay lock").take() {
            self.hub.progress.lock().expect("relay lock").remove(&t);
        }
    }
}

impl Hub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers a call on connection `conn` made by `client`. The receiver yields the
    /// notifications to send to the client while the call runs; progress goes back under
    /// `client.token`, once [`CallGuard::sent`] names the token the backend will use. With
    /// `asks`, backend requests for this call are handed over there instead of sent to the client.
    pub fn begin_call(
        self: &Arc<Self>,
        conn: u64,
        client: CallClient,
        asks: Option<mpsc::UnboundedSender<Ask>>,
    ) -> (CallGuard, mpsc::Receiver<Relayed>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(RELAY_QUEUE);
        let client_token = client.token;
        self.calls.lock().expect("relay lock").entry(conn).or_default().push(Call {
            id,
            session: client.session,
            peer: client.peer,
            client_request: client.request,
            backend_request: None,
            tx: tx.clone(),
            asks,
            level: client.level,
        });
        let guard = CallGuard { hub: self.clone(), conn, id, token: Mutex::new(None), client_token, tx };
        (guard, rx)
    }

    /// The call that traffic on connection `conn` belongs to: the one whose forwarded request is
    /// `origin`, or, with no origin, the calls of the only session with calls running on it.
    fn route(&self, conn: u64, origin: Option<&RequestId>) -> Result<Target, Unroutable> {
        let calls = self.calls.lock().expect("relay lock");
        let running = calls.get(&conn).map(Vec::as_slice).unwrap_or_default();
        let target = |c: &Call| Target {
            peer: c.peer.clone(),
            client_request: c.client_request.clone(),
            tx: c.tx.clone(),
            asks: c.asks.clone(),
            level: c.level.clone(),
        };
        if let Some(origin) = origin {
            return running
                .iter()
                .find(|c| c.backend_request.as_ref() == Some(origin))
                .map(target)
                .ok_or(Unroutable::NoCall);
        }
        // Each session counts once; each stateless request is a client of its own.
        let mut sessions = HashSet::new();
        let clients = running.iter().filter(|c| c.session.is_none_or(|s| sessions.insert(s))).count();
        match (running.last(), clients) {
            (None, _) => Err(Unroutable::NoCall),
            (Some(c), 1) => Ok(target(c)),
            (Some(_), n) => Err(Unroutable::Ambiguous(n)),
        }
    }

    /// [`Hub::route`] for a backend request, giving a call that is still registering a moment.
    async fn route_request(&self, conn: u64, origin: Option<&RequestId>) -> Result<Target, Unroutable> {
        let deadline = tokio::time::Instant::now() + REGISTRATION_GRACE;
        loop {
            match self.route(conn, origin) {
                Err(Unroutable::NoCall) if origin.is_some() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                other => return other,
            }
        }
    }

    pub fn subscribe(&self, uri: &str, peer: Peer<RoleServer>) {
        let mut subs = self.subscriptions.lock().expect("relay lock");
        let list = subs.entry(uri.to_string()).or_default();
        list.retain(|p| !p.is_transport_closed());
        list.push(peer);
    }

    /// Drops `peer`'s subscription; true if no session is subscribed to `uri` any more.
    pub fn unsubscribe(&self, uri: &str, peer: &Peer<RoleServer>) -> bool {
        let mut subs = self.subscriptions.lock().expect("relay lock");
        let Some(list) = subs.get_mut(uri) else { return true };
        if let Some(i) = list.iter().position(|p| same_peer(p, peer)) {
            list.remove(i);
        }
        list.retain(|p| !p.is_transport_closed());
        let empty = list.is_empty();
        if empty {
            subs.remove(uri);
        }
        empty
    }
}

/// Peers have no identity of their own; two handles are the same session if they share the
/// client's initialize parameters object.
fn same_peer(a: &Peer<RoleServer>, b: &Peer<RoleServer>) -> bool {
    match (a.peer_info(), b.peer_info()) {
        (Some(x), Some(y)) => Arc::ptr_eq(&x, &y),
        _ => false,
    }
}

fn unroutable(what: &str, backend: &str, why: Unroutable) -> ErrorData {
    let message = match why {
        Unroutable::NoCall => {
            format!("backend `{backend}` sent {what} outside any client call; nothing to relay it to")
        }
        Unroutable::Ambiguous(n) => format!(
            "backend `{backend}` sent {what} while calls from {n} client sessions were running on it, and its \
             transport does not say which call it belongs to; the gateway does not guess which client to ask"
        ),
    };
    ErrorData::internal_error(message, None)
}

/// Asks the client of `target` for its input: as a request on the response stream of the
/// client's call, or, for a client without a session, through the call's [`Ask`] channel.
async fn ask_client(target: Target, request: InputRequest) -> Result<Value, ErrorData> {
    if let Some(asks) = target.asks {
        let (reply, answer) = oneshot::channel();
        asks.send(Ask { request, reply })
            .map_err(|_| ErrorData::internal_error("the client's call has ended; nothing to ask", None))?;
        return answer.await.map_err(|_| ErrorData::internal_error("the client did not answer in time", None))?;
    }
    let answer = ask(&target.peer, target.client_request, server_request(request)?).await?;
    serde_json::to_value(answer).map_err(|e| ErrorData::internal_error(e.to_string(), None))
}

/// The server-to-client request an input request stands for.
pub fn server_request(request: InputRequest) -> Result<ServerRequest, ErrorData> {
    match request {
        InputRequest::CreateMessage(r) => Ok(ServerRequest::CreateMessageRequest(r)),
        InputRequest::Elicitation(r) => Ok(ServerRequest::ElicitRequest(r)),
        InputRequest::ListRoots(r) => Ok(ServerRequest::ListRootsRequest(r)),
        other => Err(ErrorData::invalid_params(format!("an input request the gateway cannot relay: {other:?}"), None)),
    }
}

/// Sends `request` to a session client, on the response stream of its request `client_request`.
pub async fn ask(
    peer: &Peer<RoleServer>,
    client_request: RequestId,
    mut request: ServerRequest,
) -> Result<ClientResult, ErrorData> {
    use rmcp::model::GetExtensions;
    let peer = peer.clone();
    request.extensions_mut().insert(OriginatingRequestId(client_request));
    // rmcp stamps a request sent from inside a request handler with that request's id; this
    // runs inside the handler of the backend's request, whose id means nothing to the client.
    // A task of its own keeps the stamp set above.
    tokio::spawn(async move { peer.send_request(request).await })
        .await
        .map_err(|e| ErrorData::internal_error(format!("relaying to the client failed: {e}"), None))?
        .map_err(service_error)
}

impl Hub {
    /// Progress from connection `conn`, to the call whose forwarded request carries its token.
    fn relay_progress(&self, conn: u64, mut params: ProgressNotificationParam) {
        let key = (conn, token_key(&params.progress_token));
        let Some((tx, original)) = self.progress.lock().expect("relay lock").get(&key).cloned() else {
            return;
        };
        params.progress_token = original;
        let _ = tx.try_send(Relayed::Progress(params));
    }
}

/// The gateway's shared connections: traffic goes by the rules at the top of this module.
impl Relay for Hub {
    fn ask<'a>(
        &'a self,
        from: Source<'a>,
        origin: Option<RequestId>,
        request: InputRequest,
    ) -> BoxFuture<'a, Result<Value, ErrorData>> {
        Box::pin(async move {
            let what = request_name(&request);
            let target = self.route_request(from.conn, origin.as_ref()).await.map_err(|why| {
                // Never dropped in silence: the backend gets an error, the operator a line and a count.
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    backend = from.backend,
                    request = what,
                    ?why,
                    "a backend request was refused: no single client it belongs to"
                );
                unroutable(what, from.backend, why)
            })?;
            ask_client(target, request).await
        })
    }

    fn progress(&self, from: Source<'_>, params: ProgressNotificationParam) {
        self.relay_progress(from.conn, params);
    }

    fn logging(&self, from: Source<'_>, params: LoggingMessageNotificationParam) {
        match self.route(from.conn, None) {
            Ok(target) if target.level.as_ref().is_none_or(|l| l.allows(params.level)) => {
                let _ = target.tx.try_send(Relayed::Log(params));
            }
            Ok(_) => {}
            Err(why) => tracing::debug!(backend = from.backend, ?why, "backend log message not relayed"),
        }
    }

    fn resource_updated(&self, _from: Source<'_>, uri: &str) {
        let peers = self.subscriptions.lock().expect("relay lock").get(uri).cloned().unwrap_or_default();
        for peer in peers {
            let params = ResourceUpdatedNotificationParam::new(uri.to_string());
            tokio::spawn(async move {
                let _ = peer.notify_resource_updated(params).await;
            });
        }
    }
}

/// Who makes a call, for [`Hub::begin_call`].
pub struct CallClient {
    /// The client session, or `None` for a stateless request (a client of its own).
    pub session: Option<u64>,
    pub peer: Peer<RoleServer>,
    /// The client's `tools/call` request id: backend requests ride its response stream.
    pub request: RequestId,
    /// The client's progress token, if it asked for progress.
    pub token: Option<ProgressToken>,
    pub level: Option<Arc<LogLevel>>,
}

/// The relay of one client session's own upstream sessions: everything they send is this
/// session's. During one of its calls, traffic rides that call's response stream (as the
/// shared rules would route it); between calls it goes to the session's standalone stream.
pub struct SessionRelay {
    pub hub: Arc<Hub>,
    pub peer: Peer<RoleServer>,
    pub level: Arc<LogLevel>,
    /// What a log message sent between calls is scrubbed by, as a call's are.
    pub scrubbing: Arc<crate::scrub::Scrubbing>,
}

impl Relay for SessionRelay {
    fn ask<'a>(
        &'a self,
        from: Source<'a>,
        origin: Option<RequestId>,
        request: InputRequest,
    ) -> BoxFuture<'a, Result<Value, ErrorData>> {
        Box::pin(async move {
            match self.hub.route_request(from.conn, origin.as_ref()).await {
                Ok(target) => ask_client(target, request).await,
                // Nothing of this session's is running on the connection: ask the session itself.
                Err(_) => {
                    let peer = self.peer.clone();
                    let request = server_request(request)?;
                    let answer = tokio::spawn(async move { peer.send_request(request).await })
                        .await
                        .map_err(|e| ErrorData::internal_error(format!("relaying to the client failed: {e}"), None))?
                        .map_err(service_error)?;
                    serde_json::to_value(answer).map_err(|e| ErrorData::internal_error(e.to_string(), None))
                }
            }
        })
    }

    fn progress(&self, from: Source<'_>, params: ProgressNotificationParam) {
        self.hub.relay_progress(from.conn, params);
    }

    fn logging(&self, from: Source<'_>, params: LoggingMessageNotificationParam) {
        if !self.level.allows(params.level) {
            return;
        }
        match self.hub.route(from.conn, None) {
            Ok(target) => {
                let _ = target.tx.try_send(Relayed::Log(params));
            }
            Err(_) => {
                let peer = self.peer.clone();
                let log = Relayed::Log(params).scrubbed(&self.scrubbing, from.backend);
                tokio::spawn(async move { log.send(&peer).await });
            }
        }
    }

    fn resource_updated(&self, _from: Source<'_>, uri: &str) {
        let peer = self.peer.clone();
        let params = ResourceUpdatedNotificationParam::new(uri.to_string());
        tokio::spawn(async move {
            let _ = peer.notify_resource_updated(params).await;
        });
    }
}

fn service_error(e: rmcp::ServiceError) -> ErrorData {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
    }
}
