//! The gateway's shared state: store, backends, health, and every live session's handle. It
//! computes scopes (the one [`crate::session::scope`] function, for sessions and stateless
//! callers alike) and fans a scope change out to every session through per-session workers.
//!
//! Scopes follow changes at once; only what clients are told is debounced. Every snapshot
//! carries the generation and health version it was built at, and a request that finds its
//! session's snapshot older than either rebuilds it before use (microseconds), so no answer is
//! computed over a scope the gateway already knows to be wrong. The workers swap eagerly too,
//! and send `tools/list_changed` on the debounced notice ticks when what the client lists
//! changed (every tool in passthrough mode; the pinned tools in optimizer mode).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rmcp::service::{Peer, RoleServer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::catalog::Aggregation;
use crate::config::{AnswerForm, Limits, Mode};
use crate::health::Monitor;
use crate::health::notifier::Notifier;
use crate::mcp::relay::{Hub, SessionRelay};
use crate::mcp::rounds::Parked;
use crate::session::registry::Registry;
use crate::session::shared::SharedSessions;
use crate::session::surface::Surface;
use crate::session::{Caller, Policy, Presented, SessionHandle, Snapshot, scope};
use crate::store::Store;
use crate::store::integrity::Integrity;
use crate::upstream::{ClientUpstreams, PrincipalUpstreams, Upstream};

/// Callers whose scopes are cached (least recently used out first). A session keeps its own
/// snapshot, so a caller pushed out only costs a fresh derivation on the next change.
const CACHED_SCOPES: usize = 1024;

/// Work the gateway did, for tests and benchmarks.
#[derive(Debug, Default)]
pub struct Counters {
    /// Snapshot rebuilds done by session workers.
    pub resyncs: AtomicU64,
    /// `notifications/tools/list_changed` sent to sessions.
    pub list_changed_sent: AtomicU64,
}

/// What a gateway is built from.
pub struct Parts {
    pub mode: Mode,
    pub max_tools: usize,
    pub find_tool_description: Option<String>,
    /// `optimizer.pinned`: globs over exposed names, checked by the configuration.
    pub pinned: Vec<String>,
    pub answer: AnswerForm,
    /// Every listing passes through it on its way to the catalog (`store::integrity`).
    pub integrity: Arc<Integrity>,
    /// `[groups]`.
    pub groups: crate::config::GroupsConfig,
    pub aggregation: Aggregation,
    pub store: Arc<Store>,
    pub upstream: Arc<Upstream>,
    pub health: Arc<Monitor>,
    pub policy: Arc<dyn Policy>,
    /// Carries backend-initiated traffic to the right client; also given to the backends.
    pub relay: Arc<Hub>,
    /// How long passthrough `tools/list_changed` notices are debounced once ready.
    pub notice_window: std::time::Duration,
    pub limits: Limits,
    /// Longest find_tool query accepted (`optimizer.max_query_chars`).
    pub max_query_chars: usize,
    /// Who a client without HTTP is (stdio serving): `auth.stdio_principal`.
    pub local_caller: Caller,
    pub ct: CancellationToken,
}

impl Parts {
    /// An optimizer gateway over `store`, `upstream`, `health` and `policy`, every other part as
    /// a configuration that says nothing gives it (notices not debounced): for tests and benches
    /// that drive the handler without a configuration file.
    pub fn optimizer(
        store: Arc<Store>,
        upstream: Arc<Upstream>,
        health: Arc<Monitor>,
        policy: Arc<dyn Policy>,
    ) -> Self {
        Self {
            mode: Mode::Optimizer,
            max_tools: crate::config::DEFAULT_MAX_TOOLS,
            find_tool_description: None,
            pinned: Vec::new(),
            answer: Default::default(),
            integrity: Default::default(),
            groups: Default::default(),
            aggregation: Default::default(),
            store,
            upstream,
            health,
            policy,
            relay: Hub::new(),
            notice_window: std::time::Duration::ZERO,
            limits: Default::default(),
            max_query_chars: crate::config::DEFAULT_MAX_QUERY_CHARS,
            local_caller: Caller::anonymous(),
            ct: CancellationToken::new(),
        }
    }
}

