//! The int8 encoder's matrix product: which kernel runs, and the one weight layout the fast ones
//! share.
//!
//! The product is `out[r][c] = Σ_b xs[r][b] · ws[c][b] · Σ_k x[r][32b+k] · w[c][32b+k]`: weights
//! and activations quantised in blocks of [`BLOCK`] bytes with a scale each, exact integer sums
//! within a block, scaled once per block.
//!
//! **The outer-product layout** ([`Packed`]). A row kernel takes one weight row (an output column)
//! against the activation rows, and every block ends in a horizontal sum of a register's lanes.
//! The outer-product kernels instead give each output column a lane of its own: the weights are
//! repacked at load so that one register load holds 4 consecutive bytes of each of `lanes`
//! consecutive columns (a *group*), and a byte dot product of 4 against the same 4 activation
//! bytes broadcast to every lane adds those 4 products into each column's own lane. Eight such
//! steps cover a 32-byte block, and the block's sums are already where they belong. In memory,
//! per (group, block): step 0's `lanes × 4` bytes, then step 1's, … step 7's; columns past the
//! last and bytes past `inner` are zeros. The kernels differ in register width and instruction:
//!
//! | kernel | file | lanes | multiply |
//! |---|---|---:|---|
//! | `avx512-vnni` | `vnni512.rs` | 16 | VPDPBUSD on zmm |
//! | `avx-vnni` | `avx2.rs` | 8 | VPDPBUSD on ymm (VEX) |
//! | `avx2` | `avx2.rs` | 8 | VPMADDUBSW + VPMADDWD |
//! | `i8mm` | `i8mm.rs` | 4, in pairs | SMMLA, 2 rows × 2 columns × 8 bytes (aarch64) |
//! | `sdot` | `sdot.rs` | 4 | SDOT by element (aarch64) |
//! | `rows` | `../simd.rs` | — | one weight row at a time, horizontal sums (SDOT on aarch64) |
//!
//! **The I8MM layout** differs in one way: SMMLA multiplies two rows by two columns over 8 bytes,
//! so within a (group, block) the columns go in pairs rather than lanes: chunk `j` of 8 bytes
//! holds, for column pair 0 then pair 1, the pair's first column's bytes `8j..8j+8` then its
//! second's (16 bytes, one register: [`Kernel::byte_at`]).
//!
//! VPDPBUSD multiplies unsigned by signed bytes, so its activations are stored offset by 128
//! (`x ^ 0x80`) and each block's sum corrected by `128 · Σ w` ([`Packed::offsets`]). VPMADDUBSW
//! (AVX2) does too, but sums pairs into 16 bits, where `2 · 255 · 127` would saturate: its
//! weights are 7-bit (within ±63, [`Kernel::weight_max_code`]), so a pair is at most
//! `2 · 255 · 63`. The model's vectors then differ from the other kernels' in the third decimal
//! of their cosine, and the vector cache keeps them apart ([`Kernel::weights_suffix`]).
//!
//! **Which kernel** ([`choice`]): the widest this CPU runs, or the one named by the environment
//! variable [`FORCE`] (a narrower family, so that every kernel can be tested and timed on one
//! machine). Whether `precision = "auto"` takes int8 at all follows a measurement per kernel
//! ([`Kernel::beats_f32`], docs/performance.md).

use super::BLOCK;

/// The environment variable that forces a kernel: one of [`Kernel::NAMES`].
pub const FORCE: &str = "TOOLMUX_INT8_KERNEL";

/// An int8 matrix-product kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// x86-64 with AVX-512 F, BW and VNNI.
    Avx512Vnni,
    /// x86-64 with AVX2, FMA and AVX-VNNI (the 256-bit VEX form).
    AvxVnni,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// aarch64 with the int8 matrix-multiply extension (SMMLA).
    I8mm,
    /// aarch64 with the dot-product extension.
    Sdot,
    /// Any CPU: the row kernels ([`super::idot_rows_blocks`]: AVX2, SDOT or portable inside).
    Rows,
}

