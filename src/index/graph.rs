//! The HNSW graph, flat. hnsw_rs builds it (parallel insertion); its layers are then copied into
//! plain arrays of slot ids and hnsw_rs's structure is dropped, and queries walk the arrays here:
//! no locks, no reference counts, a reusable visited set.
//!
//! The walk scores nodes on the vectors' byte codes ([`super::vectors`]: a quarter of the memory
//! traffic of f32, which is what a walk over random nodes waits on), fetching a node's neighbours
//! ahead of scoring them; then its best `8·k` (at least 64) are scored again on the
//! half-precision copies, so the order returned is the vectors' own. On the same graph this search returned the
//! same neighbours as hnsw_rs's own in a fraction of the time (docs/performance.md).
//!
//! The search is the usual one: greedy descent through the upper layers, then a beam of width
//! `ef` on layer 0. With an allow-list, the beam still walks every node (the graph's
//! connectivity needs them) but only allowed nodes enter the results.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use hnsw_rs::anndists::dist::Distance;
use hnsw_rs::hnsw::Hnsw;

use super::vectors::Vectors;
use super::{AllowList, Hit, Slot};
use crate::simd::dot;

/// `1 - dot`, clamped at zero: cosine distance for unit vectors. hnsw_rs's own dot distance
/// asserts `1 - dot >= 0`, which f32 rounding breaks for a vector and itself (duplicate tool
/// texts), so the graph is built with this one.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClampedDot;

impl Distance<f32> for ClampedDot {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

/// No neighbour, in a fixed-width row of layer 0.
const NONE: Slot = Slot::MAX;

pub struct Graph {
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
        Self::flatten(&hnsw, len, m)
    }

    /// Copies the layers of an hnsw_rs graph over `len` vectors with `m` neighbours a layer.
    fn flatten(hnsw: &Hnsw<'_, f32, ClampedDot>, len: usize, m: usize) -> Self {
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
        Self { entry: entry.0, width, bottom, upper }
    }

    /// The `k` most similar allowed nodes to `query` (`None`: all allowed), best first, with a
    /// beam of `ef` (at least `k`) on layer 0. `vectors` are those the graph was built over.
    pub fn search(&self, vectors: &Vectors, query: &[f32], k: usize, ef: usize, allow: Option<&AllowList>) -> Vec<Hit> {
        let len = vectors.len();
        if len == 0 || k == 0 {
            return Vec::new();
        }
        let probe = vectors.probe(query);
        let score = |s: Slot| vectors.approx(&probe, s);
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
                    prefetch(vectors.code(n));
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
            // The walk's scores are approximate: its best few are scored again, then ranked.
            vectors.refine(query, best.into_iter().map(|r| Hit { slot: r.0.1, score: r.0.0 }).collect(), k)
        })
    }

    pub fn heap_bytes(&self) -> usize {
        let upper: usize = self.upper.iter().flat_map(|l| l.values()).map(|v| v.len() * 4 + 48).sum();
        self.bottom.len() * 4 + upper
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filtered_walk_returns_only_allowed_nodes_and_finds_the_exact_ones() {
        let (n, dim) = (3000, 32);
        let data = crate::index::unit_vectors(n, dim, 5);
        let g = Graph::build(dim, &data, 16, 100);
        let vectors = Vectors::new(dim, &data);
        let allow = AllowList::from_slots(n, (0..n as Slot).filter(|s| s % 2 == 0));
        let mut found = 0;
        for qi in 0..50 {
            let q = &data[qi * 7 * dim..(qi * 7 + 1) * dim];
            let hits = g.search(&vectors, q, 10, 200, Some(&allow));
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
