//! The int8 encoder's matrix product on AVX-512 VNNI, as an outer product: no horizontal sums.
//!
//! The row kernels ([`super::idot_rows_blocks`]) take one weight row (an output column) against
//! the activation rows, so every 32-byte block ends in a horizontal sum of its lanes. Here the
//! weights are repacked at load so that one 64-byte load holds 4 consecutive bytes of each of 16
//! output columns: a VPDPBUSD against 4 activation bytes broadcast to every lane adds those 4
//! products into each column's own lane. Eight of them cover a 32-byte block for 16 columns of one
//! activation row, and the block's sums are already where they belong. Four rows by 32 columns
//! are kept in registers (8 integer accumulators, 8 float ones), so each weight load serves four
//! rows and each broadcast two column groups.
//!
//! VPDPBUSD multiplies unsigned by signed bytes: activations are stored offset by 128 (`x ^ 0x80`,
//! in `0..=255`) and each block's sum is corrected by `128 · Σ w` over the block, kept per column
//! beside the weights. The result is the same as the row kernels' (exact integer block sums, each
//! scaled by its two block scales) up to the order of float additions.

use std::arch::x86_64::*;

use super::BLOCK;

/// Output columns per packed group: one zmm of 32-bit lanes.
pub const GROUP: usize = 16;
/// Bytes of one (group, block) tile: 16 columns × 32 bytes.
const TILE: usize = GROUP * BLOCK;

/// Int8 weights in the kernel's layout (built once, at load).
pub struct Packed {
    /// Per (group, block): 8 steps of 16 columns × 4 bytes.
    codes: Vec<i8>,
    /// Per (group, block): the 16 columns' scales.
    scales: Vec<f32>,
    /// Per (group, block): `128 · Σ w` over the block, per column.
    offsets: Vec<i32>,
    pub cols: usize,
    pub inner: usize,
    pub blocks: usize,
    pub groups: usize,
}

impl Packed {
    /// Packs `codes` (`cols × inner`, row-major, in `-127..=127`) with their per-block `scales`
    /// (`cols × blocks`). Columns and the last block are padded with zeros.
    pub fn new(codes: &[i8], scales: &[f32], cols: usize, inner: usize) -> Self {
        let blocks = inner.div_ceil(BLOCK);
        let groups = cols.div_ceil(GROUP);
        assert_eq!(codes.len(), cols * inner);
        assert_eq!(scales.len(), cols * blocks);
        let mut packed = vec![0i8; groups * blocks * TILE];
        let mut packed_scales = vec![0f32; groups * blocks * GROUP];
        let mut offsets = vec![0i32; groups * blocks * GROUP];
        for c in 0..cols {
            let (g, lane) = (c / GROUP, c % GROUP);
            for b in 0..blocks {
                let tile = (g * blocks + b) * TILE;
                let mut sum = 0i32;
                for k in 0..BLOCK {
                    let i = b * BLOCK + k;
                    if i >= inner {
                        break;
                    }
                    let w = codes[c * inner + i];
                    // Step k/4 of the block: 16 lanes × 4 bytes; this column's 4 are at lane·4.
                    packed[tile + (k / 4) * (GROUP * 4) + lane * 4 + k % 4] = w;
                    sum += i32::from(w);
                }
                packed_scales[(g * blocks + b) * GROUP + lane] = scales[c * blocks + b];
                offsets[(g * blocks + b) * GROUP + lane] = 128 * sum;
            }
        }
        Self { codes: packed, scales: packed_scales, offsets, cols, inner, blocks, groups }
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4 + self.offsets.len() * 4
    }
}

/// Activations for [`gemm`]: each row quantised per block to bytes offset by 128, rows
/// `blocks · 32` bytes apart (zero-padded to whole blocks), and a scale per (row, block).
pub struct Activations {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub stride: usize,
}