pub struct Gateway {
    pub mode: Mode,
    pub max_tools: usize,
    pub find_tool_description: Option<String>,
    /// Tools listed beside the meta-tools in optimizer mode (`optimizer.pinned`); `None`: none.
    pinned: Option<globset::GlobSet>,
    /// How find_tool describes what it found (`optimizer.answer`).
    pub answer: AnswerForm,
    pub integrity: Arc<Integrity>,
    /// Backends as groups for clients that declare the extension (`[groups]`); `None`: off.
    pub groups: Option<super::groups::Groups>,
    pub aggregation: Aggregation,
    pub store: Arc<Store>,
    pub upstream: Arc<Upstream>,
    pub health: Arc<Monitor>,
    /// Replaced whole by a reload ([`Gateway::set_policy`]).
    policy: arc_swap::ArcSwap<Arc<dyn Policy>>,
    /// `[auth]` as in force: who sees the gateway's details ([`Gateway::is_admin`]). Written
    /// by the app at start and by each reload.
    auth: arc_swap::ArcSwap<crate::config::AuthConfig>,
    pub relay: Arc<Hub>,
    /// Calls waiting for a session-less client's input (`rounds`).
    pub parked: Arc<Parked>,
    /// Tasks backends run for this gateway's clients, by the id the client was given.
    pub tasks: super::tasks::TaskRoutes,
    /// Per principal calling without a session: the places for its running calls and its part
    /// in learning from use, as a session has them.
    pub callers: super::callers::Callers,
    /// The backend sessions of callers without a session on `per_client` backends, one set per
    /// principal (`server.max_sessionless_principals` of them).
    pub sessionless: PrincipalUpstreams,
    /// The client sessions held here, from their claim to their end ([`Registry`]).
    registry: Arc<Registry>,
    /// Bumped when the generation or any backend's advertisability changes.
    epoch: watch::Sender<u64>,
    /// Debounced ticks after scope changes: when passthrough clients are told.
    notices: Notifier,
    /// Scopes by caller (principal and groups), shared by all of that caller's sessions and
    /// stateless requests while current: a scope change derives each distinct caller's scope
    /// once, not once per session. With the generation every entry was built over.
    scopes: Mutex<(u64, lru::LruCache<Caller, Arc<Snapshot>>)>,
    /// Bumped by every [`Gateway::set_policy`].
    policy_version: AtomicU64,
    pub limits: Limits,
    /// `[[limits]]`: rates and quotas per caller (rules put in force by the app and reloads).
    pub limiter: crate::limits::Limiter,
    /// `[[hooks]]`: guard services around each call (put in force by the app and reloads).
    pub hooks: crate::hooks::Hooks,
    /// `[results] scrub`: secrets out of what backends answer (put in force by the app and
    /// reloads; on with the built-in rules until then).
    pub scrubbing: Arc<crate::scrub::Scrubbing>,
    /// `[results]`' bounds and the results kept past them (put in force by the app and
    /// reloads; the defaults until then).
    pub results: crate::results::Results,
    /// `[optimizer] surface`: what each client is shown (put in force by the app and reloads).
    pub surfaces: super::surface::Surfaces,
    /// `[audit]`, set by the app ([`Gateway::audit`]).
    audit: std::sync::OnceLock<crate::audit::Audit>,
    pub max_query_chars: usize,
    pub local_caller: Caller,
    ready: AtomicBool,
    /// Set when a stop begins: `/readyz` answers 503 and new sessions are refused.
    draining: AtomicBool,
    /// Requests being answered (HTTP POSTs until their answer is written, forwarded calls):
    /// a stop waits for these, up to `server.shutdown_grace`.
    pub inflight: tokio_util::task::TaskTracker,
    pub counters: Counters,
    pub metrics: crate::metrics::Metrics,
    /// Configuration reloads, for `/status`.
    pub reloads: Mutex<super::status::ReloadLog>,
    /// Where sessions are shared with other replicas (`[sessions] store = "redis"`); set once
    /// before the listener starts.
    shared_sessions: std::sync::OnceLock<Arc<SharedSessions>>,
    ct: CancellationToken,
}

