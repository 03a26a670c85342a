//! SDOT, aarch64's dot-product extension: the byte dot product of the graph walk and the row
//! kernels ([`idot`]), and the int8 outer product ([`super::int8`]'s layout, 4 lanes, [`gemm`]).
//!
//! In the outer product, SDOT by element (`sdot v.4s, w.16b, x.4b[l]`) multiplies 4 signed bytes of each of 4 columns
//! (one 16-byte weight load) by the 4 activation bytes in lane `l` of `x` and adds each column's
//! sum into its own lane: one load of 16 activation bytes serves 4 steps, with no broadcast. Both
//! sides are signed, so there is no offset to correct. Four rows by two groups (8 columns) are
//! kept in registers: 8 integer and 8 float accumulators, 2 weight and 4 activation registers of
//! the 32.
//!
//! SDOT is written as inline assembly.

use std::arch::aarch64::*;
use std::arch::asm;

use super::BLOCK;
use super::int8::{Activations, Packed};

/// Output columns per group: one q register of 32-bit lanes.
const GROUP: usize = 4;
/// Bytes of one (group, block) tile: 4 columns × 32 bytes.
const TILE: usize = GROUP * BLOCK;

/// The byte dot product of the graph walk and the row kernels ([`super::idot`]), 16 bytes per
/// SDOT.
///
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
            asm!(
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

/// [`super::int8::gemm`] with SDOT.
///
/// # Safety
/// The CPU must support the dot-product extension; the rest is [`super::int8::gemm`]'s, which
/// checked the shapes. `x` holds signed codes.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn gemm(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(w.lanes, GROUP, "weights packed for another kernel");
    // SAFETY: the caller's guarantees, for each tile's rows and groups.
    unsafe { super::int8::for_each_tile!(tile; w, x, rows, groups, out) }
}

/// `acc += w · x[L]` per lane (SDOT by element).
///
/// # Safety
/// The CPU must support the dot-product extension.
#[inline(always)]
unsafe fn sdot<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: SDOT reads and writes registers only; the feature is the caller's.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{l}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            l = const L,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// Rows `r0..r0+R` by groups `g0..g0+G`, kept in registers over every block.
///
/// # Safety
/// As [`gemm`], for these rows and groups; inlined into it, so compiled for its features.
#[inline(always)]
unsafe fn tile<const R: usize, const G: usize>(w: &Packed, x: &Activations, r0: usize, g0: usize, out: *mut f32) {
    // SAFETY: NEON and the dot product are [`gemm`]'s; the pointer arithmetic is explained where
    // it happens.
    unsafe {
        let blocks = w.blocks;
        let mut acc = [[vdupq_n_f32(0.0); G]; R];
        for b in 0..blocks {
            let mut sums = [[vdupq_n_s32(0); G]; R];
            // Two halves of 16 activation bytes, each serving 4 steps.
            for half in 0..2 {
                let mut xv = [vdupq_n_s8(0); R];
                for (i, v) in xv.iter_mut().enumerate() {
                    // `+ 16 <= codes.len()`: inside row r0+i's padded block b.
                    *v = vld1q_s8(x.codes.as_ptr().add((r0 + i) * x.stride + b * BLOCK + half * 16).cast());
                }
                macro_rules! step {
                    ($l:literal) => {{
                        let step = half * 4 + $l;
                        let mut wv = [vdupq_n_s8(0); G];
                        for (j, v) in wv.iter_mut().enumerate() {
                            // `+ 16 <= codes.len()`: the tile of an existing (group, block).
                            *v = vld1q_s8(w.codes.as_ptr().add(((g0 + j) * blocks + b) * TILE + step * GROUP * 4));
                        }
                        for (row, &xr) in sums.iter_mut().zip(&xv) {
                            for (s, &wj) in row.iter_mut().zip(&wv) {
                                *s = sdot::<$l>(*s, wj, xr);
                            }
                        }
                    }};
                }
                step!(0);
                step!(1);
                step!(2);
                step!(3);
            }
            for (i, (row_acc, row_sums)) in acc.iter_mut().zip(&sums).enumerate() {
                let xs = vdupq_n_f32(x.scales[(r0 + i) * blocks + b]);
                for (j, (a, &s)) in row_acc.iter_mut().zip(row_sums).enumerate() {
                    // `+ 4 <= scales.len()`.
                    let ws = vld1q_f32(w.scales.as_ptr().add(((g0 + j) * blocks + b) * GROUP));
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(s), vmulq_f32(ws, xs));
                }
            }
        }
        for (i, row_acc) in acc.iter().enumerate() {
            for (j, &a) in row_acc.iter().enumerate() {
                let c0 = (g0 + j) * GROUP;
                let valid = w.cols.saturating_sub(c0).min(GROUP);
                // Row r0+i of `out`, columns c0..c0+valid: inside `rows × cols`.
                let dst = out.add((r0 + i) * w.cols + c0);
                if valid == GROUP {
                    vst1q_f32(dst, a);
                } else {
                    let mut lanes = [0f32; GROUP];
                    vst1q_f32(lanes.as_mut_ptr(), a);
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                }
            }
        }
    }
}
