//! Upstream sessions of one client session (`backends[].session = "per_client"`).
//!
//! A client session's first request that needs a per-client backend opens a backend session
//! for it alone; later requests reuse it. Everything that backend session carries back
//! (sampling, elicitation, progress, logs, resource updates) goes to the [`Relay`] the client
//! session was given, so it reaches that client and no other by construction.
//!
//! Each upstream session has a keeper task that owns the connection and closes it when the
//! client session ends ([`ClientUpstreams`] is dropped), when it has been idle for the idle
//! timeout, or when a request saw it fail. A closed one is opened afresh by the next request
//! that needs it, so a backend restart costs the client nothing but that request's retry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
use rmcp::model::{LoggingLevel, SetLevelRequestParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::adopt::{Adoption, StoredUpstream};
use super::client::{Relay, UpstreamClient};
use super::identity::{Identity, LiveIdentity};
use super::{Backend, CONNECT_TIMEOUT, CallError, Link};

/// How long a new upstream session waits for its backend to answer the standalone stream's GET
/// before its first request goes out anyway.
const STANDALONE_GRACE: Duration = Duration::from_secs(2);

/// One client session's upstream sessions, by backend.
pub struct ClientUpstreams {
    relay: Arc<dyn Relay>,
    /// Who the client is, for backends whose headers carry the caller's identity: replaced by
    /// each request that presents a new credential, read by every request to the backend.
    identity: LiveIdentity,
    idle: Duration,
    slots: Mutex<HashMap<String, Slot>>,
    /// The client's `logging/setLevel`, applied to sessions opened later too.
    #[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
    level: Mutex<Option<LoggingLevel>>,
    /// Cancelled when the client session ends: every keeper closes its connection.
    ct: CancellationToken,
    /// Backend sessions another replica opened for this client session, to take over on first
    /// use (by backend name); see [`super::adopt`].
    adoptable: Mutex<HashMap<String, StoredUpstream>>,
    /// The gateway's "leave backend sessions to other replicas" flag.
    keep: Arc<AtomicBool>,
}

/// One backend's upstream session for one client: locked while it is being opened, so that
/// concurrent first requests open it once.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

/// A live upstream session, shared by the requests that use it.
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) peer: Arc<rmcp::service::Peer<rmcp::service::RoleClient>>,
    /// Closed (cancelled) when the session is lost or closed.
    pub(super) closed: CancellationToken,
    /// The HTTP session's adoption state (its backend session id), for HTTP backends.
    adoption: Option<Arc<Adoption>>,
    /// The [`Backend::instance`] it was opened to.
    backend: u64,
    /// When it was last used, and how many requests use it now.
    last_used: Mutex<Instant>,
    busy: AtomicUsize,
}

impl Conn {
    /// Marks it in use until the returned guard drops.
    pub(super) fn using(self: &Arc<Self>) -> InUse {
        self.busy.fetch_add(1, Ordering::AcqRel);
        *self.last_used.lock().expect("conn lock") = Instant::now();
        InUse(self.clone())
    }

    /// When it goes idle, if nothing uses it until then.
    fn idle_at(&self, idle: Duration) -> Option<Instant> {
        (self.busy.load(Ordering::Acquire) == 0).then(|| *self.last_used.lock().expect("conn lock") + idle)
    }
}

/// A request using a connection.
pub struct InUse(Arc<Conn>);

