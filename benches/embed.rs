//! Embedding speed: toolmux's candle model, in f32 and in int8 (`optimizer.precision`), against
//! the standard CPU alternatives: sentence-transformers on torch, and ONNX Runtime running the
//! model quantised to int8 by its own dynamic quantisation, on the same machine, model files and
//! texts, in alternating rounds so that every side sees the same background load. Prints each
//! side's figures and the ratios.
//!
//! The baselines run when `benches/python/setup.sh` has installed them (or
//! `TOOLMUX_BASELINE_PYTHON` names a python with torch, sentence-transformers and, for the
//! second, onnxruntime); otherwise only candle is measured. Before timing, every side embeds the
//! same texts: torch must agree with candle f32 (cosine ≥ 0.999); ONNX Runtime's int8 is only
//! held to 0.95 (its dynamic quantisation strays further than toolmux's int8, which the golden
//! test holds to 0.995), and its lowest cosine is printed beside candle int8's.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};
use toolmux::embed::Embedder;

use support::*;

const ROUNDS: usize = 5;
const QUERIES_PER_ROUND: usize = 12;
const BATCH: usize = 32;
const BATCH_REPEAT: usize = 3;
const CATALOG: usize = 256;

/// The Python worker (`benches/python/st_worker.py`), driven one request at a time.
struct Baseline {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Baseline {
    fn python() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("TOOLMUX_BASELINE_PYTHON") {
            return Some(PathBuf::from(p));
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(cache.join("toolmux/python-baseline/bin/python")).filter(|p| p.exists())
    }

    /// `engine`: `torch` or `ort-int8` (`benches/python/st_worker.py`).
    fn start(model_dir: &std::path::Path, threads: usize, engine: &str) -> Option<Self> {
        let python = Self::python()?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/python/st_worker.py");
        let mut child = Command::new(&python)
            .arg(script)
            .arg(model_dir)
            .arg(threads.to_string())
            .arg(engine)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| eprintln!("baseline: cannot start {}: {e}", python.display()))
            .ok()?;
        let stdin = child.stdin.take()?;
        let mut stdout = BufReader::new(child.stdout.take()?);
        let mut ready = String::new();
        stdout.read_line(&mut ready).ok()?;
        if !ready.contains("ready") {
            eprintln!(
                "baseline: the worker did not start (is sentence-transformers installed for {}?)",
                python.display()
            );
            return None;
        }
        Some(Self { child, stdin, stdout })
    }

    fn ask(&mut self, request: Value) -> Value {
        writeln!(self.stdin, "{request}").expect("baseline worker alive");
        self.stdin.flush().expect("baseline worker alive");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("baseline worker answers");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("baseline answered {line:?}: {e}"))
    }

    fn seconds(&mut self, request: Value) -> Vec<f64> {
        let r = self.ask(request);
        r["seconds"].as_array().unwrap_or_else(|| panic!("baseline: {r}")).iter().filter_map(Value::as_f64).collect()
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-12)
}

