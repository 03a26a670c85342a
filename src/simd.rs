//! Wider vector units without target-specific code: [`widest!`] compiles one plain-Rust body
//! (loops the compiler vectorises) for the target's baseline and, on x86-64, also for AVX2+FMA
//! and AVX-512, and picks the widest the CPU has at run time. On aarch64 the baseline is NEON,
//! which every aarch64 CPU has, so the same bodies vectorise there with nothing to pick; the one
//! kernel that gains from a newer instruction (the byte dot product of the graph walk and the
//! int8 encoder, with SDOT) picks it itself ([`idot`], [`idot_rows`]). [`path`] names what runs
//! on this CPU.

/// Defines `fn $name` that runs `$body` compiled for the widest vector unit the CPU has: on
/// x86-64, AVX-512 (F and BW, for byte and word arithmetic; unless [`avx512`] says no) or
/// AVX2+FMA when detected at run time; otherwise (and on every other target) the baseline build.
/// The body is written once; only the instructions chosen differ.
macro_rules! widest {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::simd::avx512() {
                    // SAFETY: the CPU has just been found to support AVX-512F and BW.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has just been found to support AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use widest;

/// Whether [`widest!`] takes AVX-512: the CPU has F and BW, and no 256-bit int8 kernel was forced
/// with [`int8::FORCE`] (`avx2` or `avx-vnni` make the whole process run its own vector code as
/// a CPU of that class would, so that its figures can be measured on an AVX-512 machine). Read
/// once.
#[cfg(target_arch = "x86_64")]
pub fn avx512() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && !int8::choice().narrows_to_avx2()
    })
}

/// `v` as signed bytes scaled by its largest component, and the scale back.
pub fn quantize(v: &[f32]) -> (Vec<i8>, f32) {
    let mut codes = vec![0; v.len()];
    let scale = quantize_into(v, &mut codes);
    (codes, scale)
}

/// [`quantize`] into `codes` (as long as `v`), without allocating: returns the scale. Ties round
/// to even (one vector instruction where `round`'s away-from-zero is a libm call).
#[inline]
pub fn quantize_into(v: &[f32], codes: &mut [i8]) -> f32 {
    quantize_to(v, 127, codes)
}

widest! {
    /// [`quantize_into`] with codes within `±max_code` (at most 127).
    pub fn quantize_to(v: &[f32], max_code: i32, codes: &mut [i8]) -> f32 {
        debug_assert!((1..=127).contains(&max_code));
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        if max == 0.0 {
            codes.fill(0);
            return 0.0;
        }
        let top = max_code as f32;
        let to_code = top / max;
        for (c, x) in codes.iter_mut().zip(v) {
            *c = (x * to_code).round_ties_even() as i32 as i8;
        }
        max / top
    }
}

widest! {
    /// Dot product of two float vectors: the wider vector unit where the CPU has one ([`widest!`]).
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_body(a, b)
    }
}

/// Sixteen independent accumulators: one AVX-512 register, two AVX2 or four SSE/NEON ones, so
/// the loop is vectorised at every width without target-specific code.
#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Dot product of two byte vectors, in 32-bit sums: the graph walk's inner loop, and the int8
/// encoder's (`embed::kernels::qmatmul`).
#[inline]
pub fn idot(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        // SAFETY: the CPU has just been found to support the dot-product instructions.
        return unsafe { sdot::idot(a, b) };
    }
    idot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod i8mm;
pub mod int8;
/// The byte dot product with SDOT (ARMv8.2 dot-product extension: Apple M1 and later, Neoverse,
/// Cortex-A76 and later): one instruction multiplies 16 byte pairs and adds them into four
/// 32-bit lanes, where plain NEON needs widening multiplies and pairwise adds (about six
/// instructions for the same 16 pairs). The compiler does not form SDOT from the portable loop,
/// and its intrinsic is not stable, so the one instruction is written out.
#[cfg(target_arch = "aarch64")]
mod sdot;
#[cfg(target_arch = "x86_64")]
pub mod vnni512;

/// The byte dot product's loop: 32 lanes of 32-bit sums, which the compiler turns into the
/// target's widening multiply-adds (NEON; SSE2, AVX2 or AVX-512 on x86-64 through [`widest!`]).
#[inline(always)]
fn dot_lanes(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; 32];
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..32 {
            acc[i] += i32::from(x[i]) * i32::from(y[i]);
        }
    }
    let mut s: i32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += i32::from(*x) * i32::from(*y);
    }
    s
}