impl Drop for InUse {
    fn drop(&mut self) {
        *self.0.last_used.lock().expect("conn lock") = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Process-wide connection numbers: relayed traffic is keyed by (connection, backend's id).
pub fn next_conn() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl ClientUpstreams {
    /// `relay` carries what these sessions' backends send to the one client they serve.
    /// `keep` is the gateway's "leave backend sessions to other replicas" flag.
    pub fn new(relay: Arc<dyn Relay>, idle: Duration, keep: Arc<AtomicBool>) -> Self {
        Self {
            relay,
            identity: LiveIdentity::default(),
            idle,
            slots: Mutex::default(),
            level: Mutex::new(None),
            ct: CancellationToken::new(),
            adoptable: Mutex::default(),
            keep,
        }
    }

    /// The caller as backends see it from the next request on.
    pub fn set_identity(&self, principal: String, token: Option<Arc<str>>) {
        self.identity.store(Arc::new(Identity { principal, token }));
    }

    /// Offers a backend session another replica opened for this client session: the next
    /// session opened to `backend` takes it over, if the backend still knows it.
    pub fn adopt(&self, backend: &str, stored: StoredUpstream) {
        self.adoptable.lock().expect("adoptable lock").insert(backend.to_string(), stored);
    }

    async fn live(&self, backend: &str) -> Option<Arc<Conn>> {
        let slot = self.slots.lock().expect("slots lock").get(backend).cloned()?;
        slot.lock().await.clone().filter(|c| !c.closed.is_cancelled())
    }

    /// The backend's id of the live backend session to `backend` (HTTP backends).
    pub async fn session_id(&self, backend: &str) -> Option<String> {
        self.live(backend).await?.adoption.as_ref()?.session()
    }

    /// The live backend session to `backend`, as another replica would take it over.
    pub async fn stored(&self, backend: &str) -> Option<StoredUpstream> {
        let conn = self.live(backend).await?;
        let id = conn.adoption.as_ref()?.session()?;
        // What the backend answered to the handshake, in the shape the handshake's answer has.
        let info = serde_json::to_value(&*conn.peer.peer_info()?).ok()?;
        let init = serde_json::from_value(info).ok()?;
        Some(StoredUpstream { id, init })
    }

    /// This client's live session to the per-client `backend`, if one is open (none is opened).
    pub async fn open_link(&self, backend: &Arc<Backend>) -> Option<Link> {
        let conn = self.live(backend.name()).await?;
        (conn.backend == backend.instance).then(|| Link::own(&conn))
    }

    /// The connection for one request to `backend`: this client's own session when the backend
    /// is per-client (opened now if there is none), else the gateway's shared connection.
    pub async fn link(&self, backend: &Arc<Backend>) -> Result<Link, CallError> {
        if !backend.per_client() {
            return backend.awake_link().await;
        }
        if let Some(exchanger) = &backend.exchanger {
            // The backend's own token for this caller, fresh for this request (see `exchange`).
            let subject = self.identity.load().token.clone();
            if let Err(why) = exchanger.token_for(subject.as_deref()).await {
                return Err(CallError::Exchange { backend: backend.name().to_string(), why });
            }
        }
        let slot = self.slots.lock().expect("slots lock").entry(backend.name().to_string()).or_default().clone();
        let mut slot = slot.lock().await;
        // A session opened to a backend that a reload has since replaced is not reused.
        if let Some(conn) = slot.as_ref().filter(|c| !c.closed.is_cancelled() && c.backend == backend.instance) {
            return Ok(Link::own(conn));
        }
        let conn = self.open(backend).await?;
        *slot = Some(conn.clone());
        Ok(Link::own(&conn))
    }

    async fn open(&self, backend: &Arc<Backend>) -> Result<Arc<Conn>, CallError> {
        let name = backend.name().to_string();
        let permit = match backend.is_stdio() {
            true => Some(
                backend
                    .instances
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| CallError::AtCapacity { backend: name.clone(), max: backend.config.max_instances })?,
            ),
            false => None,
        };
        let id = super::session::next_conn();
        // List changes are the gateway's own connection's business: it hears them too.
        let handler = UpstreamClient::new(name.clone(), id, None, self.relay.clone());
        let failed = |error: String| {
            tracing::warn!(backend = %name, %error, "a backend session for a client could not be opened");
            CallError::SessionFailed { backend: name.clone() }
        };
        let stored = self.adoptable.lock().expect("adoptable lock").remove(&name);
        let adoption = Adoption::new(stored.filter(|_| !backend.is_stdio()), self.keep.clone());
        let opened = backend.open(handler, Some((&self.identity, adoption.clone())));
        let adoption = (!backend.is_stdio()).then_some(adoption);
        let service = match tokio::time::timeout(CONNECT_TIMEOUT, opened).await {
            Err(_) => return Err(failed(format!("no answer within {}", humantime::format_duration(CONNECT_TIMEOUT)))),
            Ok(Err(e)) => {
                // A grant that was revoked, or never given: the client is told to log in (the
                // same words as the gateway's own connection), not to retry.
                if let Some(needs) = e.downcast_ref::<super::oauth::NeedsLogin>() {
                    backend.login_refused(needs);
                    return Err(CallError::NeedsLogin(needs.clone()));
                }
                return Err(failed(super::words::explain(&e, &backend.config)));
            }
            Ok(Ok(s)) => s,
        };
        // The backend's standalone stream answered before the first request goes out: what the
        // backend sends tied to no call (a TypeScript SDK server's sampling, say) has somewhere
        // to go, instead of being dropped by a backend whose stream is not open yet.
        // (Only a session has one: a backend that gave no session id gets no GET.)
        if let Some(adoption) = adoption.as_ref().filter(|a| a.session().is_some())
            && !adoption.standalone_settled(STANDALONE_GRACE).await
        {
            tracing::debug!(backend = %name, conn = id, "the backend's standalone stream did not answer in time");
        }
        let peer = Arc::new(service.peer().clone());
        let level = *self.level.lock().expect("level lock");
        if let Some(level) = level
            && peer.peer_info().is_some_and(|i| i.capabilities.logging.is_some())
        {
            #[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
            let _ = peer.set_level(SetLevelRequestParams::new(level)).await;
        }
        if adoption.as_ref().is_some_and(|a| a.adopted()) {
            tracing::debug!(backend = %name, conn = id, "a backend session opened on another replica taken over");
        }
        let conn = Arc::new(Conn {
            id,
            peer: peer.clone(),
            closed: CancellationToken::new(),
            adoption,
            backend: backend.instance,
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
        });
        backend.client_sessions.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(backend = %name, conn = id, "upstream session opened for a client session");
        // A stdio child of this client's own sleeps after the backend's idle_stop, if sooner: the
        // client's next request opens another.
        let idle = backend.config.idle_stop.map_or(self.idle, |stop| stop.min(self.idle));
        let keeper = Keeper { backend: backend.clone(), conn: conn.clone(), idle, ct: self.ct.clone() };
        tokio::spawn(keeper.run(service, permit));
        Ok(conn)
    }

    /// Applies the client's `logging/setLevel` to its open upstream sessions, and to those it
    /// opens later. The gateway's shared connections are not told: that would change what
    /// every other client hears.
    #[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
    pub async fn set_level(&self, level: LoggingLevel, backends: &[Arc<Backend>]) {
        *self.level.lock().expect("level lock") = Some(level);
        for b in backends.iter().filter(|b| b.per_client()) {
            let slot = self.slots.lock().expect("slots lock").get(b.name()).cloned();
            let Some(slot) = slot else { continue };
            let Some(conn) = slot.lock().await.clone().filter(|c| !c.closed.is_cancelled()) else { continue };
            let link = Link::own(&conn);
            if link.peer.peer_info().is_some_and(|i| i.capabilities.logging.is_some())
                && let Err(e) = link.peer.set_level(SetLevelRequestParams::new(level)).await
            {
                tracing::debug!(backend = b.name(), %e, "logging/setLevel not accepted");
            }
        }
    }

    /// Upstream sessions open now.
    pub fn open_count(&self) -> usize {
        let slots: Vec<_> = self.slots.lock().expect("slots lock").values().cloned().collect();
        slots
            .iter()
            .filter(|s| s.try_lock().ok().is_some_and(|c| c.as_ref().is_some_and(|c| !c.closed.is_cancelled())))
            .count()
    }
}

impl Drop for ClientUpstreams {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

/// Owns one upstream session's connection and closes it when it is no longer wanted.
struct Keeper {
    backend: Arc<Backend>,
    conn: Arc<Conn>,
    idle: Duration,
    ct: CancellationToken,
}

impl Keeper {
    async fn run(
        self,
        service: rmcp::service::RunningService<rmcp::service::RoleClient, UpstreamClient>,
        _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        let closer = service.cancellation_token();
        let mut waiting = Box::pin(service.waiting());
        let mut ended = false;
        let why = loop {
            let wake = self.conn.idle_at(self.idle).unwrap_or_else(|| Instant::now() + self.idle);
            tokio::select! {
                _ = self.ct.cancelled() => break "the client session ended",
                _ = self.backend.retired().cancelled() => break "the backend was removed or replaced",
                _ = self.conn.closed.cancelled() => break "a request saw it fail",
                _ = &mut waiting => {
                    ended = true;
                    break "the backend closed it";
                }
                _ = tokio::time::sleep_until(wake) => {
                    if self.conn.idle_at(self.idle).is_some_and(|at| at <= Instant::now()) {
                        break "it was idle";
                    }
                }
            }
        };
        self.conn.closed.cancel();
        closer.cancel();
        if !ended {
            let _ = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        }
        self.backend.client_sessions.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(backend = self.backend.name(), why, "upstream session closed");
    }
}
