//! Backend health: a probe per backend every `health.interval`, a status per backend, and
//! whether it is advertised. Transitions follow the reference gateway (docs/health.md):
//!
//! - `unknown` until a probe first succeeds; a first probe that fails leaves it `unknown`;
//! - `unhealthy_threshold` consecutive failures make it `unhealthy`; below that the previous
//!   status stands;
//! - a success slower than `degraded_threshold` is `degraded`; the first success after failures
//!   is `degraded` (recovering) until the next probe, then `healthy`.
//!
//! Advertised: healthy and degraded. With `interval = 0` nothing is probed and every backend is
//! advertised. [`Tracker`] is the pure state machine; [`Monitor`] drives it with real probes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::HealthConfig;
use crate::upstream::{Backend, Upstream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Unknown,
    Healthy,
    Degraded,
    Unhealthy,
}

impl Status {
    pub fn advertisable(self) -> bool {
        matches!(self, Status::Healthy | Status::Degraded)
    }
}

/// One backend's health, driven by probe outcomes.
#[derive(Debug, Clone)]
pub struct Tracker {
    pub status: Status,
    consecutive_failures: u32,
    /// When the status last changed.
    pub since: Instant,
    recovering: bool,
}

impl Tracker {
    pub fn new(now: Instant) -> Self {
        Self { status: Status::Unknown, consecutive_failures: 0, since: now, recovering: false }
    }

    /// Applies one probe outcome (`Some(latency)` on success); returns true if the status changed.
    pub fn observe(&mut self, outcome: Option<Duration>, cfg: &HealthConfig, now: Instant) -> bool {
        let before = self.status;
        match outcome {
            Some(latency) => {
                let after_failures = self.consecutive_failures > 0;
                self.consecutive_failures = 0;
                self.status = if latency > cfg.degraded_threshold {
                    self.recovering = false;
                    Status::Degraded
                } else if after_failures {
                    // Recovering: degraded until the next probe confirms it.
                    self.recovering = true;
                    Status::Degraded
                } else {
                    self.recovering = false;
                    Status::Healthy
                };
            }
            None => {
                self.consecutive_failures += 1;
                self.recovering = false;
                if self.consecutive_failures >= cfg.unhealthy_threshold && before != Status::Unknown {
                    self.status = Status::Unhealthy;
                }
            }
        }
        if self.status != before {
            self.since = now;
            true
        } else {
            false
        }
    }
}

/// A backend's health as others see it.
#[derive(Debug, Clone, Serialize)]
pub struct BackendHealth {
    pub status: Status,
    /// Seconds since the status last changed.
    pub since_secs: u64,
}

pub struct Monitor {
    cfg: HealthConfig,
    trackers: Mutex<HashMap<String, Tracker>>,
    /// Bumped whenever some backend's advertisability flips.
    changes: watch::Sender<u64>,
}

impl Monitor {
    pub fn new(cfg: HealthConfig, upstream: &Upstream) -> Arc<Self> {
        let now = Instant::now();
        let trackers = upstream.backends.iter().map(|b| (b.name().to_string(), Tracker::new(now))).collect();
        let (changes, _) = watch::channel(0);
        Arc::new(Self { cfg, trackers: Mutex::new(trackers), changes })
    }

    pub fn enabled(&self) -> bool {
        !self.cfg.interval.is_zero()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether `backend`'s tools are offered now. Unmonitored backends are offered while connected.
    pub fn advertisable(&self, backend: &Backend) -> bool {
        if !self.enabled() {
            return true;
        }
        self.status(backend.name()).advertisable()
    }

    pub fn status(&self, backend: &str) -> Status {
        self.trackers.lock().expect("health lock").get(backend).map_or(Status::Unknown, |t| t.status)
    }

    pub fn health(&self, backend: &str) -> Option<BackendHealth> {
        let t = self.trackers.lock().expect("health lock").get(backend).cloned()?;
        Some(BackendHealth { status: t.status, since_secs: t.since.elapsed().as_secs() })
    }

    /// Applies one probe outcome for `backend` (probes call this; tests and benches may too).
    pub fn record(&self, backend: &str, outcome: Option<Duration>) {
        let flipped = {
            let mut map = self.trackers.lock().expect("health lock");
            let t = map.entry(backend.to_string()).or_insert_with(|| Tracker::new(Instant::now()));
            let before = t.status.advertisable();
            let changed = t.observe(outcome, &self.cfg, Instant::now());
            if changed {
                tracing::info!(backend, status = ?t.status, "backend health changed");
            }
            before != t.status.advertisable()
        };
        if flipped {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Probes `backend` every interval (and at once when its connection comes or goes).
    pub async fn watch_backend(
        self: Arc<Self>,
        backend: Arc<Backend>,
        mut link: watch::Receiver<u64>,
        ct: CancellationToken,
    ) {
        if !self.enabled() {
            return;
        }
        // The first probe waits for the first connection attempt, so a backend that is merely
        // still connecting is not counted as failing.
        while !backend.was_tried() {
            tokio::select! {
                _ = ct.cancelled() => return,
                r = link.changed() => if r.is_err() { return },
            }
        }
        let mut connected = backend.is_connected();
        loop {
            let outcome = backend.probe(self.cfg.timeout).await.ok();
            self.record(backend.name(), outcome);
            let deadline = Instant::now() + self.cfg.interval;
            loop {
                tokio::select! {
                    _ = ct.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => break,
                    r = link.changed() => {
                        if r.is_err() { return; }
                        let now = backend.is_connected();
                        if now != connected {
                            connected = now;
                            break;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