impl Kernel {
    /// Widest first.
    pub const ALL: [Kernel; 6] =
        [Kernel::Avx512Vnni, Kernel::AvxVnni, Kernel::Avx2, Kernel::I8mm, Kernel::Sdot, Kernel::Rows];
    /// What [`FORCE`] accepts.
    pub const NAMES: &'static str = "avx512-vnni, avx-vnni, avx2, i8mm, sdot or rows";

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Avx512Vnni => "avx512-vnni",
            Kernel::AvxVnni => "avx-vnni",
            Kernel::Avx2 => "avx2",
            Kernel::I8mm => "i8mm",
            Kernel::Sdot => "sdot",
            Kernel::Rows => "rows",
        }
    }

    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether this CPU has the instructions.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
            match self {
                Kernel::Avx512Vnni => super::vnni512::available(),
                Kernel::AvxVnni => avx2 && std::arch::is_x86_feature_detected!("avxvnni"),
                Kernel::Avx2 => avx2,
                Kernel::I8mm | Kernel::Sdot => false,
                Kernel::Rows => true,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            match self {
                Kernel::I8mm => std::arch::is_aarch64_feature_detected!("i8mm"),
                Kernel::Sdot => std::arch::is_aarch64_feature_detected!("dotprod"),
                Kernel::Rows => true,
                _ => false,
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            self == Kernel::Rows
        }
    }

    /// The widest kernel this CPU runs.
    pub fn widest() -> Kernel {
        Kernel::ALL.into_iter().find(|k| k.runs_here()).unwrap_or(Kernel::Rows)
    }

    /// Whether int8 with this kernel was measured faster than f32 for a query and for a batch
    /// (`cargo bench --bench embed`, docs/performance.md's table per kernel); `precision =
    /// "auto"` takes int8 only then.
    pub fn beats_f32(self) -> bool {
        match self {
            Kernel::Avx512Vnni | Kernel::AvxVnni | Kernel::Avx2 => true,
            // Not measured on an aarch64 CPU (only correctness, under qemu): f32 until it is.
            Kernel::I8mm | Kernel::Sdot => false,
            // 0.72× f32 for a query on x86-64.
            Kernel::Rows => false,
        }
    }

    /// Columns per group in the outer-product layout; `None` for the row kernels.
    pub fn lanes(self) -> Option<usize> {
        match self {
            Kernel::Avx512Vnni => Some(16),
            Kernel::AvxVnni | Kernel::Avx2 => Some(8),
            Kernel::I8mm | Kernel::Sdot => Some(4),
            Kernel::Rows => None,
        }
    }

    /// Where byte `k` (`0..BLOCK`) of a group's column `lane` sits in its (group, block) tile
    /// (module docs).
    pub fn byte_at(self, lane: usize, k: usize) -> usize {
        let lanes = self.lanes().expect("an outer-product kernel");
        match self {
            // Chunk k/8, column pair lane/2, its first or second column, byte k%8.
            Kernel::I8mm => ((k / 8) * 2 + lane / 2) * 16 + (lane % 2) * 8 + k % 8,
            // Step k/4: `lanes` columns × 4 bytes; this column's 4 at lane·4.
            _ => (k / 4) * (lanes * 4) + lane * 4 + k % 4,
        }
    }

    /// Whether the kernel's activations are stored offset by 128 (the unsigned side of VPDPBUSD
    /// and VPMADDUBSW).
    fn offset(self) -> bool {
        matches!(self, Kernel::Avx512Vnni | Kernel::AvxVnni | Kernel::Avx2)
    }

    /// The largest weight code's magnitude: 127, or 63 where the kernel's 16-bit pair sums need
    /// the headroom (AVX2, module docs).
    pub fn weight_max_code(self) -> i32 {
        if self == Kernel::Avx2 { 63 } else { 127 }
    }

    /// What the model's name gains where this kernel's weights differ from the others' (the
    /// vector cache keys on the name): 7-bit weights on AVX2.
    pub fn weights_suffix(self) -> &'static str {
        if self.weight_max_code() == 127 { "" } else { "-w7" }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernel this process runs, and why.
#[derive(Debug, Clone)]
pub struct Choice {
    pub kernel: Kernel,
    /// In words, for the log and `/status`.
    pub why: String,
    /// [`FORCE`] was set to something this CPU cannot run or no kernel is called: said at start.
    pub problem: Option<String>,
    /// [`FORCE`] chose the kernel.
    pub forced: bool,
}

