//! Nearest-neighbour and keyword search over dense slot ids (`0..n` of one generation).
//!
//! Knows nothing of sessions, backends or MCP: callers hand in an [`AllowList`] and get slots
//! back, never one outside it. [`dense`] holds the vectors with an exact scan and an HNSW graph
//! ([`graph`]) and picks between them per query ([`dense::Plan`]); [`bm25`] is the keyword arm; [`fusion`]
//! merges the two rankings.

pub mod allow;
pub mod bm25;
pub mod dense;
pub mod fusion;
pub mod graph;
pub mod vectors;

pub use allow::AllowList;

/// A dense id, valid only inside the generation that assigned it.
pub type Slot = u32;

/// One ranked result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub slot: Slot,
    /// Higher is better; the scale depends on the arm.
    pub score: f32,
}

/// Keeps the `k` best hits seen; ties broken by the lower slot, so results are deterministic.
pub fn top_k(mut hits: Vec<Hit>, k: usize) -> Vec<Hit> {
    let cmp = |a: &Hit, b: &Hit| b.score.total_cmp(&a.score).then(a.slot.cmp(&b.slot));
    if hits.len() > k {
        hits.select_nth_unstable_by(k, cmp);
        hits.truncate(k);
    }
    hits.sort_by(cmp);
    hits
}

/// `n` random unit vectors of `dim` components from `seed`, slot-major: the index's tests' data.
#[cfg(test)]
pub(crate) fn unit_vectors(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let mut v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() - 0.5).collect();
        crate::embed::normalize(&mut v);
        out.extend(v);
    }
    out
}
