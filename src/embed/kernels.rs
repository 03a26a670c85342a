//! The CPU kernels of the encoder that candle's generic ops make slow: GELU, attention over
//! packed sequences, and matrix products of few rows. Plain Rust over slices: the element-wise functions are branch-free
//! arithmetic that the compiler vectorises, and the matrix products go to `gemm`, which picks its
//! SIMD kernels at run time. The element-wise loops are compiled for the target's baseline (SSE2
//! on x86-64, NEON on aarch64) and, on x86-64, also for AVX2+FMA and AVX-512, one of which is
//! picked at run time ([`crate::simd::widest!`]).
//!
//! Accuracy: `exp` and `erf` are polynomial approximations with errors near f32 rounding
//! (tested against f64 below); the golden-vector test checks the whole model against
//! sentence-transformers.

use gemm::Parallelism;
use rayon::prelude::*;

use crate::simd::int8::{self, Activations, Kernel, Packed};
use crate::simd::widest;

/// Elements per parallel chunk of an element-wise kernel.
const CHUNK: usize = 16 * 1024;

/// `e^x` for `x` in f32 range, to about 2 ulp; no table, no branch.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer using only f32 arithmetic,
    // which vectorises on every target (`f32::round` is a library call on baseline x86-64).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    // `shifted` holds k = round(x·log2 e) in its low mantissa bits.
    let shifted = x * LOG2E + ROUND;
    let k = shifted - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    // Taylor series of e^r on |r| ≤ ln2/2; the r⁷ term is below f32 precision there.
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^k built from its bits; integer arithmetic on the bits, not a (saturating, so scalar)
    // float-to-int cast, keeps the loop vectorised. k lies in -126..=127: a normal exponent.
    let two_k = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    p * two_k
}

/// The error function, to about 2e-7 absolute (Abramowitz & Stegun 7.1.26).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152, 1.061_405_4];
    let a = x.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp(-a * a);
    y.copysign(x)
}

/// BERT's GELU, `x · Φ(x)` with the exact (erf) form, in place.
pub fn gelu(xs: &mut [f32]) {
    xs.par_chunks_mut(CHUNK).for_each(gelu_serial);
}

widest! {
    fn gelu_serial(xs: &mut [f32]) {
        for x in xs {
            *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// Rows of `x` (each `weight.len()` wide), plus `residual` when given, layer-normalised in place:
/// `(x - mean) / sqrt(var + eps) · weight + bias`, the mean and variance over each row.
pub fn add_layer_norm(x: &mut [f32], residual: Option<&[f32]>, weight: &[f32], bias: &[f32], eps: f32) {
    let width = weight.len().max(1);
    assert_eq!(bias.len(), weight.len(), "a bias per weight");
    assert!(residual.is_none_or(|r| r.len() == x.len()), "the residual is as long as x");
    /// Rows per parallel chunk: a few hundred microseconds of work.
    const ROWS: usize = 32;
    let chunk = ROWS * width;
    if x.len() <= chunk {
        return norm_rows(x, residual.unwrap_or(&[]), weight, bias, eps);
    }
    x.par_chunks_mut(chunk).enumerate().for_each(|(i, rows)| {
        let res = residual.map_or(&[][..], |r| &r[i * chunk..i * chunk + rows.len()]);
        norm_rows(rows, res, weight, bias, eps);
    });
}

widest! {
    /// [`add_layer_norm`] on one thread; `residual` is empty or as long as `x`.
    fn norm_rows(x: &mut [f32], residual: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
        let width = weight.len();
        for (i, row) in x.chunks_exact_mut(width).enumerate() {
            if !residual.is_empty() {
                row.iter_mut().zip(&residual[i * width..(i + 1) * width]).for_each(|(x, r)| *x += r);
            }
            let mean = lane_sum(row, |x| x) / width as f32;
            let var = lane_sum(row, |x| (x - mean) * (x - mean)) / width as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((x, w), b) in row.iter_mut().zip(weight).zip(bias) {
                *x = (*x - mean) * inv * w + b;
            }
        }
    }
}

/// `Σ f(x)` over 16 lanes (a float sum in one register would wait on each addition in turn:
/// the compiler may not reorder float additions itself).
#[inline(always)]
fn lane_sum(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f(x);
        }
    }
    chunks.remainder().iter().map(|&x| f(x)).sum::<f32>() + lanes.iter().sum::<f32>()
}

/// The largest of `xs`, over 16 lanes (as [`lane_sum`]).
#[inline(always)]
fn lane_max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = l.max(x);
        }
    }
    chunks.remainder().iter().chain(lanes.iter()).copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Adds `bias` to each `bias.len()`-wide row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    for row in x.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    }
}