impl Activations {
    /// Quantises `rows × inner` values of `x`, block by block, as [`super::quantize_into`] does
    /// (the same codes: scale `127 / max |x|`, rounded half to even), offset by 128. Only for a
    /// CPU that runs [`gemm`] (the packed weights exist only there).
    pub fn quantize(x: &[f32], rows: usize, inner: usize) -> Self {
        assert!(available(), "AVX-512 VNNI activations on a CPU without it");
        assert!(x.len() >= rows * inner, "x holds rows × inner values");
        let blocks = inner.div_ceil(BLOCK);
        let stride = blocks * BLOCK;
        let mut codes = vec![0x80u8; rows * stride];
        let mut scales = vec![0f32; rows * blocks];
        // SAFETY: the CPU supports AVX-512F, BW and VNNI (asserted above); the sizes were made
        // for `rows`, `inner` and `blocks` just above.
        unsafe { quantize_avx512(x, rows, inner, &mut codes, &mut scales) };
        Self { codes, scales, stride }
    }
}

/// [`Activations::quantize`]'s loop: per block, two zmm of floats, their largest magnitude,
/// scaled and converted with the default rounding (to nearest, ties to even), narrowed with
/// saturation (never reached: every code is within ±127) and offset.
///
/// # Safety
/// The CPU must support AVX-512F and BW; `codes` holds `rows · blocks · 32` bytes and `scales`
/// `rows · blocks` floats.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_avx512(x: &[f32], rows: usize, inner: usize, codes: &mut [u8], scales: &mut [f32]) {
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
/// The CPU must support AVX-512F, BW and VNNI; `out` must hold `rows · w.cols` floats, and no one
/// else may write the columns of `groups` meanwhile. The shapes must agree (checked: a mismatch
/// panics): `x` holds at least `rows` rows quantised over `w.inner` values (its stride is
/// `w.blocks · 32`, with a scale per (row, block)), and `groups` lies within `0..w.groups`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn gemm(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(x.stride, w.blocks * BLOCK, "activations quantised over another inner size");
    assert!(x.codes.len() >= rows * x.stride && x.scales.len() >= rows * w.blocks, "fewer activation rows");
    assert!(groups.end <= w.groups, "column groups past the weights'");
    let mut g = groups.start;
    while g < groups.end {
        let pair = groups.end - g >= 2;
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(4);
            // SAFETY: the caller's guarantees, for rows r..r+n and groups g..g+1 or g..g+2.
            unsafe {
                match (n, pair) {
                    (4, true) => tile::<4, 2>(w, x, r, g, out),
                    (3, true) => tile::<3, 2>(w, x, r, g, out),
                    (2, true) => tile::<2, 2>(w, x, r, g, out),
                    (1, true) => tile::<1, 2>(w, x, r, g, out),
                    (4, false) => tile::<4, 1>(w, x, r, g, out),
                    (3, false) => tile::<3, 1>(w, x, r, g, out),
                    (2, false) => tile::<2, 1>(w, x, r, g, out),
                    _ => tile::<1, 1>(w, x, r, g, out),
                }
            }
            r += n;
        }
        g += if pair { 2 } else { 1 };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_get_the_portable_codes() {
        if !available() {
            eprintln!("no AVX-512 VNNI here: nothing to compare");
            return;
        }
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(5);
        for (rows, inner) in [(1, 32), (3, 50), (5, 384), (2, 7)] {
            let mut x: Vec<f32> = (0..rows * inner).map(|_| rng.random_range(-4.0..4.0)).collect();
            // A block of zeros, and ties to round.
            x[..inner.min(32)].fill(0.0);
            if x.len() > 40 {
                x[33] = 127.0;
                x[34] = 0.5;
                x[35] = -1.5;
            }
            let got = Activations::quantize(&x, rows, inner);
            let blocks = inner.div_ceil(BLOCK);
            for r in 0..rows {
                for b in 0..blocks {
                    let block = &x[r * inner + b * BLOCK..r * inner + (b * BLOCK + BLOCK).min(inner)];
                    let (want, scale) = super::super::quantize(block);
                    assert_eq!(got.scales[r * blocks + b], scale, "row {r} block {b}");
                    let at = r * got.stride + b * BLOCK;
                    for (k, &w) in want.iter().enumerate() {
                        assert_eq!(got.codes[at + k], (w as u8) ^ 0x80, "row {r} block {b} byte {k}");
                    }
                    assert!(got.codes[at + want.len()..at + BLOCK].iter().all(|&c| c == 0x80), "padding is zero");
                }
            }
        }
    }
}