widest! {
    /// The byte dot product in plain Rust, vectorised for the target (NEON on aarch64).
    fn idot_portable(a: &[i8], b: &[i8]) -> i32 {
        dot_lanes(a, b)
    }
}

/// `out[r] = w · xs[r]` for every row `r` of `xs` (rows of `w.len()` bytes, end to end): one
/// weight row against many activation rows, in one dispatch (the int8 encoder's inner loop).
pub fn idot_rows(w: &[i8], xs: &[i8], out: &mut [i32]) {
    assert_eq!(xs.len(), w.len() * out.len(), "xs holds out.len() rows of w.len() bytes");
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        /// # Safety
        /// The CPU must support the `dotprod` feature.
        #[target_feature(enable = "dotprod")]
        unsafe fn rows(w: &[i8], xs: &[i8], out: &mut [i32]) {
            for (o, x) in out.iter_mut().zip(xs.chunks_exact(w.len().max(1))) {
                // SAFETY: the caller checked the feature.
                *o = unsafe { sdot::idot(w, x) };
            }
        }
        // SAFETY: the CPU has just been found to support the dot-product instructions.
        return unsafe { rows(w, xs, out) };
    }
    idot_rows_portable(w, xs, out)
}

/// Bytes per block of [`idot_rows_blocks`]: each block of an activation row has its own scale.
pub const BLOCK: usize = 32;

/// `out[r] = Σ_b ws[b] · scales[r][b] · (w_b · xs[r]_b)` over blocks of [`BLOCK`] bytes: one
/// weight row against many activation rows, both quantised block by block (each block its own
/// scale, so an outlier spoils only its block), exact integer sums within a block.
///
/// Codes are in `-127..=127` (what [`quantize`] makes): the x86-64 kernel's byte multiply takes
/// one side's magnitude, and `-128` has none that fits.
pub fn idot_rows_blocks(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32], out: &mut [f32]) {
    let blocks = w.len().div_ceil(BLOCK);
    assert_eq!(ws.len(), blocks, "a scale per block of the weight row");
    assert_eq!(xs.len(), w.len() * out.len(), "xs holds out.len() rows of w.len() bytes");
    assert_eq!(scales.len(), blocks * out.len(), "a scale per block of every row");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        if std::arch::is_x86_feature_detected!("avxvnni") {
            // SAFETY: the CPU has just been found to support AVX2, FMA and AVX-VNNI.
            return unsafe { avx2_rows::rows_blocks_vnni(w, ws, xs, scales, out) };
        }
        // SAFETY: the CPU has just been found to support AVX2 and FMA.
        return unsafe { avx2_rows::rows_blocks(w, ws, xs, scales, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        /// # Safety
        /// The CPU must support the `dotprod` feature.
        #[target_feature(enable = "dotprod")]
        unsafe fn rows(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32], out: &mut [f32]) {
            let inner = w.len().max(1);
            let blocks = inner.div_ceil(BLOCK);
            for ((o, x), s) in out.iter_mut().zip(xs.chunks_exact(inner)).zip(scales.chunks_exact(blocks)) {
                let mut acc = 0f32;
                for (((wb, xb), sb), wsb) in w.chunks(BLOCK).zip(x.chunks(BLOCK)).zip(s).zip(ws) {
                    // SAFETY: the caller checked the feature.
                    acc += unsafe { sdot::idot(wb, xb) } as f32 * (sb * wsb);
                }
                *o = acc;
            }
        }
        // SAFETY: the CPU has just been found to support the dot-product instructions.
        return unsafe { rows(w, ws, xs, scales, out) };
    }
    idot_rows_blocks_portable(w, ws, xs, scales, out)
}

/// The block kernel in AVX2: per 32 bytes, VPMADDUBSW multiplies the weights' magnitudes by the
/// activations carrying the weights' signs into 16-bit pair sums (at most 2 · 127 · 127, no
/// saturation) and VPMADDWD widens them to eight 32-bit sums; with AVX-VNNI one VPDPBUSD does
/// both. Per block, one FMA adds the sums, scaled, to eight float lanes; the lanes are added once
/// per row. Four activation rows go through each weight block together.
#[cfg(target_arch = "x86_64")]
mod avx2_rows {
    use std::arch::x86_64::*;

