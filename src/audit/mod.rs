//! The audit trail (`[audit]`): one JSON line per action — tool calls, find_tool, resource
//! reads, prompt gets, tasks, logins, console accepts, reloads, limit refusals and policy
//! denials — each chained to the one before ([`chain`]) so that `toolmux audit verify` finds the
//! first line changed, removed or inserted ([`verify`]).
//!
//! Requests hand their [`Entry`] to a bounded queue and go on; one thread writes the lines
//! ([`file`]). A line that cannot be queued (the queue is full) or written (the disk is full) is
//! counted and logged; with `audit.on_failure = "refuse"`, calls, reads and searches are also
//! refused until lines are written again. Never silent.

pub mod chain;
pub mod command;
pub mod file;
pub mod verify;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::{AuditConfig, OnFailure};
use crate::metrics::AuditCounters;

/// One action, as its line says it (`seq`, `time`, `prev` and `hash` are added when written).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Entry {
    /// `initialize` (a session's start: its surface as `target`, why as `detail`), `tools/call`,
    /// `call_tool`, `find_tool`, `tools/list`, `resources/read`, `prompts/get`, `tasks/get`,
    /// `tasks/update`, `tasks/cancel`, `login`, `console/accept`, `config/reload`.
    pub action: &'static str,
    pub principal: String,
    /// A hash of the client session's id (its first 16 hex digits), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The client's `clientInfo.name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The backend's own tool name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// What else the action was about: a resource URI, a prompt, a task id, a tool as asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `allowed`, `denied` (policy), `limited` (`[[limits]]`), `refused` (anything else that
    /// stopped it before a backend: bad arguments, a breaker, the audit itself).
    pub decision: &'static str,
    /// How it ended once allowed: `ok`, `is_error`, `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    /// Why, in a few words: the limit's name, the refusal, the reload's summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
    /// Only with `audit.arguments = true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// find_tool's request text, only with `audit.requests = true`; its length always.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_chars: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_bytes: Option<u64>,
    /// Tokens of the result returned (bytes of its JSON / 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_tokens: Option<u64>,
    /// Tokens of tool definitions served (find_tool's answer, `tools/list`, a group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub definition_tokens: Option<u64>,
    /// Tokens not sent against listing every tool in the caller's scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl Entry {
    pub fn new(action: &'static str, principal: &str, decision: &'static str) -> Self {
        Self { action, principal: principal.to_string(), decision, ..Self::default() }
    }

    pub fn took(mut self, since: Instant) -> Self {
        self.latency_ms = Some((since.elapsed().as_secs_f64() * 1e5).round() / 100.0);
        self
    }
}

/// The hash of a session id written in the trail.
pub fn session_hash(id: &str) -> String {
    base16ct::lower::encode_string(&Sha256::digest(id.as_bytes())[..8])
}

/// What the writer thread and the requests share.
#[derive(Default)]
struct Shared {
    written: AtomicU64,
    lost: AtomicU64,
    /// The last line could not be queued or written.
    failing: AtomicBool,
    head: Mutex<String>,
    last_error: Mutex<Option<String>>,
}

pub struct Audit {
    on: Option<On>,
}

struct On {
    cfg: AuditConfig,
    tx: Mutex<Option<SyncSender<Entry>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    shared: Arc<Shared>,
    counters: AuditCounters,
}

/// Where written lines are sent besides the file: OpenTelemetry logs, set by the binary when it
/// exports (the `otlp` feature) and used when `audit.otlp` asks.
pub type Export = Box<dyn Fn(&str, &Entry) + Send + Sync>;

static EXPORT: std::sync::OnceLock<Export> = std::sync::OnceLock::new();

/// Sends every line written from now on to `export` too (once per process).
pub fn export_to(export: Export) {
    let _ = EXPORT.set(export);
}

/// A line's `detail` keeps this many characters at most.
const MAX_DETAIL_CHARS: usize = 500;

