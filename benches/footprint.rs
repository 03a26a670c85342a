//! Footprint: what a toolmux process holds and how fast it comes back.
//!
//! 1. Memory, measured in a fresh child process so that nothing of the set-up counts: the model
//!    plus a 10,000-tool store (3,605 real apigen tools and 6,395 variants whose vectors mix real
//!    ones, pre-seeded in a vector cache so no catalog embedding runs), 1,000 session snapshots,
//!    and find_tool queries through the handler: resident and peak memory (target: ≤ 400 MiB).
//!    Then the peak again after embedding 256 long tool texts cold, as a first start would.
//! 2. Restart: a store over 1,000 real tools whose vectors are in the on-disk cache, as after a
//!    restart with an unchanged catalog: time from nothing to a built generation, and the number
//!    of texts the model embedded (must be 0).

mod support;

use std::sync::Arc;
use std::time::Instant;

use toolmux::catalog::{Catalog, CatalogTool, ToolKey};
use toolmux::embed::Embedder;
use toolmux::embed::cache::VectorCache;
use toolmux::embed::worker::ModelEmbedder;
use toolmux::session::{AllowAll, Caller, scope};
use toolmux::store::Store;

use support::*;

const TOOLS: usize = 10_000;
const SESSIONS: usize = 1_000;
const RESTART_TOOLS: usize = 1_000;

/// `n` tools: the real apigen tools, then renamed variants of them, spread over 20 backends and
/// named as prefix resolution names them.
fn catalog_of(n: usize) -> Catalog {
    let real = toolmux::eval::catalog(&eval_data("toolret-apigen/tools.jsonl")).unwrap();
    let tools: Vec<CatalogTool> = (0..n)
        .map(|i| {
            let mut tool = real.tools()[i % real.len()].tool.clone();
            let original = match i / real.len() {
                0 => tool.name.to_string(),
                round => format!("{}_v{round}", tool.name),
            };
            let backend = format!("b{}", i % 20);
            tool.name = format!("{backend}_{original}").into();
            CatalogTool::new(
                ToolKey { backend: Arc::from(backend.as_str()), tool: Arc::from(original.as_str()) },
                tool,
                None,
            )
        })
        .collect();
    Catalog::from_tools(tools)
}

/// Set in the child process that measures memory: the folder of its pre-seeded vector cache.
const CHILD: &str = "TOOLMUX_FOOTPRINT_CACHE";

/// The memory figures, measured in this (child) process.
fn measure_memory(cache_dir: &std::path::Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = model();
    let (tool_texts, query_texts) = texts();
    let (before_store, load_peak) = (rss_mib(), peak_rss_mib());
    let cache = VectorCache::open(Some(cache_dir), m.model_id(), m.dim()).unwrap();
    let store = Arc::new(Store::new(Some(m.clone() as Arc<dyn Embedder>), Some(cache)));
    rt.block_on(store.rebuild(catalog_of(TOOLS)));
    assert_eq!(store.counters.texts_embedded.load(std::sync::atomic::Ordering::Relaxed), 0, "all vectors cached");
    let gw = optimizer_gateway(store.clone());
    let sessions: Vec<_> = {
        let _rt = rt.enter();
        (0..SESSIONS).map(|_| gw.open_session(Caller::anonymous(), None, None)).collect()
    };
    let handler = toolmux::mcp::GatewayHandler::new(gw.clone());
    for (i, q) in query_texts.iter().take(50).enumerate() {
        let mut args = serde_json::Map::new();
        args.insert("tool_description".into(), q.as_str().into());
        let (r, _) = rt.block_on(handler.find_tool(Some(&args), &sessions[i * 17 % SESSIONS].snapshot()));
        assert_ne!(r.is_error, Some(true));
    }
    let (steady, steady_peak) = (rss_mib(), peak_rss_mib());
    let cold: Vec<String> = tool_texts.iter().rev().take(256).map(|t| format!("{t} (cold)")).collect();
    rt.block_on(m.embed(cold)).unwrap();
    let cold_peak = peak_rss_mib();
    println!("{}", serde_json::json!([before_store, load_peak, steady, steady_peak, cold_peak]));
}

