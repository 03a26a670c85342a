//! `idle_stop`: a stdio backend whose shared connection nobody has used for that long is stopped
//! (its child and process group end) and stays *dormant*: its listing stays, so its tools stay in
//! the catalog and find_tool finds them, health probes leave it alone, and the first call that
//! needs it starts it again and waits for it (within the call's deadline).
//!
//! [`Sleep`] is the backend's side of it: what uses the connection, when it was last used, and
//! the bell a call rings to wake it. The supervisor (`Backend::supervise`) stops and starts.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub struct Sleep {
    /// `idle_stop`; `None`: never.
    idle: Option<Duration>,
    busy: AtomicUsize,
    last_used: Mutex<Instant>,
    dormant: AtomicBool,
    bell: Notify,
}

/// A request using the shared connection: it is not idle until every one has ended.
pub struct Busy<'a>(&'a Sleep);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        *self.0.last_used.lock().expect("sleep lock") = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Sleep {
    pub fn new(idle: Option<Duration>) -> Self {
        Self {
            idle,
            busy: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            dormant: AtomicBool::new(false),
            bell: Notify::new(),
        }
    }

    /// Marks the shared connection in use until the guard drops.
    pub fn using(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        *self.last_used.lock().expect("sleep lock") = Instant::now();
        Busy(self)
    }

    /// Resolves once the connection has gone unused for `idle_stop`; never without one.
    pub async fn idle(&self) {
        let Some(idle) = self.idle else { return std::future::pending().await };
        loop {
            let at = *self.last_used.lock().expect("sleep lock") + idle;
            tokio::time::sleep_until(at).await;
            let quiet = *self.last_used.lock().expect("sleep lock") + idle <= Instant::now();
            if quiet && self.busy.load(Ordering::Acquire) == 0 {
                return;
            }
            if !quiet {
                continue;
            }
            // In use now: look again once a while has passed.
            tokio::time::sleep(idle.min(Duration::from_secs(1))).await;
        }
    }

    /// Stopped for want of use, until [`Sleep::wake`] (or until a wake's attempt has ended).
    pub fn is_dormant(&self) -> bool {
        self.dormant.load(Ordering::Acquire)
    }

    pub fn fall_asleep(&self) {
        self.dormant.store(true, Ordering::Release);
    }

    /// A wake's connection attempt has ended, either way.
    pub fn woke(&self) {
        *self.last_used.lock().expect("sleep lock") = Instant::now();
        self.dormant.store(false, Ordering::Release);
    }

    /// Rings for the supervisor to start the backend again (a permit is kept if it is not
    /// listening yet).
    pub fn wake(&self) {
        self.bell.notify_one();
    }

    pub async fn rung(&self) {
        self.bell.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_the_last_use_to_end_and_the_time_to_pass() {
        let s = Sleep::new(Some(Duration::from_secs(60)));
        let start = Instant::now();
        let busy = s.using();
        let idle = s.idle();
        tokio::pin!(idle);
        // A use that lasts past the idle time keeps it awake.
        assert!(tokio::time::timeout(Duration::from_secs(120), &mut idle).await.is_err());
        drop(busy);
        idle.await;
        assert!(start.elapsed() >= Duration::from_secs(180), "idle_stop counts from the end of the last use");
        let never = Sleep::new(None);
        assert!(tokio::time::timeout(Duration::from_secs(3600), never.idle()).await.is_err());
    }
}
