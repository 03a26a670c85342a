//! The dense arm: unit vectors in one contiguous buffer, an exact scan over allowed slots, and an
//! HNSW graph (hnsw_rs) for catalogs large enough to need one. [`DenseIndex::search`] picks the
//! path per query and reports which one ran.
//!
//! hnsw_rs's own dot distance asserts `1 - dot >= 0`, which f32 rounding breaks for a vector and
//! itself (duplicate tool texts), so the graph uses [`ClampedDot`].

use hnsw_rs::anndists::dist::Distance;
use hnsw_rs::hnsw::Hnsw;

use super::{AllowList, Hit, Slot, top_k};

/// Below this many vectors no graph is built: the exact scan is as fast (docs/performance.md).
pub const GRAPH_MIN_SLOTS: usize = 20_000;
/// Allow-lists up to this size are scanned exactly even where a graph exists.
pub const EXACT_MAX_ALLOWED: usize = 20_000;
/// Graph parameters (M, ef_construction, ef_search).
pub const HNSW_M: usize = 16;
pub const HNSW_EF_CONSTRUCTION: usize = 100;
pub const HNSW_EF_SEARCH: usize = 400;

/// Which path answered a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Exact,
    Graph,
    /// The graph returned too few allowed hits; the exact scan answered.
    GraphThenExact,
}

/// `1 - dot`, clamped at zero: cosine distance for unit vectors.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClampedDot;

impl Distance<f32> for ClampedDot {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

/// Dot product with eight independent accumulators, which the compiler vectorises on every
/// target (NEON, SSE, AVX) without target-specific code.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

pub struct DenseIndex {
    dim: usize,
    /// `len * dim` floats, slot-major.
    data: Vec<f32>,
    graph: Option<Hnsw<'static, f32, ClampedDot>>,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseIndex")
            .field("dim", &self.dim)
            .field("len", &self.len())
            .field("graph", &self.graph.is_some())
            .finish()
    }
}

impl DenseIndex {
    /// Takes slot-major unit vectors; builds a graph when there are at least `graph_min` of them.
    pub fn build(dim: usize, data: Vec<f32>, graph_min: usize) -> Self {
        assert!(dim > 0 && data.len().is_multiple_of(dim), "vectors must be {dim}-dimensional");
        let len = data.len() / dim;
        let graph = (len >= graph_min && len > 0).then(|| {
            let g = Hnsw::new(HNSW_M, len, 16, HNSW_EF_CONSTRUCTION, ClampedDot);
            let items: Vec<(&[f32], usize)> = data.chunks_exact(dim).zip(0..).collect();
            g.parallel_insert_slice(&items);
            g
        });
        let mut idx = Self { dim, data, graph: None };
        if let Some(mut g) = graph {
            g.set_searching_mode(true);
            idx.graph = Some(g);
        }
        idx
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.dim
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn has_graph(&self) -> bool {
        self.graph.is_some()
    }

    pub fn vector(&self, slot: Slot) -> &[f32] {
        let s = slot as usize * self.dim;
        &self.data[s..s + self.dim]
    }

    /// The `k` allowed slots nearest to `query` (a unit vector), by cosine, best first.
    pub fn search(&self, query: &[f32], allow: &AllowList, k: usize) -> (Vec<Hit>, Plan) {
        match &self.graph {
            Some(g) if allow.count() > EXACT_MAX_ALLOWED => {
                let hits = self.graph_search(g, query, allow, k);
                if hits.len() >= k.min(allow.count()) {
                    (hits, Plan::Graph)
                } else {
                    (self.exact(query, allow, k), Plan::GraphThenExact)
                }
            }
            _ => (self.exact(query, allow, k), Plan::Exact),
        }
    }

    /// Exact scan of the allowed slots.
    pub fn exact(&self, query: &[f32], allow: &AllowList, k: usize) -> Vec<Hit> {
        if k == 0 || allow.is_empty() {
            return Vec::new();
        }
        let hits: Vec<Hit> = if allow.count() * 4 >= self.len() {
            // Dense allow-list: walk the buffer in order (prefetch-friendly), test the bit.
            self.data
                .chunks_exact(self.dim)
                .zip(0..)
                .filter(|(_, s)| allow.contains(*s))
                .map(|(v, slot)| Hit { slot, score: dot(query, v) })
                .collect()
        } else {
            allow.iter().map(|slot| Hit { slot, score: dot(query, self.vector(slot)) }).collect()
        };
        top_k(hits, k)
    }

    /// Graph search over the whole catalog, over-fetching by the inverse of the allowed share and
    /// dropping what the allow-list excludes.
    fn graph_search(&self, g: &Hnsw<'static, f32, ClampedDot>, query: &[f32], allow: &AllowList, k: usize) -> Vec<Hit> {
        let share = allow.count() as f64 / self.len().max(1) as f64;
        let fetch = ((k as f64 / share) * 2.0).ceil() as usize + 16;
        let fetch = fetch.min(self.len());
        let ef = fetch.max(HNSW_EF_SEARCH);
        let hits: Vec<Hit> = g
            .search(query, fetch, ef)
            .into_iter()
            .map(|n| n.d_id as Slot)
            .filter(|&s| allow.contains(s))
            .map(|slot| Hit { slot, score: dot(query, self.vector(slot)) })
            .collect();
        top_k(hits, k)
    }

    /// Graph search with no allow-list, for recall checks against [`Self::exact`].
    pub fn graph_only(&self, query: &[f32], k: usize) -> Option<Vec<Hit>> {
        let g = self.graph.as_ref()?;
        let all = AllowList::all(self.len());
        Some(self.graph_search(g, query, &all, k))
    }

    pub fn heap_bytes(&self) -> usize {
        self.data.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn unit_vectors(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = Vec::with_capacity(n * dim);
        for _ in 0..n {
            let v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() - 0.5).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            out.extend(v.iter().map(|x| x / norm));
        }
        out
    }

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..385).map(|i| i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..385).map(|i| 1.0 - i as f32 * 0.002).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-2 * naive.abs().max(1.0));
    }

    #[test]
    fn exact_respects_allow_list_and_order() {
        let data = unit_vectors(300, 16, 1);
        let idx = DenseIndex::build(16, data, usize::MAX);
        let q = idx.vector(7).to_vec();
        let all = AllowList::all(300);
        let (hits, plan) = idx.search(&q, &all, 5);
        assert_eq!(plan, Plan::Exact);
        assert_eq!(hits[0].slot, 7);
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        let only = AllowList::from_slots(300, [3, 9, 200]);
        let (hits, _) = idx.search(&q, &only, 5);
        let mut slots: Vec<_> = hits.iter().map(|h| h.slot).collect();
        slots.sort();
        assert_eq!(slots, vec![3, 9, 200]);
        assert!(idx.search(&q, &AllowList::none(300), 5).0.is_empty());
    }

    #[test]
    fn graph_agrees_with_exact_on_duplicates_without_panicking() {
        // Every vector twice: the case that makes hnsw_rs's stock distance panic.
        let base = unit_vectors(500, 16, 2);
        let mut data = base.clone();
        data.extend_from_slice(&base);
        let idx = DenseIndex::build(16, data, 1);
        assert!(idx.has_graph());
        let q = idx.vector(3).to_vec();
        let graph = idx.graph_only(&q, 10).unwrap();
        let exact = idx.exact(&q, &AllowList::all(1000), 10);
        let g: std::collections::HashSet<_> = graph.iter().map(|h| h.slot).collect();
        let overlap = exact.iter().filter(|h| g.contains(&h.slot)).count();
        assert!(overlap >= 9, "graph recall {overlap}/10");
    }
}
