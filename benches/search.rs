//! Search benchmarks: query and batch embedding, dense search by catalog size and allow-list
//! share (exact, HNSW, and the plan find_tool uses), and snapshot builds. find_tool end to end
//! is `benches/find_tool.rs`.
//! Before timing, each catalog's recall@10 against an exhaustive f32 scan is checked (≥ 0.99) for
//! both paths (the exhaustive search on byte codes and half-precision copies, and HNSW), the
//! memory of the tool vectors is printed beside what f32 vectors took, and the snapshot memory
//! target is checked. `f32_scan` times the f32 scan the index ran before it kept compact vectors,
//! so the two are compared in one run. Process memory is `benches/footprint.rs`'s business.

mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use toolmux::catalog::{CatalogTool, ToolKey};
use toolmux::embed::Embedder;
use toolmux::index::dense::DenseIndex;
use toolmux::index::{AllowList, Hit, top_k};
use toolmux::session::{AllowAll, Caller, scope};
use toolmux::simd::dot;

use support::*;

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
const SHARES: [f64; 3] = [0.01, 0.10, 1.00];

/// The exhaustive f32 scan: the ground truth, and what the index ran before it kept compact
/// vectors (every allowed vector's dot product, then the best `k`).
fn f32_scan(data: &[f32], query: &[f32], allow: &AllowList, k: usize) -> Vec<Hit> {
    let hits = allow
        .iter()
        .map(|slot| Hit { slot, score: dot(query, &data[slot as usize * DIM..(slot as usize + 1) * DIM]) })
        .collect();
    top_k(hits, k)
}

/// Share of the f32 scan's top 10 that `search` finds, over `queries`.
fn recall_at_10(data: &[f32], queries: &[Vec<f32>], search: impl Fn(&[f32]) -> Vec<Hit>) -> f64 {
    let all = AllowList::all(data.len() / DIM);
    let mut hit = 0usize;
    for q in queries {
        let truth: std::collections::HashSet<_> = f32_scan(data, q, &all, 10).iter().map(|h| h.slot).collect();
        hit += search(q).iter().filter(|h| truth.contains(&h.slot)).count();
    }
    hit as f64 / (queries.len() * 10) as f64
}