    use super::BLOCK;

    /// # Safety
    /// The CPU must support AVX2 and FMA; the shapes are those [`super::idot_rows_blocks`] checked.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_blocks(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32], out: &mut [f32]) {
        // SAFETY: the caller's promise, passed on; inlined here, so compiled for AVX2.
        unsafe { rows::<false>(w, ws, xs, scales, out) }
    }

    /// [`rows_blocks`] with VPDPBUSD.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and AVX-VNNI; the shapes are checked as for [`rows_blocks`].
    #[target_feature(enable = "avx2,fma,avxvnni")]
    pub unsafe fn rows_blocks_vnni(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32], out: &mut [f32]) {
        // SAFETY: the caller's promise, passed on; inlined here, so compiled for AVX-VNNI.
        unsafe { rows::<true>(w, ws, xs, scales, out) }
    }

    #[inline(always)]
    unsafe fn rows<const VNNI: bool>(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32], out: &mut [f32]) {
        let inner = w.len();
        if inner == 0 {
            out.fill(0.0);
            return;
        }
        let blocks = inner.div_ceil(BLOCK);
        let rows = out.len();
        // Four rows at a time: the weight block is read once for all four, and the four sums are
        // independent chains (one chain waits on each FMA's latency).
        let mut r = 0;
        while r + 4 <= rows {
            // SAFETY: rows `r..r + 4` exist; the CPU features are the caller's.
            let sums =
                unsafe { four::<VNNI>(w, ws, &xs[r * inner..(r + 4) * inner], &scales[r * blocks..(r + 4) * blocks]) };
            out[r..r + 4].copy_from_slice(&sums);
            r += 4;
        }
        while r < rows {
            // SAFETY: row `r` exists; the CPU features are the caller's.
            out[r] =
                unsafe { one::<VNNI>(w, ws, &xs[r * inner..(r + 1) * inner], &scales[r * blocks..(r + 1) * blocks]) };
            r += 1;
        }
    }

    /// The product of one block pair (`BLOCK` bytes from `w` and `x`): eight 32-bit sums.
    ///
    /// # Safety
    /// `BLOCK` bytes must be readable at `w` and at `x`; AVX2 (and AVX-VNNI with `VNNI`).
    #[inline(always)]
    unsafe fn block<const VNNI: bool>(w: *const i8, x: *const i8) -> __m256i {
        // SAFETY: AVX2, the caller's.
        let mut sums = unsafe { _mm256_setzero_si256() };
        for k in (0..BLOCK).step_by(32) {
            // SAFETY: `k + 32 <= BLOCK`, readable by the caller's promise; the features are the
            // caller's.
            unsafe {
                let (wv, xv) = (_mm256_loadu_si256(w.add(k).cast()), _mm256_loadu_si256(x.add(k).cast()));
                let (magnitudes, signed) = (_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                sums = if VNNI {
                    _mm256_dpbusd_avx_epi32(sums, magnitudes, signed)
                } else {
                    let pairs = _mm256_maddubs_epi16(magnitudes, signed);
                    _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
                };
            }
        }
        sums
    }

    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let mut lanes = [0f32; 8];
        // SAFETY: an unaligned store of eight floats into eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        lanes.iter().sum()
    }

    /// The blocks past the whole ones, in plain integers.
    fn tail(w: &[i8], x: &[i8], from: usize) -> i32 {
        w[from..].iter().zip(&x[from..]).map(|(a, c)| i32::from(*a) * i32::from(*c)).sum()
    }

    /// # Safety
    /// `xs` holds four rows of `w.len()` bytes, `scales` four rows of blocks; AVX2 and FMA (and
    /// AVX-VNNI with `VNNI`).
    #[inline(always)]
    unsafe fn four<const VNNI: bool>(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32]) -> [f32; 4] {
        let inner = w.len();
        let blocks = inner.div_ceil(BLOCK);
        let whole = inner / BLOCK;
        // SAFETY: AVX, the caller's.
        let mut acc = [unsafe { _mm256_setzero_ps() }; 4];
        for b in 0..whole {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `(b + 1) · BLOCK <= inner`, so the block lies inside the weight row and
                // inside row `k`; the features are the caller's.
                unsafe {
                    let sums = block::<VNNI>(w.as_ptr().add(b * BLOCK), xs.as_ptr().add(k * inner + b * BLOCK));
                    let scale = _mm256_set1_ps(scales[k * blocks + b] * ws[b]);
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, *a);
                }
            }
        }
        let mut out = [0f32; 4];
        for (k, o) in out.iter_mut().enumerate() {
            // SAFETY: AVX2, the caller's.
            *o = unsafe { hsum(acc[k]) };
            if whole < blocks {
                let t = tail(w, &xs[k * inner..(k + 1) * inner], whole * BLOCK);
                *o += t as f32 * (scales[k * blocks + whole] * ws[whole]);
            }
        }
        out
    }

    /// # Safety
    /// `x` holds one row of `w.len()` bytes, `scales` its blocks'; AVX2 and FMA (and AVX-VNNI
    /// with `VNNI`).
    #[inline(always)]
    unsafe fn one<const VNNI: bool>(w: &[i8], ws: &[f32], x: &[i8], scales: &[f32]) -> f32 {
        let inner = w.len();
        let blocks = inner.div_ceil(BLOCK);
        let whole = inner / BLOCK;
        // SAFETY: AVX, the caller's.
        let mut acc = unsafe { _mm256_setzero_ps() };
        for b in 0..whole {
            // SAFETY: `(b + 1) · BLOCK <= inner`: the block lies inside both rows; the features
            // are the caller's.
            unsafe {
                let sums = block::<VNNI>(w.as_ptr().add(b * BLOCK), x.as_ptr().add(b * BLOCK));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(scales[b] * ws[b]), acc);
            }
        }
        // SAFETY: AVX2, the caller's.
        let mut sum = unsafe { hsum(acc) };
        if whole < blocks {
            sum += tail(w, x, whole * BLOCK) as f32 * (scales[whole] * ws[whole]);
        }
        sum
    }
}

