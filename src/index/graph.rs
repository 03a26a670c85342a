//! The HNSW graph, flat. hnsw_rs builds it (parallel insertion); its layers are then copied into
//! plain arrays of slot ids and hnsw_rs's structure is dropped, and queries walk the arrays here:
//! no locks, no reference counts, a reusable visited set.
//!
//! The walk scores nodes on 8-bit copies of the vectors (a quarter of the memory traffic of f32,
//! which is what a walk over random nodes waits on), fetching a node's neighbours ahead of
//! scoring them; then its best `8·k` (at least 64) are scored again exactly on the f32 vectors of
//! [`super::dense`], so the order returned is exact. On the same graph this search returned the
//! same neighbours as hnsw_rs's own in a fraction of the time (docs/performance.md).
//!
//! The search is the usual one: greedy descent through the upper layers, then a beam of width
//! `ef` on layer 0. With an allow-list, the beam still walks every node (the graph's
//! connectivity needs them) but only allowed nodes enter the results.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use hnsw_rs::hnsw::Hnsw;

use super::dense::{ClampedDot, dot};
use super::{AllowList, Hit, Slot};
use crate::simd::widest;

/// No neighbour, in a fixed-width row of layer 0.
const NONE: Slot = Slot::MAX;
/// How many of the walk's best, per result wanted (and at least), are scored again exactly.
const RESCORE: usize = 8;
const RESCORE_MIN: usize = 64;

pub struct Graph {
    dim: usize,
    /// Each vector as `dim` signed bytes, scaled by its own largest component.
    codes: Vec<i8>,
    /// Per vector: the factor that turns a product of codes back into a dot product share.
    scales: Vec<f32>,
    entry: Slot,
    /// Layer 0: `width` neighbour slots per node, `NONE`-padded.
    width: usize,
    bottom: Vec<Slot>,
    /// Layers 1.. (index 0 is layer 1): each node's neighbours, for the few nodes that reach it.
    upper: Vec<HashMap<Slot, Vec<Slot>>>,
}

/// A node and its similarity to the query, ordered by similarity.
#[derive(Clone, Copy)]
struct Scored(f32, Slot);

impl PartialEq for Scored {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scored {}
impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

/// Nodes seen by one search: a stamp per node, so clearing is one increment.
#[derive(Default)]
struct Visited {
    stamps: Vec<u32>,
    now: u32,
}

impl Visited {
    fn start(&mut self, n: usize) {
        if self.stamps.len() != n || self.now == u32::MAX {
            self.stamps = vec![0; n];
            self.now = 0;
        }
        self.now += 1;
    }

    /// True the first time `s` is seen in this search.
    fn first(&mut self, s: Slot) -> bool {
        let seen = &mut self.stamps[s as usize];
        let first = *seen != self.now;
        *seen = self.now;
        first
    }
}

thread_local! {
    static VISITED: RefCell<Visited> = RefCell::new(Visited::default());
}

impl Graph {
    /// Builds the graph over slot-major unit vectors with hnsw_rs, then flattens it.
    pub fn build(dim: usize, data: &[f32], m: usize, ef_construction: usize) -> Self {
        let len = data.len() / dim;
        let hnsw = Hnsw::new(m, len, 16, ef_construction, ClampedDot);
        let items: Vec<(&[f32], usize)> = data.chunks_exact(dim).zip(0..).collect();
        hnsw.parallel_insert_slice(&items);
        Self::flatten(&hnsw, dim, data, m)
    }

    /// Copies the layers of an hnsw_rs graph built over `data` with `m` neighbours a layer.
    fn flatten(hnsw: &Hnsw<'_, f32, ClampedDot>, dim: usize, data: &[f32], m: usize) -> Self {
        let len = data.len() / dim;
        let width = 2 * m;
        let mut bottom = vec![NONE; len * width];
        let mut upper: Vec<HashMap<Slot, Vec<Slot>>> = Vec::new();
        let mut entry = (0, 0u8);
        for point in hnsw.get_point_indexation() {
            let slot = point.get_origin_id() as Slot;
            let level = point.get_point_id().0;
            if level >= entry.1 {
                entry = (slot, level);
            }
            for (layer, neighbours) in point.get_neighborhood_id().into_iter().enumerate() {
                let ids = neighbours.iter().map(|n| n.d_id as Slot);
                if layer == 0 {
                    let row = &mut bottom[slot as usize * width..(slot as usize + 1) * width];
                    row.iter_mut().zip(ids).for_each(|(cell, id)| *cell = id);
                } else if !neighbours.is_empty() {
                    if upper.len() < layer {
                        upper.resize_with(layer, HashMap::new);
                    }
                    upper[layer - 1].insert(slot, ids.collect());
                }
            }
        }
        let (codes, scales): (Vec<Vec<i8>>, Vec<f32>) = data.chunks_exact(dim).map(quantize).unzip();
        Self { dim, codes: codes.concat(), scales, entry: entry.0, width, bottom, upper }
    }

