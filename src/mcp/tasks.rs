//! Tasks relayed for clients (SEP-2663, `io.modelcontextprotocol/tasks`).
//!
//! A backend that runs a tool call as a task answers with a task id of its own. The client is
//! given another one, minted here (128 random bits), and this table maps it back to the backend,
//! the backend's id, the tool and the task's owner: the caller's principal and, for a client
//! with a session, the sha256 of that session's id (the raw id is never kept, here or in the
//! shared store). `tasks/get|update|cancel` reach the backend only for the owner, and only while
//! the owner may still use the tool (checked by the handler on every use); for anyone else the
//! task does not exist (the same `-32602` as an id never issued, so a guessed or leaked id tells
//! nothing). The backend's own ids never reach clients, so a client cannot name another
//! backend's task, or another client's task on the same backend.
//!
//! Bounds, per principal (all its sessions and session-less requests together): at most
//! [`MAX_LIVE_PER_PRINCIPAL`] tasks not yet seen to finish, and at most
//! [`MAX_ROUTES_PER_PRINCIPAL`] remembered. The whole table holds at most [`MAX_ROUTES`]; a
//! principal over its own bound gives up its own least recently used route, and a full table
//! takes one from the principal holding the most, so one principal can never push another's
//! routes out while it holds more. A task seen to finish is remembered [`FINISHED_TTL`] more;
//! none longer than its `ttlMs` or [`MAX_TTL`]. A route pushed out before its task finished is
//! handed back to the caller, which cancels the task at the backend. With a shared session
//! store the route is written there too, so a replica that did not create the task still finds
//! it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lru::LruCache;
use serde::{Deserialize, Serialize};

/// Tasks remembered at most, across all clients.
pub const MAX_ROUTES: usize = 16_384;
/// Tasks one principal's routes may take of the table.
pub const MAX_ROUTES_PER_PRINCIPAL: usize = 1024;
/// Tasks one principal may have that have not been seen to finish.
pub const MAX_LIVE_PER_PRINCIPAL: usize = 256;
/// How long a task is remembered once it was seen to finish (for a last `tasks/get`).
pub const FINISHED_TTL: Duration = Duration::from_secs(10 * 60);
/// The longest a task is remembered, whatever its `ttlMs` (or when it has none).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Who created a task: only the same caller, from the same session, may use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub principal: String,
    /// The sha256 (hex) of the client's session id (`Mcp-Session-Id`); `None` for a client
    /// without a session.
    pub session: Option<String>,
}

impl Owner {
    /// The owner of a task created by `principal` in session `session` (its raw id).
    pub fn new(principal: &str, session: Option<&str>) -> Self {
        let hashed = session.map(|s| base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(s)));
        Self { principal: principal.to_string(), session: hashed }
    }
}

/// Where a client's task lives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Route {
    pub backend: String,
    /// The backend's id for the task.
    pub upstream: String,
    /// The tool the task came from, as the backend names it: the owner must still be allowed
    /// it for every later use.
    #[serde(default)]
    pub tool: String,
    /// The backend connection's instance the task was created on (this replica only: a route
    /// read from the shared store has none); a backend a reload replaced does not know it.
    #[serde(skip)]
    pub instance: Option<u64>,
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
            tool: String::new(),
            instance: None,
            owner,
            expires_ms: now_ms().saturating_add(ttl.as_millis() as u64),
            finished: false,
        }
    }

    fn expired(&self) -> bool {
        now_ms() >= self.expires_ms
    }

    /// Not yet seen to finish, and not expired: it counts against its principal's bound.
    fn live(&self) -> bool {
        !self.finished && !self.expired()
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
    inner: Mutex<Table>,
}

struct Table {
    /// Most recently used first; bounded by `capacity` through [`Table::make_room`].
    routes: LruCache<String, Route>,
    /// Routes held per principal.
    held: HashMap<String, usize>,
    capacity: usize,
    per_principal: usize,
}

impl Default for TaskRoutes {
    fn default() -> Self {
        Self::with_capacity(MAX_ROUTES, MAX_ROUTES_PER_PRINCIPAL)
    }
}

impl TaskRoutes {
    pub fn with_capacity(capacity: usize, per_principal: usize) -> Self {
        let table = Table {
            routes: LruCache::unbounded(),
            held: HashMap::new(),
            capacity: capacity.max(1),
            per_principal: per_principal.max(1),
        };
        Self { inner: Mutex::new(table) }
    }

    /// A fresh client-facing id.
    pub fn mint() -> String {
        format!("tmx-{}", base16ct::lower::encode_string(&rand::random::<[u8; 16]>()))
    }

    /// Remembers `route` under a new id, unless its principal already has
    /// [`MAX_LIVE_PER_PRINCIPAL`] unfinished tasks. Also returns the unfinished routes pushed
    /// out to make room: their tasks are to be cancelled at their backends.
    pub fn insert(&self, route: Route) -> Result<(String, Vec<Route>), TooMany> {
        let mut t = self.inner.lock().expect("task routes lock");
        let principal = route.owner.principal.clone();
        let live = t.routes.iter().filter(|(_, r)| r.owner.principal == principal && r.live()).count();
        if live >= MAX_LIVE_PER_PRINCIPAL {
            return Err(TooMany);
        }
        let pushed = t.make_room(&principal);
        let id = Self::mint();
        t.put(id.clone(), route);
        Ok((id, pushed))
    }

