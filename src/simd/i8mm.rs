//! SMMLA, aarch64's int8 matrix-multiply extension (I8MM: Neoverse V1/N2 and later, Apple M2 and
//! later, Cortex-A710 and later): the int8 encoder's product ([`super::int8`], [`gemm`]).
//!
//! `smmla acc.4s, x.16b, w.16b` treats `x` as two rows of 8 signed bytes and `w` as two columns
//! of 8, and adds the 2 × 2 products into `acc` as `[r0·c0, r0·c1, r1·c0, r1·c1]`: 32
//! multiply-adds per instruction where SDOT by element does 16. So its weights pair columns
//! instead of giving each a lane (the I8MM layout, explained in [`super::int8`]). The activations keep the common row layout: two rows' 16-byte
//! loads become two `x` operands with one ZIP1 and one ZIP2 of their 64-bit halves.
//!
//! A tile is 4 rows (2 pairs) × 2 groups (4 column pairs): 8 integer and 8 float accumulators,
//! 4 weight and 8 activation registers of the 32. At the end, two column pairs' accumulators
//! are zipped back into rows of 4 columns.
//!
//! SMMLA is written as inline assembly (its intrinsic is not stable).

use std::arch::aarch64::*;
use std::arch::asm;

use super::BLOCK;
use super::int8::{Activations, Packed};

/// Output columns per group: two pairs.
const GROUP: usize = 4;
/// Bytes of one (group, block) tile: 4 columns × 32 bytes.
const TILE: usize = GROUP * BLOCK;

/// [`super::int8::gemm`] with SMMLA.
///
/// # Safety
/// The CPU must support I8MM; the rest is [`super::int8::gemm`]'s, which checked the shapes.
/// `x` holds signed codes.
#[target_feature(enable = "neon,i8mm")]
pub unsafe fn gemm(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(w.lanes, GROUP, "weights packed for another kernel");
    // SAFETY: the caller's guarantees, for each tile's rows and groups.
    unsafe { super::int8::for_each_tile!(tile; w, x, rows, groups, out) }
}

/// `acc += x · wᵀ` as 2 × 2 (SMMLA).
///
/// # Safety
/// The CPU must support I8MM.
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, x: int8x16_t, w: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: SMMLA reads and writes registers only; the feature is the caller's.
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {x:v}.16b, {w:v}.16b",
            acc = inout(vreg) acc,
            x = in(vreg) x,
            w = in(vreg) w,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// Rows `r0..r0+R` by groups `g0..g0+G`, kept in registers over every block. An odd last row is
/// paired with itself and its copy not stored.
///
/// # Safety
/// As [`gemm`], for these rows and groups; inlined into it, so compiled for its features.
#[inline(always)]
unsafe fn tile<const R: usize, const G: usize>(w: &Packed, x: &Activations, r0: usize, g0: usize, out: *mut f32) {
    // Row pairs; the column pairs are 2 per group.
    let pairs = R.div_ceil(2);
    // The two rows of pair `p`: an odd last row is paired with itself.
    let rows_of = |p: usize| (r0 + 2 * p, (r0 + 2 * p + 1).min(r0 + R - 1));
    // SAFETY: NEON and I8MM are [`gemm`]'s; the pointer arithmetic is explained where it
    // happens.
    unsafe {
        let blocks = w.blocks;
        // [row pair][column pair], lanes [r0·c0, r0·c1, r1·c0, r1·c1].
        let mut acc = [[vdupq_n_f32(0.0); 4]; 2];
        for b in 0..blocks {
            let mut sums = [[vdupq_n_s32(0); 4]; 2];
            // Each row pair's block as 4 operands of 8 bytes from each row.
            let mut xv = [[vdupq_n_s8(0); 4]; 2];
            for (p, chunks) in xv.iter_mut().enumerate().take(pairs) {
                let (ra, rb) = rows_of(p);
                for half in 0..2 {
                    // `+ 16 <= codes.len()`: inside rows ra's and rb's padded block b.
                    let at = |r: usize| x.codes.as_ptr().add(r * x.stride + b * BLOCK + half * 16).cast::<i8>();
                    let (a, c) = (vreinterpretq_s64_s8(vld1q_s8(at(ra))), vreinterpretq_s64_s8(vld1q_s8(at(rb))));
                    chunks[half * 2] = vreinterpretq_s8_s64(vzip1q_s64(a, c));
                    chunks[half * 2 + 1] = vreinterpretq_s8_s64(vzip2q_s64(a, c));
                }
            }
            for chunk in 0..4 {
                let mut wv = [vdupq_n_s8(0); 4];
                for (cp, v) in wv.iter_mut().enumerate().take(2 * G) {
                    let (j, pair) = (cp / 2, cp % 2);
                    // `+ 16 <= codes.len()`: the tile of an existing (group, block).
                    *v = vld1q_s8(w.codes.as_ptr().add(((g0 + j) * blocks + b) * TILE + (chunk * 2 + pair) * 16));
                }
                for (row, chunks) in sums.iter_mut().zip(&xv).take(pairs) {
                    for (s, &wj) in row.iter_mut().zip(&wv).take(2 * G) {
                        *s = smmla(*s, chunks[chunk], wj);
                    }
                }
            }
            for (p, (row_acc, row_sums)) in acc.iter_mut().zip(&sums).enumerate().take(pairs) {
                let (ra, rb) = rows_of(p);
                let xs = vcombine_f32(vdup_n_f32(x.scales[ra * blocks + b]), vdup_n_f32(x.scales[rb * blocks + b]));
                for j in 0..G {
                    // `+ 4 <= scales.len()`: the group's 4 columns.
                    let ws = vreinterpretq_f64_f32(vld1q_f32(w.scales.as_ptr().add(((g0 + j) * blocks + b) * GROUP)));
                    // [c0, c1, c0, c1] and [c2, c3, c2, c3].
                    let halves = [vdupq_laneq_f64::<0>(ws), vdupq_laneq_f64::<1>(ws)];
                    for (pair, half) in halves.into_iter().enumerate() {
                        let cp = j * 2 + pair;
                        let scale = vmulq_f32(vreinterpretq_f32_f64(half), xs);
                        row_acc[cp] = vfmaq_f32(row_acc[cp], vcvtq_f32_s32(row_sums[cp]), scale);
                    }
                }
            }
        }
        for (p, row_acc) in acc.iter().enumerate().take(pairs) {
            for j in 0..G {
                let (lo, hi) = (vreinterpretq_f64_f32(row_acc[j * 2]), vreinterpretq_f64_f32(row_acc[j * 2 + 1]));
                // Each row's 4 columns: its half of both column pairs.
                let lines = [vzip1q_f64(lo, hi), vzip2q_f64(lo, hi)];
                let c0 = (g0 + j) * GROUP;
                let valid = w.cols.saturating_sub(c0).min(GROUP);
                for (i, line) in lines.into_iter().enumerate() {
                    let r = 2 * p + i;
                    if r >= R {
                        break;
                    }
                    // Row r0+r of `out`, columns c0..c0+valid: inside `rows × cols`.
                    let dst = out.add((r0 + r) * w.cols + c0);
                    let line = vreinterpretq_f32_f64(line);
                    if valid == GROUP {
                        vst1q_f32(dst, line);
                    } else {
                        let mut lanes = [0f32; GROUP];
                        vst1q_f32(lanes.as_mut_ptr(), line);
                        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                    }
                }
            }
        }
    }
}
