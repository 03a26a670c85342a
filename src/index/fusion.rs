//! Merging the dense and keyword rankings into one list.
//!
//! Reciprocal-rank fusion: each arm contributes `weight / (K + rank)` per slot. Rank-based fusion
//! needs no calibration between cosine and BM25 scales, which differ per query. The dense arm
//! ranks every allowed slot, so the fused list is always filled to `n` when enough slots are
//! allowed (the backfill the reference gateway lacks). docs/search.md has the measurements.

use std::collections::HashMap;

use super::{Hit, Slot, top_k};

/// RRF's rank offset.
pub const RRF_K: f32 = 60.0;

/// Fuses rankings (best first) with per-arm weights, returning the best `n`.
pub fn rrf(arms: &[(&[Hit], f32)], n: usize) -> Vec<Hit> {
    let mut scores: HashMap<Slot, f32> = HashMap::new();
    for (hits, weight) in arms {
        for (rank, h) in hits.iter().enumerate() {
            *scores.entry(h.slot).or_default() += weight / (RRF_K + rank as f32 + 1.0);
        }
    }
    top_k(scores.into_iter().map(|(slot, score)| Hit { slot, score }).collect(), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(slots: &[Slot]) -> Vec<Hit> {
        slots.iter().map(|&slot| Hit { slot, score: 0.0 }).collect()
    }

    #[test]
    fn agreement_wins_and_backfills() {
        let dense = hits(&[1, 2, 3, 4]);
        let kw = hits(&[3, 9]);
        let fused = rrf(&[(&dense, 1.0), (&kw, 1.0)], 5);
        let slots: Vec<_> = fused.iter().map(|h| h.slot).collect();
        assert_eq!(slots[0], 3, "ranked by both arms");
        assert_eq!(slots.len(), 5);
        assert!(slots.contains(&9) && slots.contains(&4));
    }
}
