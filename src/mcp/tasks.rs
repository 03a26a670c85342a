//! Tasks relayed for clients (SEP-2663, `io.modelcontextprotocol/tasks`).
//!
//! A backend that runs a tool call as a task answers with a task id of its own. The client is
//! given another one, minted here (128 random bits), and this table maps it back to the backend,
//! the backend's id and the task's owner: the caller's principal and, for a client with a
//! session, that session. `tasks/get|update|cancel` reach the backend only for the owner; for
//! anyone else the task does not exist (the same `-32602` as an id never issued, so a guessed or
//! leaked id tells nothing). The backend's own ids never reach clients, so a client cannot name
//! another backend's task, or another client's task on the same backend.
//!
//! Bounds: at most [`MAX_ROUTES`] tasks are remembered (the least recently used is forgotten
//! first), at most [`MAX_LIVE_PER_OWNER`] of them not yet known to be finished per owner, and
//! none longer than its `ttlMs` or [`MAX_TTL`]. With a shared session store the route is written
//! there too, so a replica that did not create the task still finds it.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lru::LruCache;
use serde::{Deserialize, Serialize};

/// Tasks remembered at most, across all clients.
pub const MAX_ROUTES: usize = 16_384;
/// Tasks one owner may have that have not been seen to finish.
pub const MAX_LIVE_PER_OWNER: usize = 256;
/// The longest a task is remembered, whatever its `ttlMs` (or when it has none).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Who created a task: only the same caller, from the same session, may use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub principal: String,
    /// The client's session id (`Mcp-Session-Id`); `None` for a client without a session.
    pub session: Option<String>,
}

/// Where a client's task lives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Route {
    pub backend: String,
    /// The backend's id for the task.
    pub upstream: String,
    pub owner: Owner,
    /// Milliseconds since the Unix epoch after which the task is forgotten.
    pub expires_ms: u64,
    /// Seen in a terminal state (it no longer counts against its owner's limit).
    #[serde(default)]
    pub finished: bool,
}

impl Route {
    pub fn new(backend: &str, upstream: &str, owner: Owner, ttl_ms: Option<u64>) -> Self {
        let ttl = ttl_ms.map_or(MAX_TTL, Duration::from_millis).min(MAX_TTL);
        Self {
            backend: backend.to_string(),
            upstream: upstream.to_string(),
            owner,
            expires_ms: now_ms().saturating_add(ttl.as_millis() as u64),
            finished: false,
        }
    }

    fn expired(&self) -> bool {
        now_ms() >= self.expires_ms
    }

    /// How long it is still remembered.
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.expires_ms.saturating_sub(now_ms()))
    }
}

/// Why a task was not taken on.
#[derive(Debug, PartialEq, Eq)]
pub struct TooMany;

pub struct TaskRoutes {
    routes: Mutex<LruCache<String, Route>>,
}

impl Default for TaskRoutes {
    fn default() -> Self {
        Self::with_capacity(MAX_ROUTES)
    }
}

impl TaskRoutes {
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { routes: Mutex::new(LruCache::new(capacity)) }
    }

    /// A fresh client-facing id.
    pub fn mint() -> String {
        format!("tmx-{}", base16ct::lower::encode_string(&rand::random::<[u8; 16]>()))
    }

    /// Remembers `route` under a new id, unless its owner already has
    /// [`MAX_LIVE_PER_OWNER`] unfinished tasks.
    pub fn insert(&self, route: Route) -> Result<String, TooMany> {
        let mut routes = self.routes.lock().expect("task routes lock");
        let live = routes.iter().filter(|(_, r)| r.owner == route.owner && !r.finished && !r.expired()).count();
        if live >= MAX_LIVE_PER_OWNER {
            return Err(TooMany);
        }
        let id = Self::mint();
        routes.put(id.clone(), route);
        Ok(id)
    }

    /// Keeps a route another replica created (read from the shared store).
    pub fn adopt(&self, id: &str, route: Route) {
        self.routes.lock().expect("task routes lock").put(id.to_string(), route);
    }

    /// The route of task `id`, if `owner` created it and it has not expired.
    pub fn get(&self, id: &str, owner: &Owner) -> Option<Route> {
        let mut routes = self.routes.lock().expect("task routes lock");
        let route = routes.get(id)?;
        if route.expired() {
            routes.pop(id);
            return None;
        }
        (route.owner == *owner).then(|| route.clone())
    }

    /// Whether task `id` is known here at all (whoever owns it).
    pub fn knows(&self, id: &str) -> bool {
        self.routes.lock().expect("task routes lock").contains(id)
    }

    /// Notes that task `id` reached a terminal state.
    pub fn finished(&self, id: &str) {
        if let Some(r) = self.routes.lock().expect("task routes lock").peek_mut(id) {
            r.finished = true;
        }
    }

    pub fn len(&self) -> usize {
        self.routes.lock().expect("task routes lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(p: &str, s: Option<&str>) -> Owner {
        Owner { principal: p.into(), session: s.map(Into::into) }
    }

    #[test]
    fn only_the_owner_finds_a_task() {
        let routes = TaskRoutes::default();
        let id = routes.insert(Route::new("b", "up-1", owner("alice", Some("s1")), Some(60_000))).unwrap();
        assert!(id.starts_with("tmx-") && id.len() == 4 + 32);
        assert_eq!(routes.get(&id, &owner("alice", Some("s1"))).unwrap().upstream, "up-1");
        assert!(routes.get(&id, &owner("alice", Some("s2"))).is_none(), "another session of the same caller");
        assert!(routes.get(&id, &owner("alice", None)).is_none(), "the same caller without a session");
        assert!(routes.get(&id, &owner("bob", Some("s1"))).is_none(), "another caller");
        assert!(routes.get("tmx-unknown", &owner("alice", Some("s1"))).is_none());
    }

    #[test]
    fn an_owner_has_a_bounded_number_of_live_tasks() {
        let routes = TaskRoutes::default();
        let alice = owner("alice", None);
        let ids: Vec<String> = (0..MAX_LIVE_PER_OWNER)
            .map(|i| routes.insert(Route::new("b", &format!("t{i}"), alice.clone(), None)).unwrap())
            .collect();
        assert_eq!(routes.insert(Route::new("b", "over", alice.clone(), None)), Err(TooMany));
        // Someone else is not held back by alice's tasks.
        assert!(routes.insert(Route::new("b", "x", owner("bob", None), None)).is_ok());
        // A finished task frees its place.
        routes.finished(&ids[0]);
        assert!(routes.insert(Route::new("b", "again", alice, None)).is_ok());
    }

    #[test]
    fn an_expired_task_is_forgotten_and_ttls_are_capped() {
        let routes = TaskRoutes::default();
        let alice = owner("alice", None);
        let id = routes.insert(Route::new("b", "t", alice.clone(), Some(0))).unwrap();
        assert!(routes.get(&id, &alice).is_none());
        assert!(!routes.knows(&id));
        let long = Route::new("b", "t", alice, Some(u64::MAX));
        assert!(long.remaining() <= MAX_TTL);
    }

    #[test]
    fn the_table_is_bounded() {
        let routes = TaskRoutes::with_capacity(4);
        for i in 0..10 {
            routes.insert(Route::new("b", &format!("t{i}"), owner(&format!("p{i}"), None), None)).unwrap();
        }
        assert_eq!(routes.len(), 4);
    }
}