widest! {
    fn idot_rows_blocks_portable(w: &[i8], ws: &[f32], xs: &[i8], scales: &[f32], out: &mut [f32]) {
        if w.is_empty() {
            out.fill(0.0);
            return;
        }
        let blocks = w.len().div_ceil(BLOCK);
        for ((o, x), s) in out.iter_mut().zip(xs.chunks_exact(w.len())).zip(scales.chunks_exact(blocks)) {
            // Eight lanes of sums kept apart to the end: no horizontal add per block.
            let mut acc = [0f32; 8];
            let (wc, xc) = (w.chunks_exact(BLOCK), x.chunks_exact(BLOCK));
            let (wr, xr) = (wc.remainder(), xc.remainder());
            for (((wb, xb), sb), wsb) in wc.zip(xc).zip(s).zip(ws) {
                let mut lanes = [0i32; 8];
                for i in 0..BLOCK {
                    lanes[i % 8] += i32::from(wb[i]) * i32::from(xb[i]);
                }
                let f = sb * wsb;
                for j in 0..8 {
                    acc[j] += lanes[j] as f32 * f;
                }
            }
            let mut sum: f32 = acc.iter().sum();
            if !wr.is_empty() {
                let tail: i32 = wr.iter().zip(xr).map(|(a, b)| i32::from(*a) * i32::from(*b)).sum();
                sum += tail as f32 * (s[blocks - 1] * ws[blocks - 1]);
            }
            *o = sum;
        }
    }
}

widest! {
    fn idot_rows_portable(w: &[i8], xs: &[i8], out: &mut [i32]) {
        if w.is_empty() {
            out.fill(0);
            return;
        }
        for (o, x) in out.iter_mut().zip(xs.chunks_exact(w.len())) {
            *o = dot_lanes(w, x);
        }
    }
}

