//! Per-session scope: which tools a session may see and call, as one immutable [`Snapshot`]
//! behind an `ArcSwap` in a stable [`SessionHandle`]. A request loads the snapshot once and uses
//! it to the end, so a swap never changes a call in flight.
//!
//! [`scope`] is the one function that computes a scope, for sessions and stateless callers alike:
//! the generation's tools, narrowed to advertisable backends and by a [`Policy`]. Building a
//! snapshot runs no model and contacts no backend.
//!
//! [`registry`] is the one record of the client sessions this process holds; [`shared`] keeps
//! sessions in Redis so that other replicas can rebuild them.

pub mod registry;
pub mod shared;
pub mod surface;
pub mod usage;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use rmcp::service::{Peer, RoleServer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::catalog::CatalogTool;
use crate::index::{AllowList, Slot};
use crate::store::Generation;
use crate::upstream::ClientUpstreams;

/// Who is asking, as authentication established it. Sessions and stateless callers both have
/// one. Two callers are the same when their principal and groups are: the token is carried only
/// for backends configured to pass it on, and never hashed or logged (a session compares it
/// with its last one only to tell that it changed).
#[derive(Clone)]
pub struct Caller {
    /// The verified principal's name, or `anonymous` without authentication.
    pub principal: String,
    pub groups: Vec<String>,
    /// The bearer token the caller presented, if any.
    pub token: Option<Arc<str>>,
}

impl Caller {
    pub fn anonymous() -> Self {
        Self::named(crate::config::ANONYMOUS, Vec::new())
    }

    pub fn named(principal: &str, groups: Vec<String>) -> Self {
        Self { principal: principal.to_string(), groups, token: None }
    }

    /// The same caller without its token: what a scope is built for and may keep.
    pub fn without_token(&self) -> Self {
        Self { principal: self.principal.clone(), groups: self.groups.clone(), token: None }
    }
}

impl PartialEq for Caller {
    fn eq(&self, other: &Self) -> bool {
        self.principal == other.principal && self.groups == other.groups
    }
}

impl Eq for Caller {}

impl std::hash::Hash for Caller {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.principal.hash(state);
        self.groups.hash(state);
    }
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("principal", &self.principal)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

/// What a caller may use of one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every tool, and its resources and prompts.
    All,
    Nothing,
    /// Some tools ([`Policy::allows`] says which); no resources or prompts.
    Some,
}

/// Narrows a caller's scope beyond backend health; authorization implements it.
pub trait Policy: Send + Sync + 'static {
    /// What `caller` may use of `backend`, asked once per backend.
    fn backend(&self, caller: &Caller, backend: &str) -> Access;

    /// With [`Access::Some`]: whether `caller` may use the tool `backend` calls `tool`.
    fn allows(&self, caller: &Caller, backend: &str, tool: &str) -> bool;
}

/// Allows every tool to every caller.
pub struct AllowAll;

impl Policy for AllowAll {
    fn backend(&self, _: &Caller, _: &str) -> Access {
        Access::All
    }

    fn allows(&self, _: &Caller, _: &str, _: &str) -> bool {
        true
    }
}

/// An immutable view of the tools one caller may use, over one generation.
#[derive(Debug)]
pub struct Snapshot {
    pub generation: Arc<Generation>,
    pub allow: AllowList,
    /// Tools the caller may use whose backend is not advertised now (down): find_tool names
    /// them as unavailable. `None` when every backend is up.
    pub held_back: Option<AllowList>,
    /// Token weight of every allowed tool: find_tool's baseline.
    pub baseline_tokens: u64,
    /// The health and policy version this scope was built at (`Gateway::scope_version`): with the generation's
    /// id, it tells whether the snapshot is still current.
    pub health_version: u64,
    /// Who it was built for (principal and groups, never a token): a session whose caller's
    /// groups changed no longer uses it.
    pub caller: Caller,
    /// find_tool's description for this scope, written once when first asked for.
    pub find_tool_text: std::sync::OnceLock<String>,
}

impl Snapshot {
    pub fn empty() -> Self {
        let generation = Arc::new(Generation::empty());
        Self {
            generation,
            allow: AllowList::none(0),
            held_back: None,
            baseline_tokens: 0,
            health_version: 0,
            caller: Caller::anonymous(),
            find_tool_text: Default::default(),
        }
    }

