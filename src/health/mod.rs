//! Backend health: a probe per backend every `health.interval`, a status per backend, and
//! whether it is advertised. Transitions follow the reference gateway (docs/health.md):
//!
//! - `unknown` until a probe first succeeds; a first probe that fails leaves it `unknown`. A
//!   backend's first connection (initialize and a full listing) counts as its first successful
//!   probe, so a backend that answered at start-up is offered at once;
//! - `unhealthy_threshold` consecutive failures make it `unhealthy`; below that the previous
//!   status stands;
//! - a success slower than `degraded_threshold` is `degraded`; the first success after failures
//!   is `degraded` (recovering) until the next probe, then `healthy`.
//!
//! Advertised: healthy and degraded. With `interval = 0` nothing is probed and every backend is
//! advertised. [`Tracker`] is the pure state machine; [`Monitor`] drives it with real probes.
//!
//! Every flip of a backend's advertisability bumps [`Monitor::version`] at once, in the same
//! critical section that changes the status: scopes follow health without delay. Debouncing
//! what clients are *told* (passthrough `tools/list_changed`) is the gateway's business.

pub mod breaker;
pub mod notifier;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use breaker::Breaker;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::HealthConfig;
use crate::upstream::{Backend, Upstream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Unknown,
    Healthy,
    Degraded,
    Unhealthy,
    /// Stopped after `idle_stop` unused: its tools are offered, and a call starts it.
    Dormant,
}

impl Status {
    pub fn advertisable(self) -> bool {
        matches!(self, Status::Healthy | Status::Degraded | Status::Dormant)
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
    /// Present when `[health.circuit_breaker]` is configured.
    breakers: Option<Mutex<HashMap<String, Breaker>>>,
    /// Rung by passive signals (a call that lost its connection) to probe now.
    probe_now: Mutex<HashMap<String, Arc<Notify>>>,
    /// The health version: bumped on every advertisability flip, while the lock that made the
    /// flip is still held, so whoever sees the new status also sees the new version.
    flips: watch::Sender<u64>,
    /// Health state changes (first verdicts included), for metrics.
    pub transitions: std::sync::atomic::AtomicU64,
}

impl Monitor {
    pub fn new(cfg: HealthConfig, upstream: &Upstream) -> Arc<Self> {
        let now = Instant::now();
        let names: Vec<String> = upstream.backends().iter().map(|b| b.name().to_string()).collect();
        let trackers = names.iter().map(|n| (n.clone(), Tracker::new(now))).collect();
        let breakers =
            cfg.circuit_breaker.map(|bc| Mutex::new(names.iter().map(|n| (n.clone(), Breaker::new(bc))).collect()));
        let probe_now = names.iter().map(|n| (n.clone(), Arc::new(Notify::new()))).collect();
        let (flips, _) = watch::channel(0);
        Arc::new(Self {
            cfg,
            trackers: Mutex::new(trackers),
            breakers,
            probe_now: Mutex::new(probe_now),
            flips,
            transitions: Default::default(),
        })
    }

    /// Starts tracking `backend` afresh (a reload added or replaced it): unknown until probed.
    pub fn add(&self, backend: &str) {
        self.trackers.lock().expect("health lock").insert(backend.to_string(), Tracker::new(Instant::now()));
        if let (Some(map), Some(bc)) = (&self.breakers, self.cfg.circuit_breaker) {
            map.lock().expect("breaker lock").insert(backend.to_string(), Breaker::new(bc));
        }
        self.probe_now.lock().expect("probe lock").insert(backend.to_string(), Arc::new(Notify::new()));
        self.flipped();
    }

    /// Stops tracking `backend` (a reload removed it).
    pub fn remove(&self, backend: &str) {
        self.trackers.lock().expect("health lock").remove(backend);
        if let Some(map) = &self.breakers {
            map.lock().expect("breaker lock").remove(backend);
        }
        self.probe_now.lock().expect("probe lock").remove(backend);
        self.flipped();
    }

    fn flipped(&self) {
        self.flips.send_modify(|v| *v += 1);
    }

    fn breaker<T>(&self, backend: &str, f: impl FnOnce(&mut Breaker) -> T) -> Option<T> {
        let mut map = self.breakers.as_ref()?.lock().expect("breaker lock");
        map.get_mut(backend).map(f)
    }

    /// Whether a call to `backend` may go now; `Err(retry_in)` while its breaker is open.
    pub fn call_gate(&self, backend: &str) -> Result<(), Duration> {
        let now = Instant::now();
        match self.breaker(backend, |b| b.allow_call(now)) {
            Some(Err(until)) => Err(until.saturating_duration_since(now)),
            _ => Ok(()),
        }
    }

    /// Whether `backend`'s breaker is open; `None` without breakers.
    pub fn breaker_open(&self, backend: &str) -> Option<bool> {
        self.breaker(backend, |b| b.is_open())
    }

