//! Shared bench set-up: the real model, real tool texts and queries, and catalogs of any size
//! made from them. Larger catalogs mix two real tool vectors and a little seeded noise, so they
//! look like embeddings (clustered, anisotropic), not uniform random vectors.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use toolmux::embed::Embedder;
use toolmux::embed::cache::VectorCache;
use toolmux::embed::worker::ModelEmbedder;

pub const DIM: usize = 384;

/// A file of the evaluation data vendored in `eval/data/` (see its README for sources and licences).
pub fn eval_data(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("eval").join("data").join(path)
}

pub fn model_files() -> toolmux::embed::files::ModelFiles {
    toolmux::embed::files::locate(
        toolmux::config::DEFAULT_MODEL,
        None,
        &toolmux::embed::files::default_model_roots(),
        false,
    )
    .expect("run models/fetch.sh first")
}

pub fn model() -> Arc<ModelEmbedder> {
    Arc::new(ModelEmbedder::start(&model_files()).expect("model loads"))
}

/// The model in `precision` (`optimizer.precision`).
pub fn model_in(precision: toolmux::config::Precision) -> Arc<ModelEmbedder> {
    let batching = toolmux::embed::worker::Batching::default();
    Arc::new(ModelEmbedder::start_with(&model_files(), batching, precision).expect("model loads"))
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Real tool texts (the apigen set, in find_tool's text form) and real queries.
pub fn texts() -> (Vec<String>, Vec<String>) {
    let catalog = toolmux::eval::catalog(&eval_data("toolret-apigen/tools.jsonl")).unwrap();
    let tools = catalog.tools().iter().map(|t| t.text.clone()).collect();
    let queries = lines(&eval_data("toolret-apigen/queries.dev.jsonl"))
        .iter()
        .map(|q| q["query"].as_str().unwrap().to_string())
        .collect();
    (tools, queries)
}

/// Vectors for `texts`, from the on-disk cache where possible.
pub fn embed_cached(rt: &tokio::runtime::Runtime, m: &Arc<ModelEmbedder>, texts: &[String]) -> Vec<Vec<f32>> {
    let cache = VectorCache::open(toolmux::embed::cache::default_dir().as_deref(), m.model_id(), m.dim()).ok();
    let mut out = vec![Vec::new(); texts.len()];
    let mut missing = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        match cache.as_ref().and_then(|c| c.get(&c.key(t))) {
            Some(v) => out[i] = v,
            None => missing.push(i),
        }
    }
    if !missing.is_empty() {
        eprintln!("embedding {} texts once (cached for later runs) ...", missing.len());
        for chunk in missing.chunks(256) {
            let vs = rt.block_on(m.embed(chunk.iter().map(|&i| texts[i].clone()).collect())).unwrap();
            let mut fresh = Vec::new();
            for (&i, v) in chunk.iter().zip(vs) {
                if let Some(c) = &cache {
                    fresh.push((c.key(&texts[i]), v.clone()));
                }
                out[i] = v;
            }
            if let Some(c) = &cache {
                c.insert_all(&fresh).unwrap();
            }
        }
    }
    out
}

/// `n` unit vectors shaped like tool embeddings, slot-major.
pub fn synthetic(real: &[Vec<f32>], n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * DIM);
    for i in 0..n {
        if i < real.len() {
            out.extend_from_slice(&real[i]);
            continue;
        }
        let a = &real[rng.random_range(0..real.len())];
        let b = &real[rng.random_range(0..real.len())];
        let w: f32 = rng.random_range(0.55..0.9);
        let mut v: Vec<f32> =
            a.iter().zip(b).map(|(x, y)| w * x + (1.0 - w) * y + rng.random_range(-0.02..0.02)).collect();
        toolmux::embed::normalize(&mut v);
        out.extend(v);
    }
    out
}

/// An optimizer-mode gateway over `store`, with no backends and health monitoring off: enough to
/// drive find_tool through the handler.
pub fn optimizer_gateway(store: Arc<toolmux::store::Store>) -> Arc<toolmux::mcp::Gateway> {
    let upstream =
        Arc::new(toolmux::upstream::Upstream::new(&[], Arc::new(toolmux::upstream::NoRelay), Default::default()));
    let health = toolmux::health::Monitor::new(
        toolmux::config::HealthConfig { interval: std::time::Duration::ZERO, ..Default::default() },
        &upstream,
    );
    toolmux::mcp::Gateway::new(toolmux::mcp::gateway::Parts::optimizer(
        store,
        upstream,
        health,
        Arc::new(toolmux::session::AllowAll),
    ))
}

/// Resident memory of this process, in MiB (Linux; 0 elsewhere).
pub fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// Peak resident memory of this process so far, in MiB (Linux; 0 elsewhere).
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// Resident memory of process `pid`, in MiB (Linux; 0 elsewhere).
pub fn rss_mib_of(pid: u32) -> f64 {
    status_mib_of(&format!("/proc/{pid}/status"), "VmRSS:")
}

fn status_mib(field: &str) -> f64 {
    status_mib_of("/proc/self/status", field)
}

fn status_mib_of(path: &str, field: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The median of some timings (sorts them).
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The `toolmux` binary serving a configuration in a child process, ended on drop.
pub struct ChildGateway {
    child: std::process::Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl ChildGateway {
    /// Starts `toolmux serve` on `toml` (which should listen on 127.0.0.1:0).
    pub fn start(toml: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("toolmux.toml");
        std::fs::write(&config, toml).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toolmux"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("the toolmux binary starts");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let url = line.split_whitespace().find(|w| w.starts_with("http://")).expect("the listening line").to_string();
        Self { child, url, _dir: dir }
    }

    pub async fn ready(&self) {
        let readyz = format!("{}/readyz", self.url.trim_end_matches("/mcp"));
        for _ in 0..600 {
            if reqwest::get(&readyz).await.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the gateway did not become ready");
    }

    pub fn rss(&self) -> f64 {
        rss_mib_of(self.child.id())
    }
}

impl Drop for ChildGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const ACCEPT: &str = "application/json, text/event-stream";

/// A client session spoken to in raw HTTP, as a benchmark wants it: no SDK in the timings.
pub struct RawSession {
    http: reqwest::Client,
    url: String,
    pub id: String,
}

impl RawSession {
    pub async fn open(http: reqwest::Client, url: &str) -> Self {
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
        let r = http.post(url).header("accept", ACCEPT).json(&init).send().await.unwrap();
        assert!(r.status().is_success(), "initialize: {}", r.status());
        let id = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        r.bytes().await.unwrap();
        let s = Self { http, url: url.to_string(), id };
        s.post(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        s
    }

    /// The same session, its requests sent to `url` (another replica).
    pub fn at(&self, url: &str) -> Self {
        Self { http: self.http.clone(), url: url.to_string(), id: self.id.clone() }
    }

    /// Posts one message and reads its whole answer.
    pub async fn post(&self, body: &Value) -> String {
        let r = self
            .http
            .post(&self.url)
            .header("accept", ACCEPT)
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25")
            .json(body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        r.text().await.unwrap()
    }

    pub async fn delete(&self) {
        let r = self.http.delete(&self.url).header("mcp-session-id", &self.id).send().await.unwrap();
        assert!(r.status().is_success(), "DELETE: {}", r.status());
    }
}

pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