    /// The allowed tool exposed under `name`, if any.
    pub fn tool(&self, name: &str) -> Option<&CatalogTool> {
        let pos = self.generation.catalog.position(name)?;
        self.allow.contains(pos as Slot).then(|| &self.generation.catalog.tools()[pos])
    }

    /// Allowed tools in catalog (name) order.
    pub fn tools(&self) -> impl Iterator<Item = &CatalogTool> {
        let tools = self.generation.catalog.tools();
        self.allow.iter().map(move |s| &tools[s as usize])
    }

    /// Every tool the caller may use, whether its backend is up or down (allowed, then held
    /// back).
    pub fn scope_tools(&self) -> impl Iterator<Item = &CatalogTool> {
        let tools = self.generation.catalog.tools();
        self.allow.iter().chain(self.held_back.iter().flat_map(AllowList::iter)).map(move |s| &tools[s as usize])
    }

    /// Bytes this snapshot holds beyond the shared generation.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.allow.heap_bytes()
            + self.held_back.as_ref().map_or(0, AllowList::heap_bytes)
            + self.find_tool_text.get().map_or(0, String::capacity)
    }

    /// What a passthrough client sees of this scope (the allowed tools, names and contents, in
    /// order), as one number: two scopes with the same one list the same tools. Kept instead of
    /// a snapshot, it holds no generation alive.
    pub fn listed(&self) -> u64 {
        self.listed_where(|_| true)
    }

    /// [`Self::listed`] over the allowed tools `keep` selects (optimizer mode's pinned tools).
    pub fn listed_where(&self, keep: impl Fn(&CatalogTool) -> bool) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for t in self.tools().filter(|t| keep(t)) {
            t.digest.hash(&mut h);
        }
        h.finish()
    }
}

/// Computes a caller's scope over `generation`.
/// `advertisable` is asked once per backend, not per tool.
pub fn scope(
    generation: Arc<Generation>,
    advertisable: &dyn Fn(&str) -> bool,
    policy: &dyn Policy,
    caller: &Caller,
) -> Snapshot {
    let tools = generation.catalog.tools();
    let mut allow = AllowList::none(tools.len());
    let mut baseline_tokens = 0;
    let mut held_back: Option<AllowList> = None;
    for b in &generation.by_backend {
        let up = advertisable(&b.backend);
        let into = if up { &mut allow } else { held_back.get_or_insert_with(|| AllowList::none(tools.len())) };
        match policy.backend(caller, &b.backend) {
            Access::Nothing => {}
            Access::All => {
                into.union_with(&b.slots);
                if up {
                    baseline_tokens += b.tokens;
                }
            }
            Access::Some => {
                for slot in b.slots.iter() {
                    let t = &tools[slot as usize];
                    if policy.allows(caller, &b.backend, &t.key.tool) {
                        into.insert(slot);
                        if up {
                            baseline_tokens += t.tokens;
                        }
                    }
                }
            }
        }
    }
    Snapshot {
        generation,
        allow,
        held_back,
        baseline_tokens,
        health_version: 0,
        caller: caller.without_token(),
        find_tool_text: Default::default(),
    }
}

/// A client session's `logging/setLevel`: log messages below it are not passed on to it.
#[derive(Debug, Default)]
pub struct LogLevel(std::sync::atomic::AtomicU8);

#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
impl LogLevel {
    pub fn set(&self, level: rmcp::model::LoggingLevel) {
        self.0.store(rank(level) + 1, Ordering::Relaxed);
    }

    /// A session-less request's level: the one its `_meta` names, and none at all without one
    /// (SEP-2575: no log messages for a request that did not ask for them).
    pub fn of_request(level: Option<rmcp::model::LoggingLevel>) -> Self {
        match level {
            Some(l) => Self(std::sync::atomic::AtomicU8::new(rank(l) + 1)),
            None => Self(std::sync::atomic::AtomicU8::new(SILENT)),
        }
    }

    /// Whether a message at `level` reaches the client (all do until it sets a level).
    pub fn allows(&self, level: rmcp::model::LoggingLevel) -> bool {
        rank(level) + 1 >= self.0.load(Ordering::Relaxed)
    }
}

/// Above every level's rank + 1: nothing is let through.
const SILENT: u8 = 9;

