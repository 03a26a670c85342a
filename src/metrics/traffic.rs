//! The last minutes of traffic, for the console's plots: requests, find_tool latency and match
//! verdicts in fixed slices of time. Recorded where the Prometheus series are (the same events),
//! kept in a ring of [`SLICES`] slices of [`SLICE`], so its memory is fixed whatever the load.
//!
//! Latencies go into a log-scaled histogram per slice (quarter-octave bins from 25 µs), so a
//! percentile is read to within a bin's width (about 19 %) without keeping every sample.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How long one slice covers.
pub const SLICE: Duration = Duration::from_secs(5);
/// How many slices are kept: ten minutes.
pub const SLICES: usize = 120;

/// Latency bins: bin `i` holds times below `FIRST_BIN · 2^((i+1)/4)`; the last takes the rest.
const BINS: usize = 96;
const FIRST_BIN_SECS: f64 = 25e-6;
const BINS_PER_OCTAVE: f64 = 4.0;

#[derive(Clone)]
struct Slice {
    /// Which slice of time since the window's start this is (`u64::MAX`: never written).
    index: u64,
    requests: u64,
    errors: u64,
    searches: u64,
    /// find_tool verdicts: good, weak, none.
    verdicts: [u64; 3],
    latency: [u32; BINS],
}

impl Slice {
    const EMPTY: Slice =
        Slice { index: u64::MAX, requests: 0, errors: 0, searches: 0, verdicts: [0; 3], latency: [0; BINS] };
}

pub struct Traffic {
    started: Instant,
    slices: Mutex<Vec<Slice>>,
}

/// One slice as the console reads it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Point {
    /// Seconds before now at which the slice ends (0 for the slice under way).
    pub ago_secs: u64,
    pub requests_per_sec: f64,
    pub errors: u64,
    pub searches: u64,
    /// find_tool latency percentiles in milliseconds; `None` without searches.
    pub find_p50_ms: Option<f64>,
    pub find_p95_ms: Option<f64>,
    /// Shares of find_tool answers by verdict (0 to 1); all zero without searches.
    pub good: f64,
    pub weak: f64,
    pub none: f64,
}

impl Default for Traffic {
    fn default() -> Self {
        Self::new()
    }
}

impl Traffic {
    pub fn new() -> Self {
        Self { started: Instant::now(), slices: Mutex::new(vec![Slice::EMPTY; SLICES]) }
    }

    fn index_at(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.started).as_millis() / SLICE.as_millis()) as u64
    }

    /// The slice for now, emptied first when it last held an older one.
    fn with_now(&self, f: impl FnOnce(&mut Slice)) {
        let index = self.index_at(Instant::now());
        let mut slices = self.slices.lock().expect("traffic lock");
        let slice = &mut slices[(index % SLICES as u64) as usize];
        if slice.index != index {
            *slice = Slice { index, ..Slice::EMPTY };
        }
        f(slice);
    }

    pub fn request(&self, ok: bool) {
        self.with_now(|s| {
            s.requests += 1;
            s.errors += u64::from(!ok);
        });
    }

    /// A find_tool answer: its latency and verdict (0 good, 1 weak, 2 none).
    pub fn search(&self, took: Duration, verdict: usize) {
        let bin = bin_of(took);
        self.with_now(|s| {
            s.searches += 1;
            s.verdicts[verdict.min(2)] += 1;
            s.latency[bin] = s.latency[bin].saturating_add(1);
        });
    }

    /// Every slice of the window, oldest first, the one under way last.
    pub fn points(&self) -> Vec<Point> {
        let now = self.index_at(Instant::now());
        let slices = self.slices.lock().expect("traffic lock");
        let secs = SLICE.as_secs_f64();
        (0..SLICES as u64)
            .rev()
            .map(|back| {
                let index = now.saturating_sub(back);
                let slice = &slices[(index % SLICES as u64) as usize];
                let empty = Slice { index, ..Slice::EMPTY };
                let s = if slice.index == index && back <= now { slice } else { &empty };
                // The slice under way has run for part of its length only.
                let elapsed = if back == 0 {
                    let into = self.started.elapsed().as_secs_f64() - index as f64 * secs;
                    into.clamp(0.5, secs)
                } else {
                    secs
                };
                let share = |n: u64| if s.searches == 0 { 0.0 } else { n as f64 / s.searches as f64 };
                Point {
                    ago_secs: back * SLICE.as_secs(),
                    requests_per_sec: s.requests as f64 / elapsed,
                    errors: s.errors,
                    searches: s.searches,
                    find_p50_ms: percentile(&s.latency, 0.50),
                    find_p95_ms: percentile(&s.latency, 0.95),
                    good: share(s.verdicts[0]),
                    weak: share(s.verdicts[1]),
                    none: share(s.verdicts[2]),
                }
            })
            .collect()
    }
}

fn bin_of(took: Duration) -> usize {
    let ratio = took.as_secs_f64() / FIRST_BIN_SECS;
    if ratio < 1.0 {
        return 0;
    }
    ((ratio.log2() * BINS_PER_OCTAVE) as usize).min(BINS - 1)
}

/// The upper edge of bin `i`, in milliseconds.
fn upper_ms(i: usize) -> f64 {
    FIRST_BIN_SECS * 2f64.powf((i + 1) as f64 / BINS_PER_OCTAVE) * 1e3
}

/// The `q` quantile of a binned histogram, at the geometric middle of its bin.
fn percentile(bins: &[u32; BINS], q: f64) -> Option<f64> {
    let total: u64 = bins.iter().map(|&n| u64::from(n)).sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &n) in bins.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            let low = if i == 0 { 0.0 } else { upper_ms(i - 1) };
            let middle = if i == 0 { upper_ms(0) / 2.0 } else { (low * upper_ms(i)).sqrt() };
            return Some((middle * 1000.0).round() / 1000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_fall_within_a_bin_of_the_truth() {
        let t = Traffic::new();
        // 90 fast searches (2 ms), 10 slow (40 ms).
        for _ in 0..90 {
            t.search(Duration::from_millis(2), 0);
        }
        for _ in 0..10 {
            t.search(Duration::from_millis(40), 2);
        }
        t.request(true);
        t.request(false);
        let now = t.points().pop().unwrap();
        assert_eq!(now.ago_secs, 0);
        assert_eq!(now.searches, 100);
        assert_eq!(now.errors, 1);
        let p50 = now.find_p50_ms.unwrap();
        let p95 = now.find_p95_ms.unwrap();
        assert!((1.6..2.5).contains(&p50), "p50 {p50}");
        assert!((32.0..49.0).contains(&p95), "p95 {p95}");
        assert!((now.good - 0.9).abs() < 1e-9 && (now.none - 0.1).abs() < 1e-9);
        assert_eq!(t.points().len(), SLICES);
    }

    #[test]
    fn an_empty_window_has_no_percentiles() {
        let t = Traffic::new();
        let points = t.points();
        assert!(points.iter().all(|p| p.searches == 0 && p.find_p50_ms.is_none() && p.requests_per_sec == 0.0));
        assert_eq!(points.first().unwrap().ago_secs, (SLICES as u64 - 1) * SLICE.as_secs());
    }

    #[test]
    fn extreme_latencies_land_in_the_end_bins() {
        assert_eq!(bin_of(Duration::from_nanos(1)), 0);
        assert_eq!(bin_of(Duration::from_secs(3600)), BINS - 1);
    }
}
