//! Merging the dense and keyword rankings into one list.
//!
//! [`fuse`] offers the variants `toolmux eval-study` compares: reciprocal-rank fusion, and convex
//! combinations of per-query normalised scores. find_tool uses the one the study chose
//! (`store::FUSION`: z-scores, averaged). A tool one arm did not rank gets that arm's floor, so
//! the dense arm, which ranks every allowed slot, fills the list to `n` whenever enough slots are
//! allowed (the backfill the reference gateway lacks). docs/search.md has the measurements.

use std::collections::HashMap;

use super::{Hit, Slot, top_k};

/// How two arms' rankings become one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank: `w / (k + rank)`, the dense arm weighted `dense`, the keyword arm `1 - dense`.
    Rrf { k: f32, dense: f32 },
    /// Each arm's scores normalised per query, then `dense · d + (1 - dense) · k`.
    Convex { norm: Normalise, dense: f32 },
}

/// Per-query score normalisation over an arm's ranked hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalise {
    /// `(s - last) / (first - last)`, both arms.
    MinMax,
    /// Dense as [`Normalise::MinMax`]; BM25 as `s / first` (its floor is a score of 0).
    Max,
    /// `(s - mean) / std` over the arm's hits.
    ZScore,
}

impl std::fmt::Display for Fusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fusion::Rrf { k, dense } => write!(f, "RRF k {k}, dense {dense}"),
            Fusion::Convex { norm, dense } => write!(f, "{norm:?}, dense {dense}"),
        }
    }
}

/// Normalised scores of one arm (best first), and the value for a tool the arm did not rank.
fn normalised(hits: &[Hit], norm: Normalise, floor_zero: bool) -> (Vec<f32>, f32) {
    let Some(first) = hits.first().map(|h| h.score) else { return (Vec::new(), 0.0) };
    let last = hits.last().map(|h| h.score).unwrap_or(first);
    match norm {
        Normalise::Max if floor_zero => {
            let top = if first > 0.0 { first } else { 1.0 };
            (hits.iter().map(|h| h.score / top).collect(), 0.0)
        }
        Normalise::MinMax | Normalise::Max => {
            let range = first - last;
            let v = hits.iter().map(|h| if range > 0.0 { (h.score - last) / range } else { 1.0 }).collect();
            (v, 0.0)
        }
        Normalise::ZScore => {
            let n = hits.len() as f32;
            let mean = hits.iter().map(|h| h.score).sum::<f32>() / n;
            let var = hits.iter().map(|h| (h.score - mean).powi(2)).sum::<f32>() / n;
            let sd = if var > 0.0 { var.sqrt() } else { 1.0 };
            let v: Vec<f32> = hits.iter().map(|h| (h.score - mean) / sd).collect();
            let floor = v.last().copied().unwrap_or(0.0);
            (v, floor)
        }
    }
}

/// Merges the dense and keyword rankings (each best first) into the best `n`.
pub fn fuse(fusion: Fusion, dense: &[Hit], keyword: &[Hit], n: usize) -> Vec<Hit> {
    fuse_explained(fusion, dense, keyword, n).into_iter().map(|(hit, _)| hit).collect()
}

/// What each arm added to a fused score: `hit.score == dense + keyword`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Contribution {
    pub dense: f32,
    pub keyword: f32,
}

