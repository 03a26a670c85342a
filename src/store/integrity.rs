//! The tool ledger at run time (`catalog::ledger`): every listing passes through it before it
//! reaches the catalog, each difference is logged and counted, and with `[health] tool_ledger`
//! the ledger is kept in a file, so that a restart does not accept what changed meanwhile and an
//! operator can accept held changes (`toolmux tools accept`, then a reload).
//!
//! The file is JSON, written whole (to a temporary file, then renamed) under an exclusive lock
//! on `<file>.lock`, which `toolmux tools accept` takes too.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rmcp::model::Tool;
use serde::Serialize;

use crate::catalog::ledger::{Event, Kind, Ledger};

/// Differences remembered for `/status`, newest last.
const RECENT: usize = 100;

pub struct Integrity {
    ledger: Mutex<Ledger>,
    /// `[health] freeze_tools`: hold changes back until accepted.
    frozen: bool,
    /// `[health] tool_ledger`: where the ledger is kept; in memory only without it.
    path: Option<PathBuf>,
    recent: Mutex<VecDeque<Event>>,
    /// Differences seen, by (backend, kind), for the metrics.
    counts: Mutex<HashMap<(String, Kind), u64>>,
    /// Bumped when the ledger is read again (an operator accepted changes): the catalog takes
    /// the backends' listings through it again.
    reread: tokio::sync::watch::Sender<u64>,
}

impl Default for Integrity {
    fn default() -> Self {
        Self::in_memory(false)
    }
}

/// What `/status` shows of it.
#[derive(Debug, Serialize)]
pub struct IntegrityStatus {
    pub frozen: bool,
    /// Where the ledger is kept, if anywhere.
    pub ledger: Option<String>,
    /// Versions held back, waiting for an operator.
    pub held: Vec<Held>,
    /// The latest differences, newest last.
    pub recent: Vec<Event>,
}