/// The pinned globs as one set (the configuration checked each one); `None` when there are none.
fn pinned_set(globs: &[String]) -> Option<globset::GlobSet> {
    if globs.is_empty() {
        return None;
    }
    let mut set = globset::GlobSetBuilder::new();
    for g in globs {
        match globset::Glob::new(g) {
            Ok(g) => {
                set.add(g);
            }
            Err(e) => tracing::warn!(glob = %g, error = %e, "optimizer.pinned: not a glob, ignored"),
        }
    }
    set.build().ok()
}

impl Gateway {
    pub fn new(p: Parts) -> Arc<Self> {
        let (epoch, _) = watch::channel(0);
        let metrics = crate::metrics::Metrics::new();
        let limiter = crate::limits::Limiter::new(&[], metrics.limits.clone());
        let scrubbing = Arc::new(crate::scrub::Scrubbing::new(&Default::default(), metrics.redactions.clone()));
        Arc::new(Self {
            mode: p.mode,
            max_tools: p.max_tools,
            find_tool_description: p.find_tool_description,
            pinned: pinned_set(&p.pinned),
            answer: p.answer,
            integrity: p.integrity,
            groups: super::groups::Groups::new(&p.groups),
            aggregation: p.aggregation,
            store: p.store,
            upstream: p.upstream,
            health: p.health,
            policy: arc_swap::ArcSwap::from_pointee(p.policy),
            auth: arc_swap::ArcSwap::from_pointee(crate::config::AuthConfig::default()),
            relay: p.relay.clone(),
            parked: Arc::default(),
            tasks: Default::default(),
            callers: super::callers::Callers::new(p.limits.max_calls_per_session),
            sessionless: PrincipalUpstreams::new(
                p.relay.clone(),
                p.limits.session_idle_timeout,
                p.limits.max_sessionless_principals,
            ),
            registry: Arc::default(),
            epoch,
            notices: Notifier::new(p.notice_window),
            policy_version: AtomicU64::new(0),
            scopes: Mutex::new((
                0,
                lru::LruCache::new(std::num::NonZeroUsize::new(CACHED_SCOPES).expect("a positive capacity")),
            )),
            limits: p.limits,
            max_query_chars: p.max_query_chars,
            local_caller: p.local_caller,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            inflight: tokio_util::task::TaskTracker::new(),
            counters: Counters::default(),
            reloads: Mutex::default(),
            metrics,
            limiter,
            audit: std::sync::OnceLock::new(),
            hooks: crate::hooks::Hooks::default(),
            scrubbing,
            results: crate::results::Results::new(&Default::default()),
            surfaces: Default::default(),
            shared_sessions: std::sync::OnceLock::new(),
            ct: p.ct,
        })
    }

    /// Keeps the audit trail in `audit` from now on (set once, before the listener starts).
    pub fn set_audit(&self, audit: crate::audit::Audit) {
        let _ = self.audit.set(audit);
    }

    /// The audit trail (one that writes nothing, without `[audit]`).
    pub fn audit(&self) -> &crate::audit::Audit {
        static OFF: crate::audit::Audit = crate::audit::Audit::off();
        self.audit.get().unwrap_or(&OFF)
    }

    /// Shares this gateway's sessions through `store` (before it serves any).
    pub fn share_sessions(&self, store: Arc<SharedSessions>) {
        let _ = self.shared_sessions.set(store);
    }

    /// Whether `name` is pinned: in optimizer mode, listed beside find_tool and call_tool and
    /// callable by its own name (the meta-tools' names are never taken).
    pub fn is_pinned(&self, name: &str) -> bool {
        self.mode == Mode::Optimizer
            && name != super::meta::FIND_TOOL
            && name != super::meta::CALL_TOOL
            && self.pinned.as_ref().is_some_and(|p| p.is_match(name))
    }

    /// What `session`'s client is shown in `groups/list`, as one number; `None` unless `[groups]`
    /// is on and the client declared the extension at initialize.
    pub fn groups_listed(&self, session: &SessionHandle) -> Option<u64> {
        let groups = self.groups.as_ref()?;
        let declared = super::groups::declared(&session.peer()?.peer_info()?.capabilities);
        declared.then(|| groups.listed(&session.snapshot(), self))
    }

    /// Takes `[auth]` as it is now in force.
    pub fn set_auth(&self, auth: crate::config::AuthConfig) {
        self.auth.store(Arc::new(auth));
    }

