//! The dense arm: the tool vectors ([`super::vectors`]: byte codes and half-precision copies), an
//! exhaustive search of the allowed slots, and an HNSW graph ([`super::graph`]) for catalogs
//! large enough to need one. [`DenseIndex::search`] picks the path per query and reports which
//! one ran.

use super::graph::Graph;
use super::vectors::Vectors;
use super::{AllowList, Hit, Slot};

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
    /// The graph found fewer than `k` allowed hits; the exact scan answered.
    GraphThenExact,
}

pub struct DenseIndex {
    vectors: Vectors,
    graph: Option<Graph>,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseIndex")
            .field("dim", &self.dim())
            .field("len", &self.len())
            .field("graph", &self.graph.is_some())
            .finish()
    }
}

impl DenseIndex {
    /// Takes slot-major unit vectors; builds a graph when there are at least `graph_min` of them.
    /// The f32 vectors are not kept: searches read [`Vectors`]' two compact forms.
    pub fn build(dim: usize, data: Vec<f32>, graph_min: usize) -> Self {
        assert!(dim > 0 && data.len().is_multiple_of(dim), "vectors must be {dim}-dimensional");
        let len = data.len() / dim;
        let graph = (len >= graph_min && len > 0).then(|| Graph::build(dim, &data, HNSW_M, HNSW_EF_CONSTRUCTION));
        Self { vectors: Vectors::new(dim, &data), graph }
    }

    pub fn len(&self) -> usize {
        self.vectors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }

    pub fn dim(&self) -> usize {
        self.vectors.dim()
    }

    pub fn has_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// One tool's vector (from its half-precision copy).
    pub fn vector(&self, slot: Slot) -> Vec<f32> {
        self.vectors.vector(slot)
    }

    /// Cosine of `query` (a unit vector) and one tool's vector.
    pub fn similarity(&self, query: &[f32], slot: Slot) -> f32 {
        self.vectors.similarity(query, slot)
    }

    /// The `k` allowed slots nearest to `query` (a unit vector), by cosine, best first.
    pub fn search(&self, query: &[f32], allow: &AllowList, k: usize) -> (Vec<Hit>, Plan) {
        match &self.graph {
            Some(g) if allow.count() > EXACT_MAX_ALLOWED => {
                let filter = (allow.count() < self.len()).then_some(allow);
                let hits = g.search(&self.vectors, query, k, HNSW_EF_SEARCH, filter);
                if hits.len() >= k.min(allow.count()) {
                    (hits, Plan::Graph)
                } else {
                    (self.exact(query, allow, k), Plan::GraphThenExact)
                }
            }
            _ => (self.exact(query, allow, k), Plan::Exact),
        }
    }

    /// Exhaustive search of the allowed slots: every one scored on its codes, the best few
    /// scored again on their half-precision copies ([`Vectors::refine`]). A few allowed slots are
    /// scored on their copies straight away.
    pub fn exact(&self, query: &[f32], allow: &AllowList, k: usize) -> Vec<Hit> {
        if k == 0 || allow.is_empty() {
            return Vec::new();
        }
        if allow.count() <= Vectors::shortlist(k) {
            return self.vectors.rescore(query, allow.iter(), k);
        }
        let first = self.vectors.approx_all(&self.vectors.probe(query), allow.iter());
        self.vectors.refine(query, first, k)
    }

    /// Graph search with no allow-list, for recall checks against [`Self::exact`].
    pub fn graph_only(&self, query: &[f32], k: usize) -> Option<Vec<Hit>> {
        Some(self.graph.as_ref()?.search(&self.vectors, query, k, HNSW_EF_SEARCH, None))
    }

    pub fn heap_bytes(&self) -> usize {
        self.vectors_heap_bytes() + self.graph.as_ref().map_or(0, Graph::heap_bytes)
    }

    /// The vectors' share of [`Self::heap_bytes`] (the rest is the graph).
    pub fn vectors_heap_bytes(&self) -> usize {
        self.vectors.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::unit_vectors;

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