    fn vector<'a>(&self, data: &'a [f32], s: Slot) -> &'a [f32] {
        &data[s as usize * self.dim..(s as usize + 1) * self.dim]
    }

    fn code(&self, s: Slot) -> &[i8] {
        &self.codes[s as usize * self.dim..(s as usize + 1) * self.dim]
    }

    /// The `k` most similar allowed nodes to `query` (`None`: all allowed), best first, with a
    /// beam of `ef` (at least `k`) on layer 0. `data` is the buffer the graph was built over.
    pub fn search(&self, data: &[f32], query: &[f32], k: usize, ef: usize, allow: Option<&AllowList>) -> Vec<Hit> {
        let len = data.len() / self.dim;
        if len == 0 || k == 0 {
            return Vec::new();
        }
        let (q, q_scale) = quantize(query);
        let score = |s: Slot| idot(&q, self.code(s)) as f32 * q_scale * self.scales[s as usize];
        // Greedy descent to layer 1.
        let mut at = Scored(score(self.entry), self.entry);
        for layer in self.upper.iter().rev() {
            loop {
                let best =
                    layer.get(&at.1).into_iter().flatten().map(|&n| Scored(score(n), n)).max().filter(|b| *b > at);
                match best {
                    Some(b) => at = b,
                    None => break,
                }
            }
        }
        // Beam search on layer 0.
        let ef = ef.max(k);
        let admitted = |s: Slot| allow.is_none_or(|a| a.contains(s));
        VISITED.with_borrow_mut(|visited| {
            visited.start(len);
            visited.first(at.1);
            let mut frontier = BinaryHeap::from([at]);
            // The best `ef` admitted so far, worst on top.
            let mut best: BinaryHeap<std::cmp::Reverse<Scored>> = BinaryHeap::with_capacity(ef + 1);
            if admitted(at.1) {
                best.push(std::cmp::Reverse(at));
            }
            while let Some(c) = frontier.pop() {
                if best.len() >= ef && best.peek().is_some_and(|w| c < w.0) {
                    break;
                }
                let row = &self.bottom[c.1 as usize * self.width..(c.1 as usize + 1) * self.width];
                // Ask for every neighbour's code before scoring the first: the walk waits on
                // memory, and overlapping the fetches is most of its speed.
                for &n in row.iter().take_while(|&&n| n != NONE) {
                    prefetch(self.code(n));
                }
                for &n in row.iter().take_while(|&&n| n != NONE) {
                    if !visited.first(n) {
                        continue;
                    }
                    let s = Scored(score(n), n);
                    if best.len() < ef || best.peek().is_some_and(|w| s > w.0) {
                        frontier.push(s);
                        if admitted(n) {
                            best.push(std::cmp::Reverse(s));
                            if best.len() > ef {
                                best.pop();
                            }
                        }
                    }
                }
            }
            // The walk's scores are approximate: score its best few exactly, then rank.
            let mut kept: Vec<Scored> = best.into_iter().map(|r| r.0).collect();
            kept.sort_unstable_by(|a, b| b.cmp(a));
            kept.truncate((k * RESCORE).max(RESCORE_MIN));
            let hits = kept.iter().map(|s| Hit { slot: s.1, score: dot(query, self.vector(data, s.1)) }).collect();
            super::top_k(hits, k)
        })
    }

    pub fn heap_bytes(&self) -> usize {
        let upper: usize = self.upper.iter().flat_map(|l| l.values()).map(|v| v.len() * 4 + 48).sum();
        self.codes.len() + self.scales.len() * 4 + self.bottom.len() * 4 + upper
    }
}

/// Starts loading `bytes` into the cache: the walk scores a node's neighbours one after another,
/// and each one's codes (384 bytes) sit elsewhere in memory.
#[inline(always)]
fn prefetch(bytes: &[i8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint that never faults; the address lies inside `bytes`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr()) };
    }
    #[cfg(target_arch = "aarch64")]
    for line in bytes.chunks(64) {
        // SAFETY: PRFM is a hint that never faults and writes nothing; the address lies inside
        // `bytes`. (The prefetch intrinsic is not stable on aarch64; the instruction is baseline.)
        unsafe {
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) line.as_ptr(), options(nostack, preserves_flags, readonly))
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = bytes;
}

/// `v` as signed bytes scaled by its largest component, and the scale back.
fn quantize(v: &[f32]) -> (Vec<i8>, f32) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        return (vec![0; v.len()], 0.0);
    }
    let to_code = 127.0 / max;
    (v.iter().map(|x| (x * to_code).round() as i8).collect(), max / 127.0)
}

/// Dot product of two byte vectors, in 32-bit sums: the graph walk's inner loop.
#[inline]
fn idot(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        // SAFETY: the CPU has just been found to support the dot-product instructions.
        return unsafe { sdot::idot(a, b) };
    }
    idot_portable(a, b)
}