/// [`fuse`], with each hit's score split by arm (the console's playground shows why a tool ranks).
pub fn fuse_explained(fusion: Fusion, dense: &[Hit], keyword: &[Hit], n: usize) -> Vec<(Hit, Contribution)> {
    let mut parts: HashMap<Slot, Contribution> = HashMap::new();
    match fusion {
        Fusion::Rrf { k, dense: w } => {
            for (arm, hits, weight) in [(0, dense, w), (1, keyword, 1.0 - w)] {
                for (rank, h) in hits.iter().enumerate() {
                    let c = parts.entry(h.slot).or_default();
                    let share = weight / (k + rank as f32 + 1.0);
                    if arm == 0 { c.dense += share } else { c.keyword += share }
                }
            }
        }
        Fusion::Convex { norm, dense: w } => {
            let (d, d_floor) = normalised(dense, norm, false);
            let (kw, k_floor) = normalised(keyword, norm, true);
            let floor = Contribution { dense: w * d_floor, keyword: (1.0 - w) * k_floor };
            for (h, s) in dense.iter().zip(&d) {
                parts.entry(h.slot).or_insert(floor).dense = w * s;
            }
            for (h, s) in keyword.iter().zip(&kw) {
                parts.entry(h.slot).or_insert(floor).keyword = (1.0 - w) * s;
            }
        }
    }
    let hits = parts.iter().map(|(&slot, c)| Hit { slot, score: c.dense + c.keyword }).collect();
    top_k(hits, n).into_iter().map(|h| (h, parts[&h.slot])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(slots: &[Slot]) -> Vec<Hit> {
        slots.iter().map(|&slot| Hit { slot, score: 0.0 }).collect()
    }

    fn scored(pairs: &[(Slot, f32)]) -> Vec<Hit> {
        pairs.iter().map(|&(slot, score)| Hit { slot, score }).collect()
    }

    #[test]
    fn convex_fusion_weighs_how_far_a_tool_stands_out() {
        // The keyword arm is sure of 7 (far above its others); the dense arm barely prefers 1.
        let dense = scored(&[(1, 0.52), (7, 0.51), (2, 0.50), (3, 0.49)]);
        let keyword = scored(&[(7, 12.0), (2, 2.0), (3, 1.5), (1, 1.0)]);
        for norm in [Normalise::ZScore, Normalise::MinMax, Normalise::Max] {
            let fused = fuse(Fusion::Convex { norm, dense: 0.5 }, &dense, &keyword, 3);
            assert_eq!(fused[0].slot, 7, "{norm:?}: {fused:?}");
            assert_eq!(fused.len(), 3);
        }
        // All weight on one arm reproduces its order.
        let only_dense = fuse(Fusion::Convex { norm: Normalise::ZScore, dense: 1.0 }, &dense, &keyword, 4);
        assert_eq!(only_dense.iter().map(|h| h.slot).collect::<Vec<_>>(), vec![1, 7, 2, 3]);
    }

    #[test]
    fn a_tool_one_arm_missed_scores_that_arms_floor() {
        let dense = scored(&[(1, 0.9), (2, 0.5)]);
        let fused = fuse(Fusion::Convex { norm: Normalise::ZScore, dense: 0.5 }, &dense, &[], 5);
        assert_eq!(fused.iter().map(|h| h.slot).collect::<Vec<_>>(), vec![1, 2], "an empty arm changes nothing");
        assert!(fused.iter().all(|h| h.score.is_finite()));
    }

    #[test]
    fn the_arms_contributions_add_up_to_the_fused_score() {
        let dense = scored(&[(1, 0.9), (2, 0.6), (3, 0.5)]);
        let keyword = scored(&[(3, 8.0), (9, 2.0), (4, 1.0)]);
        for fusion in [Fusion::Convex { norm: Normalise::ZScore, dense: 0.5 }, Fusion::Rrf { k: 60.0, dense: 0.5 }] {
            let explained = fuse_explained(fusion, &dense, &keyword, 4);
            assert_eq!(explained.len(), 4, "{fusion}");
            for (hit, c) in &explained {
                assert!((hit.score - (c.dense + c.keyword)).abs() < 1e-6, "{fusion}: {hit:?} {c:?}");
            }
            let nine = explained.iter().find(|(h, _)| h.slot == 9).unwrap().1;
            let one = explained.iter().find(|(h, _)| h.slot == 1).unwrap().1;
            assert!(
                nine.keyword > one.keyword && one.dense > nine.dense,
                "{fusion}: each arm's own tool gains from it"
            );
        }
    }

    #[test]
    fn agreement_wins_and_backfills() {
        let dense = hits(&[1, 2, 3, 4]);
        let kw = hits(&[3, 9]);
        let fused = fuse(Fusion::Rrf { k: 60.0, dense: 0.5 }, &dense, &kw, 5);
        let slots: Vec<_> = fused.iter().map(|h| h.slot).collect();
        assert_eq!(slots[0], 3, "ranked by both arms");
        assert_eq!(slots.len(), 5);
        assert!(slots.contains(&9) && slots.contains(&4));
    }
}
