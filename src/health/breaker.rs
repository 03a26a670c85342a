//! The circuit breaker: closed → open (after `failure_threshold` consecutive failures) →
//! half-open (after `timeout`, one probe) → closed or open again. Unlike the reference gateway,
//! an open breaker also fails calls at once, saying when the backend will be retried.

use tokio::time::{Duration, Instant};

use crate::config::BreakerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// The timeout passed; one probe is allowed through.
    HalfOpen {
        probing: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    pub state: State,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Self {
        Self { cfg, state: State::Closed { failures: 0 } }
    }

    /// Whether a call may go through now; `Err(retry_at)` while open.
    pub fn allow_call(&mut self, now: Instant) -> Result<(), Instant> {
        self.tick(now);
        match self.state {
            State::Closed { .. } | State::HalfOpen { .. } => Ok(()),
            State::Open { until } => Err(until),
        }
    }

    /// Whether a probe may run now (in half-open, only one at a time).
    pub fn allow_probe(&mut self, now: Instant) -> bool {
        self.tick(now);
        match &mut self.state {
            State::Closed { .. } => true,
            State::Open { .. } => false,
            State::HalfOpen { probing } => !std::mem::replace(probing, true),
        }
    }

    fn tick(&mut self, now: Instant) {
        if let State::Open { until } = self.state
            && now >= until
        {
            self.state = State::HalfOpen { probing: false };
        }
    }

    pub fn on_success(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    pub fn on_failure(&mut self, now: Instant) {
        self.state = match self.state {
            State::Closed { failures } if failures + 1 < self.cfg.failure_threshold => {
                State::Closed { failures: failures + 1 }
            }
            State::Open { until } => State::Open { until },
            _ => State::Open { until: now + self.cfg.timeout },
        };
    }

    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// When the next attempt is allowed, if the breaker is open.
    pub fn retry_in(&self, now: Instant) -> Option<Duration> {
        match self.state {
            State::Open { until } => Some(until.saturating_duration_since(now)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig { failure_threshold: 3, timeout: Duration::from_secs(60) }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_half_opens_with_one_probe_and_closes() {
        let mut b = Breaker::new(cfg());
        let t0 = Instant::now();
        b.on_failure(t0);
        b.on_failure(t0);
        assert!(b.allow_call(t0).is_ok(), "below the threshold");
        b.on_failure(t0);
        assert_eq!(b.allow_call(t0), Err(t0 + Duration::from_secs(60)));
        assert!(!b.allow_probe(t0));
        tokio::time::advance(Duration::from_secs(60)).await;
        let t1 = Instant::now();
        assert!(b.allow_probe(t1), "half-open: one probe");
        assert!(!b.allow_probe(t1), "only one");
        b.on_failure(t1);
        assert!(b.is_open(), "a failed half-open probe opens it again");
        assert_eq!(b.retry_in(t1), Some(Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(b.allow_probe(Instant::now()));
        b.on_success();
        assert_eq!(b.state, State::Closed { failures: 0 });
    }
}
