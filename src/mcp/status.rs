//! What the gateway is doing now, for operators: `GET /status` and `toolmux status`.

use std::time::SystemTime;

use serde::Serialize;

use super::Gateway;
use crate::config::{SessionMode, Transport};
use crate::metrics;

/// The outcome of the last configuration reload.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReloadLog {
    /// Reloads applied since start.
    pub applied: u64,
    /// What the last applied reload did.
    pub last: Option<String>,
    /// Why the last refused reload was refused; cleared by the next applied one.
    pub last_error: Option<String>,
    /// Seconds since the Unix epoch of the last attempt.
    pub at: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub mode: String,
    pub ready: bool,
    pub stopping: bool,
    pub catalog: CatalogStatus,
    pub backends: Vec<BackendStatus>,
    pub sessions: SessionStatus,
    pub embedder: EmbedderStatus,
    pub tasks: TaskStatus,
    /// Tool definitions that changed or appeared after their backend's first listing, and
    /// what is held back (`[health] freeze_tools`).
    pub integrity: crate::store::integrity::IntegrityStatus,
    /// What find_tool learned from use (optimizer mode with a model only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning: Option<LearningStatus>,
    pub reload: ReloadLog,
    /// The process's descriptor limit and how many are open (`descriptors`).
    pub descriptors: crate::descriptors::Descriptors,
}

#[derive(Debug, Serialize)]
pub struct LearningStatus {
    pub enabled: bool,
    /// Whether learned vectors count in rankings yet (enough labels).
    pub active: bool,
    pub labels: u64,
    pub tools: usize,
    /// Tools whose labels count in rankings (from two principals or more).
    pub counting: usize,
    /// The query adapter (`store::adapter`).
    pub adapter: AdapterStatus,
}

/// The query adapter: whether find_tool searches through one, and why.
#[derive(Debug, Serialize)]
pub struct AdapterStatus {
    /// Whether the dense search runs through a fitted adapter now.
    pub served: bool,
    /// The version of the last fit's decision, served or not (the replicas all hold the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// Labels kept whole to fit it from.
    pub labels: usize,
    /// Labels recorded when the fitter last looked whether to fit.
    pub considered_at_labels: u64,
    /// Labels (of tools enough principals labelled) a fit needs at all.
    pub min_labels: usize,
    /// Points of recall@8 on held-back labels a fit must gain over the plain search.
    pub required_margin: f64,
    /// The last fit, served or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_fit: Option<FitStatus>,
}

#[derive(Debug, Serialize)]
pub struct FitStatus {
    /// Labels recorded when it began.
    pub at_labels: u64,
    /// Labels it was fitted on, and held back to judge it.
    pub fitted: usize,
    pub held_out: usize,
    /// Recall@8 of the held-back labels, plain and adapted (percent), and the difference.
    pub recall_plain: f64,
    pub recall_adapted: f64,
    pub margin: f64,
    pub seconds: f64,
}