    /// Whether `caller` may see the gateway's details (`[auth] admins`; everyone without
    /// authentication).
    pub fn is_admin(&self, caller: &Caller) -> bool {
        self.auth.load().is_admin(&caller.principal, &caller.groups)
    }

    /// Whether `optimizer.pinned` names any tool pattern.
    pub fn has_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// What a client with `surface` lists from `snap`, as one number: when it changes, the
    /// client is told (`tools/list_changed`). Every tool in passthrough mode; in optimizer
    /// mode, find_tool's description and what the surface lists beside it (every tool when
    /// deferred, the top-level tools of groups, the pinned tools).
    pub fn listed(&self, snap: &Snapshot, surface: Surface) -> u64 {
        use std::hash::{Hash, Hasher};
        if self.mode == Mode::Passthrough {
            return snap.listed();
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.find_tool_text(snap).hash(&mut h);
        match surface {
            Surface::Deferred | Surface::Passthrough => snap.listed().hash(&mut h),
            Surface::Groups => snap.listed_where(|t| self.listed_beside(t.name(), surface)).hash(&mut h),
            Surface::Tools if self.pinned.is_some() => {
                snap.listed_where(|t| self.listed_beside(t.name(), surface)).hash(&mut h)
            }
            Surface::Tools => {}
        }
        h.finish()
    }

    /// In optimizer mode, whether a `tools` or `groups` client lists backend tool `name` beside
    /// the meta-tools: pinned, or (groups) top-level.
    pub fn listed_beside(&self, name: &str, surface: Surface) -> bool {
        self.is_pinned(name)
            || (surface == Surface::Groups && self.groups.as_ref().is_some_and(|g| g.is_top_level(name)))
    }

    /// The surface `session`'s client was given (before initialize: the mode's plainest).
    pub fn surface_of(&self, session: &SessionHandle) -> Surface {
        session.surface().map_or_else(|| self.plain_surface(), |c| c.surface)
    }

    /// The surface for `caller` whose client introduced itself with `client`.
    pub fn choose_surface(
        &self,
        caller: &Caller,
        client: super::surface::Client<'_>,
    ) -> crate::session::surface::Choice {
        self.surfaces.choose(self.mode, caller, client, self.groups.is_some())
    }

    /// What a client no choice was made for is shown: `passthrough` or `tools`.
    pub fn plain_surface(&self) -> Surface {
        match self.mode {
            Mode::Passthrough => Surface::Passthrough,
            Mode::Optimizer => Surface::Tools,
        }
    }

    /// find_tool's description for a caller with scope `snap`: the operator's
    /// (`optimizer.find_tool_description`), or one written from what the scope holds.
    pub fn find_tool_text<'a>(&'a self, snap: &'a Snapshot) -> &'a str {
        match &self.find_tool_description {
            Some(text) => text,
            None => snap.find_tool_text.get_or_init(|| super::overview::find_tool_description(snap.scope_tools())),
        }
    }

    /// The store sessions are shared through, if any.
    pub fn shared_sessions(&self) -> Option<&Arc<SharedSessions>> {
        self.shared_sessions.get()
    }

    /// Whether `backend`'s tools are offered now.
    pub fn advertisable(&self, backend: &str) -> bool {
        self.upstream.get(backend).is_some_and(|b| self.health.advertisable(&b))
    }

    /// The scope `caller` has now, derived once per caller and change (see `scopes`).
    pub fn scope_for(&self, caller: &Caller) -> Arc<Snapshot> {
        // Held while deriving: sessions of one caller woken together wait for one derivation.
        let mut cache = self.scopes.lock().expect("scopes lock");
        if let Some(s) = cache.1.get(caller)
            && self.is_current(s)
        {
            return s.clone();
        }
        // A new generation makes every cached scope stale: dropped now, they keep no old
        // generation (catalog, vectors, indexes) alive for callers that have gone.
        let generation = self.store.current().id;
        if cache.0 != generation {
            cache.1.clear();
            cache.0 = generation;
        }
        let s = Arc::new(self.derive_scope(caller));
        cache.1.put(caller.without_token(), s.clone());
        s
    }

    fn derive_scope(&self, caller: &Caller) -> Snapshot {
        // Versions first: a change while the scope is built leaves it looking stale, never current.
        let health_version = self.scope_version();
        let generation = self.store.current();
        let policy = self.policy();
        let mut snap = scope(generation, &|b| self.advertisable(b), policy.as_ref(), caller);
        snap.health_version = health_version;
        snap
    }

    /// Rises with every health flip and policy change (both only rise, so the sum changes
    /// whenever either does): a snapshot built at another version may be stale.
    fn scope_version(&self) -> u64 {
        self.health.version() + self.policy_version.load(Ordering::Acquire)
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<dyn Policy> {
        self.policy.load().as_ref().clone()
    }

    /// Puts a new policy in force: every cached scope is dropped and every live session
    /// re-derives its own, as on a health change (passthrough clients are told).
    pub fn set_policy(&self, policy: Arc<dyn Policy>) {
        // Stored under the cache lock: a derivation under way finishes with the old policy
        // before the cache is cleared, and none after it can see the old one.
        let mut cache = self.scopes.lock().expect("scopes lock");
        self.policy.store(Arc::new(policy));
        self.policy_version.fetch_add(1, Ordering::AcqRel);
        cache.1.clear();
        drop(cache);
        self.scopes_changed();
    }

    /// Whether `snap` was built over the current generation and health.
    pub fn is_current(&self, snap: &Snapshot) -> bool {
        snap.health_version == self.scope_version() && snap.generation.id == self.store.current().id
    }

    /// The session's snapshot for one request, rebuilt first if the gateway has moved on or the
    /// session's caller is no longer the one it was built for.
    pub fn session_snapshot(&self, session: &SessionHandle) -> Arc<Snapshot> {
        let snap = session.snapshot();
        let caller = session.caller();
        if self.is_current(&snap) && snap.caller == *caller {
            return snap;
        }
        let next = self.scope_for(&caller);
        session.swap(next.clone());
        next
    }

    /// Takes the credential a request of `session` presented: new groups re-derive its scope
    /// now (and a passthrough client is told), a new token is what its own backend sessions
    /// send from the next request on.
    pub fn present(&self, session: &SessionHandle, caller: &Caller) {
        if session.present(caller) == Presented::Groups {
            tracing::info!(principal = %caller.principal, "the caller's groups changed: its session's scope follows");
            session.swap(self.scope_for(&session.caller()));
            session.rescoped.notify_one();
        }
    }

    /// Opens a session of the client `peer` (bound to its HTTP session `id`, if it has one: see
    /// [`Registry`]), gives it its own upstream sessions, and starts its resync worker (which
    /// ends with the session). Without a peer (benchmarks) the session has no upstream sessions
    /// of its own.
    pub fn open_session(
        self: &Arc<Self>,
        caller: Caller,
        peer: Option<Peer<RoleServer>>,
        id: Option<&str>,
    ) -> Arc<SessionHandle> {
        // Subscribe first: a change while the first snapshot is built still reaches the worker.
        let rx = self.epoch.subscribe();
        let notices = self.notices.subscribe();
        let handle = SessionHandle::new(caller.clone(), self.scope_for(&caller), self.limits.max_calls_per_session);
        // Chosen before its worker starts: what the client lists is counted on its surface.
        let info = peer.as_ref().and_then(|p| p.peer_info());
        let client =
            super::surface::Client::of(info.as_ref().map(|i| &i.client_info), info.as_ref().map(|i| &i.capabilities));
        handle.set_surface(self.choose_surface(&caller, client));
        if let Some(peer) = peer {
            let relay = SessionRelay {
                hub: self.relay.clone(),
                peer: peer.clone(),
                level: handle.level.clone(),
                scrubbing: self.scrubbing.clone(),
            };
            let keep = self.upstream.keep_sessions.clone();
            let upstreams = ClientUpstreams::new(Arc::new(relay), self.limits.session_idle_timeout, keep);
            upstreams.set_identity(caller.principal.clone(), caller.token.clone());
            handle.set_upstreams(upstreams);
            handle.set_peer(peer);
        }
        self.registry.bind(id, &handle);
        if let Some(id) = id {
            let owner = super::tasks::Owner::new(&caller.principal, Some(id));
            let ending = end_tasks_with_session(Arc::downgrade(self), handle.upstreams_at_end(), owner, id.to_string());
            tokio::spawn(ending);
        }
        let stop = [self.ct.clone(), handle.ended()];
        tokio::spawn(resync_worker(Arc::downgrade(self), Arc::downgrade(&handle), rx, notices, stop));
        handle
    }

    /// Live sessions now.
    pub fn session_count(&self) -> usize {
        self.registry.live()
    }

    /// The client sessions held here.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Tells every session its scope may have changed: each swaps at once, and passthrough
    /// clients are told on the next (debounced) notice.
    pub fn scopes_changed(&self) {
        self.epoch.send_modify(|e| *e += 1);
        self.notices.trigger();
    }

    /// Ticks when scopes may have changed.
    pub fn subscribe_scopes(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// Ticks, debounced, when clients should be told their tools may have changed.
    pub fn subscribe_notices(&self) -> watch::Receiver<u64> {
        self.notices.subscribe()
    }

    /// Runs the notice debounce until `ct` is cancelled (the app spawns this).
    pub async fn run_notices(self: Arc<Self>, ct: CancellationToken) {
        self.notices.run(ct).await;
    }

    pub fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// A token for one forwarded call: cancelled with the gateway, or alone.
    pub fn call_token(&self) -> CancellationToken {
        self.ct.child_token()
    }

    /// Marks the gateway ready. From now on notices are debounced; the first one after this
    /// still goes out at once.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
        self.notices.arm();
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Begins a stop: not ready from now on, and no new sessions.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// One per session: swaps in a fresh snapshot on every scope change (`watch` coalesces: one
/// run at a time, and changes during a run make exactly one more), and tells the client on each
/// notice tick when what it lists ([`Gateway::listed`]) differs from what it was last told.
///
/// Every idle session holds this task, so the loop awaits nothing large inline: telling the
/// client (rmcp's send futures) runs boxed, only when there is something to tell
/// (`tests::an_idle_session_s_tasks_are_small`).
async fn resync_worker(
    gw: Weak<Gateway>,
    session: Weak<SessionHandle>,
    mut scopes: watch::Receiver<u64>,
    mut notices: watch::Receiver<u64>,
    [ct, ended]: [CancellationToken; 2],
) {
    // What the client was last told it has (as [`Snapshot::listed`]: no generation is kept),
    // and its groups (`[groups]`, for a client that declared the extension at initialize).
    let (mut told, rescoped) = match session.upgrade() {
        Some(s) => match gw.upgrade() {
            Some(gw) => {
                let tools = gw.listed(&s.snapshot(), gw.surface_of(&s));
                (Told { tools, groups: gw.groups_listed(&s) }, s.rescoped.clone())
            }
            None => return,
        },
        None => return,
    };
    loop {
        let notice = tokio::select! {
            _ = ct.cancelled() => return,
            _ = ended.cancelled() => return,
            r = scopes.changed() => if r.is_err() { return } else { false },
            r = notices.changed() => if r.is_err() { return } else { true },
            // The caller's own change: its client is told at once, not on the gateway's tick.
            _ = rescoped.notified() => true,
        };
        let (Some(gw), Some(session)) = (gw.upgrade(), session.upgrade()) else { return };
        scopes.mark_unchanged();
        let next = gw.scope_for(&session.caller());
        session.swap(next.clone());
        gw.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        if !notice {
            continue;
        }
        let listed = gw.listed(&next, gw.surface_of(&session));
        drop(next);
        if Box::pin(told.tell(&gw, &session, listed)).await.is_break() {
            return;
        }
    }
}

/// What a session's client was last told: its tools (as [`Gateway::listed`]) and groups.
struct Told {
    tools: u64,
    groups: Option<u64>,
}

impl Told {
    /// Tells the client what changed since it was last told; `Break` once its transport has
    /// closed (nothing more can reach it).
    async fn tell(&mut self, gw: &Gateway, session: &SessionHandle, listed: u64) -> std::ops::ControlFlow<()> {
        let groups = gw.groups_listed(session);
        if groups != self.groups {
            self.groups = groups;
            if let Some(peer) = session.peer() {
                let notice = rmcp::model::CustomNotification::new(super::groups::LIST_CHANGED, None);
                let _ = peer.send_notification(rmcp::model::ServerNotification::CustomNotification(notice)).await;
            }
        }
        if listed == self.tools {
            return std::ops::ControlFlow::Continue(());
        }
        self.tools = listed;
        if let Some(peer) = session.peer() {
            if peer.notify_tool_list_changed().await.is_ok() {
                gw.counters.list_changed_sent.fetch_add(1, Ordering::Relaxed);
            } else if peer.is_transport_closed() {
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

/// When a session ends, the tasks it made end too: nobody can follow them any more (a task is
/// its session's alone). Each is forgotten here and in the shared store, and cancelled at its
/// backend on the connection it lives on: a `shared` backend's, or the session's own backend
/// session, which the session hands over as it ends and which closes only after (a backend's
/// task may outlive the session it was made on). Not while the session lives on elsewhere:
/// handed to another replica (a stop with sessions shared), or still in the shared store (only
/// this replica's copy ended).
///
/// Waits the session's life through holding only its arguments: the work is boxed, as in
/// [`resync_worker`].
async fn end_tasks_with_session(
    gw: std::sync::Weak<Gateway>,
    upstreams: tokio::sync::oneshot::Receiver<ClientUpstreams>,
    owner: super::tasks::Owner,
    session: String,
) {
    let upstreams = upstreams.await.ok();
    let Some(gw) = gw.upgrade() else { return };
    Box::pin(gw.end_tasks_of(owner, session, upstreams)).await
}

impl Gateway {
    /// [`end_tasks_with_session`]'s work, once the session has ended.
    async fn end_tasks_of(&self, owner: super::tasks::Owner, session: String, upstreams: Option<ClientUpstreams>) {
        if self.upstream.keep_sessions.load(Ordering::Acquire) {
            return;
        }
        if let Some(store) = self.shared_sessions()
            && !matches!(store.fetch(&session).await, Ok(None))
        {
            return;
        }
        for (id, route) in self.tasks.take_owned(&owner) {
            if let Some(store) = self.shared_sessions() {
                let _ = store.forget_task(&id).await;
            }
            self.cancel_orphaned(route, upstreams.as_ref()).await;
        }
    }
}

impl Gateway {
    /// Cancels, at its backend, a task nobody can follow any more (its route was pushed out, or
    /// its session ended), on the connection it lives on where the gateway holds one: a shared
    /// backend's, a session-less principal's own, or the ended session's own (`own`, while it is
    /// still open). A live session's own backend session is its requests' alone.
    pub async fn cancel_orphaned(&self, route: super::tasks::Route, own: Option<&ClientUpstreams>) {
        let Some(backend) = self.upstream.get(&route.backend) else { return };
        let link = match (backend.per_client(), &route.owner.session, own) {
            (false, _, _) => backend.shared_link(),
            (true, None, _) => self.sessionless.link(&route.owner.principal, None, &backend).await,
            (true, Some(_), Some(own)) => match own.open_link(&backend).await {
                Some(link) => Ok(link),
                None => return,
            },
            (true, Some(_), None) => return,
        };
        let params = rmcp::model::CancelTaskParams::new(route.upstream);
        let cancelled = match link {
            Ok(link) => backend.cancel_task(&link, params, &CancellationToken::new()).await,
            Err(e) => Err(e),
        };
        if let Err(e) = cancelled {
            tracing::debug!(backend = backend.name(), error = %e, "an orphaned task could not be cancelled");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every idle session holds these two tasks for its whole life: what they hold while they
    /// wait is what an idle session costs here (rmcp's session machinery is the rest, see
    /// docs/performance.md). Before their work was boxed they took 1,200 and 8,120 bytes.
    #[test]
    fn an_idle_session_s_tasks_are_small() {
        let (_tx, scopes) = watch::channel(0u64);
        let notices = scopes.clone();
        let stop = [CancellationToken::new(), CancellationToken::new()];
        let resync = resync_worker(Weak::new(), Weak::new(), scopes, notices, stop);
        let owner = super::super::tasks::Owner::new("alice", Some("session"));
        let ending = end_tasks_with_session(Weak::new(), tokio::sync::oneshot::channel().1, owner, "session".into());
        let (resync, ending) = (std::mem::size_of_val(&resync), std::mem::size_of_val(&ending));
        eprintln!("resync worker {resync} bytes, task ending {ending} bytes");
        assert!(resync <= 1024 && ending <= 512, "resync worker {resync} bytes, task ending {ending} bytes");
    }
}
