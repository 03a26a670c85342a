//! find_tool end to end through the handler (argument checks, query embedding, both arms over
//! the caller's snapshot, fusion, match verdict, result JSON) at 150, 1,000 and 10,000 tools, for
//! a new request (the model runs), a new two-part request (the model runs on the request and
//! its two clauses) and a repeated one (query vectors cached). The model alone is timed in the
//! same run, so the figures read as "model + the rest". Last, a new request again with learning
//! from use active and a learned vector for every tool it can hold (4,096, two labels each): the
//! worst case of the re-ranking it adds.
//!
//! `cargo bench --bench find_tool`; prints p50 / p90 in milliseconds.
//!
//! `cargo bench --bench find_tool -- concurrent`: instead, many callers at once over the
//! 10,000-tool catalog, each asking new requests in turn (1, 8, 64 and 256 callers), with the
//! model in f32 answering one request per encoder pass (the encoder as it was before batching
//! and int8), in this machine's precision one request per pass, and batching the requests that
//! wait together, side by side in one run: requests per second, p50 and p99, and how many were
//! answered busy.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use toolmux::catalog::{Catalog, CatalogTool, ToolKey};
use toolmux::embed::Embedder;
use toolmux::index::dense::{DenseIndex, GRAPH_MIN_SLOTS};
use toolmux::session::{AllowAll, Caller, scope};
use toolmux::store::{Generation, Store};

use support::*;

const RUNS: usize = 150;

/// A catalog of `n` tools: the demo catalog for the smallest size, else real apigen tools
/// (repeated under new names beyond 3,605) with their real vectors (mixed ones beyond).
fn generation(rt: &tokio::runtime::Runtime, m: &Arc<toolmux::embed::worker::ModelEmbedder>, n: usize) -> Generation {
    let tools: Vec<CatalogTool> = if n <= 200 {
        toolmux::demo::backends()
            .into_iter()
            .flat_map(|b| {
                let name = b.name.clone();
                b.tools.into_iter().map(move |t| {
                    let key = ToolKey { backend: Arc::from(name.as_str()), tool: Arc::from(&*t.name) };
                    let mut exposed = t.clone();
                    exposed.name = format!("{name}_{}", t.name).into();
                    CatalogTool::new(key, exposed, None)
                })
            })
            .collect()
    } else {
        let apigen = toolmux::eval::catalog(&eval_data("toolret-apigen/tools.jsonl")).unwrap();
        apigen
            .tools()
            .iter()
            .cycle()
            .take(n)
            .enumerate()
            .map(|(i, t)| {
                let mut tool = t.tool.clone();
                tool.name = format!("{}_{i}", t.name()).into();
                let backend = format!("b{}", i % 20);
                CatalogTool::new(
                    ToolKey { backend: Arc::from(backend.as_str()), tool: Arc::from(&*tool.name) },
                    tool,
                    None,
                )
            })
            .collect()
    };
    let catalog = Catalog::from_tools(tools);
    let texts: Vec<String> = catalog.tools().iter().map(|t| t.text.clone()).collect();
    let real = embed_cached(rt, m, &texts[..texts.len().min(3_605)]);
    let data = synthetic(&real, catalog.len(), 11);
    let keyword = Generation::keyword_only(catalog);
    Generation::new(1, keyword.catalog, Some(DenseIndex::build(DIM, data, GRAPH_MIN_SLOTS)), keyword.keyword)
}

fn report(label: &str, mut times: Vec<Duration>) {
    times.sort();
    println!("| {label} | {:.2} | {:.2} |", ms(percentile(&times, 0.5)), ms(percentile(&times, 0.9)));
}