#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
fn rank(level: rmcp::model::LoggingLevel) -> u8 {
    use rmcp::model::LoggingLevel as L;
    match level {
        L::Debug => 0,
        L::Info => 1,
        L::Notice => 2,
        L::Warning => 3,
        L::Error => 4,
        L::Critical => 5,
        L::Alert => 6,
        L::Emergency => 7,
    }
}

/// One session's stable state: its caller, its current snapshot and the peer to notify.
pub struct SessionHandle {
    /// Unique in this process: tells one session's calls from another's.
    pub id: u64,
    /// The caller as its latest request presented itself ([`SessionHandle::present`]). The
    /// principal never changes (the HTTP edge answers another principal's requests with 404);
    /// the groups and the token follow the caller's credential.
    caller: ArcSwap<Caller>,
    /// Swapped by the session's resync worker, and by a request that finds it stale
    /// ([`crate::mcp::Gateway`] decides both; the newest scope wins either way).
    scope: ArcSwap<Snapshot>,
    /// The client, for notifications; set at initialize.
    peer: OnceLock<Peer<RoleServer>>,
    /// Its own upstream sessions (`per_client` backends); set at initialize.
    upstreams: OnceLock<ClientUpstreams>,
    /// Its `logging/setLevel`.
    pub level: Arc<LogLevel>,
    /// Forwarded calls it may have running at once (`server.max_calls_per_session`).
    pub calls: Arc<Semaphore>,
    /// Cancelled when the session ends: its tasks stop with it.
    ended: CancellationToken,
    /// Where its upstream sessions go when it ends ([`SessionHandle::upstreams_at_end`]).
    farewell: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<ClientUpstreams>>>,
    /// Woken when the caller's groups changed: its resync worker tells a passthrough client.
    pub rescoped: Arc<tokio::sync::Notify>,
    /// Its last find_tool, and the labels its calls have given (learning from use).
    pub usage: Arc<usage::Usage>,
    /// What its client is shown; set at initialize.
    surface: OnceLock<surface::Choice>,
}

/// What changed when a request presented its caller to its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    Same,
    /// A new token, same groups: what backends are sent changes, the scope does not.
    Token,
    /// Other groups: the scope is derived again.
    Groups,
}