    /// Keeps a route another replica created (read from the shared store).
    pub fn adopt(&self, id: &str, route: Route) -> Vec<Route> {
        let mut t = self.inner.lock().expect("task routes lock");
        if t.routes.contains(id) {
            return Vec::new();
        }
        let pushed = t.make_room(&route.owner.principal);
        t.put(id.to_string(), route);
        pushed
    }

    /// The route of task `id`, if `owner` created it and it has not expired.
    pub fn get(&self, id: &str, owner: &Owner) -> Option<Route> {
        let mut t = self.inner.lock().expect("task routes lock");
        let route = t.routes.get(id)?;
        if route.expired() {
            t.remove(id);
            return None;
        }
        (route.owner == *owner).then(|| route.clone())
    }

    /// Whether task `id` is known here at all (whoever owns it).
    pub fn knows(&self, id: &str) -> bool {
        self.inner.lock().expect("task routes lock").routes.contains(id)
    }

    /// Notes that task `id` reached a terminal state: it is remembered [`FINISHED_TTL`] more at
    /// most. Returns the route as it is now (for the shared store), if it was known.
    pub fn finished(&self, id: &str) -> Option<Route> {
        let mut t = self.inner.lock().expect("task routes lock");
        let r = t.routes.peek_mut(id)?;
        if !r.finished {
            r.finished = true;
            r.expires_ms = r.expires_ms.min(now_ms().saturating_add(FINISHED_TTL.as_millis() as u64));
        }
        Some(r.clone())
    }

    /// Forgets every task `owner` made, and hands them back (its session ended).
    pub fn take_owned(&self, owner: &Owner) -> Vec<(String, Route)> {
        let mut t = self.inner.lock().expect("task routes lock");
        let ids: Vec<String> = t.routes.iter().filter(|(_, r)| r.owner == *owner).map(|(id, _)| id.clone()).collect();
        ids.into_iter().filter_map(|id| t.remove(&id).map(|r| (id, r))).collect()
    }

    /// Forgets task `id` (its owner may no longer use it).
    pub fn forget(&self, id: &str) {
        self.inner.lock().expect("task routes lock").remove(id);
    }

