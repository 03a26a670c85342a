//! The one record of the client sessions this process holds: each session's caller from the
//! moment its id exists, its handle once it is initialised, until it ends.
//!
//! The HTTP layer's session manager writes it at the three moments of a session's life it
//! sees, whatever caused them: a session is **claimed** for its principal when rmcp hands it its
//! `initialize` (a new session, or one rebuilt from the shared store: either way before the id
//! reaches anyone), **bound** to its [`SessionHandle`] by the handler that initialises it, and
//! **ended** when rmcp closes it (`DELETE`, idle timeout, ended on another replica). Everything
//! else reads it: the edge asks whose a session is, `/status` how many there are, the shared
//! store forgets what an ended session left. A session without an HTTP id (stdio, benchmarks)
//! is counted but has no owner to ask for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::SessionHandle;

#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<Arc<str>, Entry>,
    /// Sessions with no HTTP id: stdio's one, and benchmarks'.
    unnamed: Vec<Weak<SessionHandle>>,
}

struct Entry {
    owner: Arc<str>,
    /// Empty until the handler that initialises the session binds it.
    handle: Weak<SessionHandle>,
}

/// A claim refused: the id is someone else's already.
#[derive(Debug, PartialEq, Eq)]
pub struct Taken;

impl Registry {
    /// Records `owner` as the principal of session `id`. The same owner may claim again (a
    /// replay); another is refused.
    pub fn claim(&self, id: &str, owner: &str) -> Result<(), Taken> {
        let mut inner = self.inner.lock().expect("registry lock");
        match inner.by_id.get(id) {
            Some(e) if &*e.owner != owner => Err(Taken),
            Some(_) => Ok(()),
            None => {
                inner.by_id.insert(Arc::from(id), Entry { owner: Arc::from(owner), handle: Weak::new() });
                Ok(())
            }
        }
    }

    /// Whose session `id` is, if this process holds it.
    pub fn owner(&self, id: &str) -> Option<Arc<str>> {
        self.inner.lock().expect("registry lock").by_id.get(id).map(|e| e.owner.clone())
    }

    /// Binds the initialised session `handle` to its id (`None`: a session without one).
    pub fn bind(&self, id: Option<&str>, handle: &Arc<SessionHandle>) {
        let mut inner = self.inner.lock().expect("registry lock");
        match id.and_then(|id| inner.by_id.get_mut(id)) {
            Some(e) => e.handle = Arc::downgrade(handle),
            None => {
                inner.unnamed.retain(|w| w.strong_count() > 0);
                inner.unnamed.push(Arc::downgrade(handle));
            }
        }
    }

    /// Forgets session `id`: it has ended here. True if it was held.
    pub fn end(&self, id: &str) -> bool {
        self.inner.lock().expect("registry lock").by_id.remove(id).is_some()
    }

    /// Live sessions by principal (sessions without an HTTP id are not counted: they have no
    /// recorded owner).
    pub fn by_principal(&self) -> std::collections::BTreeMap<String, usize> {
        let inner = self.inner.lock().expect("registry lock");
        let mut out = std::collections::BTreeMap::new();
        for e in inner.by_id.values().filter(|e| e.handle.strong_count() > 0) {
            *out.entry(e.owner.to_string()).or_default() += 1;
        }
        out
    }

    /// Sessions of `principal` claimed and not ended (initialised or about to be).
    pub fn count_of(&self, principal: &str) -> usize {
        let inner = self.inner.lock().expect("registry lock");
        inner.by_id.values().filter(|e| &*e.owner == principal).count()
    }

    /// Sessions initialised and not ended, with their HTTP id if they have one.
    pub fn sessions(&self) -> Vec<(Option<Arc<str>>, Arc<SessionHandle>)> {
        let inner = self.inner.lock().expect("registry lock");
        let named = inner.by_id.iter().filter_map(|(id, e)| Some((Some(id.clone()), e.handle.upgrade()?)));
        named.chain(inner.unnamed.iter().filter_map(|w| Some((None, w.upgrade()?)))).collect()
    }

    /// Sessions initialised and not ended.
    pub fn live(&self) -> usize {
        let inner = self.inner.lock().expect("registry lock");
        let named = inner.by_id.values().filter(|e| e.handle.strong_count() > 0).count();
        named + inner.unnamed.iter().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{Caller, Snapshot};

    #[test]
    fn a_session_is_its_first_claimants_until_it_ends() {
        let r = Registry::default();
        assert_eq!(r.owner("s1"), None);
        r.claim("s1", "alice").unwrap();
        assert_eq!(r.claim("s1", "alice"), Ok(()), "a replay of the same owner");
        assert_eq!(r.claim("s1", "mallory"), Err(Taken));
        assert_eq!(r.owner("s1").as_deref(), Some("alice"));
        assert_eq!(r.live(), 0, "claimed, not yet initialised");
        let handle = SessionHandle::new(Caller::anonymous(), Arc::new(Snapshot::empty()), 1);
        r.bind(Some("s1"), &handle);
        assert_eq!(r.live(), 1);
        assert!(r.end("s1"));
        assert_eq!((r.owner("s1"), r.live()), (None, 0));
        assert!(!r.end("s1"));
        r.claim("s1", "mallory").unwrap();
        assert_eq!(r.owner("s1").as_deref(), Some("mallory"), "an ended id is free");
    }

    #[test]
    fn sessions_without_an_id_are_counted_until_dropped() {
        let r = Registry::default();
        let handle = SessionHandle::new(Caller::anonymous(), Arc::new(Snapshot::empty()), 1);
        r.bind(None, &handle);
        assert_eq!(r.live(), 1);
        drop(handle);
        assert_eq!(r.live(), 0);
    }
}