impl Choice {
    /// Whether the rest of toolmux's vector code should run as an AVX2 CPU would: a 256-bit
    /// kernel was forced, so that such a CPU can be timed whole on an AVX-512 one
    /// ([`super::avx512`] then leaves AVX-512 aside).
    pub fn narrows_to_avx2(&self) -> bool {
        self.forced && matches!(self.kernel, Kernel::Avx2 | Kernel::AvxVnni)
    }
}

/// The kernel for this process: [`FORCE`]'s if it names one this CPU runs, else the widest.
/// Read once.
pub fn choice() -> &'static Choice {
    static CHOICE: std::sync::OnceLock<Choice> = std::sync::OnceLock::new();
    CHOICE.get_or_init(|| choose(std::env::var(FORCE).ok().as_deref()))
}

fn choose(forced: Option<&str>) -> Choice {
    let widest = Kernel::widest();
    let measured = |k: Kernel| {
        if k.beats_f32() { "int8 measured faster than f32 with it" } else { "int8 measured slower than f32 with it" }
    };
    let Some(name) = forced.map(str::trim).filter(|n| !n.is_empty()) else {
        return Choice {
            kernel: widest,
            why: format!("the widest int8 kernel this CPU runs; {}", measured(widest)),
            problem: None,
            forced: false,
        };
    };
    let problem = match Kernel::from_name(name) {
        Some(k) if k.runs_here() => {
            return Choice {
                kernel: k,
                why: format!("forced by {FORCE} (the widest here is {widest}); {}", measured(k)),
                problem: None,
                forced: true,
            };
        }
        Some(k) => format!("{FORCE}={name}: this CPU cannot run the {k} kernel; the widest it runs is {widest}"),
        None => format!("{FORCE}={name} is not a kernel: use {}", Kernel::NAMES),
    };
    Choice {
        kernel: widest,
        why: format!("the widest int8 kernel this CPU runs ({FORCE} ignored)"),
        problem: Some(problem),
        forced: false,
    }
}

/// Int8 weights in the outer-product layout (module docs), built once at load.
pub struct Packed {
    pub kernel: Kernel,
    /// Per (group, block): 8 steps of `lanes` columns × 4 bytes.
    pub codes: Vec<i8>,
    /// Per (group, block): each column's scale.
    pub scales: Vec<f32>,
    /// Per (group, block): `128 · Σ w` over the block, per column (for offset activations).
    pub offsets: Vec<i32>,
    pub lanes: usize,
    pub cols: usize,
    pub inner: usize,
    pub blocks: usize,
    pub groups: usize,
}

impl Packed {
    /// Packs `codes` (`cols × inner`, row-major, within `±kernel.weight_max_code()`) with their
    /// per-block `scales` (`cols × blocks`) for `kernel`, which must have a layout
    /// ([`Kernel::lanes`]).
    pub fn new(kernel: Kernel, codes: &[i8], scales: &[f32], cols: usize, inner: usize) -> Self {
        let lanes = kernel.lanes().expect("an outer-product kernel");
        let top = kernel.weight_max_code();
        assert!(codes.iter().all(|&c| i32::from(c).abs() <= top), "{kernel} weights past ±{top}");
        let tile = lanes * BLOCK;
        let blocks = inner.div_ceil(BLOCK);
        let groups = cols.div_ceil(lanes);
        assert_eq!(codes.len(), cols * inner);
        assert_eq!(scales.len(), cols * blocks);
        let mut packed = vec![0i8; groups * blocks * tile];
        let mut packed_scales = vec![0f32; groups * blocks * lanes];
        let mut offsets = vec![0i32; groups * blocks * lanes];
        for c in 0..cols {
            let (g, lane) = (c / lanes, c % lanes);
            for b in 0..blocks {
                let at = (g * blocks + b) * tile;
                let mut sum = 0i32;
                for (k, &w) in codes[c * inner..(c + 1) * inner].iter().enumerate().skip(b * BLOCK).take(BLOCK) {
                    packed[at + kernel.byte_at(lane, k - b * BLOCK)] = w;
                    sum += i32::from(w);
                }
                packed_scales[(g * blocks + b) * lanes + lane] = scales[c * blocks + b];
                offsets[(g * blocks + b) * lanes + lane] = 128 * sum;
            }
        }
        Self { kernel, codes: packed, scales: packed_scales, offsets, lanes, cols, inner, blocks, groups }
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4 + self.offsets.len() * 4
    }
}

