//! The int8 outer product ([`super::int8`]'s layout, 8 lanes) on 256-bit registers: AVX2, and
//! AVX-VNNI where the CPU has it.
//!
//! Per step, one 32-byte load holds 4 bytes of each of 8 columns, and each row's 4 activation
//! bytes (offset by 128) are broadcast to the 8 lanes; each block's sums are corrected by
//! `128 · Σ w`, as on AVX-512.
//! - **AVX-VNNI**: one VPDPBUSD adds the 4 products into each lane.
//! - **AVX2**: VPMADDUBSW multiplies the unsigned activations by the signed weights into 16-bit
//!   pair sums, VPMADDWD against ones widens them to 32-bit sums of 4, and a VPADDD accumulates:
//!   three instructions where VNNI takes one. The weights are 7-bit so that no pair saturates
//!   (`2 · 255 · 63`; [`super::int8`]). Keeping 8-bit weights instead means signed activations
//!   with their sign moved onto the weights (VPABSB, VPSIGNB): four and a half instructions a
//!   step, which this kernel was until measured (docs/performance.md).
//!
//! Both keep four rows by two groups: 8 integer and 8 float accumulators, the weights, the
//! broadcast and the ones among 16 ymm registers, so the float ones spill once per block.

use std::arch::x86_64::*;

use super::BLOCK;
use super::int8::{Activations, Packed};

/// Output columns per group: one ymm of 32-bit lanes.
const GROUP: usize = 8;
/// Bytes of one (group, block) tile: 8 columns × 32 bytes.
const TILE: usize = GROUP * BLOCK;

/// [`super::int8::gemm`] with VPMADDUBSW.
///
/// # Safety
/// The CPU must support AVX2 and FMA; the rest is [`super::int8::gemm`]'s, which checked the
/// shapes. `x` holds codes offset by 128, `w` 7-bit weights.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn gemm(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    // SAFETY: the caller's guarantees; inlined here, so compiled for AVX2.
    unsafe { tiles::<false>(w, x, rows, groups, out) }
}

/// [`super::int8::gemm`] with VPDPBUSD (VEX).
///
/// # Safety
/// The CPU must support AVX2, FMA and AVX-VNNI; the rest is [`super::int8::gemm`]'s, which
/// checked the shapes. `x` holds codes offset by 128.
#[target_feature(enable = "avx2,fma,avxvnni")]
pub unsafe fn gemm_vnni(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    // SAFETY: the caller's guarantees; inlined here, so compiled for AVX-VNNI.
    unsafe { tiles::<true>(w, x, rows, groups, out) }
}

/// Tiles of up to 4 rows by 2 groups over `groups` and every row.
///
/// # Safety
/// As [`gemm`] (or [`gemm_vnni`] with `VNNI`); inlined into them.
#[inline(always)]
unsafe fn tiles<const VNNI: bool>(
    w: &Packed,
    x: &Activations,
    rows: usize,
    groups: std::ops::Range<usize>,
    out: *mut f32,
) {
    assert_eq!(w.lanes, GROUP, "weights packed for another kernel");
    // SAFETY: the caller's guarantees, for each tile's rows and groups.
    unsafe { super::int8::for_each_tile!(tile, VNNI; w, x, rows, groups, out) }
}

