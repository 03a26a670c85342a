//! `[audit]`: the trail of who did what, one JSON line per action, chained so that an edit shows
//! (written by [`crate::audit`]).

use std::path::PathBuf;
use std::time::Duration;

use super::{Validator, raw};

#[derive(Debug, Clone, PartialEq)]
pub struct AuditConfig {
    /// The file written (rotated files beside it); `None`: no trail.
    pub file: Option<PathBuf>,
    /// Rotate once the file reaches this many bytes.
    pub max_bytes: u64,
    /// Rotate once the file's first line is this old.
    pub max_age: Duration,
    /// Write each call's arguments (otherwise only their SHA-256).
    pub arguments: bool,
    /// Write find_tool's request text (otherwise only its length).
    pub requests: bool,
    /// Lines waiting to be written, at most.
    pub queue: usize,
    pub on_failure: OnFailure,
    /// Keys the chain (HMAC-SHA256): whoever can edit the file but not read the key cannot
    /// rewrite the chain after an edit.
    pub key: Option<AuditKey>,
    /// Also send each line as an OpenTelemetry log record (the `otlp` build, with an OTLP
    /// endpoint in the environment), beside the traces.
    pub otlp: bool,
}

/// What happens when a line cannot be written (the queue is full, the disk is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Serve on; count every line lost (`toolmux_audit_lines_lost_total`) and log it.
    #[default]
    Count,
    /// Refuse calls, reads and searches until lines are written again.
    Refuse,
}

/// `audit.key`; its `Debug` does not show it.
#[derive(Clone, PartialEq)]
pub struct AuditKey(pub Vec<u8>);

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditKey(..)")
    }
}

pub const DEFAULT_MAX_BYTES: u64 = 100 << 20;
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_QUEUE: usize = 10_000;
/// Shortest `audit.key` accepted.
pub const MIN_KEY_CHARS: usize = 32;

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            file: None,
            max_bytes: DEFAULT_MAX_BYTES,
            max_age: DEFAULT_MAX_AGE,
            arguments: false,
            requests: false,
            queue: DEFAULT_QUEUE,
            on_failure: OnFailure::Count,
            key: None,
            otlp: false,
        }
    }
}

impl Validator<'_> {
    pub(super) fn audit(&mut self, raw: raw::Audit) -> AuditConfig {
        let d = AuditConfig::default();
        let file = raw.file.map(PathBuf::from);
        if file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
            self.problem("audit.file", "is empty; give the path of the trail, e.g. \"/var/log/toolmux/audit.jsonl\"");
        }
        let max_bytes = match raw.max_bytes {
            None => d.max_bytes,
            Some(n) if n >= 4096 => n as u64,
            Some(_) => {
                self.problem("audit.max_bytes", "must be at least 4096");
                d.max_bytes
            }
        };
        let max_age = self.positive("audit.max_age", raw.max_age.as_deref(), d.max_age);
        let queue = match raw.queue {
            None => d.queue,
            Some(n) if (1..=1_000_000).contains(&n) => n as usize,
            Some(_) => {
                self.problem("audit.queue", "must be between 1 and 1000000");
                d.queue
            }
        };
        let on_failure = match raw.on_failure.as_deref() {
            None | Some("count") => OnFailure::Count,
            Some("refuse") => OnFailure::Refuse,
            Some(other) => {
                self.problem("audit.on_failure", format!("`{other}` is not one of \"count\", \"refuse\""));
                OnFailure::Count
            }
        };
        let key = match raw.key.as_deref().map(|k| self.expand(k)) {
            None => None,
            Some(Err(var)) => {
                self.problem("audit.key", super::unset(&var));
                None
            }
            Some(Ok(k)) if k.chars().count() < MIN_KEY_CHARS => {
                self.problem(
                    "audit.key",
                    format!("at least {MIN_KEY_CHARS} characters; e.g. \"${{TOOLMUX_AUDIT_KEY}}\" set to `openssl rand -hex 32`"),
                );
                None
            }
            Some(Ok(k)) => Some(AuditKey(k.into_bytes())),
        };
        let otlp = raw.otlp.unwrap_or(false);
        if otlp && !cfg!(feature = "otlp") {
            self.problem("audit.otlp", "this build has no OpenTelemetry export; build toolmux with `--features otlp`");
        }
        if file.is_none() && (raw.arguments.is_some() || raw.requests.is_some() || key.is_some() || otlp) {
            self.problem("audit.file", "the other [audit] keys need a file to write to");
        }
        AuditConfig {
            file,
            max_bytes,
            max_age,
            arguments: raw.arguments.unwrap_or(false),
            requests: raw.requests.unwrap_or(false),
            queue,
            on_failure,
            key,
            otlp,
        }
    }
}