/// The plan find_tool runs against the exhaustive searches, everything allowed: the index's own
/// (codes, then a rescored shortlist) and the f32 scan it replaced. Per-query medians of five
/// alternating passes over the queries, so all see the same machine. Printed as ratios.
fn ratio_to_exact(idx: &DenseIndex, data: &[f32], queries: &[Vec<f32>]) {
    let all = AllowList::all(idx.len());
    let pass = |f: &dyn Fn(&[f32])| {
        let t = std::time::Instant::now();
        queries.iter().for_each(|q| f(q));
        t.elapsed().as_secs_f64() / queries.len() as f64
    };
    let (mut f32s, mut exact, mut plan) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        f32s.push(pass(&|q| {
            black_box(f32_scan(data, q, &all, 8));
        }));
        exact.push(pass(&|q| {
            black_box(idx.exact(q, &all, 8));
        }));
        plan.push(pass(&|q| {
            black_box(idx.search(q, &all, 8));
        }));
    }
    let (f, e, p) = (median(&mut f32s), median(&mut exact), median(&mut plan));
    let path = idx.search(&queries[0], &all, 8).1;
    eprintln!(
        "N {}: f32 scan {:.0} µs, exhaustive {:.0} µs, plan ({path:?}) {:.0} µs per query: {:.1}x faster than the f32 scan, {:.1}x than the exhaustive search",
        idx.len(),
        f * 1e6,
        e * 1e6,
        p * 1e6,
        f / p,
        e / p
    );
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = model();
    let (tool_texts, query_texts) = texts();

    // Embedding.
    let mut g = c.benchmark_group("embed");
    g.sample_size(30).measurement_time(Duration::from_secs(10));
    let mut n = 0u64;
    g.bench_function("query", |b| {
        b.iter(|| {
            n += 1;
            // A fresh text each time: the model runs, no cache is involved.
            let q = format!("create a pull request on a code repository {n}");
            black_box(rt.block_on(m.embed(vec![q])).unwrap())
        })
    });
    let batch: Vec<String> = tool_texts.iter().take(32).cloned().collect();
    g.throughput(criterion::Throughput::Elements(32));
    g.bench_function("batch_32_tool_texts", |b| b.iter(|| black_box(rt.block_on(m.embed(batch.clone())).unwrap())));
    g.finish();

    let real = embed_cached(&rt, &m, &tool_texts);
    let queries: Vec<Vec<f32>> = embed_cached(&rt, &m, &query_texts[..100.min(query_texts.len())]);

    // Dense search by size and share.
    let mut g = c.benchmark_group("search");
    g.sample_size(20).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for &size in &SIZES {
        let data = synthetic(&real, size, 7);
        let started = std::time::Instant::now();
        let idx = DenseIndex::build(DIM, data.clone(), 0);
        let built = started.elapsed().as_secs_f64();
        let all = AllowList::all(size);
        let exact = recall_at_10(&data, &queries, |q| idx.exact(q, &all, 10));
        let graph = recall_at_10(&data, &queries, |q| idx.graph_only(q, 10).expect("graph built"));
        eprintln!(
            "N {size}: graph built in {built:.1} s; recall@10 vs the f32 scan: exhaustive {exact:.4}, HNSW {graph:.4}"
        );
        assert!(exact >= 0.99 && graph >= 0.99, "recall@10 {exact} / {graph} < 0.99 at N {size}");
        // Before: f32 vectors, and beside a graph its own byte codes and scales.
        let graph_bytes = idx.heap_bytes() - idx.vectors_heap_bytes();
        let before = data.len() * 4 + if idx.has_graph() { size * (DIM + 4) + graph_bytes } else { 0 };
        let per_10k = |bytes: usize| bytes as f64 / size as f64 * 1e4 / 1e6;
        eprintln!(
            "N {size}: dense index {:.1} MB (vectors {:.1} + graph {:.1}), before {:.1} MB; per 10k tools {:.1} MB, before {:.1} MB",
            idx.heap_bytes() as f64 / 1e6,
            idx.vectors_heap_bytes() as f64 / 1e6,
            graph_bytes as f64 / 1e6,
            before as f64 / 1e6,
            per_10k(idx.heap_bytes()),
            per_10k(before),
        );
        if idx.has_graph() {
            ratio_to_exact(&idx, &data, &queries);
        }
        for &share in &SHARES {
            let mut rng = StdRng::seed_from_u64(size as u64);
            let allow = AllowList::from_slots(size, (0..size as u32).filter(|_| rng.random_bool(share)));
            let label = format!("{size}/{}%", (share * 100.0) as u32);
            let mut qi = 0;
            let mut next = || {
                qi = (qi + 1) % queries.len();
                &queries[qi]
            };
            g.bench_function(BenchmarkId::new("f32_scan", &label), |b| {
                b.iter(|| black_box(f32_scan(&data, next(), &allow, 8)))
            });
            g.bench_function(BenchmarkId::new("exact", &label), |b| b.iter(|| black_box(idx.exact(next(), &allow, 8))));
            g.bench_function(BenchmarkId::new("plan", &label), |b| b.iter(|| black_box(idx.search(next(), &allow, 8))));
            if share == 1.0 {
                g.bench_function(BenchmarkId::new("hnsw", &label), |b| b.iter(|| black_box(idx.graph_only(next(), 8))));
            }
        }
    }
    g.finish();

    // Snapshots: 1,000 sessions over a 10k-tool generation.
    let tools: Vec<CatalogTool> = tool_texts
        .iter()
        .cycle()
        .take(10_000)
        .enumerate()
        .map(|(i, t)| {
            let tool = rmcp::model::Tool::new(format!("tool_{i}"), t.clone(), Arc::new(serde_json::Map::new()));
            CatalogTool::new(
                ToolKey { backend: Arc::from(format!("b{}", i % 20).as_str()), tool: Arc::from("x") },
                tool,
                None,
            )
        })
        .collect();
    let store = toolmux::store::Store::new(None, None);
    let generation = rt.block_on(store.rebuild(toolmux::catalog::Catalog::from_tools(tools)));
    let snap = scope(generation.clone(), &|_| true, &AllowAll, &Caller::anonymous());
    let limit = 10_000 / 8 + 1024;
    eprintln!("snapshot over 10k tools: {} bytes (target ≤ {limit})", snap.heap_bytes());
    assert!(snap.heap_bytes() <= limit);
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(20);
    g.bench_function("build_1000_sessions_10k_tools", |b| {
        b.iter(|| {
            for _ in 0..1000 {
                black_box(scope(generation.clone(), &|b| b != "b3", &AllowAll, &Caller::anonymous()));
            }
        })
    });
    g.finish();
}

criterion_group!(search, benches);
criterion_main!(search);