/// Activations for [`gemm`]: each row quantised per block as [`super::quantize_into`] does (scale
/// `127 / max |x|`, rounded half to even), rows `blocks · 32` bytes apart and zero-padded to whole
/// blocks, a scale per (row, block); stored offset by 128 for the kernels that want it.
pub struct Activations {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub stride: usize,
}

impl Activations {
    /// Quantises `rows × inner` values of `x` for `kernel`, with its own vector code where it
    /// has some (the scalar loop took as long as the product).
    pub fn quantize(kernel: Kernel, x: &[f32], rows: usize, inner: usize) -> Self {
        assert!(x.len() >= rows * inner, "x holds rows × inner values");
        assert!(kernel.runs_here(), "{kernel} activations on a CPU without it");
        let blocks = inner.div_ceil(BLOCK);
        let stride = blocks * BLOCK;
        let zero = if kernel.offset() { 0x80 } else { 0 };
        let mut codes = vec![zero; rows * stride];
        let mut scales = vec![0f32; rows * blocks];
        match kernel {
            // SAFETY: the CPU runs the kernel (asserted above), so it has AVX-512 F and BW, or
            // AVX2; the buffers were sized for `rows`, `inner` and `blocks` just above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => unsafe { super::vnni512::quantize(x, rows, inner, &mut codes, &mut scales) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::AvxVnni | Kernel::Avx2 => unsafe { super::avx2::quantize(x, rows, inner, &mut codes, &mut scales) },
            _ => quantize_portable(x, rows, inner, kernel.offset(), &mut codes, &mut scales),
        }
        Self { codes, scales, stride }
    }
}

/// [`Activations::quantize`] in plain Rust: the oracle the vector quantisers are tested against.
fn quantize_portable(x: &[f32], rows: usize, inner: usize, offset: bool, codes: &mut [u8], scales: &mut [f32]) {
    let blocks = inner.div_ceil(BLOCK);
    let stride = blocks * BLOCK;
    let mut block = [0i8; BLOCK];
    for r in 0..rows {
        for (b, values) in x[r * inner..(r + 1) * inner].chunks(BLOCK).enumerate() {
            scales[r * blocks + b] = super::quantize_into(values, &mut block[..values.len()]);
            let at = r * stride + b * BLOCK;
            for (c, &q) in codes[at..at + values.len()].iter_mut().zip(&block) {
                *c = if offset { (q as u8) ^ 0x80 } else { q as u8 };
            }
        }
    }
}

/// Calls `$tile::<R, G>(w, x, r, g, out)` (with any further const arguments after `G`) for every
/// tile of up to 4 rows by 2 column groups over `rows` × `groups`: the shape each outer-product
/// kernel keeps in registers (each weight load serves 4 rows, each activation load 2 groups).
/// Expands inside the calling kernel's `unsafe` block, whose safety comment covers the tiles.
macro_rules! for_each_tile {
    ($tile:ident $(, $extra:ident)*; $w:expr, $x:expr, $rows:expr, $groups:expr, $out:expr) => {{
        let (rows, groups): (usize, std::ops::Range<usize>) = ($rows, $groups);
        let mut g = groups.start;
        while g < groups.end {
            let pair = groups.end - g >= 2;
            let mut r = 0;
            while r < rows {
                let n = (rows - r).min(4);
                match (n, pair) {
                    (4, true) => $tile::<4, 2 $(, $extra)*>($w, $x, r, g, $out),
                    (3, true) => $tile::<3, 2 $(, $extra)*>($w, $x, r, g, $out),
                    (2, true) => $tile::<2, 2 $(, $extra)*>($w, $x, r, g, $out),
                    (1, true) => $tile::<1, 2 $(, $extra)*>($w, $x, r, g, $out),
                    (4, false) => $tile::<4, 1 $(, $extra)*>($w, $x, r, g, $out),
                    (3, false) => $tile::<3, 1 $(, $extra)*>($w, $x, r, g, $out),
                    (2, false) => $tile::<2, 1 $(, $extra)*>($w, $x, r, g, $out),
                    _ => $tile::<1, 1 $(, $extra)*>($w, $x, r, g, $out),
                }
                r += n;
            }
            g += if pair { 2 } else { 1 };
        }
    }};
}
pub(super) use for_each_tile;

