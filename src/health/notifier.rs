//! The change notifier: turns bursts of changes (advertisability flips, backend set changes)
//! into deliveries debounced to a window. The first change in a quiet window is delivered at
//! once; further changes in that window fold into one trailing delivery at its end. Every
//! delivery carries a rising generation number.
//!
//! Until [`Notifier::arm`] is called every change is delivered at once: start-up, when backends
//! come up one after another, must not hold a client's news back by a whole window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

pub struct Notifier {
    trigger: Notify,
    deliveries: watch::Sender<u64>,
    window: Duration,
    armed: AtomicBool,
}

impl Notifier {
    pub fn new(window: Duration) -> Self {
        let (deliveries, _) = watch::channel(0);
        Self { trigger: Notify::new(), deliveries, window, armed: AtomicBool::new(false) }
    }

    /// Starts debouncing: from now on a delivery opens a window.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// Reports a change.
    pub fn trigger(&self) {
        self.trigger.notify_one();
    }

    /// Ticks with the generation number of each delivery.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.deliveries.subscribe()
    }

    fn deliver(&self) {
        self.deliveries.send_modify(|g| *g += 1);
    }

    /// Runs the debounce until `ct` is cancelled.
    pub async fn run(&self, ct: CancellationToken) {
        loop {
            tokio::select! {
                _ = ct.cancelled() => return,
                _ = self.trigger.notified() => {}
            }
            self.deliver(); // leading edge
            if self.window.is_zero() || !self.armed.load(Ordering::Acquire) {
                continue;
            }
            // One window after each delivery; a change inside it makes one trailing delivery,
            // which opens the next window.
            loop {
                let window = tokio::time::sleep(self.window);
                tokio::pin!(window);
                let mut pending = false;
                loop {
                    tokio::select! {
                        _ = ct.cancelled() => return,
                        _ = &mut window => break,
                        _ = self.trigger.notified() => pending = true,
                    }
                }
                if !pending {
                    break;
                }
                self.deliver();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leading_edge_then_one_trailing_delivery() {
        let n = Arc::new(Notifier::new(Duration::from_secs(1)));
        let ct = CancellationToken::new();
        let task = tokio::spawn({
            let n = n.clone();
            let ct = ct.clone();
            async move { n.run(ct).await }
        });
        let rx = n.subscribe();
        tokio::task::yield_now().await;

        for expected in 1..=3 {
            n.trigger();
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(*rx.borrow(), expected, "before it is armed, every change goes at once");
        }
        n.arm();
        let base = *rx.borrow();
        let delivered = || *rx.borrow() - base;

        n.trigger();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(delivered(), 1, "the first change is delivered at once");
        for _ in 0..5 {
            n.trigger();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(delivered(), 1, "changes inside the window wait");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(delivered(), 2, "one trailing delivery for all of them");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(delivered(), 2, "quiet: nothing more");
        n.trigger();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(delivered(), 3, "a change after a quiet window is delivered at once again");
        ct.cancel();
        task.await.unwrap();
    }
}
