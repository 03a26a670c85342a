//! The gateway's own session layer for rmcp's streamable-HTTP service.
//!
//! rmcp's `LocalSessionManager` runs a worker task per session between the HTTP side and the MCP
//! service, with five tokio channels whose first block (32 slots of 360–400-byte messages) is
//! allocated when the session is made: about 54 KB of heap for a session that does nothing. Here
//! there is no worker: the HTTP side routes into the session's state under its lock, the
//! service's answers are routed by the transport's `send` under the same lock, and the only
//! per-session channel carries boxed messages (a 32-slot block of pointers).
//!
//! What a client sees is the same: every request gets its own SSE stream, opened with a priming
//! event when the service is configured with an SSE retry; answers, progress and the server's
//! requests made for a request ride that request's stream, everything else the standalone
//! (`GET`) stream; the last [`KEPT_EVENTS`] events of each stream are kept so a client that
//! reconnects with `Last-Event-ID` gets what it missed (never an event twice), and a request's
//! stream whose client was away when it ended stays resumable for [`COMPLETED_TTL`] (one that had
//! every event is forgotten at once: a finished answer is not held for nobody). A session ends on
//! `DELETE`, when its service ends, or
//! after the idle timeout with no request in flight.
//!
//! Every session's life is also reported to the gateway's [`Registry`]: a session is claimed for
//! the caller of its `initialize` (new, or replayed from the shared store) before the service
//! sees it, and ended when the session is closed, whatever closed it. The handler finds the
//! session's id on its `initialize` ([`SessionKey`]) and binds its handle to it.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, GetExtensions, GetMeta, JsonRpcMessage, ProgressToken, RequestId,
    ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::OriginatingRequestId;
use rmcp::transport::Transport;
use rmcp::transport::common::server_side_http::session_id;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::time::Instant;

use crate::session::Caller;
use crate::session::registry::Registry;
use crate::session::shared::{SessionKey, SharedSessions};

/// Events kept per stream for a client that reconnects with `Last-Event-ID`.
pub const KEPT_EVENTS: usize = 16;
/// How long a finished request's stream stays resumable.
pub const COMPLETED_TTL: Duration = Duration::from_secs(60);
/// Finished request streams kept per session for resumption, newest first.
const COMPLETED_KEPT: usize = 8;
/// Messages from the client waiting for the service; a sender waits when it is full.
const INBOX: usize = 16;
/// Extra `GET` streams held open (keep-alive only) while the standalone stream is live.
const MAX_SHADOWS: usize = 8;
/// How long an event may wait for a stream's connection to take it. A client that stopped
/// reading would otherwise hold the session's lock (and with it `DELETE`, the idle end and the
/// replicas' sweep); past this its connection is dropped, and what it missed stays kept for
/// `Last-Event-ID`.
const SEND_WAIT: Duration = Duration::from_secs(1);

/// How sessions behave.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// A session with no message either way and no request in flight for this long ends.
    pub idle_timeout: Duration,
    /// The retry hint of the priming event that opens each request's stream; `None`: no priming.
    /// Must match the service's `sse_retry`, which primes `GET` streams.
    pub sse_retry: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session {0} not found")]
    NotFound(SessionId),
    #[error("session {0} has ended")]
    Ended(SessionId),
    #[error("Last-Event-ID {0:?} names no stream this session can replay")]
    UnknownEvent(String),
    #[error("the initialize of session {0} was refused")]
    Refused(SessionId),
}

pub struct Sessions {
    map: RwLock<HashMap<SessionId, Arc<Session>>>,
    settings: Settings,
    registry: Arc<Registry>,
    shared: Option<Arc<SharedSessions>>,
}

impl Sessions {
    pub fn new(settings: Settings, registry: Arc<Registry>, shared: Option<Arc<SharedSessions>>) -> Self {
        Self { map: RwLock::default(), settings, registry, shared }
    }

    /// Whether the session `id` is held here.
    pub fn holds(&self, id: &str) -> bool {
        self.read().contains_key(id)
    }

    /// Sessions held here.
    pub fn count(&self) -> usize {
        self.read().len()
    }

    /// The ids of the sessions held here.
    pub fn ids(&self) -> Vec<String> {
        self.read().keys().map(|id| id.to_string()).collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &SessionId) -> Result<Arc<Session>, SessionError> {
        self.read().get(id).cloned().ok_or_else(|| SessionError::NotFound(id.clone()))
    }

