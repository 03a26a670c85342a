//! The int8 outer product ([`super::int8`]'s layout, 16 lanes) on AVX-512 VNNI.
//!
//! One VPDPBUSD per step adds 4 activation bytes (offset by 128, broadcast) times 4 bytes of each
//! of 16 columns into the columns' lanes. Four rows by two groups (32 columns) are kept in
//! registers (8 integer accumulators, 8 float ones), so each weight load serves four rows and each
//! broadcast two groups; per block the sums are corrected by `128 · Σ w`, converted and scaled.

use std::arch::x86_64::*;

use super::BLOCK;
use super::int8::{Activations, Packed};

/// Output columns per packed group: one zmm of 32-bit lanes.
const GROUP: usize = 16;
/// Bytes of one (group, block) tile: 16 columns × 32 bytes.
const TILE: usize = GROUP * BLOCK;

/// [`Activations::quantize`] for this kernel: per block, two zmm of floats, their largest
/// magnitude, scaled and converted with the default rounding (to nearest, ties to even), narrowed
/// with saturation (never reached: every code is within ±127) and offset by 128.
///
/// # Safety
/// The CPU must support AVX-512F and BW; `codes` holds `rows · blocks · 32` bytes (0x80 where no
/// value is written) and `scales` `rows · blocks` floats.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn quantize(x: &[f32], rows: usize, inner: usize, codes: &mut [u8], scales: &mut [f32]) {
    let blocks = inner.div_ceil(BLOCK);
    let stride = blocks * BLOCK;
    let offset = _mm_set1_epi8(-128);
    for r in 0..rows {
        for b in 0..blocks {
            let start = r * inner + b * BLOCK;
            let len = (inner - b * BLOCK).min(BLOCK);
            let (lo_n, hi_n) = (len.min(16), len.saturating_sub(16));
            let mask = |n: usize| if n >= 16 { u16::MAX } else { (1u16 << n) - 1 };
            // SAFETY: `start` is inside row r's `inner` values (len >= 1), and the mask keeps the
            // load there. The upper half is loaded only when the block has values past 16, so
            // `start + 16` then lies inside the slice too (no pointer is formed past its end).
            let lo = unsafe { _mm512_maskz_loadu_ps(mask(lo_n), x.as_ptr().add(start)) };
            let hi = if hi_n == 0 {
                _mm512_setzero_ps()
            } else {
                // SAFETY: as above, for values start+16..start+len.
                unsafe { _mm512_maskz_loadu_ps(mask(hi_n), x.as_ptr().add(start + 16)) }
            };
            let max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            if max == 0.0 {
                continue;
            }
            scales[r * blocks + b] = max / 127.0;
            let to_code = _mm512_set1_ps(127.0 / max);
            let at = r * stride + b * BLOCK;
            for (half, v) in [(0, lo), (16, hi)] {
                let narrowed = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v, to_code)));
                // SAFETY: bytes at..at+32 are row r's block b in `codes`; padding past `len`
                // stays 0x80 (zero) because the masked loads read zeros there.
                unsafe { _mm_storeu_si128(codes.as_mut_ptr().add(at + half).cast(), _mm_xor_si128(narrowed, offset)) };
            }
        }
    }
}

/// `out[r][c] = Σ_b xs[r][b] · ws[c][b] · Σ_k x[r][b·32+k] · w[c][b·32+k]` for the column
/// groups `groups`, every row; `out` is `rows × cols`, row-major.
///
/// # Safety
/// The CPU must support AVX-512F, BW and VNNI, and the rest is [`super::int8::gemm`]'s, which
/// checked the shapes; `w` is packed 16 lanes wide.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn gemm(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(w.lanes, GROUP, "weights packed for another kernel");
    // SAFETY: the caller's guarantees, for each tile's rows and groups.
    unsafe { super::int8::for_each_tile!(tile; w, x, rows, groups, out) }
}

/// Rows `r0..r0+R` by column groups `g0..g0+G`, kept in registers over every block.
///
/// # Safety
/// As [`gemm`], for these rows and groups.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const G: usize>(w: &Packed, x: &Activations, r0: usize, g0: usize, out: *mut f32) {
    let blocks = w.blocks;
    let mut acc = [[_mm512_setzero_ps(); G]; R];
    for b in 0..blocks {
        let mut sums = [[_mm512_setzero_si512(); G]; R];
        for step in 0..BLOCK / 4 {
            let mut wv = [_mm512_setzero_si512(); G];
            for (j, v) in wv.iter_mut().enumerate() {
                let at = ((g0 + j) * blocks + b) * TILE + step * GROUP * 4;
                // SAFETY: `at + 64 <= codes.len()`: the tile of an existing (group, block).
                *v = unsafe { _mm512_loadu_si512(w.codes.as_ptr().add(at).cast()) };
            }
            for (i, row) in sums.iter_mut().enumerate() {
                let at = (r0 + i) * x.stride + b * BLOCK + step * 4;
                // SAFETY: `at + 4 <= codes.len()`: inside row r0+i's padded blocks.
                let four = unsafe { std::ptr::read_unaligned(x.codes.as_ptr().add(at).cast::<i32>()) };
                let xv = _mm512_set1_epi32(four);
                for (s, &wj) in row.iter_mut().zip(&wv) {
                    *s = _mm512_dpbusd_epi32(*s, xv, wj);
                }
            }
        }
        for (i, (row_acc, row_sums)) in acc.iter_mut().zip(&sums).enumerate() {
            let xs = _mm512_set1_ps(x.scales[(r0 + i) * blocks + b]);
            for (j, (a, &s)) in row_acc.iter_mut().zip(row_sums).enumerate() {
                let at = ((g0 + j) * blocks + b) * GROUP;
                // SAFETY: `at + 16 <= scales.len() == offsets.len()`.
                let (ws, off) = unsafe {
                    (_mm512_loadu_ps(w.scales.as_ptr().add(at)), _mm512_loadu_si512(w.offsets.as_ptr().add(at).cast()))
                };
                let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, off));
                *a = _mm512_fmadd_ps(exact, _mm512_mul_ps(ws, xs), *a);
            }
        }
    }
    for (i, row_acc) in acc.iter().enumerate() {
        for (j, &a) in row_acc.iter().enumerate() {
            let c0 = (g0 + j) * GROUP;
            let valid = w.cols.saturating_sub(c0).min(GROUP);
            // SAFETY: row r0+i of `out`, columns c0..c0+valid, inside `rows × cols`.
            unsafe {
                let dst = out.add((r0 + i) * w.cols + c0);
                if valid == GROUP {
                    _mm512_storeu_ps(dst, a);
                } else {
                    _mm512_mask_storeu_ps(dst, (1u16 << valid) - 1, a);
                }
            }
        }
    }
}

/// Whether this CPU runs [`gemm`].
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}