/// Log a failing trail at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl Audit {
    /// No trail.
    pub const fn off() -> Self {
        Self { on: None }
    }

    /// Opens the trail (an error names the file: a gateway asked to keep a trail does not start
    /// without one) and starts its writer.
    pub fn start(cfg: &AuditConfig, counters: AuditCounters) -> anyhow::Result<Self> {
        let Some(path) = &cfg.file else { return Ok(Self::off()) };
        let mut trail = file::Trail::open(cfg)
            .map_err(|e| anyhow::anyhow!("cannot open the audit trail {} (audit.file): {e}", path.display()))?;
        let shared = Arc::new(Shared::default());
        *shared.head.lock().expect("audit head lock") = trail.head().to_string();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Entry>(cfg.queue);
        let (s, c) = (shared.clone(), counters.clone());
        let export = cfg.otlp.then(|| EXPORT.get()).flatten();
        if cfg.otlp && export.is_none() {
            tracing::warn!(
                "audit.otlp is on but no OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT): lines go to the file only"
            );
        }
        let thread = std::thread::Builder::new().name("toolmux-audit".into()).spawn(move || {
            let mut warned: Option<Instant> = None;
            for entry in rx {
                match trail.append(&entry) {
                    Ok(line) => {
                        if let Some(export) = export {
                            export(&line, &entry);
                        }
                        s.written.fetch_add(1, Ordering::Relaxed);
                        c.written.inc();
                        s.failing.store(false, Ordering::Release);
                        *s.head.lock().expect("audit head lock") = trail.head().to_string();
                    }
                    Err(e) => {
                        s.lost.fetch_add(1, Ordering::Relaxed);
                        c.lost("write");
                        s.failing.store(true, Ordering::Release);
                        *s.last_error.lock().expect("audit error lock") = Some(e.to_string());
                        if warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                            warned = Some(Instant::now());
                            tracing::error!(error = %e, "an audit line could not be written; it is lost (counted in toolmux_audit_lines_lost_total)");
                        }
                    }
                }
            }
        })?;
        Ok(Self {
            on: Some(On {
                cfg: cfg.clone(),
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                shared,
                counters,
            }),
        })
    }

    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// Queues `entry` for writing; a full queue loses it, counted and logged.
    pub fn record(&self, mut entry: Entry) {
        let Some(on) = &self.on else { return };
        // A detail may quote a backend's error: bounded, and URLs' credentials taken out.
        if let Some(d) = entry.detail.as_mut() {
            let mut kept = crate::redact::urls(d);
            if kept.chars().count() > MAX_DETAIL_CHARS {
                kept = kept.chars().take(MAX_DETAIL_CHARS).chain(['…']).collect();
            }
            *d = kept;
        }
        let tx = on.tx.lock().expect("audit queue lock");
        let Some(tx) = tx.as_ref() else { return };
        match tx.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                on.shared.lost.fetch_add(1, Ordering::Relaxed);
                on.counters.lost("queue");
                if !on.shared.failing.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        queue = on.cfg.queue,
                        "the audit queue is full: lines are lost (counted in toolmux_audit_lines_lost_total)"
                    );
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                on.shared.lost.fetch_add(1, Ordering::Relaxed);
                on.counters.lost("closed");
            }
        }
    }

    /// Why a request must be refused now: lines are being lost and `audit.on_failure` is
    /// `"refuse"`.
    pub fn refusal(&self) -> Option<&'static str> {
        let on = self.on.as_ref()?;
        (on.cfg.on_failure == OnFailure::Refuse && on.shared.failing.load(Ordering::Acquire)).then_some(
            "refused: the audit trail cannot be written and this gateway refuses what it cannot record (audit.on_failure = \"refuse\"); try again in a few seconds, or tell the operator",
        )
    }

    /// A call's arguments as the trail keeps them: their SHA-256 always (of their JSON), the
    /// arguments themselves only with `audit.arguments = true`.
    pub fn arguments(&self, args: Option<&serde_json::Map<String, Value>>) -> (Option<String>, Option<Value>) {
        let Some(on) = &self.on else { return (None, None) };
        let json = args.map_or_else(|| "{}".to_string(), |a| serde_json::to_string(a).unwrap_or_default());
        let digest = base16ct::lower::encode_string(&Sha256::digest(json.as_bytes()));
        (Some(digest), on.cfg.arguments.then(|| args.map_or(Value::Null, |a| Value::Object(a.clone()))))
    }

    /// find_tool's request text, only with `audit.requests = true`.
    pub fn request(&self, text: &str) -> Option<String> {
        self.on.as_ref().filter(|on| on.cfg.requests).map(|_| text.to_string())
    }

    /// Writes what is queued and stops the writer (a stop of the gateway).
    pub fn close(&self) {
        let Some(on) = &self.on else { return };
        on.tx.lock().expect("audit queue lock").take();
        if let Some(t) = on.thread.lock().expect("audit thread lock").take() {
            let _ = t.join();
        }
    }

    /// For `/status` (admins): the file, lines written and lost, the chain's head.
    pub fn status(&self) -> Value {
        let Some(on) = &self.on else { return Value::Null };
        let s = &on.shared;
        serde_json::json!({
            "file": on.cfg.file.as_ref().map(|f| f.display().to_string()),
            "lines_written": s.written.load(Ordering::Relaxed),
            "lines_lost": s.lost.load(Ordering::Relaxed),
            "failing": s.failing.load(Ordering::Relaxed),
            "last_error": *s.last_error.lock().expect("audit error lock"),
            "head": *s.head.lock().expect("audit head lock"),
            "on_failure": match on.cfg.on_failure { OnFailure::Count => "count", OnFailure::Refuse => "refuse" },
            "keyed": on.cfg.key.is_some(),
        })
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_is_bounded_and_loses_url_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("audit.jsonl");
        let cfg = AuditConfig { file: Some(file.clone()), ..AuditConfig::default() };
        let audit = Audit::start(&cfg, AuditCounters::default()).unwrap();
        let mut e = Entry::new("tools/call", "alice", "allowed");
        e.detail = Some(format!("backend said: see https://user:hunter2@example.com/x {}", "y".repeat(2000)));
        audit.record(e);
        audit.close();
        let line: Value = serde_json::from_str(std::fs::read_to_string(&file).unwrap().trim()).unwrap();
        let detail = line["detail"].as_str().unwrap();
        assert!(!detail.contains("hunter2"), "{detail}");
        assert_eq!(detail.chars().count(), MAX_DETAIL_CHARS + 1, "bounded, with a mark where it was cut");
    }
}