/// The byte dot product with SDOT (ARMv8.2 dot-product extension: Apple M1 and later, Neoverse,
/// Cortex-A76 and later): one instruction multiplies 16 byte pairs and adds them into four
/// 32-bit lanes, where plain NEON needs widening multiplies and pairwise adds (about six
/// instructions for the same 16 pairs). The compiler does not form SDOT from the portable loop,
/// and its intrinsic is not stable, so the one instruction is written out.
#[cfg(target_arch = "aarch64")]
mod sdot {
    use std::arch::aarch64::{int32x4_t, vaddvq_s32, vdupq_n_s32, vld1q_s8};

    /// # Safety
    /// The CPU must support the `dotprod` feature.
    #[target_feature(enable = "dotprod")]
    pub unsafe fn idot(a: &[i8], b: &[i8]) -> i32 {
        let n = a.len().min(b.len());
        let whole = n - n % 16;
        let mut acc: int32x4_t = vdupq_n_s32(0);
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 16 <= whole <= n`, so both 16-byte loads lie inside the slices.
            let (va, vb) = unsafe { (vld1q_s8(a.as_ptr().add(i)), vld1q_s8(b.as_ptr().add(i))) };
            // SAFETY: SDOT reads and writes registers only; the caller checked the feature.
            unsafe {
                std::arch::asm!(
                    "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                    acc = inout(vreg) acc,
                    a = in(vreg) va,
                    b = in(vreg) vb,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
            i += 16;
        }
        let tail: i32 = a[whole..n].iter().zip(&b[whole..n]).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum();
        vaddvq_s32(acc) + tail
    }
}

widest! {
    /// The byte dot product in plain Rust, vectorised for the target (NEON on aarch64).
    fn idot_portable(a: &[i8], b: &[i8]) -> i32 {
        let mut acc = [0i32; 32];
        let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..32 {
                acc[i] += i32::from(x[i]) * i32::from(y[i]);
            }
        }
        let mut s: i32 = acc.iter().sum();
        for (x, y) in ra.iter().zip(rb) {
            s += i32::from(*x) * i32::from(*y);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_codes_keep_the_dot_product() {
        let a: Vec<f32> = (0..384).map(|i| ((i * 37 % 101) as f32 - 50.0) / 400.0).collect();
        let b: Vec<f32> = (0..384).map(|i| ((i * 53 % 97) as f32 - 48.0) / 380.0).collect();
        let ((qa, sa), (qb, sb)) = (quantize(&a), quantize(&b));
        let approx = idot(&qa, &qb) as f32 * sa * sb;
        let exact = dot(&a, &b);
        assert!((approx - exact).abs() < 0.01 * exact.abs().max(1.0), "{approx} vs {exact}");
        assert_eq!(quantize(&[0.0; 4]), (vec![0; 4], 0.0));
    }

    /// Whatever path this CPU takes (SDOT, NEON, AVX), the byte dot product is exact.
    #[test]
    fn the_byte_dot_product_matches_its_oracle_at_every_length() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(11);
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 384, 385] {
            let a: Vec<i8> = (0..len).map(|_| rng.random()).collect();
            let b: Vec<i8> = (0..len).map(|_| rng.random()).collect();
            let oracle: i32 = a.iter().zip(&b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum();
            assert_eq!(idot(&a, &b), oracle, "length {len}");
            assert_eq!(idot_portable(&a, &b), oracle, "length {len}, portable");
        }
        // Extremes: every product at its largest magnitude.
        let (lo, hi) = (vec![i8::MIN; 384], vec![i8::MAX; 384]);
        assert_eq!(idot(&lo, &lo), 384 * 128 * 128);
        assert_eq!(idot(&lo, &hi), -384 * 128 * 127);
    }

    #[test]
    fn a_filtered_walk_returns_only_allowed_nodes_and_finds_the_exact_ones() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let (n, dim) = (3000, 32);
        let mut rng = StdRng::seed_from_u64(5);
        let mut data = Vec::with_capacity(n * dim);
        for _ in 0..n {
            let mut v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() - 0.5).collect();
            crate::embed::normalize(&mut v);
            data.extend(v);
        }
        let g = Graph::build(dim, &data, 16, 100);
        let allow = AllowList::from_slots(n, (0..n as Slot).filter(|s| s % 2 == 0));
        let mut found = 0;
        for qi in 0..50 {
            let q = &data[qi * 7 * dim..(qi * 7 + 1) * dim];
            let hits = g.search(&data, q, 10, 200, Some(&allow));
            assert_eq!(hits.len(), 10);
            assert!(hits.iter().all(|h| allow.contains(h.slot)), "only allowed nodes");
            assert!(hits.windows(2).all(|w| w[0].score >= w[1].score), "best first");
            let mut exact: Vec<Hit> = allow
                .iter()
                .map(|s| Hit { slot: s, score: dot(q, &data[s as usize * dim..(s as usize + 1) * dim]) })
                .collect();
            exact = crate::index::top_k(exact, 10);
            found += hits.iter().filter(|h| exact.iter().any(|e| e.slot == h.slot)).count();
        }
        assert!(found as f64 / 500.0 >= 0.95, "filtered recall@10 {}", found as f64 / 500.0);
    }
}