impl SessionHandle {
    pub fn new(caller: Caller, snapshot: Arc<Snapshot>, max_calls: usize) -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            caller: ArcSwap::from_pointee(caller),
            scope: ArcSwap::new(snapshot),
            peer: OnceLock::new(),
            upstreams: OnceLock::new(),
            level: Arc::default(),
            calls: Arc::new(Semaphore::new(max_calls)),
            ended: CancellationToken::new(),
            farewell: std::sync::Mutex::new(None),
            rescoped: Arc::default(),
            usage: Default::default(),
            surface: OnceLock::new(),
        })
    }

    /// The caller as of its latest request.
    pub fn caller(&self) -> Arc<Caller> {
        self.caller.load_full()
    }

    /// Takes `caller` (the same principal, as the edge checked) as the session's caller from now
    /// on, and says what changed: a re-issued token with fewer groups takes effect on the
    /// request that presents it, and a refreshed token is what backends get next.
    pub fn present(&self, caller: &Caller) -> Presented {
        let current = self.caller.load();
        let changed = if current.groups != caller.groups {
            Presented::Groups
        } else if current.token != caller.token {
            Presented::Token
        } else {
            return Presented::Same;
        };
        self.caller.store(Arc::new(caller.clone()));
        if let Some(upstreams) = self.upstreams.get() {
            upstreams.set_identity(caller.principal.clone(), caller.token.clone());
        }
        changed
    }

    pub fn set_upstreams(&self, upstreams: ClientUpstreams) {
        let _ = self.upstreams.set(upstreams);
    }

    pub fn upstreams(&self) -> Option<&ClientUpstreams> {
        self.upstreams.get()
    }

    /// Cancelled when the session ends.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Resolves when the session ends: with its upstream sessions, which then close when the
    /// receiver drops them (not at once), so that what still has to be said on them can be.
    /// Without upstream sessions, or a second time, it resolves with an error.
    pub fn upstreams_at_end(&self) -> tokio::sync::oneshot::Receiver<ClientUpstreams> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.farewell.lock().expect("farewell lock") = Some(tx);
        rx
    }

    /// The snapshot to use for one whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.scope.load_full()
    }

    /// Installs a new snapshot, returning the one it replaced.
    pub fn swap(&self, next: Arc<Snapshot>) -> Arc<Snapshot> {
        self.scope.swap(next)
    }

    pub fn set_peer(&self, peer: Peer<RoleServer>) {
        let _ = self.peer.set(peer);
    }

    pub fn peer(&self) -> Option<&Peer<RoleServer>> {
        self.peer.get()
    }

    /// What its client is shown (set once, at initialize; `None` before).
    pub fn surface(&self) -> Option<&surface::Choice> {
        self.surface.get()
    }

    pub fn set_surface(&self, choice: surface::Choice) {
        let _ = self.surface.set(choice);
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        let farewell = self.farewell.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(tx), Some(upstreams)) = (farewell, self.upstreams.take()) {
            // Refused (nobody waits any more): they close here, as they would have.
            let _ = tx.send(upstreams);
        }
        self.ended.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Aggregation, Catalog, Listing};
    use rmcp::model::Tool;

    fn generation() -> Arc<Generation> {
        let schema = Arc::new(serde_json::Map::new());
        let a = [Tool::new("echo", "Echo", schema.clone()), Tool::new("add", "Add", schema.clone())];
        let b = [Tool::new("echo", "Echo", schema)];
        let (catalog, _) = Catalog::resolve(
            &[
                Listing { backend: "stable", tools: &a, server: None },
                Listing { backend: "unstable", tools: &b, server: None },
            ],
            &Aggregation::default(),
        );
        Arc::new(Generation::keyword_only(catalog))
    }

    struct OnlyEcho;
    impl Policy for OnlyEcho {
        fn backend(&self, _: &Caller, _: &str) -> Access {
            Access::Some
        }

        fn allows(&self, _: &Caller, _: &str, tool: &str) -> bool {
            tool == "echo"
        }
    }

    #[test]
    fn scope_narrows_by_health_and_policy() {
        let g = generation();
        let caller = Caller::anonymous();
        let s = scope(g.clone(), &|b| b == "stable", &AllowAll, &caller);
        let names: Vec<_> = s.tools().map(|t| t.name().to_string()).collect();
        assert_eq!(names, vec!["stable_add", "stable_echo"]);
        assert!(s.tool("unstable_echo").is_none());
        assert!(s.tool("stable_echo").is_some());
        let total: u64 = s.tools().map(|t| t.tokens).sum();
        assert_eq!(s.baseline_tokens, total);

        let s = scope(g.clone(), &|_| true, &OnlyEcho, &caller);
        assert_eq!(s.tools().count(), 2);
        let none = scope(g, &|_| false, &AllowAll, &caller);
        assert_eq!(none.tools().count(), 0);
        assert_eq!(none.baseline_tokens, 0);
    }

    #[test]
    fn snapshot_memory_is_a_bit_per_tool() {
        let s = scope(generation(), &|_| true, &AllowAll, &Caller::anonymous());
        // Three tools: one 64-bit word of bits plus the fixed header.
        assert!(s.heap_bytes() <= 8 + 1024, "{}", s.heap_bytes());
    }

    #[test]
    #[expect(deprecated, reason = "logging levels are what is checked")]
    fn a_request_without_a_log_level_hears_no_log_lines() {
        use rmcp::model::LoggingLevel as L;
        let none = LogLevel::of_request(None);
        assert!(!none.allows(L::Emergency) && !none.allows(L::Debug));
        let warning = LogLevel::of_request(Some(L::Warning));
        assert!(warning.allows(L::Error) && warning.allows(L::Warning) && !warning.allows(L::Info));
        assert!(LogLevel::default().allows(L::Debug), "a session hears everything until it sets a level");
    }

    #[test]
    fn a_swap_leaves_a_loaded_snapshot_alone() {
        let g = generation();
        let s = scope(g.clone(), &|_| true, &AllowAll, &Caller::anonymous());
        let h = SessionHandle::new(Caller::anonymous(), Arc::new(s), 1);
        let in_flight = h.snapshot();
        h.swap(Arc::new(scope(g, &|b| b == "stable", &AllowAll, &Caller::anonymous())));
        assert!(in_flight.tool("unstable_echo").is_some());
        assert!(h.snapshot().tool("unstable_echo").is_none());
    }
}
