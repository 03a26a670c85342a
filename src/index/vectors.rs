//! The tool vectors as searches read them, in two forms that together take three quarters of the
//! memory of the f32 vectors they are made from (and the graph no longer needs codes of its own):
//!
//! - **byte codes** (each vector as `dim` signed bytes, scaled by its largest component): every
//!   search's first pass (the exact scan and the graph walk) scores these, moving a quarter of
//!   the bytes of f32, which is what a scan over thousands of vectors waits on;
//! - **half-precision copies**: a first pass's best few are scored again on these, so the order
//!   and scores a search returns are those of the vectors (to about 1e-4), not of the codes.
//!
//! The codes' scores are within a few thousandths of the true ones, so the true top `k` sit well
//! inside the first pass's best [`RESCORE`]·`k`; `benches/search.rs` checks recall@10 against
//! an f32 exact scan at 1k, 10k and 100k tools before timing.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::{Hit, Slot, top_k};
use crate::simd::{idot, quantize, quantize_into};

/// How many first-pass hits, per result wanted, are scored again on the half-precision copies.
pub const RESCORE: usize = 2;
/// ... and at least this many.
pub const RESCORE_MIN: usize = 64;

pub struct Vectors {
    dim: usize,
    codes: Vec<i8>,
    /// Per vector: the factor that turns a product of codes back into a share of the dot product.
    scales: Vec<f32>,
    half: Vec<f16>,
}

/// A query prepared for the first pass: its codes and their scale.
pub struct Probe {
    codes: Vec<i8>,
    scale: f32,
}

impl Vectors {
    /// From slot-major unit vectors of `dim` components.
    pub fn new(dim: usize, data: &[f32]) -> Self {
        assert!(dim > 0 && data.len().is_multiple_of(dim), "vectors must be {dim}-dimensional");
        let mut codes = vec![0i8; data.len()];
        let scales =
            data.chunks_exact(dim).zip(codes.chunks_exact_mut(dim)).map(|(v, c)| quantize_into(v, c)).collect();
        let mut half = vec![f16::ZERO; data.len()];
        half.convert_from_f32_slice(data);
        Self { dim, codes, scales, half }
    }

    pub fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn probe(&self, query: &[f32]) -> Probe {
        let (codes, scale) = quantize(query);
        Probe { codes, scale }
    }

    pub fn code(&self, slot: Slot) -> &[i8] {
        let at = slot as usize * self.dim;
        &self.codes[at..at + self.dim]
    }

    /// The first pass's score of one vector: the dot product, to a few thousandths.
    #[inline]
    pub fn approx(&self, probe: &Probe, slot: Slot) -> f32 {
        idot(&probe.codes, self.code(slot)) as f32 * probe.scale * self.scales[slot as usize]
    }

    /// First-pass scores of the vectors in `slots` (ascending), one kernel call per run of
    /// consecutive slots: an allow-list of everything is one call over one contiguous buffer.
    pub fn approx_all(&self, probe: &Probe, slots: impl Iterator<Item = Slot>) -> Vec<Hit> {
        let mut hits = Vec::new();
        let mut sums = Vec::new();
        let mut run: Option<(Slot, Slot)> = None;
        let mut flush = |(first, end): (Slot, Slot), hits: &mut Vec<Hit>| {
            let (a, b) = (first as usize, end as usize);
            sums.resize(b - a, 0);
            crate::simd::idot_rows(&probe.codes, &self.codes[a * self.dim..b * self.dim], &mut sums);
            hits.extend(
                (first..end)
                    .zip(&sums)
                    .map(|(slot, &s)| Hit { slot, score: s as f32 * probe.scale * self.scales[slot as usize] }),
            );
        };
        for slot in slots {
            run = match run {
                Some((first, end)) if end == slot => Some((first, end + 1)),
                Some(r) => {
                    flush(r, &mut hits);
                    Some((slot, slot + 1))
                }
                None => Some((slot, slot + 1)),
            };
        }
        if let Some(r) = run {
            flush(r, &mut hits);
        }
        hits
    }

    /// The vector, widened back to f32.
    pub fn vector(&self, slot: Slot) -> Vec<f32> {
        let mut out = vec![0f32; self.dim];
        self.widen(slot, &mut out);
        out
    }

