//! The gateway's shared state: store, backends, health, and every live session's handle. It
//! computes scopes (the one [`crate::session::scope`] function, for sessions and stateless
//! callers alike) and fans a scope change out to every session through per-session workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::catalog::Aggregation;
use crate::config::Mode;
use crate::health::Monitor;
use crate::mcp::relay::Hub;
use crate::session::{Caller, Policy, SessionHandle, Snapshot, scope};
use crate::store::Store;
use crate::upstream::Upstream;

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
    pub aggregation: Aggregation,
    pub store: Arc<Store>,
    pub upstream: Arc<Upstream>,
    pub health: Arc<Monitor>,
    pub policy: Arc<dyn Policy>,
    /// Carries backend-initiated traffic to the right client; also given to the backends.
    pub relay: Arc<Hub>,
    pub ct: CancellationToken,
}

pub struct Gateway {
    pub mode: Mode,
    pub max_tools: usize,
    pub find_tool_description: Option<String>,
    pub aggregation: Aggregation,
    pub store: Arc<Store>,
    pub upstream: Arc<Upstream>,
    pub health: Arc<Monitor>,
    policy: Arc<dyn Policy>,
    pub relay: Arc<Hub>,
    /// Live sessions (pruned as they go). Written by [`Gateway::open_session`].
    sessions: Mutex<Vec<Weak<SessionHandle>>>,
    /// Bumped when the generation or any backend's advertisability changes.
    epoch: watch::Sender<u64>,
    /// Stateless callers' scopes, valid for the epoch they were built in.
    stateless: Mutex<HashMap<Caller, (u64, Arc<Snapshot>)>>,
    ready: AtomicBool,
    pub counters: Counters,
    ct: CancellationToken,
}

impl Gateway {
    pub fn new(p: Parts) -> Arc<Self> {
        let (epoch, _) = watch::channel(0);
        Arc::new(Self {
            mode: p.mode,
            max_tools: p.max_tools,
            find_tool_description: p.find_tool_description,
            aggregation: p.aggregation,
            store: p.store,
            upstream: p.upstream,
            health: p.health,
            policy: p.policy,
            relay: p.relay,
            sessions: Mutex::new(Vec::new()),
            epoch,
            stateless: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
            counters: Counters::default(),
            ct: p.ct,
        })
    }

    /// Whether `backend`'s tools are offered now.
    pub fn advertisable(&self, backend: &str) -> bool {
        self.upstream.get(backend).is_some_and(|b| self.health.advertisable(b))
    }

    /// The scope `caller` has now.
    pub fn scope_for(&self, caller: &Caller) -> Snapshot {
        scope(self.store.current(), &|b| self.advertisable(b), self.policy.as_ref(), caller)
    }

    /// Registers a session and starts its resync worker.
    pub fn open_session(self: &Arc<Self>, caller: Caller) -> Arc<SessionHandle> {
        // Subscribe first: a change while the first snapshot is built still reaches the worker.
        let rx = self.epoch.subscribe();
        let handle = SessionHandle::new(caller.clone(), self.scope_for(&caller));
        {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            sessions.retain(|w| w.strong_count() > 0);
            sessions.push(Arc::downgrade(&handle));
        }
        tokio::spawn(resync_worker(Arc::downgrade(self), Arc::downgrade(&handle), rx, self.ct.clone()));
        handle
    }

    /// Live sessions now.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().expect("sessions lock").iter().filter(|w| w.strong_count() > 0).count()
    }

    /// The scope of a caller with no session (protocol 2026-07-28), cached per epoch.
    pub fn stateless_snapshot(&self, caller: &Caller) -> Arc<Snapshot> {
        let epoch = *self.epoch.borrow();
        let mut cache = self.stateless.lock().expect("stateless lock");
        if let Some((e, s)) = cache.get(caller)
            && *e == epoch
        {
            return s.clone();
        }
        let s = Arc::new(self.scope_for(caller));
        cache.insert(caller.clone(), (epoch, s.clone()));
        s
    }

    /// Tells every session its scope may have changed.
    pub fn scopes_changed(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Ticks when scopes may have changed.
    pub fn subscribe_scopes(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    pub fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// One per session: rebuilds and swaps its snapshot on every epoch change. `watch` coalesces:
/// one run at a time, and changes during a run produce exactly one more.
async fn resync_worker(
    gw: Weak<Gateway>,
    session: Weak<SessionHandle>,
    mut rx: watch::Receiver<u64>,
    ct: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = ct.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
        let (Some(gw), Some(session)) = (gw.upgrade(), session.upgrade()) else { return };
        let next = Arc::new(gw.scope_for(&session.caller));
        let prev = session.swap(next.clone());
        gw.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        if gw.mode == Mode::Passthrough
            && !prev.same_tools(&next)
            && let Some(peer) = session.peer()
        {
            if peer.notify_tool_list_changed().await.is_ok() {
                gw.counters.list_changed_sent.fetch_add(1, Ordering::Relaxed);
            } else if peer.is_transport_closed() {
                return;
            }
        }
    }
}
