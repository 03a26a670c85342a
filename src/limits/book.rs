//! The counts one process keeps: token buckets and windowed counters by key, checked and spent
//! all or nothing under one lock. The Redis script in [`super::shared`] does the same
//! arithmetic, so that a replica alone and replicas together refuse the same calls.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Check, Kind};

/// Entries kept before stale ones are swept (a full bucket, a past window).
const SWEEP_AT: usize = 16_384;

#[derive(Default)]
pub struct Book {
    entries: HashMap<String, Entry>,
    swept: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    /// Tokens left as of `at`; from `full` on, as good as a new bucket.
    Bucket { tokens: f64, at: Instant, full: Instant },
    /// A window's count, forgotten at `ends`.
    Count { n: u64, ends: Instant },
}

/// What [`Book::usage`] finds under a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    /// Tokens left in a bucket now.
    Tokens(f64),
    /// A window's count so far.
    Count(u64),
}

impl Book {
    /// Admits one request against every check, spending from each, or spends nothing and
    /// answers the check that refuses longest, with how long until it would pass.
    pub fn admit(&mut self, checks: &[Check], now: Instant) -> Result<(), (usize, Duration)> {
        self.sweep(now);
        let mut worst: Option<(usize, Duration)> = None;
        for (i, c) in checks.iter().enumerate() {
            let wait = match c.kind {
                Kind::Bucket { burst, refill } => {
                    let left = self.tokens(&c.key, burst, refill, now);
                    (left < 1.0).then(|| refill.mul_f64(1.0 - left))
                }
                Kind::Calls { max, ends_in, .. } | Kind::Tokens { max, ends_in } => {
                    (self.count(&c.key, now) >= max).then_some(ends_in)
                }
            };
            if let Some(wait) = wait
                && worst.is_none_or(|(_, w)| wait > w)
            {
                worst = Some((i, wait));
            }
        }
        if let Some(worst) = worst {
            return Err(worst);
        }
        for c in checks {
            match c.kind {
                Kind::Bucket { burst, refill } => {
                    let tokens = self.tokens(&c.key, burst, refill, now) - 1.0;
                    let full = now + refill.mul_f64(f64::from(burst) - tokens);
                    self.entries.insert(c.key.clone(), Entry::Bucket { tokens, at: now, full });
                }
                Kind::Calls { ends_in, .. } => self.add(&c.key, 1, now + ends_in, now),
                Kind::Tokens { .. } => {}
            }
        }
        Ok(())
    }

    /// Adds `n` to a window's count (result tokens, once a call has returned).
    pub fn add(&mut self, key: &str, n: u64, ends: Instant, now: Instant) {
        let count = self.count(key, now);
        self.entries.insert(key.to_string(), Entry::Count { n: count.saturating_add(n), ends });
    }

    /// What is kept under `key` now, for the console.
    pub fn reading(&self, c: &Check, now: Instant) -> Reading {
        match c.kind {
            Kind::Bucket { burst, refill } => Reading::Tokens(self.tokens(&c.key, burst, refill, now)),
            _ => Reading::Count(self.count(&c.key, now)),
        }
    }

    fn tokens(&self, key: &str, burst: u32, refill: Duration, now: Instant) -> f64 {
        match self.entries.get(key) {
            Some(Entry::Bucket { tokens, at, .. }) => {
                let back = now.saturating_duration_since(*at).as_secs_f64() / refill.as_secs_f64();
                (tokens + back).min(f64::from(burst))
            }
            _ => f64::from(burst),
        }
    }

    fn count(&self, key: &str, now: Instant) -> u64 {
        match self.entries.get(key) {
            Some(Entry::Count { n, ends }) if *ends > now => *n,
            _ => 0,
        }
    }

    /// Past [`SWEEP_AT`] entries, at most once a second, drops what reads as nothing kept: full
    /// buckets and ended windows.
    fn sweep(&mut self, now: Instant) {
        if self.entries.len() < SWEEP_AT || self.swept.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        self.swept = Some(now);
        self.entries.retain(|_, e| match *e {
            Entry::Bucket { full, .. } => full > now,
            Entry::Count { ends, .. } => ends > now,
        });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limit;

    fn bucket(key: &str, burst: u32, refill_ms: u64) -> Check {
        Check {
            rule: 0,
            limit: Limit::Rate,
            key: key.into(),
            kind: Kind::Bucket { burst, refill: Duration::from_millis(refill_ms) },
        }
    }

    fn calls(key: &str, max: u64, ends_in_s: u64) -> Check {
        Check {
            rule: 0,
            limit: Limit::CallsPerHour,
            key: key.into(),
            kind: Kind::Calls { max, ends_in: Duration::from_secs(ends_in_s) },
        }
    }

    #[test]
    fn a_bucket_allows_its_burst_then_one_per_refill() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let b = [bucket("b", 3, 100)];
        for _ in 0..3 {
            assert!(book.admit(&b, t0).is_ok());
        }
        let (i, wait) = book.admit(&b, t0).unwrap_err();
        assert_eq!(i, 0);
        assert_eq!(wait, Duration::from_millis(100));
        let (_, wait) = book.admit(&b, t0 + Duration::from_millis(40)).unwrap_err();
        assert!((59..=60).contains(&wait.as_millis()), "{wait:?}");
        assert!(book.admit(&b, t0 + Duration::from_millis(100)).is_ok());
        assert!(book.admit(&b, t0 + Duration::from_millis(100)).is_err());
        // Idle for long: full again, never more than the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(book.admit(&b, later).is_ok());
        }
        assert!(book.admit(&b, later).is_err());
    }

    #[test]
    fn a_refusal_spends_nothing_and_names_the_longest_wait() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let both = [bucket("rate", 10, 100), calls("hour", 2, 1800)];
        assert!(book.admit(&both, t0).is_ok());
        assert!(book.admit(&both, t0).is_ok());
        assert_eq!(book.admit(&both, t0), Err((1, Duration::from_secs(1800))));
        // The refused calls took nothing from the bucket: 8 of 10 are left.
        let rate = [bucket("rate", 10, 100)];
        for _ in 0..8 {
            assert!(book.admit(&rate, t0).is_ok());
        }
        assert!(book.admit(&rate, t0).is_err());
    }

    #[test]
    fn a_window_forgets_its_count_when_it_ends() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let c = [calls("w", 1, 10)];
        assert!(book.admit(&c, t0).is_ok());
        assert!(book.admit(&c, t0 + Duration::from_secs(9)).is_err());
        // The next window's check names a new key; the old entry reads as nothing once over.
        assert_eq!(book.reading(&c[0], t0 + Duration::from_secs(11)), Reading::Count(0));
        let tokens = Check {
            rule: 0,
            limit: Limit::TokensPerDay,
            key: "t".into(),
            kind: Kind::Tokens { max: 100, ends_in: Duration::from_secs(5) },
        };
        assert!(book.admit(std::slice::from_ref(&tokens), t0).is_ok(), "a token quota is read, not spent");
        book.add("t", 100, t0 + Duration::from_secs(5), t0);
        assert!(book.admit(std::slice::from_ref(&tokens), t0).is_err());
    }

    #[test]
    fn stale_entries_are_swept() {
        let mut book = Book::default();
        let t0 = Instant::now();
        for i in 0..SWEEP_AT / 2 {
            book.admit(&[calls(&format!("k{i}"), 5, 1)], t0).unwrap();
            book.admit(&[bucket(&format!("b{i}"), 5, 100)], t0).unwrap();
        }
        assert_eq!(book.len(), SWEEP_AT);
        book.admit(&[calls("new", 5, 1)], t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(book.len(), 1);
    }
}