#[derive(Debug, Serialize)]
pub struct Held {
    pub backend: String,
    pub tool: String,
    pub digest: String,
    pub seen_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The lock beside the ledger file, held exclusively while it is read or written.
struct Locked(File);

impl Locked {
    fn take(path: &Path) -> std::io::Result<Self> {
        let mut lock = path.as_os_str().to_owned();
        lock.push(".lock");
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(PathBuf::from(lock))?;
        file.lock()?;
        Ok(Self(file))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Reads the ledger at `path` (empty when there is no file yet). Call under the lock.
fn read(path: &Path) -> anyhow::Result<Ledger> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| format!("{} is not a tool ledger", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ledger::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes the ledger whole ([`super::write_whole`]). Call under the lock.
fn write(path: &Path, ledger: &Ledger) -> anyhow::Result<()> {
    super::write_whole(path, &serde_json::to_vec_pretty(ledger)?)
}

/// Accepts held versions in the ledger file at `path` (all, one backend's, or one tool); a
/// running gateway serves them after its next reload. Returns what was accepted.
pub fn accept_in_file(path: &Path, backend: Option<&str>, tool: Option<&str>) -> anyhow::Result<Vec<(String, String)>> {
    let _lock = Locked::take(path).with_context(|| format!("locking {}", path.display()))?;
    let mut ledger = read(path)?;
    let accepted = ledger.accept(backend, tool);
    if !accepted.is_empty() {
        write(path, &ledger)?;
    }
    Ok(accepted)
}

/// What is held in the ledger file at `path`, as (backend, tool, digest).
pub fn held_in_file(path: &Path) -> anyhow::Result<Vec<(String, String, String)>> {
    let _lock = Locked::take(path).with_context(|| format!("locking {}", path.display()))?;
    let ledger = read(path)?;
    Ok(ledger.held().map(|(b, t, v)| (b.to_string(), t.to_string(), v.digest.clone())).collect())
}

impl Integrity {
    pub fn in_memory(frozen: bool) -> Self {
        Self {
            ledger: Mutex::default(),
            frozen,
            path: None,
            recent: Mutex::default(),
            counts: Mutex::default(),
            reread: tokio::sync::watch::channel(0).0,
        }
    }

    /// The ledger kept in `path` (read now, if it exists); `frozen` holds changes back.
    pub fn open(frozen: bool, path: Option<PathBuf>) -> anyhow::Result<Self> {
        let mut me = Self::in_memory(frozen);
        if let Some(p) = &path {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("health.tool_ledger: creating {}", dir.display()))?;
            }
            let _lock = Locked::take(p).with_context(|| format!("health.tool_ledger: locking {}", p.display()))?;
            me.ledger = Mutex::new(read(p).context("health.tool_ledger")?);
        }
        me.path = path;
        Ok(me)
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Woken when the ledger was read again.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reread.subscribe()
    }

    /// Takes `backend`'s listing through the ledger: returns the tools to serve, logs and counts
    /// each difference, and keeps the ledger in its file when it changed.
    pub fn observe(&self, backend: &str, tools: &[Tool]) -> Vec<Tool> {
        let mut ledger = self.ledger.lock().expect("ledger lock");
        let observed = ledger.observe(backend, tools, self.frozen, now_ms());
        for e in &observed.events {
            let what = match e.kind {
                Kind::Changed => "a tool's definition changed",
                Kind::Added => "a tool was added after its backend's first listing",
            };
            let action = if e.held { "held back until accepted" } else { "served" };
            tracing::warn!(backend = %e.backend, tool = %e.tool, looks_like = e.looks_like.as_deref(), "{what}: {action}");
            *self.counts.lock().expect("counts lock").entry((e.backend.clone(), e.kind)).or_default() += 1;
            let mut recent = self.recent.lock().expect("recent lock");
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(e.clone());
        }
        if observed.dirty
            && let Some(path) = &self.path
        {
            let saved = Locked::take(path).map_err(anyhow::Error::from).and_then(|_lock| {
                // Accepted elsewhere meanwhile (`toolmux tools accept`) stays accepted.
                let on_disk = read(path)?;
                let merged = merge(&ledger, &on_disk);
                write(path, &merged)
            });
            if let Err(e) = saved {
                tracing::error!(error = %format!("{e:#}"), "the tool ledger could not be saved; it is kept in memory");
            }
        }
        observed.served
    }

    /// Reads the file again (after an operator accepted changes in it); the catalog then takes
    /// the listings through it again. Returns how many versions are still held.
    pub fn reread(&self) -> anyhow::Result<usize> {
        let Some(path) = &self.path else { return Ok(self.ledger.lock().expect("ledger lock").held().count()) };
        let on_disk = {
            let _lock = Locked::take(path)?;
            read(path)?
        };
        let held = {
            let mut ledger = self.ledger.lock().expect("ledger lock");
            *ledger = on_disk;
            ledger.held().count()
        };
        self.reread.send_modify(|n| *n += 1);
        Ok(held)
    }

    pub fn status(&self) -> IntegrityStatus {
        let ledger = self.ledger.lock().expect("ledger lock");
        IntegrityStatus {
            frozen: self.frozen,
            ledger: self.path.as_ref().map(|p| p.display().to_string()),
            held: ledger
                .held()
                .map(|(b, t, v)| Held {
                    backend: b.into(),
                    tool: t.into(),
                    digest: v.digest.clone(),
                    seen_ms: v.seen_ms,
                })
                .collect(),
            recent: self.recent.lock().expect("recent lock").iter().cloned().collect(),
        }
    }

    /// Differences seen since start, by backend and kind.
    pub fn counts(&self) -> Vec<(String, Kind, u64)> {
        self.counts.lock().expect("counts lock").iter().map(|((b, k), n)| (b.clone(), *k, *n)).collect()
    }
}

/// This process's ledger, with what the file accepted that this one still holds.
fn merge(mine: &Ledger, on_disk: &Ledger) -> Ledger {
    let mut out = mine.clone();
    for (backend, disk) in &on_disk.backends {
        let Some(known) = out.backends.get_mut(backend) else { continue };
        for (tool, version) in &disk.accepted {
            if known.held.get(tool).is_some_and(|h| h.digest == version.digest) {
                known.held.remove(tool);
                known.accepted.insert(tool.clone(), version.clone());
            }
        }
    }
    out
}
