//! Embedding speed: toolmux's candle model, in f32 and in int8 (`optimizer.precision`), against
//! sentence-transformers on torch (CPU), the Python baseline, on the same machine, model files
//! and texts, in alternating rounds so that every side sees the same background load. Prints each
//! side's figures and the ratios.
//!
//! The baseline runs when `benches/python/setup.sh` has installed it (or `TOOLMUX_BASELINE_PYTHON`
//! names a python with torch and sentence-transformers); otherwise only candle is measured.
//! Before timing, both sides embed the same texts and must agree (cosine ≥ 0.999).

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

    fn start(model_dir: &std::path::Path, threads: usize) -> Option<Self> {
        let python = Self::python()?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/python/st_worker.py");
        let mut child = Command::new(&python)
            .arg(script)
            .arg(model_dir)
            .arg(threads.to_string())
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
    let m = model();
    let m8 = model_in(toolmux::config::Precision::Int8);
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
    let mut py = Baseline::start(&model_dir, threads);
    match &mut py {
        None => eprintln!("baseline: not set up (run benches/python/setup.sh); measuring candle only"),
        Some(py) => {
            let info = py.ask(json!({"op": "info"}));
            eprintln!(
                "baseline: torch {} / sentence-transformers {}, {} threads",
                info["torch"], info["sentence_transformers"], info["threads"]
            );
            // Both sides must embed alike, or the comparison means nothing.
            let probe: Vec<String> =
                batch.iter().take(6).cloned().chain(["".to_string(), queries[0].clone()]).collect();
            let ours = rt.block_on(m.embed(probe.clone())).unwrap();
            let theirs = py.ask(json!({"op": "vectors", "texts": probe}));
            let theirs: Vec<Vec<f32>> = serde_json::from_value(theirs["vectors"].clone()).unwrap();
            let worst = ours.iter().zip(&theirs).map(|(a, b)| cosine(a, b)).fold(1.0, f64::min);
            eprintln!("agreement: lowest cosine between candle and torch vectors {worst:.6}");
            assert!(worst >= 0.999, "candle and torch disagree: cosine {worst}");
        }
    }

    let mut ours = Timings::default();
    let mut ours8 = Timings::default();
    let mut theirs = Timings::default();
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
            candle(&m8, &mut ours8);
        }
        if let Some(py) = &mut py {
            theirs.query.extend(py.seconds(json!({"op": "query", "texts": qs})));
            theirs.batch.extend(
                py.seconds(json!({"op": "batch", "texts": batch, "batch_size": BATCH, "repeat": BATCH_REPEAT})),
            );
            theirs
                .catalog
                .extend(py.seconds(json!({"op": "batch", "texts": catalog, "batch_size": BATCH, "repeat": 1})));
        }
        if round % 2 == 0 {
            candle(&m8, &mut ours8);
            candle(&m, &mut ours);
        }
        eprintln!("round {}/{ROUNDS} done", round + 1);
    }

    println!("\nembedding, {threads} threads, medians of {ROUNDS} alternating rounds");
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "", "candle f32", "candle int8", "torch", "int8/f32", "f32/torch"
    );
    let row = |label: &str, a: f64, a8: f64, b: Option<f64>, unit: &str, higher_is_better: bool| {
        let better = |x: f64, y: f64| if higher_is_better { x / y } else { y / x };
        println!(
            "{label:<34} {:>12} {:>12} {:>12} {:>10} {:>10}",
            format!("{a:.1} {unit}"),
            format!("{a8:.1} {unit}"),
            b.map_or("-".into(), |b| format!("{b:.1} {unit}")),
            format!("{:.2}x", better(a8, a)),
            b.map_or("-".into(), |b| format!("{:.2}x", better(a, b))),
        );
    };
    let has = py.is_some();
    row("query p50", ours.query_ms(), ours8.query_ms(), has.then(|| theirs.query_ms()), "ms", false);
    row(
        &format!("batch of {BATCH}, texts/s"),
        ours.rate(BATCH, |t| &mut t.batch),
        ours8.rate(BATCH, |t| &mut t.batch),
        has.then(|| theirs.rate(BATCH, |t| &mut t.batch)),
        "/s",
        true,
    );
    row(
        &format!("{CATALOG} texts in batches of {BATCH}, texts/s"),
        ours.rate(CATALOG, |t| &mut t.catalog),
        ours8.rate(CATALOG, |t| &mut t.catalog),
        has.then(|| theirs.rate(CATALOG, |t| &mut t.catalog)),
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
    let py_rss = py.as_mut().map(|p| p.ask(json!({"op": "info"}))["peak_rss_mib"].as_f64().unwrap_or(0.0));
    println!(
        "peak RSS of this process (both candle models loaded): {:.0} MiB; torch: {}",
        peak_rss_mib(),
        py_rss.map_or("-".into(), |r| format!("{r:.0} MiB"))
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
