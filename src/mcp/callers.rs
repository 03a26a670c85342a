//! What the gateway keeps for each principal that calls without a session (2026-07-28): the
//! places for its running calls, as a session has, and its part in learning from use, as a
//! session's. The [`KEPT`] principals seen last are kept; one pushed out starts afresh.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Semaphore;

use crate::session::usage::{SESSIONLESS_SPAN, Usage};

/// Principals without a session kept at once.
pub const KEPT: usize = 4096;

pub struct Callers {
    /// Places for calls per principal (`server.max_calls_per_session`).
    max_calls: usize,
    seen: Mutex<lru::LruCache<String, Caller>>,
}

struct Caller {
    calls: Arc<Semaphore>,
    usage: Arc<Usage>,
    /// When `usage` began: it counts as one session's for [`SESSIONLESS_SPAN`].
    usage_began: Instant,
}

impl Callers {
    pub fn new(max_calls: usize) -> Self {
        let kept = std::num::NonZeroUsize::new(KEPT).expect("a positive capacity");
        Self { max_calls, seen: Mutex::new(lru::LruCache::new(kept)) }
    }

    /// The places for `principal`'s calls: `max_calls` of them, shared by every request of that
    /// principal (one pushed out while its calls run starts afresh).
    pub fn calls(&self, principal: &str) -> Arc<Semaphore> {
        self.with(principal, |c| c.calls.clone())
    }

    /// Where `principal`'s last find_tool and the labels it gave are kept: its requests count as
    /// one session's for [`SESSIONLESS_SPAN`], then begin afresh.
    pub fn usage(&self, principal: &str) -> Arc<Usage> {
        self.with(principal, |c| {
            if c.usage_began.elapsed() >= SESSIONLESS_SPAN {
                (c.usage, c.usage_began) = (Arc::default(), Instant::now());
            }
            c.usage.clone()
        })
    }

    fn with<T>(&self, principal: &str, f: impl FnOnce(&mut Caller) -> T) -> T {
        let mut seen = self.seen.lock().expect("callers lock");
        let caller = seen.get_or_insert_mut(principal.to_string(), || Caller {
            calls: Arc::new(Semaphore::new(self.max_calls)),
            usage: Arc::default(),
            usage_began: Instant::now(),
        });
        f(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_its_own_places_and_usage() {
        let callers = Callers::new(2);
        let a = callers.calls("alice");
        assert!(Arc::ptr_eq(&a, &callers.calls("alice")));
        assert!(!Arc::ptr_eq(&a, &callers.calls("bob")));
        assert_eq!(a.available_permits(), 2);
        let u = callers.usage("alice");
        assert!(Arc::ptr_eq(&u, &callers.usage("alice")));
        assert!(!Arc::ptr_eq(&u, &callers.usage("bob")));
    }

    #[test]
    fn the_principals_seen_last_are_kept() {
        let callers = Callers::new(1);
        let first = callers.calls("p0");
        for i in 1..=KEPT {
            callers.calls(&format!("p{i}"));
        }
        assert!(!Arc::ptr_eq(&first, &callers.calls("p0")), "the oldest was pushed out");
        assert_eq!(callers.seen.lock().unwrap().len(), KEPT);
    }
}