widest! {
    /// Softmax of each `width`-long row of `rows`, in place.
    pub fn softmax(rows: &mut [f32], width: usize) {
        for row in rows.chunks_exact_mut(width) {
            let max = lane_max(row);
            row.iter_mut().for_each(|x| *x = exp(*x - max));
            let inv = 1.0 / lane_sum(row, |x| x);
            row.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

/// Below this many rows, [`matmul`] splits the output's columns between threads itself.
const FEW_ROWS: usize = 64;

/// `out = x · w` for row-major `x` (`rows × inner`), `w` (`inner × cols`) and `out`.
///
/// A query has a couple of dozen rows; gemm's own threading does not split so small a product,
/// and the time goes in streaming the weights. Splitting the columns between threads, each
/// streaming its share of `w`, made a query's dense layers about a quarter faster; larger
/// products are left to gemm's threading.
pub fn matmul(x: &[f32], w: &[f32], rows: usize, inner: usize, cols: usize, out: &mut [f32]) {
    assert_eq!(x.len(), rows * inner, "x is rows × inner");
    assert_eq!(w.len(), inner * cols, "w is inner × cols");
    assert_eq!(out.len(), rows * cols, "out is rows × cols");
    /// A block of output columns, `[start, start + width)` of every row.
    struct Block(*mut f32, usize, usize);
    // SAFETY: blocks cover disjoint columns of `out`, which outlives the scope they are used in.
    unsafe impl Send for Block {}
    let product = |Block(out, start, width): Block, parallelism| {
        // SAFETY: `x` and `w` are read within their asserted shapes; `out` is written at rows
        // `0..rows`, columns `start..start + width`, inside `out` and inside this block only.
        unsafe {
            gemm::gemm(
                rows,
                width,
                inner,
                out.add(start),
                1,
                cols as isize,
                false,
                x.as_ptr(),
                1,
                inner as isize,
                w.as_ptr().add(start),
                1,
                cols as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        }
    };
    let threads = rayon::current_num_threads();
    if rows >= FEW_ROWS || threads == 1 {
        product(Block(out.as_mut_ptr(), 0, cols), Parallelism::Rayon(0));
        return;
    }
    // Blocks of whole 16-float vectors, one per thread.
    let width = cols.div_ceil(threads).next_multiple_of(16);
    // One base pointer for every block: taking `as_mut_ptr` per block would reborrow `out` each
    // time and, under Rust's aliasing model, invalidate the pointers handed out before it.
    let base = out.as_mut_ptr();
    let blocks: Vec<Block> =
        (0..cols).step_by(width).map(|start| Block(base, start, width.min(cols - start))).collect();
    rayon::scope(|scope| {
        for block in blocks {
            scope.spawn(|_| product(block, Parallelism::None));
        }
    });
}

/// One dense layer's weights in int8: a row of `inner` signed bytes per output column, in
/// blocks of [`crate::simd::BLOCK`] with a scale each (symmetric; Q8_0's layout), so
/// `w[c][i] ≈ codes[c][i] · scales[c][i / BLOCK]`. A little over a quarter of the f32 bytes: the
/// weights a query's pass streams are what bounds it.
pub struct QWeights {
    /// Empty when `packed` holds them.
    codes: Vec<i8>,
    scales: Vec<f32>,
    inner: usize,
    cols: usize,
    /// The same codes in the outer-product layout of `kernel`, when it has one.
    packed: Option<Packed>,
}

impl QWeights {
    /// Quantises `w`, stored `(cols, inner)` row-major (PyTorch's `(out, in)`), in the layout
    /// of `kernel` (which this CPU must run).
    pub fn new(w: &[f32], cols: usize, inner: usize, kernel: Kernel) -> Self {
        assert!(kernel.runs_here(), "the {kernel} kernel on a CPU without it");
        let q = Self::rows(w, cols, inner, kernel.weight_max_code());
        if kernel.lanes().is_some() {
            let packed = Packed::new(kernel, &q.codes, &q.scales, cols, inner);
            return Self { codes: Vec::new(), packed: Some(packed), ..q };
        }
        q
    }

    /// Quantises `w` into codes within `±top`, in rows: the row kernels' layout
    /// ([`crate::simd::idot_rows_blocks`]).
    fn rows(w: &[f32], cols: usize, inner: usize, top: i32) -> Self {
        assert_eq!(w.len(), cols * inner, "w is cols × inner");
        let blocks = inner.div_ceil(crate::simd::BLOCK);
        let mut codes = Vec::with_capacity(w.len());
        let mut scales = Vec::with_capacity(cols * blocks);
        for row in w.chunks_exact(inner.max(1)).take(cols) {
            for block in row.chunks(crate::simd::BLOCK) {
                let at = codes.len();
                codes.resize(at + block.len(), 0);
                scales.push(crate::simd::quantize_to(block, top, &mut codes[at..]));
            }
        }
        Self { codes, scales, inner, cols, packed: None }
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn inner(&self) -> usize {
        self.inner
    }
}

/// `out = x · Wᵀ` for row-major `x` (`rows × inner`) and int8 weights: each row of `x` is
/// quantised on the fly in blocks of [`crate::simd::BLOCK`] values (each block its own scale:
/// BERT's activations have a few outlier features, which would spoil a whole row's scale),
/// products are summed exactly in 32-bit integers per block and scaled back per block.
///
/// Threads split the output columns, each streaming its share of the weights once against every
/// row (a row of weights stays in L1 while the rows pass).
pub fn qmatmul(x: &[f32], rows: usize, w: &QWeights, out: &mut [f32]) {
    use crate::simd::BLOCK;
    let (inner, cols) = (w.inner, w.cols);
    assert_eq!(x.len(), rows * inner, "x is rows × inner");
    assert_eq!(out.len(), rows * cols, "out is rows × cols");
    if let Some(packed) = &w.packed {
        return qmatmul_packed(x, rows, packed, out);
    }
    let blocks = inner.div_ceil(BLOCK);
    let mut xq = vec![0i8; rows * inner];
    let mut xs = Vec::with_capacity(rows * blocks);
    for (row, codes) in x.chunks_exact(inner.max(1)).zip(xq.chunks_exact_mut(inner.max(1))).take(rows) {
        for (block, c) in row.chunks(BLOCK).zip(codes.chunks_mut(BLOCK)) {
            xs.push(crate::simd::quantize_into(block, c));
        }
    }
    /// Output columns `[start, end)` of every row.
    struct Block(*mut f32, usize, usize);
    // SAFETY: blocks cover disjoint columns of `out`, which outlives the scope they are used in.
    unsafe impl Send for Block {}
    let product = |Block(base, start, end): Block| {
        let mut sums = vec![0f32; rows];
        for c in start..end {
            let row = &w.codes[c * inner..(c + 1) * inner];
            crate::simd::idot_rows_blocks(row, &w.scales[c * blocks..(c + 1) * blocks], &xq, &xs, &mut sums);
            for (r, &sum) in sums.iter().enumerate() {
                // SAFETY: `r < rows` and `start <= c < end <= cols`: inside `out`, and in this
                // block's columns only.
                unsafe { *base.add(r * cols + c) = sum };
            }
        }
    };
    let threads = rayon::current_num_threads().max(1);
    let base = out.as_mut_ptr();
    if threads == 1 {
        product(Block(base, 0, cols));
        return;
    }
    let width = cols.div_ceil(threads * 4).max(1);
    let blocks: Vec<Block> = (0..cols).step_by(width).map(|s| Block(base, s, (s + width).min(cols))).collect();
    rayon::scope(|scope| {
        for block in blocks {
            scope.spawn(|_| product(block));
        }
    });
}

/// [`qmatmul`] on an outer-product kernel ([`crate::simd::int8`]): threads split the column
/// groups.
fn qmatmul_packed(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    let xq = Activations::quantize(w.kernel, x, rows, w.inner);
    struct Out(*mut f32);
    // SAFETY: each task writes the columns of its own groups only; `out` outlives the scope.
    unsafe impl Send for Out {}
    // SAFETY: as for `Send`: shared, the pointer is only used for disjoint columns.
    unsafe impl Sync for Out {}
    let base = Out(out.as_mut_ptr());
    let run = |groups: std::ops::Range<usize>| {
        let base = &base;
        // SAFETY: `out` is `rows × cols` (checked by the caller) and `groups` are this task's
        // alone; the kernel checks the rest.
        unsafe { int8::gemm(w, &xq, rows, groups, base.0) }
    };
    let threads = rayon::current_num_threads().max(1);
    // Pairs of groups (the widest kernels' tile), a few per thread for balance.
    let per = w.groups.div_ceil(threads * 4).max(2).next_multiple_of(2);
    if threads == 1 || w.groups <= per {
        run(0..w.groups);
        return;
    }
    rayon::scope(|scope| {
        for start in (0..w.groups).step_by(per) {
            let run = &run;
            scope.spawn(move |_| run(start..(start + per).min(w.groups)));
        }
    });
}

/// Self-attention over packed sequences: no padding, no mask.
///
/// `qkv` holds one row per token, `3 · heads · head_dim` wide (queries, then keys, then values);
/// the tokens of each sequence are consecutive, `lens` long. Writes each token's context,
/// `heads · head_dim` wide, to `out`. Sequences run in parallel; each (sequence, head) is two
/// matrix products straight from the packed rows, with no copies.
pub fn attention(qkv: &[f32], lens: &[usize], heads: usize, head_dim: usize, out: &mut [f32]) {
    let hidden = heads * head_dim;
    let total: usize = lens.iter().sum();
    assert_eq!(qkv.len(), total * 3 * hidden, "qkv is tokens × 3·hidden");
    assert_eq!(out.len(), total * hidden, "out is tokens × hidden");
    let mut jobs = Vec::with_capacity(lens.len());
    let (mut rest, mut start) = (out, 0);
    for &len in lens {
        let (mine, tail) = rest.split_at_mut(len * hidden);
        jobs.push((start, len, mine));
        rest = tail;
        start += len;
    }
    let scale = 1.0 / (head_dim as f32).sqrt();
    jobs.into_par_iter().for_each(|(start, len, out)| {
        let rows = &qkv[start * 3 * hidden..(start + len) * 3 * hidden];
        let mut scores = vec![0f32; len * len];
        for h in 0..heads {
            let q = &rows[h * head_dim..];
            let k = &rows[hidden + h * head_dim..];
            let v = &rows[2 * hidden + h * head_dim..];
            let stride = (3 * hidden) as isize;
            // SAFETY: every matrix below lies inside its slice: `len` rows of `stride` apart and
            // `head_dim` (or `len`) columns, starting within the first row; `scores` and `out`
            // are exclusively borrowed and do not overlap the inputs.
            unsafe {
                // scores = scale · Q Kᵀ   (len × len)
                gemm::gemm(
                    len,
                    len,
                    head_dim,
                    scores.as_mut_ptr(),
                    1,
                    len as isize,
                    false,
                    q.as_ptr(),
                    1,
                    stride,
                    k.as_ptr(),
                    stride,
                    1,
                    0.0,
                    scale,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
            softmax(&mut scores, len);
            // SAFETY: as above; the context goes to columns h·head_dim.. of this sequence's rows.
            unsafe {
                // context = P V   (len × head_dim)
                gemm::gemm(
                    len,
                    head_dim,
                    len,
                    out[h * head_dim..].as_mut_ptr(),
                    1,
                    hidden as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    len as isize,
                    v.as_ptr(),
                    1,
                    stride,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_over_the_softmax_range() {
        let mut worst = 0f64;
        for i in 0..=20_000 {
            let x = -80.0 + i as f32 * 0.0045;
            let want = (x as f64).exp();
            worst = worst.max(((exp(x) as f64 - want) / want).abs());
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-200.0) >= 0.0 && exp(-200.0) < 1e-37);
    }

    #[test]
    fn erf_and_gelu_are_accurate() {
        let mut worst = 0f64;
        for i in 0..=20_000 {
            let x = -8.0 + i as f64 * 0.0008;
            worst = worst.max((erf(x as f32) as f64 - libm_erf(x)).abs());
        }
        assert!(worst < 1e-6, "erf absolute error {worst}");
        let mut xs = vec![-3.0f32, -1.0, -0.1, 0.0, 0.5, 2.0, 10.0];
        let want: Vec<f64> = xs.iter().map(|&x| 0.5 * x as f64 * (1.0 + libm_erf(x as f64 / 2f64.sqrt()))).collect();
        gelu(&mut xs);
        for (g, w) in xs.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "gelu {g} vs {w}");
        }
    }

    /// erf in f64 by its Maclaurin series (|x| < 3) or the continued fraction of erfc, for tests.
    fn libm_erf(x: f64) -> f64 {
        let a = x.abs();
        let y = if a < 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
        };
        y.copysign(x)
    }

    #[test]
    fn matmul_matches_a_naive_product_for_few_and_many_rows() {
        for (rows, inner, cols) in [(3, 40, 100), (1, 384, 1536), (70, 33, 50)] {
            let x: Vec<f32> = (0..rows * inner).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
            let w: Vec<f32> = (0..inner * cols).map(|i| ((i * 7 % 23) as f32 - 11.0) / 11.0).collect();
            let mut out = vec![f32::NAN; rows * cols];
            matmul(&x, &w, rows, inner, cols, &mut out);
            for r in 0..rows {
                for c in 0..cols {
                    let want: f64 = (0..inner).map(|k| x[r * inner + k] as f64 * w[k * cols + c] as f64).sum();
                    let got = out[r * cols + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-3 * want.abs().max(1.0),
                        "({rows}x{inner}x{cols}) [{r},{c}] {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn layer_norm_matches_a_naive_one_with_and_without_a_residual() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(9);
        let width = 48;
        let weight: Vec<f32> = (0..width).map(|_| rng.random_range(0.5..1.5)).collect();
        let bias: Vec<f32> = (0..width).map(|_| rng.random_range(-0.5..0.5)).collect();
        // Few rows (one thread) and many (parallel chunks, the last one short).
        for rows in [3, 75] {
            let x: Vec<f32> = (0..rows * width).map(|_| rng.random_range(-4.0..4.0)).collect();
            let r: Vec<f32> = (0..rows * width).map(|_| rng.random_range(-1.0..1.0)).collect();
            for residual in [None, Some(&r[..])] {
                let mut got = x.clone();
                add_layer_norm(&mut got, residual, &weight, &bias, 1e-12);
                for (i, row) in got.chunks_exact(width).enumerate() {
                    let v: Vec<f64> = (0..width)
                        .map(|j| x[i * width + j] as f64 + residual.map_or(0.0, |r| r[i * width + j] as f64))
                        .collect();
                    let mean = v.iter().sum::<f64>() / width as f64;
                    let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / width as f64;
                    for (j, &g) in row.iter().enumerate() {
                        let want = (v[j] - mean) / (var + 1e-12).sqrt() * weight[j] as f64 + bias[j] as f64;
                        assert!((g as f64 - want).abs() < 1e-4, "row {i} col {j}: {g} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut row = vec![1.0f32, 3.0, -2.0, 3.0, 1000.0, -1000.0];
        softmax(&mut row, 6);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(row[4] > 0.999 && row[5] < 1e-30);
        let mut rows = vec![0.5f32, 0.25, 0.0, 0.0];
        softmax(&mut rows, 2);
        let want = 1.0 / (1.0 + (-0.25f64).exp());
        assert!((rows[0] as f64 - want).abs() < 1e-6);
        assert_eq!(&rows[2..], &[0.5, 0.5], "each row on its own");
    }

    /// The same attention, computed naively per token in f64.
    fn naive(qkv: &[f32], lens: &[usize], heads: usize, d: usize) -> Vec<f64> {
        let hidden = heads * d;
        let mut out = vec![0f64; lens.iter().sum::<usize>() * hidden];
        let mut start = 0;
        for &len in lens {
            for h in 0..heads {
                let at =
                    |t: usize, part: usize, i: usize| qkv[(start + t) * 3 * hidden + part * hidden + h * d + i] as f64;
                for i in 0..len {
                    let scores: Vec<f64> = (0..len)
                        .map(|j| (0..d).map(|c| at(i, 0, c) * at(j, 1, c)).sum::<f64>() / (d as f64).sqrt())
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for c in 0..d {
                        out[(start + i) * hidden + h * d + c] = (0..len).map(|j| e[j] / z * at(j, 2, c)).sum();
                    }
                }
            }
            start += len;
        }
        out
    }

    #[test]
    fn packed_attention_matches_a_naive_one_sequence_by_sequence() {
        let (heads, d) = (3, 8);
        let lens = [5, 1, 12, 2];
        let total: usize = lens.iter().sum();
        let qkv: Vec<f32> = (0..total * 3 * heads * d).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
        let mut out = vec![0f32; total * heads * d];
        attention(&qkv, &lens, heads, d, &mut out);
        let want = naive(&qkv, &lens, heads, d);
        let worst = out.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-5, "max difference {worst}");
    }

    /// Every outer-product kernel this CPU runs, through `qmatmul` and its threads, against the
    /// row kernels on the same weight codes.
    #[test]
    fn each_packed_kernel_matches_the_row_kernels() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.lanes().is_some() && k.runs_here()).collect();
        eprintln!("packed kernels here: {kernels:?}");
        let mut rng = StdRng::seed_from_u64(11);
        // Every tile shape (1 to 4 rows and more; one or two groups; a partial group; a tail block).
        for (rows, inner, cols) in [(1, 32, 16), (3, 50, 40), (4, 384, 48), (9, 384, 384), (7, 1536, 33), (17, 96, 1)] {
            let x: Vec<f32> = (0..rows * inner).map(|_| rng.random_range(-3.0..3.0)).collect();
            let w: Vec<f32> = (0..cols * inner).map(|_| rng.random_range(-0.2..0.2)).collect();
            for &kernel in &kernels {
                // The row kernels on the same weight codes (7-bit for AVX2).
                let mut rows_out = vec![0f32; rows * cols];
                qmatmul(&x, rows, &QWeights::rows(&w, cols, inner, kernel.weight_max_code()), &mut rows_out);
                let packed = QWeights::new(&w, cols, inner, kernel);
                assert!(packed.packed.is_some() && packed.codes.is_empty());
                let mut packed_out = vec![f32::NAN; rows * cols];
                qmatmul(&x, rows, &packed, &mut packed_out);
                for (p, r) in packed_out.iter().zip(&rows_out) {
                    // The same exact block sums and scales; only the order of float additions differs.
                    assert!((p - r).abs() <= 1e-5 * (1.0 + r.abs()), "{kernel} {rows}×{inner}×{cols}: {p} vs {r}");
                }
            }
        }
    }

    #[test]
    fn int8_products_stay_close_to_f32() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(3);
        let (rows, inner, cols) = (5, 100, 37);
        let x: Vec<f32> = (0..rows * inner).map(|_| rng.random_range(-2.0..2.0)).collect();
        let w: Vec<f32> = (0..cols * inner).map(|_| rng.random_range(-0.2..0.2)).collect();
        // f32: x · Wᵀ with W stored (cols, inner).
        let mut w_t = vec![0f32; inner * cols];
        for c in 0..cols {
            for i in 0..inner {
                w_t[i * cols + c] = w[c * inner + i];
            }
        }
        let mut want = vec![0f32; rows * cols];
        matmul(&x, &w_t, rows, inner, cols, &mut want);
        let mut got = vec![0f32; rows * cols];
        qmatmul(&x, rows, &QWeights::new(&w, cols, inner, int8::choice().kernel), &mut got);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() <= 0.02 * scale, "{g} vs {e} (largest {scale})");
        }
    }
}