/// `out[r][c]` for every row and the columns of `groups` (module docs); `out` is `rows × cols`,
/// row-major.
///
/// # Safety
/// `out` must hold `rows · w.cols` floats, and no one else may write the columns of `groups`
/// meanwhile. The rest is checked (a mismatch panics): `x` was quantised for `w.kernel`, which
/// this CPU runs, over `w.inner` values and at least `rows` rows; `groups` lies within
/// `0..w.groups`.
pub unsafe fn gemm(w: &Packed, x: &Activations, rows: usize, groups: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(x.stride, w.blocks * BLOCK, "activations quantised over another inner size");
    assert!(x.codes.len() >= rows * x.stride && x.scales.len() >= rows * w.blocks, "fewer activation rows");
    assert!(groups.end <= w.groups, "column groups past the weights'");
    assert!(w.kernel.runs_here(), "the {} kernel on a CPU without it", w.kernel);
    match w.kernel {
        // SAFETY: the CPU runs the kernel (asserted), the shapes were checked above, and `out`
        // is the caller's promise.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Vnni => unsafe { super::vnni512::gemm(w, x, rows, groups, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Kernel::AvxVnni => unsafe { super::avx2::gemm_vnni(w, x, rows, groups, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Kernel::Avx2 => unsafe { super::avx2::gemm(w, x, rows, groups, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Kernel::I8mm => unsafe { super::i8mm::gemm(w, x, rows, groups, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Kernel::Sdot => unsafe { super::sdot::gemm(w, x, rows, groups, out) },
        _ => unreachable!("the {} kernel has no packed layout", w.kernel),
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::*;

    fn packed_kernels_here() -> Vec<Kernel> {
        Kernel::ALL.into_iter().filter(|k| k.lanes().is_some() && k.runs_here()).collect()
    }

    /// Every outer-product kernel this CPU runs against the exact integer oracle, at shapes around
    /// its lane and block widths, with the largest magnitudes the codes take.
    #[test]
    fn each_packed_kernel_matches_the_exact_oracle() {
        let kernels = packed_kernels_here();
        eprintln!("packed kernels here: {kernels:?}");
        let mut rng = StdRng::seed_from_u64(9);
        for kernel in kernels {
            for (rows, cols, inner) in
                [(1usize, 1usize, 1usize), (3, 7, 33), (4, 16, 32), (5, 17, 64), (9, 40, 100), (2, 33, 384)]
            {
                let blocks = inner.div_ceil(BLOCK);
                let top = kernel.weight_max_code() as i8;
                let mut w: Vec<i8> = (0..cols * inner).map(|_| rng.random_range(-top..=top)).collect();
                let mut x: Vec<f32> = (0..rows * inner).map(|_| rng.random_range(-3.0..3.0)).collect();
                // Extremes: weight rows at both ends of the kernel's range and an activation row
                // whose codes are ±127.
                w[..inner].fill(top);
                if cols > 1 {
                    w[inner..2 * inner].fill(-top);
                }
                for (i, v) in x[..inner].iter_mut().enumerate() {
                    *v = if i % 2 == 0 { 1.0 } else { -1.0 };
                }
                // Power-of-two scales: every float product and sum below is exact.
                let ws: Vec<f32> = (0..cols * blocks).map(|i| 2f32.powi(i as i32 % 3 - 1)).collect();
                let packed = Packed::new(kernel, &w, &ws, cols, inner);
                let xq = Activations::quantize(kernel, &x, rows, inner);
                let mut out = vec![f32::NAN; rows * cols];
                // SAFETY: `out` is rows × cols and this thread's alone.
                unsafe { gemm(&packed, &xq, rows, 0..packed.groups, out.as_mut_ptr()) };
                for r in 0..rows {
                    for c in 0..cols {
                        let terms: Vec<f64> = (0..blocks)
                            .map(|b| {
                                let sum: i32 = (b * BLOCK..((b + 1) * BLOCK).min(inner))
                                    .map(|i| {
                                        let code = xq.codes[r * xq.stride + i];
                                        let code = if kernel.offset() { (code ^ 0x80) as i8 } else { code as i8 };
                                        i32::from(w[c * inner + i]) * i32::from(code)
                                    })
                                    .sum();
                                f64::from(sum) * f64::from(ws[c * blocks + b]) * f64::from(xq.scales[r * blocks + b])
                            })
                            .collect();
                        // Exact up to the float additions of the blocks' terms, in some order.
                        let want: f64 = terms.iter().sum();
                        let bound = 1e-6 * terms.iter().map(|t| t.abs()).sum::<f64>() + 1e-12;
                        let got = f64::from(out[r * cols + c]);
                        assert!(
                            (got - want).abs() <= bound,
                            "{kernel}: rows {rows} cols {cols} inner {inner}: [{r}][{c}] {got} != {want}"
                        );
                    }
                }
            }
        }
    }

    /// Each vector quantiser makes the portable codes, code for code.
    #[test]
    fn each_quantiser_makes_the_portable_codes() {
        let mut rng = StdRng::seed_from_u64(5);
        for kernel in packed_kernels_here() {
            for (rows, inner) in [(1, 32), (3, 50), (5, 384), (2, 7), (1, 1536)] {
                let mut x: Vec<f32> = (0..rows * inner).map(|_| rng.random_range(-4.0..4.0)).collect();
                // A block of zeros, and ties to round.
                x[..inner.min(32)].fill(0.0);
                if x.len() > 40 {
                    x[33] = 127.0;
                    x[34] = 0.5;
                    x[35] = -1.5;
                }
                let got = Activations::quantize(kernel, &x, rows, inner);
                let blocks = inner.div_ceil(BLOCK);
                let mut codes = vec![if kernel.offset() { 0x80 } else { 0 }; rows * blocks * BLOCK];
                let mut scales = vec![0f32; rows * blocks];
                quantize_portable(&x, rows, inner, kernel.offset(), &mut codes, &mut scales);
                assert_eq!(got.scales, scales, "{kernel}: rows {rows} inner {inner}");
                assert_eq!(got.codes, codes, "{kernel}: rows {rows} inner {inner}");
            }
        }
    }

    /// Every layout puts each (column, byte) of a tile in a place of its own, whichever CPU
    /// runs the test (the kernels themselves are checked where they run).
    #[test]
    fn each_layout_fills_its_tile_once() {
        for kernel in Kernel::ALL.into_iter().filter(|k| k.lanes().is_some()) {
            let lanes = kernel.lanes().unwrap();
            let mut seen = vec![false; lanes * BLOCK];
            for lane in 0..lanes {
                for k in 0..BLOCK {
                    let at = kernel.byte_at(lane, k);
                    assert!(at < seen.len() && !seen[at], "{kernel}: column {lane} byte {k} at {at}");
                    seen[at] = true;
                }
            }
        }
        // SMMLA's operand: chunk 0 of pair 0 is column 0's bytes 0..8, then column 1's.
        assert_eq!(Kernel::I8mm.byte_at(1, 0), 8);
        assert_eq!(Kernel::I8mm.byte_at(2, 0), 16);
        assert_eq!(Kernel::I8mm.byte_at(0, 8), 32);
    }

    #[test]
    fn a_forced_kernel_is_taken_or_refused_in_words() {
        let widest = Kernel::widest();
        assert_eq!(choose(None).kernel, widest);
        assert!(choose(None).problem.is_none());
        let rows = choose(Some("rows"));
        assert_eq!(rows.kernel, Kernel::Rows);
        assert!(rows.why.contains(FORCE), "{}", rows.why);
        // Only a forced 256-bit kernel narrows the rest of the vector code.
        assert!(!choose(None).narrows_to_avx2() && !rows.narrows_to_avx2());
        if Kernel::Avx2.runs_here() {
            assert!(choose(Some("avx2")).narrows_to_avx2());
        }
        let bad = choose(Some("avx1024"));
        assert_eq!(bad.kernel, widest);
        assert!(bad.problem.as_deref().is_some_and(|p| p.contains(FORCE) && p.contains("avx2")), "{bad:?}");
        for k in Kernel::ALL.into_iter().filter(|k| !k.runs_here()) {
            let c = choose(Some(k.name()));
            assert_eq!(c.kernel, widest, "{k} does not run here");
            assert!(c.problem.is_some_and(|p| p.contains("cannot run")));
        }
    }
}