/// Rows `r0..r0+R` by groups `g0..g0+G`, kept in registers over every block.
///
/// # Safety
/// As [`gemm`] (or [`gemm_vnni`] with `VNNI`), for these rows and groups; inlined into them, so
/// compiled for their features.
#[inline(always)]
unsafe fn tile<const R: usize, const G: usize, const VNNI: bool>(
    w: &Packed,
    x: &Activations,
    r0: usize,
    g0: usize,
    out: *mut f32,
) {
    // SAFETY: the intrinsics need AVX2 and FMA (and AVX-VNNI with `VNNI`): this function is
    // inlined into `gemm` or `gemm_vnni`, which have them; the pointer arithmetic is explained
    // where it happens.
    unsafe {
        let blocks = w.blocks;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); G]; R];
        for b in 0..blocks {
            let mut sums = [[_mm256_setzero_si256(); G]; R];
            for step in 0..BLOCK / 4 {
                let mut wv = [_mm256_setzero_si256(); G];
                for (j, v) in wv.iter_mut().enumerate() {
                    let at = ((g0 + j) * blocks + b) * TILE + step * GROUP * 4;
                    // `at + 32 <= codes.len()`: the tile of an existing (group, block).
                    *v = _mm256_loadu_si256(w.codes.as_ptr().add(at).cast());
                }
                for (i, row) in sums.iter_mut().enumerate() {
                    let at = (r0 + i) * x.stride + b * BLOCK + step * 4;
                    // `at + 4 <= codes.len()`: inside row r0+i's padded blocks.
                    let four = std::ptr::read_unaligned(x.codes.as_ptr().add(at).cast::<i32>());
                    let xv = _mm256_set1_epi32(four);
                    for (s, &wj) in row.iter_mut().zip(&wv) {
                        *s = if VNNI {
                            _mm256_dpbusd_avx_epi32(*s, xv, wj)
                        } else {
                            _mm256_add_epi32(*s, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, wj), ones))
                        };
                    }
                }
            }
            for (i, (row_acc, row_sums)) in acc.iter_mut().zip(&sums).enumerate() {
                let xs = _mm256_set1_ps(x.scales[(r0 + i) * blocks + b]);
                for (j, (a, &s)) in row_acc.iter_mut().zip(row_sums).enumerate() {
                    let at = ((g0 + j) * blocks + b) * GROUP;
                    // `at + 8 <= scales.len() == offsets.len()`.
                    let ws = _mm256_loadu_ps(w.scales.as_ptr().add(at));
                    let exact = _mm256_sub_epi32(s, _mm256_loadu_si256(w.offsets.as_ptr().add(at).cast()));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(ws, xs), *a);
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
                    _mm256_storeu_ps(dst, a);
                } else {
                    let mut lanes = [0f32; GROUP];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), a);
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                }
            }
        }
    }
}

/// [`Activations::quantize`] for these kernels: per block, four ymm of floats, their largest
/// magnitude, scaled and converted with the default rounding (to nearest, ties to even), narrowed
/// with signed saturation (never reached: every code is within ±127), put back in order (the
/// packs interleave 128-bit halves), and offset by 128 (both kernels take activations on the
/// unsigned side).
///
/// # Safety
/// The CPU must support AVX2; `codes` holds `rows · blocks · 32` bytes (0x80, the zero code,
/// where no value is written) and `scales` `rows · blocks` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize(x: &[f32], rows: usize, inner: usize, codes: &mut [u8], scales: &mut [f32]) {
    let blocks = inner.div_ceil(BLOCK);
    let stride = blocks * BLOCK;
    let sign = _mm256_set1_ps(-0.0);
    let flip = _mm256_set1_epi8(-128);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut partial: [f32; BLOCK];
    for r in 0..rows {
        for b in 0..blocks {
            let start = r * inner + b * BLOCK;
            let len = (inner - b * BLOCK).min(BLOCK);
            let values = if len == BLOCK {
                &x[start..start + BLOCK]
            } else {
                partial = [0.0; BLOCK];
                partial[..len].copy_from_slice(&x[start..start + len]);
                &partial[..]
            };
            // SAFETY: `values` holds 32 floats.
            let v: [__m256; 4] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(values.as_ptr().add(8 * k)) });
            let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| _mm256_max_ps(m, _mm256_andnot_ps(sign, v)));
            let mut lanes = [0f32; 8];
            // SAFETY: eight floats into eight.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
            let max = lanes.iter().fold(0f32, |a, &b| a.max(b));
            if max == 0.0 {
                continue;
            }
            scales[r * blocks + b] = max / 127.0;
            let to_code = _mm256_set1_ps(127.0 / max);
            let [a, bb, c, d] = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, to_code)));
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, bb), _mm256_packs_epi32(c, d));
            let bytes = _mm256_xor_si256(_mm256_permutevar8x32_epi32(bytes, order), flip);
            let at = r * stride + b * BLOCK;
            // SAFETY: bytes at..at+32 are row r's block b in `codes`; padding past `len` is the
            // zero code because the values there are zeros.
            unsafe { _mm256_storeu_si256(codes.as_mut_ptr().add(at).cast(), bytes) };
        }
    }
}
