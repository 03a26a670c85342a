//! Backend sessions of callers without a client session (2026-07-28 clients), one set per
//! principal.
//!
//! A `per_client` backend keeps state per backend session, and a caller without a session has
//! no [`ClientUpstreams`] of its own; sending such callers over the gateway's shared connection
//! would let one principal read what another left there. So each principal gets a
//! [`ClientUpstreams`] here on its first session-less request to a `per_client` backend, reused
//! by that principal's later session-less requests; its connections close when idle like a
//! session's. The backend is sent the principal's identity (headers, exchanged token) as it
//! would be for a session of that principal.
//!
//! Bounded: at most `max` principals hold one at once. Past it, the least recently used set no
//! request is using is closed to make room; when every set is in use, the request is refused
//! ([`CallError::PrincipalsBusy`]) rather than sharing anything.
//!
//! Without authentication every caller is the one `anonymous` principal, and shares one set.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client::Relay;
use super::{Backend, CallError, ClientUpstreams, Link};

pub struct PrincipalUpstreams {
    /// Where their backends' traffic goes: routed to the call it belongs to, as on a shared
    /// connection (several requests of one principal may run on one connection).
    relay: Arc<dyn Relay>,
    idle: Duration,
    max: usize,
    /// One writer at a time: [`PrincipalUpstreams::link`].
    held: Mutex<lru::LruCache<String, Arc<ClientUpstreams>>>,
    /// Sets closed to make room for another principal.
    evicted: AtomicU64,
    /// Requests refused because every set was in use.
    refused: AtomicU64,
}

impl PrincipalUpstreams {
    pub fn new(relay: Arc<dyn Relay>, idle: Duration, max: usize) -> Self {
        Self {
            relay,
            idle,
            max: max.max(1),
            held: Mutex::new(lru::LruCache::unbounded()),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The connection to `backend` for a session-less request of `principal` (presenting
    /// `token`): that principal's own backend session, opened now if need be. The link keeps
    /// the principal's set alive until the request drops it.
    pub async fn link(
        &self,
        principal: &str,
        token: Option<Arc<str>>,
        backend: &Arc<Backend>,
    ) -> Result<Link, CallError> {
        let upstreams = self.upstreams(principal)?;
        upstreams.set_identity(principal.to_string(), token);
        let mut link = upstreams.link(backend).await?;
        link.owner = Some(upstreams);
        Ok(link)
    }

    fn upstreams(&self, principal: &str) -> Result<Arc<ClientUpstreams>, CallError> {
        let mut held = self.held.lock().expect("principal upstreams lock");
        if let Some(u) = held.get(principal) {
            return Ok(u.clone());
        }
        if held.len() >= self.max {
            // The least recently used set that no request holds (the cache's is the only handle).
            let idle = held.iter().rev().find(|(_, u)| Arc::strong_count(u) == 1).map(|(p, _)| p.clone());
            let Some(idle) = idle else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(CallError::PrincipalsBusy { max: self.max });
            };
            held.pop(&idle);
            self.evicted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(principal = %idle, "a session-less principal's backend sessions closed to make room");
        }
        // Nothing is recorded for another replica to take over: these close when they end.
        let keep = Arc::new(AtomicBool::new(false));
        let upstreams = Arc::new(ClientUpstreams::new(self.relay.clone(), self.idle, keep));
        held.put(principal.to_string(), upstreams.clone());
        Ok(upstreams)
    }

    /// Sets a request is using now.
    pub fn in_use(&self) -> usize {
        self.held.lock().expect("principal upstreams lock").iter().filter(|(_, u)| Arc::strong_count(u) > 1).count()
    }

    /// The principals whose backend sessions are held (least recently used last).
    pub fn principals(&self) -> Vec<String> {
        self.held.lock().expect("principal upstreams lock").iter().map(|(p, _)| p.clone()).collect()
    }

    /// Principals holding a set now, sets closed to make room, and requests refused.
    pub fn counts(&self) -> (usize, u64, u64) {
        let held = self.held.lock().expect("principal upstreams lock").len();
        (held, self.evicted.load(Ordering::Relaxed), self.refused.load(Ordering::Relaxed))
    }

    /// Closes every set (a stop).
    pub fn clear(&self) {
        self.held.lock().expect("principal upstreams lock").clear();
    }
}