    /// When `backend` will next be tried, if its breaker is open.
    pub fn retry_in(&self, backend: &str) -> Option<Duration> {
        self.breaker(backend, |b| b.retry_in(Instant::now())).flatten()
    }

    /// A passive signal: a call to `backend` failed on its connection. Counts toward the
    /// breaker and probes now rather than at the next tick.
    pub fn call_failed(&self, backend: &str) {
        let flipped = self.breaker(backend, |b| {
            let was = b.is_open();
            b.on_failure(Instant::now());
            let flipped = was != b.is_open();
            if flipped {
                self.flipped();
            }
            flipped
        });
        if flipped == Some(true) {
            tracing::warn!(backend, "circuit breaker opened");
        }
        if let Some(n) = self.probe_now.lock().expect("probe lock").get(backend) {
            n.notify_one();
        }
    }

    pub fn enabled(&self) -> bool {
        !self.cfg.interval.is_zero()
    }

    /// Ticks, without delay, when some backend's advertisability flips.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.flips.subscribe()
    }

    /// Rises with every advertisability flip: a scope built at an older version may be stale.
    pub fn version(&self) -> u64 {
        *self.flips.borrow()
    }

    /// Whether `backend`'s tools are offered now. Unmonitored backends are offered while connected.
    pub fn advertisable(&self, backend: &Backend) -> bool {
        if !self.enabled() {
            return true;
        }
        let open = self.breaker(backend.name(), |b| b.is_open()).unwrap_or(false);
        self.status(backend.name()).advertisable() && !open
    }

    pub fn status(&self, backend: &str) -> Status {
        self.trackers.lock().expect("health lock").get(backend).map_or(Status::Unknown, |t| t.status)
    }

    pub fn health(&self, backend: &str) -> Option<BackendHealth> {
        let t = self.trackers.lock().expect("health lock").get(backend).cloned()?;
        Some(BackendHealth { status: t.status, since_secs: t.since.elapsed().as_secs() })
    }

    /// `backend` went dormant (`idle_stop`): no probe reaches it until a call starts it again,
    /// and its tools stay offered.
    fn rest(&self, backend: &str) {
        let mut map = self.trackers.lock().expect("health lock");
        let t = map.entry(backend.to_string()).or_insert_with(|| Tracker::new(Instant::now()));
        if t.status != Status::Dormant {
            let before = t.status.advertisable();
            (t.status, t.since) = (Status::Dormant, Instant::now());
            t.consecutive_failures = 0;
            tracing::info!(backend, "backend dormant");
            if !before {
                drop(map);
                self.flipped();
            }
        }
    }

    /// Applies one probe outcome for `backend` (probes call this; tests and benches may too).
    pub fn record(&self, backend: &str, outcome: Option<Duration>) {
        self.breaker(backend, |b| {
            let was = b.is_open();
            match outcome {
                Some(_) => b.on_success(),
                None => b.on_failure(Instant::now()),
            }
            if was != b.is_open() {
                self.flipped();
            }
        });
        let mut map = self.trackers.lock().expect("health lock");
        let t = map.entry(backend.to_string()).or_insert_with(|| Tracker::new(Instant::now()));
        let (before, was) = (t.status.advertisable(), t.status);
        if t.observe(outcome, &self.cfg, Instant::now()) {
            self.transitions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // A first verdict is routine (every backend gets one at start-up); a change is news.
            if was == Status::Unknown {
                tracing::debug!(backend, status = ?t.status, "backend health known");
            } else {
                tracing::info!(backend, status = ?t.status, "backend health changed");
            }
        }
        if before != t.status.advertisable() {
            self.flipped();
        }
    }

    /// Probes `backend` every interval (and at once when its connection comes or goes).
    pub async fn watch_backend(self: Arc<Self>, backend: Arc<Backend>, mut link: watch::Receiver<u64>) {
        let ct = backend.retired().clone();
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
        let probe_now = self.probe_now.lock().expect("probe lock").get(backend.name()).cloned().unwrap_or_default();
        // A first connection that initialized and listed everything is a successful round trip:
        // it stands for the first probe, and the next one comes an interval later.
        let mut probed = connected;
        if connected {
            self.record(backend.name(), Some(Duration::ZERO));
        }
        loop {
            // A dormant backend is not probed: it is asleep on purpose, and a probe would not wake
            // it (nor should it).
            if backend.is_dormant() {
                self.rest(backend.name());
                probed = false;
            } else if !std::mem::take(&mut probed)
                && self.breaker(backend.name(), |b| b.allow_probe(Instant::now())).unwrap_or(true)
            {
                let outcome = backend.probe(self.cfg.timeout).await.ok();
                self.record(backend.name(), outcome);
            }
            let next = self.retry_in(backend.name()).map_or(self.cfg.interval, |r| r.min(self.cfg.interval));
            let deadline = Instant::now() + next.max(Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = ct.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = probe_now.notified() => break,
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