    /// Tasks remembered, by owning principal: (unfinished, finished).
    pub fn by_principal(&self) -> std::collections::BTreeMap<String, (usize, usize)> {
        let t = self.inner.lock().expect("task routes lock");
        let mut out: std::collections::BTreeMap<String, (usize, usize)> = std::collections::BTreeMap::new();
        for (_, r) in t.routes.iter() {
            let e = out.entry(r.owner.principal.clone()).or_default();
            if r.live() { e.0 += 1 } else { e.1 += 1 }
        }
        out
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("task routes lock").routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Table {
    fn put(&mut self, id: String, route: Route) {
        *self.held.entry(route.owner.principal.clone()).or_default() += 1;
        self.routes.put(id, route);
    }

    fn remove(&mut self, id: &str) -> Option<Route> {
        let route = self.routes.pop(id)?;
        if let Some(n) = self.held.get_mut(&route.owner.principal) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&route.owner.principal);
            }
        }
        Some(route)
    }

    /// Makes room for one more route of `principal`: expired routes go first; then, while
    /// `principal` is at its own bound, its own least recently used; while the table is full,
    /// the least recently used of whoever holds the most (finished routes before live ones).
    /// Returns the live routes pushed out.
    fn make_room(&mut self, principal: &str) -> Vec<Route> {
        let full =
            |t: &Self| t.routes.len() >= t.capacity || t.held.get(principal).copied().unwrap_or(0) >= t.per_principal;
        if !full(self) {
            return Vec::new();
        }
        let expired: Vec<String> = self.routes.iter().filter(|(_, r)| r.expired()).map(|(id, _)| id.clone()).collect();
        for id in expired {
            self.remove(&id);
        }
        let mut pushed = Vec::new();
        while full(self) {
            let from = if self.held.get(principal).copied().unwrap_or(0) >= self.per_principal {
                principal.to_string()
            } else {
                let most = self.held.iter().max_by_key(|(_, n)| **n).map(|(p, _)| p.clone());
                let Some(most) = most else { break };
                most
            };
            let oldest = |finished: bool| {
                self.routes
                    .iter()
                    .rev()
                    .find(|(_, r)| r.owner.principal == from && (r.finished || !finished))
                    .map(|(id, _)| id.clone())
            };
            let Some(id) = oldest(true).or_else(|| oldest(false)) else { break };
            if let Some(route) = self.remove(&id).filter(|r| r.live()) {
                pushed.push(route);
            }
        }
        pushed
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(p: &str, s: Option<&str>) -> Owner {
        Owner::new(p, s)
    }

    fn insert(routes: &TaskRoutes, route: Route) -> String {
        routes.insert(route).unwrap().0
    }

    #[test]
    fn only_the_owner_finds_a_task() {
        let routes = TaskRoutes::default();
        let id = insert(&routes, Route::new("b", "up-1", owner("alice", Some("s1")), Some(60_000)));
        assert!(id.starts_with("tmx-") && id.len() == 4 + 32);
        assert_eq!(routes.get(&id, &owner("alice", Some("s1"))).unwrap().upstream, "up-1");
        assert!(routes.get(&id, &owner("alice", Some("s2"))).is_none(), "another session of the same caller");
        assert!(routes.get(&id, &owner("alice", None)).is_none(), "the same caller without a session");
        assert!(routes.get(&id, &owner("bob", Some("s1"))).is_none(), "another caller");
        assert!(routes.get("tmx-unknown", &owner("alice", Some("s1"))).is_none());
    }

    #[test]
    fn a_route_keeps_no_raw_session_id() {
        let route = Route::new("b", "up", owner("alice", Some("secret-session-id")), None);
        let stored = serde_json::to_string(&route).unwrap();
        assert!(!stored.contains("secret-session-id"), "{stored}");
        assert_eq!(route.owner.session.as_deref().map(str::len), Some(64));
    }

    #[test]
    fn a_principal_has_a_bounded_number_of_live_tasks_over_all_its_sessions() {
        let routes = TaskRoutes::default();
        let ids: Vec<String> = (0..MAX_LIVE_PER_PRINCIPAL)
            .map(|i| {
                let session = format!("s{}", i % 7);
                insert(&routes, Route::new("b", &format!("t{i}"), owner("alice", Some(&session)), None))
            })
            .collect();
        let over = routes.insert(Route::new("b", "over", owner("alice", Some("fresh-session")), None));
        assert_eq!(over.unwrap_err(), TooMany, "a new session of the same principal gets no more");
        assert_eq!(routes.insert(Route::new("b", "over", owner("alice", None), None)).unwrap_err(), TooMany);
        // Someone else is not held back by alice's tasks.
        assert!(routes.insert(Route::new("b", "x", owner("bob", None), None)).is_ok());
        // A finished task frees its place.
        routes.finished(&ids[0]);
        assert!(routes.insert(Route::new("b", "again", owner("alice", None), None)).is_ok());
    }

    #[test]
    fn an_expired_task_is_forgotten_and_ttls_are_capped() {
        let routes = TaskRoutes::default();
        let alice = owner("alice", None);
        let id = insert(&routes, Route::new("b", "t", alice.clone(), Some(0)));
        assert!(routes.get(&id, &alice).is_none());
        assert!(!routes.knows(&id));
        let long = Route::new("b", "t", alice, Some(u64::MAX));
        assert!(long.remaining() <= MAX_TTL);
    }

    #[test]
    fn a_finished_task_is_remembered_briefly() {
        let routes = TaskRoutes::default();
        let id = insert(&routes, Route::new("b", "t", owner("alice", None), None));
        let finished = routes.finished(&id).unwrap();
        assert!(finished.finished && finished.remaining() <= FINISHED_TTL, "{:?}", finished.remaining());
    }

    #[test]
    fn the_table_is_bounded() {
        let routes = TaskRoutes::with_capacity(4, 4);
        for i in 0..10 {
            insert(&routes, Route::new("b", &format!("t{i}"), owner(&format!("p{i}"), None), None));
        }
        assert_eq!(routes.len(), 4);
    }

    #[test]
    fn one_principal_cannot_push_out_anothers_routes() {
        let routes = TaskRoutes::with_capacity(8, 6);
        let alice = owner("alice", None);
        let kept: Vec<String> =
            (0..2).map(|i| insert(&routes, Route::new("b", &format!("a{i}"), alice.clone(), None))).collect();
        // Mallory fills the table and goes on: past her own bound she pushes out her own routes.
        let mut pushed = Vec::new();
        for i in 0..40 {
            let (_, out) = routes.insert(Route::new("b", &format!("m{i}"), owner("mallory", None), None)).unwrap();
            pushed.extend(out);
        }
        for id in &kept {
            assert!(routes.get(id, &alice).is_some(), "alice's task {id} survived mallory's flood");
        }
        assert!(pushed.iter().all(|r| r.owner.principal == "mallory"), "only mallory's own routes went");
        assert!(routes.len() <= 8);
    }

    #[test]
    fn a_full_table_takes_from_whoever_holds_most_and_hands_back_live_routes() {
        let routes = TaskRoutes::with_capacity(4, 4);
        for i in 0..3 {
            insert(&routes, Route::new("b", &format!("m{i}"), owner("mallory", None), None));
        }
        insert(&routes, Route::new("b", "a0", owner("alice", None), None));
        let (_, pushed) = routes.insert(Route::new("b", "b0", owner("bob", None), None)).unwrap();
        assert_eq!(pushed.len(), 1);
        assert_eq!((pushed[0].owner.principal.as_str(), pushed[0].upstream.as_str()), ("mallory", "m0"));
        assert_eq!(routes.len(), 4);
    }
}