/// Every `step`-th text from the middle of the list, so lengths are mixed.
fn sample(texts: &[String], n: usize, offset: usize) -> Vec<String> {
    let step = (texts.len() / n).max(1);
    texts.iter().skip(offset % step).step_by(step).take(n).cloned().collect()
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let files = model_files();
    // Named precisions: `model()` takes the default. int8 once per kernel this CPU runs, side by
    // side (`TOOLMUX_INT8_KERNEL` narrows the list to that kernel and the ones narrower).
    use toolmux::config::Precision;
    use toolmux::simd::int8::Kernel;
    let m = model_in(Precision::F32);
    let widest = toolmux::simd::int8::choice().kernel;
    let kernels: Vec<Kernel> = Kernel::ALL.into_iter().skip_while(|k| *k != widest).filter(|k| k.runs_here()).collect();
    let int8: Vec<_> = kernels.iter().map(|&k| (k, model_in(Precision::Int8(k)))).collect();
    let m8 = &int8[0].1;
    eprintln!("int8 kernels measured: {}", kernels.iter().map(|k| k.name()).collect::<Vec<_>>().join(", "));
    let (tool_texts, query_texts) = texts();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let queries: Vec<String> = query_texts.iter().take(ROUNDS * QUERIES_PER_ROUND).cloned().collect();
    let batch = sample(&tool_texts, BATCH, 3);
    let catalog = sample(&tool_texts, CATALOG, 5);
    let mean_chars = |t: &[String]| t.iter().map(String::len).sum::<usize>() / t.len().max(1);
    eprintln!(
        "texts: {} queries (~{} chars), a batch of {BATCH} and a catalog of {CATALOG} apigen tool texts (~{} chars)",
        queries.len(),
        mean_chars(&queries),
        mean_chars(&catalog)
    );

    let model_dir = files.config.parent().expect("model folder").to_path_buf();
    // (name, worker, its timings): the baselines that are set up.
    let mut baselines: Vec<(&str, Baseline, Timings)> = Vec::new();
    for (engine, name, floor) in [("torch", "torch", 0.999), ("ort-int8", "ORT int8", 0.95)] {
        let Some(mut py) = Baseline::start(&model_dir, threads, engine) else {
            eprintln!("baseline {engine}: not set up (run benches/python/setup.sh); not measured");
            continue;
        };
        let info = py.ask(json!({"op": "info"}));
        eprintln!(
            "baseline {name}: {} / sentence-transformers {}, {} threads",
            info["runtime"], info["sentence_transformers"], info["threads"]
        );
        // Every side must embed alike, or the comparison means nothing.
        let probe: Vec<String> = batch.iter().take(6).cloned().chain(["".to_string(), queries[0].clone()]).collect();
        let ours = rt.block_on(m.embed(probe.clone())).unwrap();
        let theirs = py.ask(json!({"op": "vectors", "texts": probe}));
        let theirs: Vec<Vec<f32>> = serde_json::from_value(theirs["vectors"].clone()).unwrap();
        let worst = ours.iter().zip(&theirs).map(|(a, b)| cosine(a, b)).fold(1.0, f64::min);
        let ours8 = rt.block_on(m8.embed(probe.clone())).unwrap();
        let worst8 = ours.iter().zip(&ours8).map(|(a, b)| cosine(a, b)).fold(1.0, f64::min);
        eprintln!("agreement: lowest cosine to candle f32: {name} {worst:.6}, candle int8 {worst8:.6}");
        assert!(worst >= floor, "candle and {name} disagree: cosine {worst}");
        baselines.push((name, py, Timings::default()));
    }

    let mut ours = Timings::default();
    let mut ours8: Vec<Timings> = int8.iter().map(|_| Timings::default()).collect();
    for round in 0..ROUNDS {
        let qs = &queries[round * QUERIES_PER_ROUND..(round + 1) * QUERIES_PER_ROUND];
        let candle = |m: &std::sync::Arc<toolmux::embed::worker::ModelEmbedder>, into: &mut Timings| {
            for q in qs {
                let t = Instant::now();
                rt.block_on(m.embed(vec![q.clone()])).unwrap();
                into.query.push(t.elapsed().as_secs_f64());
            }
            for _ in 0..BATCH_REPEAT {
                let t = Instant::now();
                rt.block_on(m.embed(batch.clone())).unwrap();
                into.batch.push(t.elapsed().as_secs_f64());
            }
            let t = Instant::now();
            rt.block_on(m.embed(catalog.clone())).unwrap();
            into.catalog.push(t.elapsed().as_secs_f64());
        };
        // Alternate who goes first, so neither side always runs on a warmer machine.
        if round % 2 == 1 {
            candle(&m, &mut ours);
            for ((_, m8), t) in int8.iter().zip(&mut ours8) {
                candle(m8, t);
            }
        }
        for (_, py, theirs) in &mut baselines {
            theirs.query.extend(py.seconds(json!({"op": "query", "texts": qs})));
            theirs.batch.extend(
                py.seconds(json!({"op": "batch", "texts": batch, "batch_size": BATCH, "repeat": BATCH_REPEAT})),
            );
            theirs
                .catalog
                .extend(py.seconds(json!({"op": "batch", "texts": catalog, "batch_size": BATCH, "repeat": 1})));
        }
        if round % 2 == 0 {
            for ((_, m8), t) in int8.iter().zip(&mut ours8).rev() {
                candle(m8, t);
            }
            candle(&m, &mut ours);
        }
        eprintln!("round {}/{ROUNDS} done", round + 1);
    }

    println!("\nembedding, {threads} threads, medians of {ROUNDS} alternating rounds");
    let theirs = |name: &str| baselines.iter().position(|(n, ..)| *n == name);
    let (torch, ort) = (theirs("torch"), theirs("ORT int8"));
    let mut timings: Vec<Timings> = baselines.iter_mut().map(|(.., t)| std::mem::take(t)).collect();
    let mut head = format!("{:<34} {:>12}", "", "candle f32");
    for k in &kernels {
        head += &format!(" {:>14} {:>9}", format!("int8 {k}"), "/f32");
    }
    println!("{head} {:>12} {:>12} {:>10} {:>14}", "torch", "ORT int8", "f32/torch", "int8/ORT int8");
    let mut row = |label: &str, pick: &dyn Fn(&mut Timings) -> f64, unit: &str, higher_is_better: bool| {
        let better = |x: f64, y: f64| if higher_is_better { x / y } else { y / x };
        let a = pick(&mut ours);
        let a8: Vec<f64> = ours8.iter_mut().map(pick).collect();
        let mut of = |i: Option<usize>| i.map(|i| pick(&mut timings[i]));
        let (t, o) = (of(torch), of(ort));
        let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} {unit}"));
        let ratio = |x: f64, y: Option<f64>| y.map_or("-".into(), |y| format!("{:.2}x", better(x, y)));
        let mut line = format!("{label:<34} {:>12}", format!("{a:.1} {unit}"));
        for &v in &a8 {
            line += &format!(" {:>14} {:>9}", format!("{v:.1} {unit}"), format!("{:.2}x", better(v, a)));
        }
        println!("{line} {:>12} {:>12} {:>10} {:>14}", show(t), show(o), ratio(a, t), ratio(a8[0], o));
    };
    row("query p50", &|t| t.query_ms(), "ms", false);
    row(&format!("batch of {BATCH}, texts/s"), &|t| t.rate(BATCH, |t| &mut t.batch), "/s", true);
    row(
        &format!("{CATALOG} texts in batches of {BATCH}, texts/s"),
        &|t| t.rate(CATALOG, |t| &mut t.catalog),
        "/s",
        true,
    );
    // The physical floor of a query: the dense layers' weights, streamed once, at the memory
    // bandwidth of this machine.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&files.config).unwrap()).unwrap();
    let (h, i, layers) = (
        config["hidden_size"].as_u64().unwrap() as f64,
        config["intermediate_size"].as_u64().unwrap() as f64,
        config["num_hidden_layers"].as_u64().unwrap() as f64,
    );
    let params = layers * (4.0 * h * h + 2.0 * h * i);
    let gbps = read_bandwidth_gbps(threads);
    let block = toolmux::simd::BLOCK as f64;
    for (label, bytes) in [("f32", params * 4.0), ("int8", params * (1.0 + 4.0 / block))] {
        println!(
            "floor, {label}: {:.1} MB of dense weights / {gbps:.1} GB/s read bandwidth = {:.2} ms a query",
            bytes / 1e6,
            bytes / (gbps * 1e9) * 1e3
        );
    }
    let theirs_rss: Vec<String> = baselines
        .iter_mut()
        .map(|(name, py, _)| {
            let rss = py.ask(json!({"op": "info"}))["peak_rss_mib"].as_f64().unwrap_or(0.0);
            format!("{name}: {rss:.0} MiB")
        })
        .collect();
    println!(
        "peak RSS of this process (every candle model above loaded): {:.0} MiB; {}",
        peak_rss_mib(),
        if theirs_rss.is_empty() { "no baseline".to_string() } else { theirs_rss.join(", ") }
    );
    println!("(ratios: how many times better the first is; above 1.00 it is faster)");
}

/// Memory read bandwidth with `threads` threads summing their share of a buffer far larger than
/// the caches: the best of five passes.
fn read_bandwidth_gbps(threads: usize) -> f64 {
    let words: usize = 64 << 20; // 512 MiB of u64
    let buffer: Vec<u64> = (0..words as u64).collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let parts: Vec<_> = buffer
                .chunks(words.div_ceil(threads))
                .map(|part| s.spawn(move || part.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            parts.into_iter().map(|p| p.join().unwrap()).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best / 1e9
}

#[derive(Default)]
struct Timings {
    query: Vec<f64>,
    batch: Vec<f64>,
    catalog: Vec<f64>,
}

impl Timings {
    fn query_ms(&mut self) -> f64 {
        median(&mut self.query) * 1000.0
    }

    fn rate(&mut self, n: usize, f: impl Fn(&mut Self) -> &mut Vec<f64>) -> f64 {
        n as f64 / median(f(self))
    }
}
