//! Each int8 matrix-product kernel alone, one thread, on the encoder's four product shapes:
//! multiply-adds per second, and what a query and a 10,000-tool catalog of the benches' texts
//! cost in products alone.
//!
//! The encoder's figures (`--bench embed`) mix the products with attention, GELU, LayerNorm and
//! the threads' hand-offs; this says how close each kernel runs to its own arithmetic bound, and
//! so whether a goal for a query can be met by the kernel at all. Weights are random codes, in
//! L2 as the encoder's layer weights are not: a ceiling for the kernel, not a pass.
//!
//! `cargo bench --bench int8` (every kernel this CPU runs; `TOOLMUX_INT8_KERNEL` starts the list
//! at a narrower one).

use std::time::Instant;

use rand::{Rng, SeedableRng, rngs::StdRng};
use toolmux::simd::int8::{Activations, Kernel, Packed, choice, gemm};

/// all-MiniLM-L6-v2's dense layers: (output columns, inner size) of the fused query/key/value
/// product, the attention output, the feed-forward up and down products.
const SHAPES: [(&str, usize, usize); 4] =
    [("qkv", 1152, 384), ("attention out", 384, 384), ("ffn up", 1536, 384), ("ffn down", 384, 1536)];
/// Rows: a query of the benches' apigen requests (29.5 tokens on average), and a batch pass of
/// apigen tool texts (65.3 tokens on average).
const ROWS: [usize; 2] = [30, 512];
/// Multiply-adds per token of the whole encoder: 6 layers of the shapes above.
const MACS_PER_TOKEN: f64 = 6.0 * (1152.0 * 384.0 + 384.0 * 384.0 + 1536.0 * 384.0 + 384.0 * 1536.0);

fn main() {
    let widest = choice().kernel;
    let kernels: Vec<Kernel> =
        Kernel::ALL.into_iter().skip_while(|k| *k != widest).filter(|k| k.lanes().is_some() && k.runs_here()).collect();
    eprintln!("int8 kernels: {}; one thread; {} M multiply-adds a token", names(&kernels), MACS_PER_TOKEN / 1e6);
    let mut rng = StdRng::seed_from_u64(3);
    for kernel in kernels {
        for rows in ROWS {
            let (mut macs, mut seconds) = (0f64, 0f64);
            for (name, cols, inner) in SHAPES {
                let top = kernel.weight_max_code() as i8;
                let codes: Vec<i8> = (0..cols * inner).map(|_| rng.random_range(-top..=top)).collect();
                let scales: Vec<f32> = (0..cols * inner.div_ceil(32)).map(|_| rng.random_range(0.001..0.01)).collect();
                let w = Packed::new(kernel, &codes, &scales, cols, inner);
                let x: Vec<f32> = (0..rows * inner).map(|_| rng.random_range(-3.0..3.0)).collect();
                let xq = Activations::quantize(kernel, &x, rows, inner);
                let mut out = vec![0f32; rows * cols];
                let run = |out: &mut Vec<f32>| {
                    // SAFETY: `out` is rows × cols and this thread's alone.
                    unsafe { gemm(&w, &xq, rows, 0..w.groups, out.as_mut_ptr()) }
                };
                run(&mut out);
                let (start, mut n) = (Instant::now(), 0u32);
                while start.elapsed().as_secs_f64() < 0.5 {
                    run(&mut out);
                    n += 1;
                }
                let s = start.elapsed().as_secs_f64() / f64::from(n);
                let m = (rows * cols * inner) as f64;
                eprintln!(
                    "  {:12} {rows:4} rows  {name:14} {:8.1} µs  {:6.1} GMAC/s",
                    kernel.name(),
                    s * 1e6,
                    m / s / 1e9
                );
                macs += m;
                seconds += s;
            }
            let rate = macs / seconds;
            // What the products alone cost at this rate, on one thread and on two.
            let what = if rows == ROWS[0] {
                let ms = 29.5 * MACS_PER_TOKEN / rate * 1e3;
                format!("a 29.5-token query's products {ms:.2} ms, {:.2} ms on two threads", ms / 2.0)
            } else {
                let s = 10_000.0 * 65.3 * MACS_PER_TOKEN / rate;
                format!("10,000 tool texts of 65.3 tokens: products {s:.0} s, {:.0} s on two threads", s / 2.0)
            };
            println!("{:12} {rows:4} rows: {:6.1} GMAC/s on one thread; {what}", kernel.name(), rate / 1e9);
        }
    }
}

fn names(kernels: &[Kernel]) -> String {
    kernels.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
}