impl AdapterStatus {
    pub fn of(l: &crate::store::learned::Learned) -> Self {
        Self {
            served: l.served().is_some(),
            version: l.version(),
            labels: l.pairs(),
            considered_at_labels: l.considered_at(),
            min_labels: crate::store::adapter::MIN_LABELS,
            required_margin: crate::store::adapter::MARGIN,
            last_fit: l.last_fit().map(|(j, at_labels)| FitStatus {
                at_labels,
                fitted: j.fitted,
                held_out: j.held_out,
                recall_plain: round1(j.plain),
                recall_adapted: round1(j.adapted),
                margin: round1(j.margin()),
                seconds: (j.seconds * 1000.0).round() / 1000.0,
            }),
        }
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Tasks backends run for clients (SEP-2663), as this replica knows them.
#[derive(Debug, Serialize)]
pub struct TaskStatus {
    /// Tasks remembered here (finished ones included until they expire or are pushed out).
    pub relayed: usize,
    /// At most this many are remembered (`mcp::tasks::MAX_ROUTES`).
    pub limit: usize,
}

#[derive(Debug, Serialize)]
pub struct CatalogStatus {
    pub generation: u64,
    pub tools: usize,
    /// `hybrid` (semantic and keyword) or `keyword` (no vectors in this generation).
    pub search: &'static str,
    /// Tools whose descriptions were flagged as aimed at the model (`crate::fence`): served
    /// with a warning.
    pub flagged: Vec<FlaggedTool>,
}

#[derive(Debug, Serialize)]
pub struct FlaggedTool {
    pub backend: String,
    pub tool: String,
    pub flags: Vec<crate::fence::Flag>,
}

#[derive(Debug, Serialize)]
pub struct BackendStatus {
    pub name: String,
    /// `http` (streamable HTTP), `sse` (the 2024-11-05 HTTP+SSE transport) or `stdio`.
    pub transport: &'static str,
    /// `per_client` (a backend session per client session) or `shared`.
    pub session: &'static str,
    pub connected: bool,
    /// `unknown`, `healthy`, `degraded`, `unhealthy` (`unmonitored` with health checks off).
    pub health: String,
    pub health_since_secs: Option<u64>,
    /// `closed`, `open` or `none` (no breaker configured).
    pub breaker: &'static str,
    pub breaker_retry_in_secs: Option<u64>,
    pub tools: usize,
    pub client_sessions: usize,
    /// Whether it waits for a login (`auth = "oauth"` without a usable grant); `last_error`
    /// names the command that gives it one. Shown to everyone it is shown to, as find_tool's
    /// `needs_login` is.
    pub needs_login: bool,
    pub last_error: Option<String>,
    pub last_error_secs_ago: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct SessionStatus {
    pub live: usize,
    pub mode: String,
    /// Live sessions by the surface their client was given.
    pub by_surface: std::collections::BTreeMap<&'static str, usize>,
    /// Each live session (admins only; at most [`LISTED_SESSIONS`]).
    pub list: Vec<SessionRow>,
    /// The store sessions are shared through (`[sessions] store = "redis"`); absent when they
    /// live in this process only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<crate::session::shared::StoreStatus>,
}

/// Sessions `/status` lists one by one, at most (the count is `live`).
pub const LISTED_SESSIONS: usize = 200;

/// One live session: whose, which client, and what it is shown.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRow {
    /// A hash of its id (as the audit trail names it); absent for stdio's one session.
    pub session: Option<String>,
    pub principal: String,
    /// Its `clientInfo.name` and version.
    pub client: Option<String>,
    pub surface: &'static str,
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct EmbedderStatus {
    /// The model id, or `None` when search is keyword-only by configuration.
    pub model: Option<String>,
    /// `ok`, `failed` (the current generation has no vectors: retried with backoff) or `none`.
    pub state: &'static str,
    /// `f32` or `int8` (`optimizer.precision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<&'static str>,
    /// The int8 matrix-product kernel (`crate::simd::int8`), and why it was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int8_kernel: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int8_kernel_why: Option<String>,
}

impl Gateway {
    /// `/status` as `caller` may see it: whole for an admin (`[auth] admins`; everyone without
    /// authentication); for anyone else counts only, of the backends their policy lets them use
    /// (the others' names and health are the catalog's business), no backend errors, tool
    /// names, ledger entries or reload details, with `details: false` saying so.
    pub fn status_for(&self, caller: &crate::session::Caller) -> serde_json::Value {
        let mut v = serde_json::to_value(self.status()).expect("the status serialises");
        if self.is_admin(caller) {
            v["details"] = true.into();
            // The trail's file, counts and chain head: compare the head with `audit verify`'s.
            v["audit"] = self.audit().status();
            return v;
        }
        let shown = self.backends_shown_to(caller);
        if let Some(backends) = v["backends"].as_array_mut() {
            backends.retain(|b| b["name"].as_str().is_some_and(&shown));
            for b in backends {
                b["last_error"] = serde_json::Value::Null;
            }
        }
        if let Some(flagged) = v["catalog"]["flagged"].as_array_mut() {
            flagged.retain(|f| f["backend"].as_str().is_some_and(&shown));
        }
        let integrity = &mut v["integrity"];
        let (held, recent, firsts) =
            (count(&integrity["held"]), count(&integrity["recent"]), count(&integrity["first_listings"]));
        integrity["held"] = held.into();
        integrity["recent"] = recent.into();
        integrity["first_listings"] = firsts.into();
        integrity["ledger"] = serde_json::Value::Null;
        v["reload"]["last"] = serde_json::Value::Null;
        v["reload"]["last_error"] = serde_json::Value::Null;
        v["sessions"]["list"] = serde_json::Value::Null;
        v["details"] = false.into();
        v
    }

    /// Live sessions, `only` one principal's, ordered by principal then client.
    pub fn session_rows(&self, only: Option<&str>) -> Vec<SessionRow> {
        let mut rows: Vec<SessionRow> = (self.registry().sessions().into_iter())
            .filter_map(|(id, s)| {
                let principal = s.caller().principal.clone();
                if only.is_some_and(|p| p != principal) {
                    return None;
                }
                let client = s.peer().and_then(|p| p.peer_info()).map(|i| {
                    let c = &i.client_info;
                    if c.version.is_empty() { c.name.clone() } else { format!("{} {}", c.name, c.version) }
                });
                let (surface, why) = s
                    .surface()
                    .map_or((self.plain_surface().name(), String::new()), |c| (c.surface.name(), c.why.clone()));
                Some(SessionRow {
                    session: id.map(|i| crate::audit::session_hash(&i)),
                    principal,
                    client,
                    surface,
                    why,
                })
            })
            .collect();
        rows.sort_by(|a, b| (&a.principal, &a.client, &a.session).cmp(&(&b.principal, &b.client, &b.session)));
        rows
    }

    /// Whether a backend is shown to `caller`, who is not an admin: one their policy lets them
    /// use, in part or whole.
    pub fn backends_shown_to(&self, caller: &crate::session::Caller) -> impl Fn(&str) -> bool + use<> {
        let policy = self.policy();
        let caller = caller.without_token();
        move |name| !matches!(policy.backend(&caller, name), crate::session::Access::Nothing)
    }

    pub fn status(&self) -> Status {
        let generation = self.store.current();
        let mode = format!("{:?}", self.mode).to_lowercase();
        let backends = self
            .upstream
            .backends()
            .iter()
            .map(|b| {
                let health = self.health.health(b.name());
                let (breaker, retry) = match self.health.breaker_open(b.name()) {
                    None => ("none", None),
                    Some(false) => ("closed", None),
                    Some(true) => ("open", self.health.retry_in(b.name()).map(|d| d.as_secs())),
                };
                let last_error = b.last_error();
                BackendStatus {
                    name: b.name().to_string(),
                    transport: match b.config.transport {
                        Transport::Http { sse: false, .. } => "http",
                        Transport::Http { sse: true, .. } => "sse",
                        Transport::Stdio { .. } => "stdio",
                    },
                    session: match b.config.session {
                        SessionMode::PerClient => "per_client",
                        SessionMode::Shared => "shared",
                    },
                    connected: b.is_connected(),
                    health: match (&health, self.health.enabled()) {
                        (_, false) => "unmonitored".into(),
                        (Some(h), true) => format!("{:?}", h.status).to_lowercase(),
                        (None, true) => "unknown".into(),
                    },
                    health_since_secs: health.map(|h| h.since_secs),
                    breaker,
                    breaker_retry_in_secs: retry,
                    tools: b.listing().tools.len(),
                    client_sessions: b.client_sessions(),
                    needs_login: b.needs_login().is_some(),
                    last_error_secs_ago: last_error
                        .as_ref()
                        .and_then(|(_, at)| SystemTime::now().duration_since(*at).ok())
                        .map(|d| d.as_secs()),
                    last_error: last_error.map(|(e, _)| e),
                }
            })
            .collect();
        let sessions = self.session_rows(None);
        let embedder = match self.store.embedder() {
            None => {
                EmbedderStatus { model: None, state: "none", precision: None, int8_kernel: None, int8_kernel_why: None }
            }
            Some(e) => {
                let kernel = e.precision().and_then(|p| p.kernel());
                EmbedderStatus {
                    precision: e.precision().map(|p| p.name()),
                    int8_kernel: kernel.map(|k| k.name()),
                    int8_kernel_why: kernel.map(|_| crate::simd::int8::choice().why.clone()),
                    model: Some(e.model_id().to_string()),
                    state: if generation.dense.is_some() || generation.catalog.is_empty() { "ok" } else { "failed" },
                }
            }
        };
        Status {
            version: env!("CARGO_PKG_VERSION"),
            mode: mode.clone(),
            ready: self.is_ready(),
            stopping: self.is_draining(),
            catalog: CatalogStatus {
                generation: generation.id,
                tools: generation.catalog.len(),
                search: if generation.dense.is_some() { "hybrid" } else { "keyword" },
                flagged: (generation.catalog.tools().iter().filter(|t| !t.flags.is_empty()))
                    .map(|t| FlaggedTool {
                        backend: t.key.backend.to_string(),
                        tool: t.key.tool.to_string(),
                        flags: t.flags.clone(),
                    })
                    .collect(),
            },
            backends,
            sessions: SessionStatus {
                live: self.session_count(),
                mode,
                by_surface: sessions.iter().fold(Default::default(), |mut by, r| {
                    *by.entry(r.surface).or_default() += 1;
                    by
                }),
                list: sessions.into_iter().take(LISTED_SESSIONS).collect(),
                store: self.shared_sessions().map(|s| s.status()),
            },
            embedder,
            tasks: TaskStatus { relayed: self.tasks.len(), limit: super::tasks::MAX_ROUTES },
            integrity: self.integrity.status(),
            learning: self.store.learned().map(|l| LearningStatus {
                enabled: l.is_enabled(),
                active: l.active(),
                labels: l.total(),
                tools: l.tools(),
                counting: l.counting(),
                adapter: AdapterStatus::of(l),
            }),
            reload: self.reloads.lock().expect("reload log").clone(),
            descriptors: crate::descriptors::current(),
        }
    }
}

impl Gateway {
    /// Reads every state and outside counter into the metrics, then renders them.
    pub fn render_metrics(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.metrics;
        let status = self.status();
        m.backend_health.clear();
        m.backend_breaker_open.clear();
        m.backend_tools.clear();
        for b in &status.backends {
            let state: &'static str = match b.health.as_str() {
                "healthy" => "healthy",
                "degraded" => "degraded",
                "unhealthy" => "unhealthy",
                "unmonitored" => "unmonitored",
                _ => "unknown",
            };
            m.backend_health.get_or_create(&metrics::BackendState { backend: b.name.clone(), state }).set(1);
            let backend = metrics::Backend { backend: b.name.clone() };
            m.backend_breaker_open.get_or_create(&backend).set(i64::from(b.breaker == "open"));
            m.backend_tools.get_or_create(&backend).set(b.tools as i64);
        }
        let mode = match self.mode {
            crate::config::Mode::Optimizer => "optimizer",
            crate::config::Mode::Passthrough => "passthrough",
        };
        m.sessions.get_or_create(&metrics::Mode { mode }).set(status.sessions.live as i64);
        m.catalog_tools.set(status.catalog.tools as i64);
        m.catalog_generation.set(status.catalog.generation as i64);
        m.embedder_queue.set(self.store.embedder().map_or(0, |e| e.queue_depth()) as i64);
        let store = &self.store.counters;
        metrics::catch_up(&m.texts_embedded, store.texts_embedded.load(Relaxed));
        metrics::catch_up(&m.queries_embedded, store.queries_embedded.load(Relaxed));
        metrics::catch_up(&m.vector_cache_hits, store.cache_hits.load(Relaxed));
        metrics::catch_up(&m.vector_cache_misses, store.cache_misses.load(Relaxed));
        metrics::catch_up(&m.embed_failures, store.embed_failures.load(Relaxed));
        metrics::catch_up(&m.health_transitions, self.health.transitions.load(Relaxed));
        metrics::catch_up(&m.snapshot_swaps, self.counters.resyncs.load(Relaxed));
        metrics::catch_up(&m.list_changed_sent, self.counters.list_changed_sent.load(Relaxed));
        metrics::catch_up(&m.reloads, status.reload.applied);
        for (backend, kind, n) in self.integrity.counts() {
            let kind = match kind {
                crate::catalog::ledger::Kind::Changed => "changed",
                crate::catalog::ledger::Kind::Added => "added",
                crate::catalog::ledger::Kind::First => "first",
            };
            metrics::catch_up(&m.tool_changes.get_or_create(&metrics::BackendKind { backend, kind }), n);
        }
        m.tools_held.set(status.integrity.held.len() as i64);
        metrics::catch_up(&m.backend_requests_refused, self.relay.refused.load(Relaxed));
        let (held, evicted, refused) = self.sessionless.counts();
        m.sessionless_principals.set(held as i64);
        metrics::catch_up(&m.sessionless_evicted, evicted);
        metrics::catch_up(&m.sessionless_refused, refused);
        m.descriptor_limit.set(status.descriptors.limit.map_or(-1, |n| n.min(i64::MAX as u64) as i64));
        m.descriptors_open.set(status.descriptors.open.map_or(-1, |n| n as i64));
        if let Some(l) = &status.learning {
            m.learning_labels.set(l.labels.min(i64::MAX as u64) as i64);
            m.adapter_served.set(i64::from(l.adapter.served));
            m.adapter_version.set(l.adapter.version.map_or(0, |v| v.min(i64::MAX as u64) as i64));
            m.adapter_margin.set(l.adapter.last_fit.as_ref().map_or(0.0, |f| f.margin));
            m.adapter_fit_labels.set(l.adapter.last_fit.as_ref().map_or(0, |f| f.fitted as i64));
        }
        if let Some(store) = &status.sessions.store {
            m.session_store_up.set(i64::from(store.state == "up"));
            m.session_store_pending.set(store.pending_writes as i64);
            metrics::catch_up(&m.session_store_errors, store.errors);
            metrics::catch_up(&m.sessions_restored, store.restored);
        }
        m.render()
    }
}

/// `/status` as a table for a terminal.
pub fn table(s: &serde_json::Value) -> String {
    use std::fmt::Write;
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let state = if s["stopping"] == true {
        "stopping"
    } else if s["ready"] == true {
        "ready"
    } else {
        "starting"
    };
    let _ = writeln!(
        out,
        "toolmux {} ({} mode): {state}; catalog generation {}, {} tools, {} search; {} live sessions; embedder {}{}",
        text(&s["version"]),
        text(&s["mode"]),
        text(&s["catalog"]["generation"]),
        text(&s["catalog"]["tools"]),
        text(&s["catalog"]["search"]),
        text(&s["sessions"]["live"]),
        text(&s["embedder"]["state"]),
        match (s["embedder"]["precision"].as_str(), s["embedder"]["int8_kernel"].as_str()) {
            (Some(p), Some(k)) => format!(" ({p}, {k} kernel)"),
            (Some(p), None) => format!(" ({p})"),
            _ => String::new(),
        },
    );
    let header = ["BACKEND", "TRANSPORT", "CONNECTED", "HEALTH", "SINCE", "BREAKER", "TOOLS", "SESSIONS", "LAST ERROR"];
    let mut rows = vec![header.map(String::from).to_vec()];
    for b in s["backends"].as_array().into_iter().flatten() {
        let since = b["health_since_secs"].as_u64().map_or("-".into(), |n| format!("{n}s"));
        let error = match (b["last_error"].as_str(), b["last_error_secs_ago"].as_u64()) {
            (Some(e), Some(ago)) => format!("{ago}s ago: {e}"),
            // Errors are an admin's to read; that it waits for a login is anyone's.
            _ if b["needs_login"] == true => "waits for a login".into(),
            _ => "-".into(),
        };
        rows.push(vec![
            text(&b["name"]),
            text(&b["transport"]),
            text(&b["connected"]),
            text(&b["health"]),
            since,
            text(&b["breaker"]),
            text(&b["tools"]),
            text(&b["client_sessions"]),
            error,
        ]);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    if let Some(by) = s["sessions"]["by_surface"].as_object().filter(|b| !b.is_empty()) {
        let parts: Vec<String> = by.iter().map(|(surface, n)| format!("{n} {surface}")).collect();
        let _ = writeln!(out, "sessions by surface: {}", parts.join(", "));
        for r in s["sessions"]["list"].as_array().into_iter().flatten() {
            let session = r["session"].as_str().unwrap_or("(stdio)");
            let client = r["client"].as_str().unwrap_or("(no name)");
            let _ = writeln!(out, "  {session}  {}  {client}: {}", text(&r["principal"]), text(&r["why"]));
        }
    }
    if let Some(store) = s["sessions"]["store"].as_object() {
        let error = match (store["last_error"].as_str(), store["last_error_secs_ago"].as_u64()) {
            (Some(e), Some(ago)) => format!("; last error {ago}s ago: {e}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "session store {}: {}; {} sessions restored here, {} writes pending{error}",
            text(&store["kind"]),
            text(&store["state"]),
            text(&store["restored"]),
            text(&store["pending_writes"]),
        );
    }
    if let Some(file) = s["audit"]["file"].as_str() {
        let lost = s["audit"]["lines_lost"].as_u64().unwrap_or(0);
        let lost = if lost > 0 { format!(", {lost} LOST") } else { String::new() };
        let _ = writeln!(
            out,
            "audit trail: {file}, {} lines written{lost}, head {}",
            text(&s["audit"]["lines_written"]),
            text(&s["audit"]["head"])
        );
    }
    if let Some(limit) = s["descriptors"]["limit"].as_u64() {
        let raised = s["descriptors"]["started_with"].as_u64().map_or(String::new(), |n| format!(", raised from {n}"));
        let _ = writeln!(out, "file descriptors: {} open of {limit}{raised}", text(&s["descriptors"]["open"]));
    }
    let adapter = &s["learning"]["adapter"];
    if adapter.is_object() {
        let served = match adapter["version"].as_u64() {
            Some(v) if adapter["served"] == true => format!("served (version {v})"),
            Some(v) => format!("not served (version {v})"),
            None => "not served".to_string(),
        };
        let fit = &adapter["last_fit"];
        let why = if fit.is_object() {
            format!(
                "; last fit on {} labels: held-back recall@8 {} -> {} (needs +{})",
                text(&fit["fitted"]),
                text(&fit["recall_plain"]),
                text(&fit["recall_adapted"]),
                text(&adapter["required_margin"])
            )
        } else {
            format!(", not fitted yet (needs {} labels of tools two principals used)", text(&adapter["min_labels"]))
        };
        let _ = writeln!(out, "query adapter: {served}, {} labels kept{why}", text(&adapter["labels"]));
    }
    if let Some(e) = s["reload"]["last_error"].as_str() {
        let _ = writeln!(out, "last reload refused: {e}");
    } else if let Some(l) = s["reload"]["last"].as_str() {
        let _ = writeln!(out, "last reload: {l}");
    }
    out
}

/// How many entries a JSON list has.
fn count(list: &serde_json::Value) -> usize {
    list.as_array().map_or(0, Vec::len)
}
