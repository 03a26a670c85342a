//! Every configured backend, as one set that reloads change atomically.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Backend, children, client};
use crate::config::BackendConfig;

/// Every configured backend. The set changes only on a reload ([`Upstream::add`],
/// [`Upstream::remove`]); readers take the set as it is at that moment.
pub struct Upstream {
    backends: ArcSwap<Vec<Arc<Backend>>>,
    changes: watch::Sender<u64>,
    relay: Arc<dyn client::Relay>,
    /// Cancelled when the gateway stops; every backend's `retired` is a child of it.
    ct: CancellationToken,
    /// Serialises changes to the set.
    writer: std::sync::Mutex<()>,
    groups: children::Groups,
    /// Set when the gateway stops while sessions are shared with other replicas: per-client
    /// HTTP backend sessions are left open for the replica that takes their client over.
    pub keep_sessions: Arc<AtomicBool>,
}

impl Upstream {
    pub fn new(configs: &[BackendConfig], relay: Arc<dyn client::Relay>, ct: CancellationToken) -> Self {
        let (changes, _) = watch::channel(0);
        let groups = children::Groups::default();
        let backends = configs
            .iter()
            .map(|c| Backend::new(c.clone(), changes.clone(), relay.clone(), ct.child_token(), groups.clone()))
            .collect();
        Self {
            backends: ArcSwap::from_pointee(backends),
            changes,
            relay,
            ct,
            writer: Default::default(),
            groups,
            keep_sessions: Arc::default(),
        }
    }

    /// The process groups of every stdio backend started by these backends.
    pub fn children(&self) -> children::Groups {
        self.groups.clone()
    }

    /// The backends now, in configuration order.
    pub fn backends(&self) -> Arc<Vec<Arc<Backend>>> {
        self.backends.load_full()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Backend>> {
        self.backends.load().iter().find(|b| b.name() == name).cloned()
    }

    /// Adds a backend (replacing, and retiring, one of the same name) and returns it; its
    /// supervisor is the caller's to start.
    pub fn add(&self, config: BackendConfig) -> Arc<Backend> {
        let _w = self.writer.lock().expect("upstream writer");
        let backend =
            Backend::new(config, self.changes.clone(), self.relay.clone(), self.ct.child_token(), self.groups.clone());
        let mut next: Vec<Arc<Backend>> = self.backends.load().iter().cloned().collect();
        match next.iter().position(|b| b.name() == backend.name()) {
            Some(i) => std::mem::replace(&mut next[i], backend.clone()).retired.cancel(),
            None => next.push(backend.clone()),
        }
        self.backends.store(Arc::new(next));
        self.changes.send_modify(|v| *v += 1);
        backend
    }

    /// Removes and retires a backend: no new request reaches it, calls under way finish.
    pub fn remove(&self, name: &str) -> Option<Arc<Backend>> {
        let _w = self.writer.lock().expect("upstream writer");
        let mut next: Vec<Arc<Backend>> = self.backends.load().iter().cloned().collect();
        let i = next.iter().position(|b| b.name() == name)?;
        let gone = next.remove(i);
        self.backends.store(Arc::new(next));
        gone.retired.cancel();
        self.changes.send_modify(|v| *v += 1);
        Some(gone)
    }

    /// Ticks whenever any backend's listing or connection changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn all_tried(&self) -> bool {
        self.backends.load().iter().all(|b| b.was_tried())
    }
}
