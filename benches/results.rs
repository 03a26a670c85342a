//! What bounding a result costs (`[results]`): `Results::apply` on a result over the default
//! 25,000-token limit, which finds what to cut, keeps the whole for its caller and cuts: a 1 MB
//! log (head and tail kept), a JSON array of 20,000 rows as text and the same rows as
//! `structuredContent` (shortened as JSON). `baseline_clone` clones the same result once, as the
//! gateway already does with every result it relays, for scale. Run after run, the kept store
//! reaches its per-principal bound and evicts the oldest, as a busy gateway's would.
//!
//! `cargo bench --bench results`

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};
use toolmux::config::ResultsConfig;
use toolmux::results::{Bound, Results};

fn log_text() -> String {
    (0..14_000)
        .map(|i| format!("2026-12-06T07:00:{:02}Z INFO worker {i}: request served in {} ms\n", i % 60, i % 97))
        .collect()
}

fn rows() -> Value {
    let rows: Vec<Value> =
        (0..20_000).map(|i| json!({"id": i, "name": format!("row {i}"), "status": "open", "score": i % 100})).collect();
    json!({"rows": rows, "total": 20_000})
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let results = Results::new(&ResultsConfig::default());
    let bound = Bound { tokens: 25_000, bytes: 1 << 20 };
    let log = CallToolResult::success(vec![ContentBlock::text(log_text())]);
    let json_text = CallToolResult::success(vec![ContentBlock::text(rows().to_string())]);
    let structured = CallToolResult::structured(rows());
    let mut g = c.benchmark_group("results_cut");
    g.sample_size(20);
    for (name, result) in [("log_1mb", &log), ("json_text_20k_rows", &json_text), ("structured_20k_rows", &structured)]
    {
        let size = serde_json::to_vec(result).unwrap().len();
        let mut cut = result.clone();
        assert!(runtime.block_on(results.apply("p", bound, || None, &mut cut)) > 0, "{name} ({size} bytes) is cut");
        g.bench_function(format!("{name}/baseline_clone"), |b| b.iter(|| std::hint::black_box(result.clone())));
        g.bench_function(format!("{name}/apply"), |b| {
            b.iter_batched(
                || result.clone(),
                |mut r| runtime.block_on(results.apply("p", bound, || None, &mut r)),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