    fn widen(&self, slot: Slot, out: &mut [f32]) {
        let at = slot as usize * self.dim;
        self.half[at..at + self.dim].convert_to_f32_slice(out);
    }

    /// Cosine of `query` (a unit vector) and one vector, on the half-precision copy.
    pub fn similarity(&self, query: &[f32], slot: Slot) -> f32 {
        crate::simd::dot(query, &self.vector(slot))
    }

    /// How many of a first pass's best are scored again for `k` results.
    pub fn shortlist(k: usize) -> usize {
        (k * RESCORE).max(RESCORE_MIN)
    }

    /// The best `k` of `slots`, scored on the half-precision copies, best first.
    pub fn rescore(&self, query: &[f32], slots: impl Iterator<Item = Slot>, k: usize) -> Vec<Hit> {
        let mut buf = vec![0f32; self.dim];
        let hits = slots
            .map(|slot| {
                self.widen(slot, &mut buf);
                Hit { slot, score: crate::simd::dot(query, &buf) }
            })
            .collect();
        top_k(hits, k)
    }

    /// The best `k` of a first pass's hits: its [`Self::shortlist`] scored again ([`Self::rescore`]).
    pub fn refine(&self, query: &[f32], first: Vec<Hit>, k: usize) -> Vec<Hit> {
        let shortlist = top_k(first, Self::shortlist(k));
        self.rescore(query, shortlist.iter().map(|h| h.slot), k)
    }

    pub fn heap_bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4 + self.half.len() * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::unit_vectors;

    #[test]
    fn both_forms_keep_the_dot_product() {
        let dim = 384;
        let data = unit_vectors(50, dim, 3);
        let v = Vectors::new(dim, &data);
        assert_eq!((v.len(), v.heap_bytes()), (50, 50 * (dim + 4 + 2 * dim)));
        let q = &data[..dim];
        let probe = v.probe(q);
        for slot in 0..50u32 {
            let exact = crate::simd::dot(q, &data[slot as usize * dim..(slot as usize + 1) * dim]);
            let (approx, similarity) = (v.approx(&probe, slot), v.similarity(q, slot));
            assert!((approx - exact).abs() < 5e-3, "codes: {approx} vs {exact}");
            assert!((similarity - exact).abs() < 5e-4, "half: {similarity} vs {exact}");
        }
        // A zero vector (an empty tool text never makes one, but nothing divides by its scale).
        let zero = Vectors::new(4, &[0.0; 4]);
        assert_eq!((zero.code(0), zero.approx(&zero.probe(&[0.5; 4]), 0)), (&[0i8; 4][..], 0.0));
    }

    #[test]
    fn runs_of_slots_score_as_one_at_a_time() {
        let dim = 40;
        let v = Vectors::new(dim, &unit_vectors(30, dim, 4));
        let probe = v.probe(&unit_vectors(1, dim, 5));
        let slots = [0u32, 1, 2, 5, 7, 8, 29];
        let hits = v.approx_all(&probe, slots.iter().copied());
        assert_eq!(hits.iter().map(|h| h.slot).collect::<Vec<_>>(), slots);
        for h in &hits {
            assert_eq!(h.score, v.approx(&probe, h.slot));
        }
        assert!(v.approx_all(&probe, std::iter::empty()).is_empty());
    }

    #[test]
    fn rescoring_restores_the_exact_order() {
        let dim = 64;
        let data = unit_vectors(2000, dim, 6);
        let v = Vectors::new(dim, &data);
        let q = unit_vectors(1, dim, 7);
        let first = v.approx_all(&v.probe(&q), 0..2000);
        let got = v.refine(&q, first, 10);
        let exact: Vec<Hit> = (0..2000u32)
            .map(|s| Hit { slot: s, score: crate::simd::dot(&q, &data[s as usize * dim..(s as usize + 1) * dim]) })
            .collect();
        let exact = top_k(exact, 10);
        assert_eq!(got.iter().map(|h| h.slot).collect::<Vec<_>>(), exact.iter().map(|h| h.slot).collect::<Vec<_>>());
        assert!(got.iter().zip(&exact).all(|(a, b)| (a.score - b.score).abs() < 5e-4));
    }
}