/// The vector paths this CPU runs, for logs and for the cross-architecture checks
/// (`scripts/test-arm64.sh`): `x86-64 avx512`, `x86-64 avx2+fma`, `x86-64 baseline`,
/// `aarch64 neon+dotprod`, `aarch64 neon`, or the target's name elsewhere.
pub fn path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512() {
            return "x86-64 avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return "x86-64 avx2+fma";
        }
        "x86-64 baseline"
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("dotprod") { "aarch64 neon+dotprod" } else { "aarch64 neon" }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        std::env::consts::ARCH
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..385).map(|i| i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..385).map(|i| 1.0 - i as f32 * 0.002).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-2 * naive.abs().max(1.0));
    }

    /// Whatever path this CPU takes (SDOT, NEON, AVX), the byte dot product is exact.
    #[test]
    fn the_byte_dot_product_matches_its_oracle_at_every_length() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(11);
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 384, 385] {
            let a: Vec<i8> = (0..len).map(|_| rng.random()).collect();
            let b: Vec<i8> = (0..len).map(|_| rng.random()).collect();
            let oracle: i32 = a.iter().zip(&b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum();
            assert_eq!(idot(&a, &b), oracle, "length {len}");
            assert_eq!(idot_portable(&a, &b), oracle, "length {len}, portable");
        }
        // Extremes: every product at its largest magnitude.
        let (lo, hi) = (vec![i8::MIN; 384], vec![i8::MAX; 384]);
        assert_eq!(idot(&lo, &lo), 384 * 128 * 128);
        assert_eq!(idot(&lo, &hi), -384 * 128 * 127);
    }

    /// The encoder's kernels against their exact integer oracle, at lengths around the vector
    /// and block widths, with extremes.
    #[test]
    fn the_row_kernels_match_their_oracles() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(5);
        for inner in [1, 15, 31, 32, 33, 64, 100, 384, 1536] {
            let rows = 7;
            // Codes as `quantize` makes them: -127..=127.
            let w: Vec<i8> = (0..inner).map(|_| rng.random_range(-127..=127)).collect();
            let xs: Vec<i8> = (0..inner * rows).map(|_| rng.random_range(-127..=127)).collect();
            let oracle: Vec<i32> =
                xs.chunks(inner).map(|x| x.iter().zip(&w).map(|(a, b)| i32::from(*a) * i32::from(*b)).sum()).collect();
            let mut out = vec![0; rows];
            idot_rows(&w, &xs, &mut out);
            assert_eq!(out, oracle, "idot_rows, inner {inner}");
            idot_rows_portable(&w, &xs, &mut out);
            assert_eq!(out, oracle, "idot_rows portable, inner {inner}");
            // Blocks with power-of-two scales: every product and sum is exact in f32 too.
            let blocks = inner.div_ceil(BLOCK);
            let ws: Vec<f32> = (0..blocks).map(|b| 2f32.powi(b as i32 % 3 - 1)).collect();
            let scales: Vec<f32> = (0..blocks * rows).map(|i| 2f32.powi(-(i as i32 % 4))).collect();
            let oracle: Vec<f32> = xs
                .chunks(inner)
                .zip(scales.chunks(blocks))
                .map(|(x, s)| {
                    (0..blocks)
                        .map(|b| {
                            let r = b * BLOCK..((b + 1) * BLOCK).min(inner);
                            let d: i32 =
                                x[r.clone()].iter().zip(&w[r]).map(|(a, c)| i32::from(*a) * i32::from(*c)).sum();
                            d as f32 * (s[b] * ws[b])
                        })
                        .sum()
                })
                .collect();
            let mut out = vec![0f32; rows];
            idot_rows_blocks(&w, &ws, &xs, &scales, &mut out);
            assert_eq!(out, oracle, "idot_rows_blocks, inner {inner}");
            idot_rows_blocks_portable(&w, &ws, &xs, &scales, &mut out);
            assert_eq!(out, oracle, "idot_rows_blocks portable, inner {inner}");
            // Each x86-64 kernel this CPU can run, not only the one dispatch picks.
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has just been found to support AVX2 and FMA.
                unsafe { avx2_rows::rows_blocks(&w, &ws, &xs, &scales, &mut out) };
                assert_eq!(out, oracle, "idot_rows_blocks AVX2, inner {inner}");
            }
        }
        let (lo, hi) = (vec![i8::MIN; 1536], vec![i8::MAX; 1536 * 2]);
        let mut out = vec![0; 2];
        idot_rows(&lo, &hi, &mut out);
        assert_eq!(out, [-1536 * 128 * 127; 2]);
    }

    #[test]
    fn names_the_vector_path_this_cpu_runs() {
        let path = super::path();
        // Printed for scripts/test-arm64.sh, which checks it against the emulated CPU model.
        eprintln!("simd path: {path}");
        eprintln!("int8 kernel: {}", int8::choice().kernel);
        assert!(path.starts_with(std::env::consts::ARCH.replace('_', "-").as_str()), "{path}");
    }
}