fn main() {
    if std::env::args().any(|a| a == "concurrent") {
        return concurrent();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = model();
    println!("| case | p50 ms | p90 ms |");
    println!("|---|---:|---:|");
    let mut n = 0u64;
    let model_alone: Vec<Duration> = (0..RUNS)
        .map(|_| {
            n += 1;
            let q = format!("send a chat message to the team {n}");
            let at = Instant::now();
            rt.block_on(m.embed(vec![q])).unwrap();
            at.elapsed()
        })
        .collect();
    report("model alone, one new request", model_alone);
    for size in [150, 1_000, 10_000] {
        let generation = Arc::new(generation(&rt, &m, size));
        let store = Arc::new(Store::new(Some(m.clone()), None));
        let learned = Arc::new(toolmux::store::learned::Learned::new(true, DIM, None));
        store.set_learned(learned.clone());
        let gw = optimizer_gateway(store);
        let handler = toolmux::mcp::GatewayHandler::new(gw);
        let snap = scope(generation.clone(), &|_| true, &AllowAll, &Caller::anonymous());
        let tools = generation.catalog.len();
        let args = |q: String| {
            let mut a = serde_json::Map::new();
            a.insert("tool_description".into(), q.into());
            a
        };
        let time = |make: &mut dyn FnMut(usize) -> String| -> Vec<Duration> {
            (0..RUNS)
                .map(|i| {
                    let a = args(make(i));
                    let at = Instant::now();
                    let (r, _) = rt.block_on(handler.find_tool(Some(&a), &snap));
                    let took = at.elapsed();
                    assert_ne!(r.is_error, Some(true));
                    took
                })
                .collect()
        };
        n += 1_000;
        let base = n;
        report(
            &format!("{tools} tools, new request"),
            time(&mut |i| format!("send a chat message to the team {}", base + i as u64)),
        );
        report(
            &format!("{tools} tools, new two-part request"),
            time(&mut |i| {
                format!("Fetch the stock price of item {}. Also, list the countries in Europe {}.", base + i as u64, i)
            }),
        );
        report(
            &format!("{tools} tools, repeated request"),
            time(&mut |_| "create a pull request on a code repository".to_string()),
        );
        // Learning active: every tool (up to the store's bound) has a learned vector.
        let dense = generation.dense.as_ref().expect("vectors");
        for (slot, t) in generation.catalog.tools().iter().enumerate().take(toolmux::store::learned::MAX_TOOLS) {
            // Two principals each: enough for a learned vector to count.
            for principal in ["a", "b"] {
                learned.record(&dense.vector(slot as u32), &t.key, principal);
            }
        }
        assert!(learned.active());
        n += 1_000;
        let base = n;
        report(
            &format!("{tools} tools, new request, learning active"),
            time(&mut |i| format!("send a chat message to the team {}", base + i as u64)),
        );
    }
}

/// Requests per caller at each level: about 512 requests a level, at least 4 per caller.
fn per_caller(callers: usize) -> usize {
    (512 / callers).max(4)
}

fn concurrent() {
    use toolmux::embed::worker::{Batching, ModelEmbedder};
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let start = |batching, precision| {
        Arc::new(ModelEmbedder::start_with(&model_files(), batching, precision).expect("model loads"))
    };
    let before = start(Batching::none(), toolmux::config::Precision::F32);
    let plain = start(Batching::none(), Default::default());
    let batched = start(Batching::default(), Default::default());
    let generation = Arc::new(generation(&rt, &batched, 10_000));
    let snap = Arc::new(scope(generation.clone(), &|_| true, &AllowAll, &Caller::anonymous()));
    println!("| callers | model | requests/s | p50 ms | p99 ms | busy |");
    println!("|---:|---|---:|---:|---:|---:|");
    let mut n = 0u64;
    for callers in [1usize, 8, 64, 256] {
        let models = [("f32, one request per pass", &before), ("one request per pass", &plain), ("batched", &batched)];
        for (label, m) in models {
            let handler = Arc::new(toolmux::mcp::GatewayHandler::new(optimizer_gateway(Arc::new(Store::new(
                Some(m.clone() as Arc<dyn Embedder>),
                None,
            )))));
            n += 100_000;
            let base = n;
            let each = per_caller(callers);
            let started = Instant::now();
            let runs = (0..callers).map(|c| {
                let (handler, snap) = (handler.clone(), snap.clone());
                rt.spawn(async move {
                    let mut times = Vec::with_capacity(each);
                    let mut busy = 0;
                    for i in 0..each {
                        let mut a = serde_json::Map::new();
                        let q = format!("send a chat message to the team {}", base + (c * each + i) as u64);
                        a.insert("tool_description".into(), q.into());
                        let at = Instant::now();
                        let (r, _) = handler.find_tool(Some(&a), &snap).await;
                        times.push(at.elapsed());
                        busy += usize::from(r.is_error == Some(true));
                    }
                    (times, busy)
                })
            });
            let results: Vec<(Vec<Duration>, usize)> =
                rt.block_on(futures::future::join_all(runs)).into_iter().map(|r| r.unwrap()).collect();
            let wall = started.elapsed();
            let busy: usize = results.iter().map(|(_, b)| b).sum();
            let mut times: Vec<Duration> = results.into_iter().flat_map(|(t, _)| t).collect();
            times.sort();
            let total = times.len();
            println!(
                "| {callers} | {label} | {:.0} | {:.1} | {:.1} | {busy} |",
                total as f64 / wall.as_secs_f64(),
                ms(percentile(&times, 0.5)),
                ms(percentile(&times, 0.99)),
            );
        }
    }
}