fn main() {
    if let Some(dir) = std::env::var_os(CHILD) {
        measure_memory(std::path::Path::new(&dir));
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = model();
    let (tool_texts, _) = texts();
    let real = embed_cached(&rt, &m, &tool_texts);

    // 1. Memory with a 10k-tool catalog, in a child process.
    let dir = tempfile::tempdir().unwrap();
    {
        let catalog = catalog_of(TOOLS);
        let vectors = synthetic(&real, TOOLS, 11);
        let cache = VectorCache::open(Some(dir.path()), m.model_id(), m.dim()).unwrap();
        let items: Vec<_> = catalog
            .tools()
            .iter()
            .zip(vectors.chunks_exact(DIM))
            .map(|(t, v)| (cache.key(&t.text), v.to_vec()))
            .collect();
        cache.insert_all(&items).unwrap();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env(CHILD, dir.path())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("the measuring child runs");
    assert!(out.status.success(), "the measuring child failed");
    let figures: Vec<f64> = serde_json::from_slice(
        out.stdout.split(|&b| b == b'\n').rfind(|l| l.starts_with(b"[")).expect("the child's figures"),
    )
    .unwrap();
    let [before_store, load_peak, steady, steady_peak, cold_peak] = figures[..] else { panic!("figures: {figures:?}") };
    let snapshot = {
        let store = Store::new(None, None);
        let generation = rt.block_on(store.rebuild(catalog_of(TOOLS)));
        scope(generation, &|_| true, &AllowAll, &Caller::anonymous()).heap_bytes()
    };

    // 2. Restart with 1,000 cached tools.
    let restart_catalog = catalog_of(RESTART_TOOLS);
    let restart_dir = tempfile::tempdir().unwrap();
    {
        let cache = VectorCache::open(Some(restart_dir.path()), m.model_id(), m.dim()).unwrap();
        let store = Store::new(Some(m.clone() as Arc<dyn Embedder>), Some(cache));
        rt.block_on(store.rebuild(restart_catalog.clone()));
    }
    let restart_once = |with_model: bool| {
        let t = Instant::now();
        let m = if with_model { Arc::new(ModelEmbedder::start(&model_files()).unwrap()) } else { m.clone() };
        let cache = VectorCache::open(Some(restart_dir.path()), m.model_id(), m.dim()).unwrap();
        let store = Store::new(Some(m as Arc<dyn Embedder>), Some(cache));
        rt.block_on(store.rebuild(restart_catalog.clone()));
        assert_eq!(store.counters.texts_embedded.load(std::sync::atomic::Ordering::Relaxed), 0, "nothing re-embedded");
        t.elapsed().as_secs_f64() * 1000.0
    };
    let restart = median(&mut (0..5).map(|_| restart_once(false)).collect::<Vec<_>>());
    let with_model = median(&mut (0..3).map(|_| restart_once(true)).collect::<Vec<_>>());

    println!("\nfootprint (memory from a fresh process)");
    println!("RSS with the model loaded                              {before_store:>8.0} MiB (peak {load_peak:.0})");
    println!(
        "RSS with {TOOLS} tools, {SESSIONS} sessions, 50 find_tool calls  {steady:>8.0} MiB (peak {steady_peak:.0}; target ≤ 400)"
    );
    println!("peak RSS after also embedding 256 long texts cold       {cold_peak:>8.0} MiB");
    println!(
        "one session snapshot over {TOOLS} tools                  {snapshot:>8} bytes (target ≤ {})",
        TOOLS / 8 + 1024
    );
    println!("restart with {RESTART_TOOLS} cached tools: store ready in        {restart:>8.1} ms, 0 texts embedded");
    println!("  the same, model load and checksums included            {with_model:>8.1} ms");
    assert!(steady_peak <= 400.0, "RSS {steady_peak} MiB over the 400 MiB target");
    assert!(snapshot <= TOOLS / 8 + 1024);
}