    /// A new session under `id`, held here, and the transport its service runs on.
    fn open(&self, id: SessionId) -> SessionTransport {
        let (session, transport) = Session::new(id.clone(), self.settings);
        self.write().insert(id, session);
        transport
    }
}

impl SessionManager for Sessions {
    type Error = SessionError;
    type Transport = SessionTransport;

    async fn create_session(&self) -> Result<(SessionId, SessionTransport), SessionError> {
        let id = session_id();
        Ok((id.clone(), self.open(id)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, SessionError> {
        if let ClientJsonRpcMessage::Request(r) = &mut message
            && let Some(parts) = r.request.extensions_mut().get_mut::<http::request::Parts>()
        {
            let principal = parts.extensions.get::<Caller>().map_or(crate::config::ANONYMOUS, |c| &c.principal);
            if self.registry.claim(id, principal).is_err() {
                // Ids are random UUIDs: only a replay by someone else could get here.
                tracing::warn!(%principal, "an initialize for a session held by another principal was refused");
                // Its service ends with it; the other principal's claim stays (see close_session).
                let refused = self.write().remove(id);
                if let Some(session) = refused {
                    session.end().await;
                }
                return Err(SessionError::Refused(id.clone()));
            }
            parts.extensions.insert(SessionKey(Arc::from(id.as_ref())));
        }
        let session = self.get(id)?;
        let (answer, answered) = oneshot::channel();
        session.state.lock().await.initialize = Some(answer);
        session.push(message).await?;
        answered.await.map_err(|_| SessionError::Ended(id.clone()))
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, SessionError> {
        Ok(self.read().contains_key(id))
    }

    /// Ends a session held here (a `DELETE`, the idle timeout, its service ending, the sweep for
    /// sessions ended on another replica); an id not held here names nothing to end.
    async fn close_session(&self, id: &SessionId) -> Result<(), SessionError> {
        let session = self.write().remove(id);
        let Some(session) = session else { return Ok(()) };
        if self.registry.end(id)
            && let Some(shared) = &self.shared
        {
            shared.ended_here(id);
        }
        session.end().await;
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        let session = self.get(id)?;
        session.touch();
        let events = {
            let mut state = session.state.lock().await;
            if state.ended {
                return Err(SessionError::Ended(id.clone()));
            }
            session.forget_completed(&mut state);
            let stream = state.next_stream;
            state.next_stream += 1;
            let mut outlet = Outlet::new(Some(stream), 0);
            let events = outlet.connect(None);
            if let Some(retry) = self.settings.sse_retry {
                outlet.prime(retry).await;
            }
            if let ClientJsonRpcMessage::Request(request) = &message {
                let mut routes = vec![Route::Request(request.id.clone())];
                routes.extend(request.request.get_meta().get_progress_token().map(Route::Progress));
                for route in &routes {
                    state.routes.insert(route.clone(), stream);
                }
                outlet.routes = routes;
            }
            state.requests.insert(stream, outlet);
            events
        };
        session.push(message).await?;
        Ok(Events(events))
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), SessionError> {
        let session = self.get(id)?;
        session.touch();
        if let ClientJsonRpcMessage::Notification(n) = &message
            && let ClientNotification::CancelledNotification(c) = &n.notification
            && let Some(request) = &c.params.request_id
        {
            // The client gave up on the request: its stream ends.
            let mut state = session.state.lock().await;
            if let Some(&stream) = state.routes.get(&Route::Request(request.clone())) {
                state.complete(stream);
            }
        }
        session.push(message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        let session = self.get(id)?;
        session.touch();
        let mut state = session.state.lock().await;
        if state.ended {
            return Err(SessionError::Ended(id.clone()));
        }
        // A new listener gets what was sent while no one listened.
        let undelivered = state.common.delivered;
        Ok(Events(state.listen(undelivered)))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        let session = self.get(id)?;
        session.touch();
        let unknown = || SessionError::UnknownEvent(last_event_id.clone());
        let (index, stream) = parse_event_id(&last_event_id).ok_or_else(unknown)?;
        let after = index.checked_add(1).ok_or_else(unknown)?;
        let mut state = session.state.lock().await;
        if state.ended {
            return Err(SessionError::Ended(id.clone()));
        }
        session.forget_completed(&mut state);
        let events = match stream {
            None => state.listen(after),
            Some(stream) => {
                let outlet = state.requests.get_mut(&stream).ok_or_else(unknown)?;
                let events = outlet.connect(Some(after));
                if outlet.completed.is_some() {
                    // Replayed; nothing more will come.
                    outlet.tx = None;
                }
                events
            }
        };
        Ok(Events(events))
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<SessionTransport>, SessionError> {
        if self.read().contains_key(&id) {
            return Ok(RestoreOutcome::AlreadyPresent);
        }
        Ok(RestoreOutcome::Restored(self.open(id)))
    }
}

/// `<index>` on the standalone stream, `<index>/<stream>` on a request's.
fn parse_event_id(id: &str) -> Option<(usize, Option<u64>)> {
    match id.split_once('/') {
        Some((index, stream)) => Some((index.parse().ok()?, Some(stream.parse().ok()?))),
        None => Some((id.parse().ok()?, None)),
    }
}

/// Milliseconds since the first session, on tokio's clock: what `Session::last_active` counts in.
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

struct Session {
    id: SessionId,
    state: Mutex<State>,
    /// To the service; `None` once the session has ended.
    inbox: std::sync::Mutex<Option<mpsc::Sender<Box<ClientJsonRpcMessage>>>>,
    last_active: AtomicU64,
    /// When the oldest finished request stream is to be forgotten ([`now_ms`]), or `u64::MAX`:
    /// the service's receive loop wakes for it, so a finished stream never outlives its minute.
    forget_at: AtomicU64,
    /// Tells the receive loop that `forget_at` moved earlier.
    forget_sooner: tokio::sync::Notify,
}

impl Session {
    fn new(id: SessionId, settings: Settings) -> (Arc<Self>, SessionTransport) {
        let (tx, rx) = mpsc::channel(INBOX);
        let session = Arc::new(Self {
            id,
            state: Mutex::new(State::default()),
            inbox: std::sync::Mutex::new(Some(tx)),
            last_active: AtomicU64::new(now_ms()),
            forget_at: AtomicU64::new(u64::MAX),
            forget_sooner: tokio::sync::Notify::new(),
        });
        (session.clone(), SessionTransport { session, inbox: rx, idle_timeout: settings.idle_timeout })
    }

    fn touch(&self) {
        self.last_active.store(now_ms(), Ordering::Relaxed);
    }

    async fn push(&self, message: ClientJsonRpcMessage) -> Result<(), SessionError> {
        let inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ended = || SessionError::Ended(self.id.clone());
        inbox.ok_or_else(ended)?.send(Box::new(message)).await.map_err(|_| ended())
    }

    /// Forgets the finished streams whose minute is up, and notes when the next one's is: the
    /// one place that keeps `forget_at` in step with the streams kept.
    fn forget_completed(&self, state: &mut State) {
        self.forget_at.store(state.forget_completed(), Ordering::Relaxed);
    }

    /// Ends the session: the service's inbox closes and every stream ends.
    async fn end(&self) {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut state = self.state.lock().await;
        state.ended = true;
        state.initialize = None;
        state.requests.clear();
        state.routes.clear();
        state.common.tx = None;
        state.shadows.clear();
    }

    /// Routes one message from the service to the stream it belongs on.
    async fn deliver(&self, message: ServerJsonRpcMessage) -> Result<(), SessionError> {
        self.touch();
        let mut state = self.state.lock().await;
        if state.ended {
            return Err(SessionError::Ended(self.id.clone()));
        }
        if matches!(message, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_))
            && let Some(answer) = state.initialize.take()
        {
            let _ = answer.send(message);
            return Ok(());
        }
        match state.route_of(&message) {
            Some((stream, last)) => {
                if let Some(outlet) = state.requests.get_mut(&stream) {
                    outlet.emit(message).await;
                }
                if last && state.complete(stream) {
                    let at = now_ms() + COMPLETED_TTL.as_millis() as u64;
                    if self.forget_at.fetch_min(at, Ordering::Relaxed) > at {
                        self.forget_sooner.notify_one();
                    }
                }
            }
            None => state.common.emit(message).await,
        }
        Ok(())
    }
}

#[derive(Default)]
struct State {
    /// Where the answer to the `initialize` goes.
    initialize: Option<oneshot::Sender<ServerJsonRpcMessage>>,
    next_stream: u64,
    /// Each request's stream, by its number (kept for a while after it ends).
    requests: HashMap<u64, Outlet>,
    /// Which request stream a request id or progress token belongs to.
    routes: HashMap<Route, u64>,
    /// The standalone stream.
    common: Outlet,
    /// `GET` streams opened while the standalone stream was live: keep-alive only.
    shadows: Vec<mpsc::Sender<ServerSseMessage>>,
    /// Ended request streams, oldest first.
    completed: VecDeque<u64>,
    ended: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Route {
    Request(RequestId),
    Progress(ProgressToken),
}

impl State {
    /// The request stream `message` belongs on, and whether it is the stream's last message;
    /// `None`: the standalone stream.
    fn route_of(&self, message: &ServerJsonRpcMessage) -> Option<(u64, bool)> {
        let (route, last) = match message {
            JsonRpcMessage::Request(r) => {
                (Route::Request(r.request.extensions().get::<OriginatingRequestId>()?.0.clone()), false)
            }
            JsonRpcMessage::Notification(n) => match &n.notification {
                ServerNotification::ProgressNotification(p) => {
                    (Route::Progress(p.params.progress_token.clone()), false)
                }
                ServerNotification::CancelledNotification(c) => (Route::Request(c.params.request_id.clone()?), false),
                _ => return None,
            },
            JsonRpcMessage::Response(r) => (Route::Request(r.id.clone()), true),
            JsonRpcMessage::Error(e) => (Route::Request(e.id.clone()?), true),
        };
        Some((*self.routes.get(&route)?, last))
    }

    /// The request stream `stream` has ended: it closes, and stays resumable for a while if its
    /// client has not had every event (it was not connected when they were sent). True when it
    /// is kept.
    fn complete(&mut self, stream: u64) -> bool {
        let Some(outlet) = self.requests.get_mut(&stream) else { return false };
        if outlet.completed.is_some() {
            return false;
        }
        for route in std::mem::take(&mut outlet.routes) {
            self.routes.remove(&route);
        }
        if outlet.delivered == outlet.next {
            self.requests.remove(&stream);
            return false;
        }
        outlet.tx = None;
        outlet.completed = Some(Instant::now());
        self.completed.push_back(stream);
        while self.completed.len() > COMPLETED_KEPT {
            let oldest = self.completed.pop_front().expect("longer than the limit");
            self.requests.remove(&oldest);
        }
        true
    }

    /// Forgets the finished streams whose minute is up; returns when the next one's will be
    /// ([`now_ms`]), or `u64::MAX` when none is kept.
    fn forget_completed(&mut self) -> u64 {
        while let Some(&oldest) = self.completed.front() {
            match self.requests.get(&oldest).and_then(|o| o.completed) {
                Some(at) if at.elapsed() < COMPLETED_TTL => {
                    return now_ms() + (COMPLETED_TTL - at.elapsed()).as_millis() as u64;
                }
                _ => {
                    self.completed.pop_front();
                    self.requests.remove(&oldest);
                }
            }
        }
        u64::MAX
    }

    /// A `GET` stream: the standalone stream if no one listens to it (replaying its events from
    /// index `from` on), otherwise a shadow that only keeps its connection alive.
    fn listen(&mut self, from: usize) -> mpsc::Receiver<ServerSseMessage> {
        if self.common.tx.as_ref().is_some_and(|tx| !tx.is_closed()) {
            self.shadows.retain(|tx| !tx.is_closed());
            if self.shadows.len() >= MAX_SHADOWS {
                self.shadows.remove(0);
            }
            let (tx, rx) = mpsc::channel(1);
            self.shadows.push(tx);
            return rx;
        }
        self.common.connect(Some(from))
    }

    fn open_requests(&self) -> bool {
        self.requests.values().any(|o| o.completed.is_none())
    }
}

/// One SSE stream: its live connection, if any, and its last events for reconnection.
struct Outlet {
    /// `None`: the standalone stream.
    stream: Option<u64>,
    tx: Option<mpsc::Sender<ServerSseMessage>>,
    kept: VecDeque<(usize, ServerSseMessage)>,
    next: usize,
    /// Events below this index went into a live connection.
    delivered: usize,
    /// The request id and progress token routed here.
    routes: Vec<Route>,
    completed: Option<Instant>,
}

impl Default for Outlet {
    /// The standalone stream. Its events count from 1: the service primes every `GET` with `0`.
    fn default() -> Self {
        Self::new(None, 1)
    }
}

impl Outlet {
    fn new(stream: Option<u64>, first: usize) -> Self {
        Self {
            stream,
            tx: None,
            kept: VecDeque::new(),
            next: first,
            delivered: first,
            routes: Vec::new(),
            completed: None,
        }
    }

    /// The id of the next event.
    fn next_id(&self) -> String {
        match self.stream {
            Some(stream) => format!("{}/{stream}", self.next),
            None => self.next.to_string(),
        }
    }

    async fn emit(&mut self, message: ServerJsonRpcMessage) {
        self.send(ServerSseMessage::new(self.next_id(), message)).await
    }

    /// The event that tells a client how soon to reconnect and where it stands.
    async fn prime(&mut self, retry: Duration) {
        self.send(ServerSseMessage::priming(self.next_id(), retry)).await
    }

    async fn send(&mut self, event: ServerSseMessage) {
        let index = self.next;
        self.next += 1;
        if self.kept.len() == KEPT_EVENTS {
            self.kept.pop_front();
        }
        self.kept.push_back((index, event.clone()));
        if let Some(tx) = &self.tx {
            // A client that stopped reading holds its own stream up, as a full socket would, but
            // only for a moment: the session's lock is held meanwhile.
            match tokio::time::timeout(SEND_WAIT, tx.send(event)).await {
                Ok(Ok(())) => self.delivered = index + 1,
                Ok(Err(_)) => self.tx = None,
                Err(_) => {
                    tracing::debug!("a stream's client stopped reading; its connection is dropped (it may resume)");
                    self.tx = None;
                }
            }
        }
    }

    /// A new connection to this stream, replaying the kept events from index `from` on (none
    /// when `None`). It replaces any earlier connection.
    fn connect(&mut self, from: Option<usize>) -> mpsc::Receiver<ServerSseMessage> {
        let (tx, rx) = mpsc::channel(KEPT_EVENTS);
        for (_, event) in self.kept.iter().filter(|(index, _)| from.is_some_and(|from| *index >= from)) {
            // The channel holds every kept event: this never waits.
            let _ = tx.try_send(event.clone());
        }
        self.tx = Some(tx);
        rx
    }
}

/// A stream's live connection as the service's SSE body reads it.
struct Events(mpsc::Receiver<ServerSseMessage>);

impl Stream for Events {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ServerSseMessage>> {
        self.0.poll_recv(cx)
    }
}

/// What a session's MCP service runs on: the client's messages in, routing out.
pub struct SessionTransport {
    session: Arc<Session>,
    inbox: mpsc::Receiver<Box<ClientJsonRpcMessage>>,
    idle_timeout: Duration,
}

impl Transport<RoleServer> for SessionTransport {
    type Error = SessionError;

    fn send(&mut self, item: ServerJsonRpcMessage) -> impl Future<Output = Result<(), SessionError>> + Send + 'static {
        let session = self.session.clone();
        // Boxed: rmcp awaits the `initialize` answer's send inside the task that serves the session
        // for as long as it lives, and routing's future (about 2 KB) would stay in it.
        Box::pin(async move { session.deliver(item).await })
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let deadline = self.session.last_active.load(Ordering::Relaxed) + self.idle_timeout.as_millis() as u64;
            let forget_at = self.session.forget_at.load(Ordering::Relaxed);
            let wait = Duration::from_millis(deadline.min(forget_at).saturating_sub(now_ms()));
            tokio::select! {
                message = self.inbox.recv() => return message.map(|m| *m),
                () = self.session.forget_sooner.notified() => {}
                () = tokio::time::sleep(wait) => {
                    if now_ms() >= forget_at {
                        let mut state = self.session.state.lock().await;
                        self.session.forget_completed(&mut state);
                    }
                    let idle = now_ms() >= self.session.last_active.load(Ordering::Relaxed) + self.idle_timeout.as_millis() as u64;
                    if idle && !self.session.state.lock().await.open_requests() {
                        tracing::debug!(session = %self.session.id, "session ended after its idle timeout");
                        return None;
                    }
                    if idle {
                        // A request is still running: look again after another timeout.
                        self.session.touch();
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), SessionError> {
        self.session.end().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
