//! Prometheus metrics, served at `GET /metrics` in the text exposition format.
//!
//! Every gateway has its own registry (several gateways in one process, as in tests, never mix
//! their series). Events are counted where they happen; states (backend health, breakers, live
//! sessions, catalog size, the embedder's queue) and the counters other parts keep for
//! themselves are read when the endpoint is scraped.

pub mod tokens;
pub mod traffic;

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodOutcome {
    pub method: &'static str,
    /// `ok` or `error` (a JSON-RPC error).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Method {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendOutcome {
    pub backend: String,
    /// `ok`, `is_error`, `timeout`, `breaker_open`, `limited` (`[[limits]]`), `unavailable`,
    /// `cancelled` or `error`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Backend {
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendState {
    pub backend: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Stage {
    /// `embed`, `search` or `fuse`.
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Search {
    /// `hybrid`, `keyword` or `dense`.
    pub mode: &'static str,
    /// `exact`, `graph`, `graph_then_exact`, or `none` (no dense arm).
    pub plan: &'static str,
    /// The answer's verdict: `good`, `weak` or `none`.
    pub r#match: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendKind {
    pub backend: String,
    /// `changed`, `added`, or `first` (a first listing's tool held, or looking like another's).
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Mode {
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: &'static str,
}

/// What the accept loop counts (`http::serve`), shared with it.
#[derive(Clone, Default)]
pub struct Connections {
    /// Open HTTP connections.
    pub open: Gauge,
    /// Connections answered 503 and closed at once: `descriptors` (the process's limit).
    pub refused: Family<Reason, Counter>,
    /// Connections the gateway closed: `header_timeout` (headers not complete in time).
    pub cut: Family<Reason, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLimit {
    /// The `[[limits]]` rule's name (empty for a refusal by the store's setting).
    pub rule: String,
    /// The rule's key that refused (`rate`, `calls_per_day`, ...).
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Action {
    pub action: &'static str,
}

/// What `[[limits]]` counts (`crate::limits`), shared with the limiter.
#[derive(Clone, Default)]
pub struct LimitCounters {
    /// Requests refused, by rule and limit.
    pub refusals: Family<RuleLimit, Counter>,
    /// Checks made while the shared store did not answer, by what was done (`local`, `refused`,
    /// `allowed`: `sessions.limits_when_unreachable`).
    pub unreachable: Family<Action, Counter>,
}

impl LimitCounters {
    pub fn refused(&self, rule: &str, limit: &'static str) {
        self.refusals.get_or_create(&RuleLimit { rule: rule.to_string(), limit }).inc();
    }

    pub fn unreachable(&self, action: &'static str) {
        self.unreachable.get_or_create(&Action { action }).inc();
    }
}

/// What the audit trail counts (`crate::audit`), shared with its writer.
#[derive(Clone, Default)]
pub struct AuditCounters {
    pub written: Counter,
    /// Lines lost, by why: `queue` (full), `write` (the file could not be written).
    pub lost: Family<Reason, Counter>,
}

impl AuditCounters {
    pub fn lost(&self, reason: &'static str) {
        self.lost.get_or_create(&Reason { reason }).inc();
    }
}

/// Latency buckets from 100 µs to about 26 s.
fn seconds() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.0001, 4.0, 10))
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<MethodOutcome, Counter>,
    pub request_seconds: Family<Method, Histogram, fn() -> Histogram>,
    pub tool_calls: Family<BackendOutcome, Counter>,
    pub tool_call_seconds: Family<Backend, Histogram, fn() -> Histogram>,
    pub find_tool_seconds: Family<Stage, Histogram, fn() -> Histogram>,
    pub find_tool_searches: Family<Search, Counter>,
    pub embed_failures: Counter,
    pub find_tool_busy: Counter,
    // Read at scrape time.
    pub backend_health: Family<BackendState, Gauge>,
    pub backend_breaker_open: Family<Backend, Gauge>,
    pub backend_tools: Family<Backend, Gauge>,
    pub sessions: Family<Mode, Gauge>,
    pub catalog_tools: Gauge,
    pub catalog_generation: Gauge,
    pub embedder_queue: Gauge,
    pub texts_embedded: Counter,
    pub queries_embedded: Counter,
    pub vector_cache_hits: Counter,
    pub vector_cache_misses: Counter,
    pub health_transitions: Counter,
    pub snapshot_swaps: Counter,
    pub list_changed_sent: Counter,
    pub reloads: Counter,
    pub session_store_up: Gauge,
    pub session_store_pending: Gauge,
    pub session_store_errors: Counter,
    pub sessions_restored: Counter,
    pub tool_changes: Family<BackendKind, Counter>,
    pub tools_held: Gauge,
    pub backend_requests_refused: Counter,
    pub sessionless_principals: Gauge,
    pub sessionless_evicted: Counter,
    pub sessionless_refused: Counter,
    pub connections: Connections,
    pub descriptor_limit: Gauge,
    pub descriptors_open: Gauge,
    pub learning_labels: Gauge,
    pub adapter_served: Gauge,
    pub adapter_version: Gauge,
    pub adapter_margin: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub adapter_fit_labels: Gauge,
    pub limits: LimitCounters,
    pub audit: AuditCounters,
    pub tokens: tokens::Tokens,
    /// Secrets replaced in backends' answers (`crate::scrub`), by backend and rule.
    pub redactions: Family<crate::scrub::Redaction, Counter>,
    /// The last minutes, for the console's plots.
    pub traffic: traffic::Traffic,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("toolmux");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(seconds),
            tool_calls: Family::default(),
            tool_call_seconds: Family::new_with_constructor(seconds),
            find_tool_seconds: Family::new_with_constructor(seconds),
            find_tool_searches: Family::default(),
            embed_failures: Counter::default(),
            find_tool_busy: Counter::default(),
            backend_health: Family::default(),
            backend_breaker_open: Family::default(),
            backend_tools: Family::default(),
            sessions: Family::default(),
            catalog_tools: Gauge::default(),
            catalog_generation: Gauge::default(),
            embedder_queue: Gauge::default(),
            texts_embedded: Counter::default(),
            queries_embedded: Counter::default(),
            vector_cache_hits: Counter::default(),
            vector_cache_misses: Counter::default(),
            health_transitions: Counter::default(),
            snapshot_swaps: Counter::default(),
            list_changed_sent: Counter::default(),
            reloads: Counter::default(),
            session_store_up: Gauge::default(),
            session_store_pending: Gauge::default(),
            session_store_errors: Counter::default(),
            sessions_restored: Counter::default(),
            tool_changes: Family::default(),
            tools_held: Gauge::default(),
            backend_requests_refused: Counter::default(),
            sessionless_principals: Gauge::default(),
            sessionless_evicted: Counter::default(),
            sessionless_refused: Counter::default(),
            connections: Connections::default(),
            descriptor_limit: Gauge::default(),
            descriptors_open: Gauge::default(),
            learning_labels: Gauge::default(),
            adapter_served: Gauge::default(),
            adapter_version: Gauge::default(),
            adapter_margin: Gauge::default(),
            adapter_fit_labels: Gauge::default(),
            limits: LimitCounters::default(),
            audit: AuditCounters::default(),
            tokens: tokens::Tokens::default(),
            redactions: Family::default(),
            traffic: traffic::Traffic::new(),
        };
        r.register("requests", "MCP requests answered, by method and outcome", m.requests.clone());
        r.register("request_duration_seconds", "Time to answer an MCP request", m.request_seconds.clone());
        r.register("tool_calls", "Forwarded tool calls, by backend and outcome", m.tool_calls.clone());
        r.register("tool_call_duration_seconds", "Time a forwarded tool call took", m.tool_call_seconds.clone());
        r.register("find_tool_stage_duration_seconds", "find_tool time per stage", m.find_tool_seconds.clone());
        r.register(
            "find_tool_searches",
            "find_tool searches, by search mode, dense plan and match verdict",
            m.find_tool_searches.clone(),
        );
        r.register(
            "find_tool_busy",
            "find_tool requests answered busy: the search model's queue was full",
            m.find_tool_busy.clone(),
        );
        r.register("embed_failures", "Catalog builds whose tool texts could not be embedded", m.embed_failures.clone());
        r.register("backend_health", "1 for each backend's current health state", m.backend_health.clone());
        r.register(
            "backend_breaker_open",
            "1 while a backend's circuit breaker is open",
            m.backend_breaker_open.clone(),
        );
        r.register("backend_tools", "Tools each backend last listed", m.backend_tools.clone());
        r.register("sessions", "Live client sessions, by serving mode", m.sessions.clone());
        r.register("catalog_tools", "Tools in the current catalog generation", m.catalog_tools.clone());
        r.register("catalog_generation", "The current catalog generation's number", m.catalog_generation.clone());
        r.register("embedder_queue_depth", "Embedding jobs waiting for the model", m.embedder_queue.clone());
        r.register("texts_embedded", "Tool texts run through the model", m.texts_embedded.clone());
        r.register("queries_embedded", "find_tool queries run through the model", m.queries_embedded.clone());
        r.register("vector_cache_hits", "Tool vectors found in the vector cache", m.vector_cache_hits.clone());
        r.register("vector_cache_misses", "Tool vectors not in the vector cache", m.vector_cache_misses.clone());
        r.register("health_transitions", "Backend health state changes", m.health_transitions.clone());
        r.register("snapshot_swaps", "Session scope snapshots rebuilt and swapped", m.snapshot_swaps.clone());
        r.register(
            "list_changed_sent",
            "tools/list_changed notifications sent to sessions",
            m.list_changed_sent.clone(),
        );
        r.register("config_reloads", "Configuration reloads applied", m.reloads.clone());
        r.register(
            "session_store_up",
            "1 while the shared session store answers (with [sessions] store = \"redis\")",
            m.session_store_up.clone(),
        );
        r.register(
            "session_store_pending_writes",
            "Sessions whose writes wait for the session store to answer",
            m.session_store_pending.clone(),
        );
        r.register(
            "session_store_errors",
            "Session store commands that failed or timed out",
            m.session_store_errors.clone(),
        );
        r.register("sessions_restored", "Sessions rebuilt here from the session store", m.sessions_restored.clone());
        r.register(
            "tool_changes",
            "Tool definitions that changed, or tools added after their backend's first listing, by backend",
            m.tool_changes.clone(),
        );
        r.register("tools_held", "Tool versions held back until an operator accepts them", m.tools_held.clone());
        r.register(
            "backend_requests_refused",
            "Backend requests (sampling, elicitation) refused because they could not be tied to one client",
            m.backend_requests_refused.clone(),
        );
        r.register(
            "sessionless_principals",
            "Principals without a session holding backend sessions of their own (per_client backends)",
            m.sessionless_principals.clone(),
        );
        r.register(
            "sessionless_principals_evicted",
            "Session-less principals' backend sessions closed to make room for another principal",
            m.sessionless_evicted.clone(),
        );
        r.register(
            "sessionless_principals_refused",
            "Session-less requests refused because every principal's backend sessions were in use",
            m.sessionless_refused.clone(),
        );
        r.register("connections_open", "Open HTTP connections", m.connections.open.clone());
        r.register(
            "connections_refused",
            "Connections answered 503 and closed at once, by reason (descriptors: the process's limit)",
            m.connections.refused.clone(),
        );
        r.register(
            "connections_cut",
            "Connections the gateway closed, by reason (header_timeout: server.header_timeout)",
            m.connections.cut.clone(),
        );
        r.register("descriptor_limit", "The process's file descriptor limit (soft)", m.descriptor_limit.clone());
        r.register("descriptors_open", "File descriptors the process holds", m.descriptors_open.clone());
        r.register(
            "learning_labels",
            "Labels find_tool learned from (calls that followed it)",
            m.learning_labels.clone(),
        );
        r.register(
            "adapter_served",
            "1 while find_tool searches through a fitted query adapter",
            m.adapter_served.clone(),
        );
        r.register(
            "adapter_version",
            "The version of the query adapter's last fit, served or not (0: none yet)",
            m.adapter_version.clone(),
        );
        r.register(
            "adapter_margin",
            "Points of held-back recall@8 the last fit of the query adapter gained over the plain search",
            m.adapter_margin.clone(),
        );
        r.register(
            "adapter_fit_labels",
            "Labels the last fit of the query adapter was fitted on",
            m.adapter_fit_labels.clone(),
        );
        r.register(
            "limit_refusals",
            "Requests refused by a [[limits]] rule, by rule and limit",
            m.limits.refusals.clone(),
        );
        r.register(
            "limit_store_unreachable",
            "Limit checks made while the shared store did not answer, by what was done",
            m.limits.unreachable.clone(),
        );
        r.register(
            "tokens",
            "Tokens (JSON bytes / 4) by principal, backend and kind: tool definitions served, results returned, saved against listing the whole scope",
            m.tokens.family.clone(),
        );
        r.register(
            "redactions",
            "Secrets replaced by a marker in backends' answers ([results] scrub), by backend and rule",
            m.redactions.clone(),
        );
        r.register("audit_lines", "Lines written to the audit trail", m.audit.written.clone());
        r.register(
            "audit_lines_lost",
            "Audit lines lost, by reason (queue: the queue was full; write: the file could not be written)",
            m.audit.lost.clone(),
        );
        *m.registry.lock().expect("registry lock") = r;
        m
    }

    /// One MCP request answered.
    pub fn request(&self, method: &'static str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.requests.get_or_create(&MethodOutcome { method, outcome }).inc();
        self.request_seconds.get_or_create(&Method { method }).observe(took.as_secs_f64());
        self.traffic.request(ok);
    }

    /// One forwarded tool call ended.
    pub fn tool_call(&self, backend: &str, outcome: &'static str, took: Duration) {
        self.tool_calls.get_or_create(&BackendOutcome { backend: backend.to_string(), outcome }).inc();
        self.tool_call_seconds.get_or_create(&Backend { backend: backend.to_string() }).observe(took.as_secs_f64());
    }

    /// One find_tool search: its stages' times, its mode and plan.
    pub fn find_tool(&self, r: &crate::store::SearchResult) {
        let t = r.timings;
        for (stage, took) in [("embed", t.embed), ("search", t.search), ("fuse", t.fuse)] {
            self.find_tool_seconds.get_or_create(&Stage { stage }).observe(took.as_secs_f64());
        }
        let mode = match r.mode {
            crate::store::SearchMode::Hybrid => "hybrid",
            crate::store::SearchMode::Keyword => "keyword",
            crate::store::SearchMode::Dense => "dense",
        };
        let plan = match r.plan {
            None => "none",
            Some(crate::index::dense::Plan::Exact) => "exact",
            Some(crate::index::dense::Plan::Graph) => "graph",
            Some(crate::index::dense::Plan::GraphThenExact) => "graph_then_exact",
        };
        let r#match = match r.verdict {
            crate::store::Verdict::Good => "good",
            crate::store::Verdict::Weak => "weak",
            crate::store::Verdict::None => "none",
        };
        self.find_tool_searches.get_or_create(&Search { mode, plan, r#match }).inc();
        let verdict = match r.verdict {
            crate::store::Verdict::Good => 0,
            crate::store::Verdict::Weak => 1,
            crate::store::Verdict::None => 2,
        };
        self.traffic.search(t.embed + t.search + t.fuse, verdict);
    }

    /// Renders every series (after `refresh` has read the states).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().expect("registry lock");
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

/// Raises `counter` to `total` (a count another part keeps): counters only go up.
pub fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}
