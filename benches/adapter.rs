//! What fitting the query adapter costs (`store::adapter`): one fit with the shipped settings
//! on 10,000 labels (the size the issue of record asks about) over a catalog of 1,000 tools
//! (every batch scored against the whole catalog) and of 10,000 tools (past 4,096 the batches
//! sample: their own tools, each request's 16 hardest, 512 at random). Vectors are random unit
//! vectors of the model's 384 dimensions; a label's request is its tool's vector moved a
//! little, so the fit has something to learn. One thread, as the gateway's fitter (which also
//! rests as long as it works, so a fit there takes twice the time below, at half a core).
//! `apply` is the request path's cost: one 384×384 product and a normalisation; `take_back`
//! the rest of it, the offset taken from the dense arm's 50 hits of a store whose 1,000 tools
//! all count (one lock, 50 lookups, a sort).
//!
//! `cargo bench --bench adapter`

use criterion::{Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use toolmux::catalog::ToolKey;
use toolmux::index::Hit;
use toolmux::store::adapter::{Adapter, Example, Judged, Settings, fit};
use toolmux::store::learned::{Fitted, Learned};

const DIM: usize = 384;

fn unit(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..n).map(|_| rng.random::<f32>() - 0.5).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

fn deployment(tools: usize, labels: usize) -> (Vec<f32>, Vec<Example>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let catalog: Vec<f32> = (0..tools).flat_map(|_| unit(&mut rng, DIM)).collect();
    let examples = (0..labels)
        .map(|i| {
            let target = rng.random_range(0..tools);
            let noise = unit(&mut rng, DIM);
            let q: Vec<f32> = catalog[target * DIM..][..DIM].iter().zip(&noise).map(|(t, n)| t + n).collect();
            let norm = q.iter().map(|x| x * x).sum::<f32>().sqrt();
            let query = q.into_iter().map(|x| x / norm).collect();
            Example { query, target, weight: 1.0, request: i as u64, teaches: true }
        })
        .collect();
    (catalog, examples)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("adapter_fit_10k_labels");
    g.sample_size(10);
    for tools in [1_000, 10_000] {
        let (catalog, examples) = deployment(tools, 10_000);
        g.bench_function(format!("{tools}_tools"), |b| {
            b.iter(|| fit(&examples, &catalog, DIM, Settings::default(), 7, &|| false).expect("fitted"))
        });
    }
    g.finish();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let adapter = Adapter { dim: DIM, w: (0..DIM * DIM).map(|_| rng.random::<f32>() * 0.01).collect() };
    let q = unit(&mut rng, DIM);
    c.bench_function("adapter_apply", |b| b.iter(|| adapter.apply(std::hint::black_box(&q))));

    let keys: Vec<ToolKey> =
        (0..1_000).map(|t| ToolKey { backend: "b".into(), tool: format!("tool_{t}").into() }).collect();
    let learned = Learned::new(true, DIM, None);
    for key in &keys {
        for who in ["alice", "bob"] {
            learned.record(&unit(&mut rng, DIM), key, who);
        }
    }
    let judged = Judged { fitted: 2_000, held_out: 400, plain: 60.0, adapted: 70.0, seconds: 1.0 };
    learned.install(Fitted { adapter: Some(adapter), judged, labels: 2_000 }, 1);
    let hits: Vec<Hit> = (0..50).map(|i| Hit { slot: i * 20, score: 1.0 - i as f32 * 0.01 }).collect();
    c.bench_function("adapter_take_back_50_hits", |b| {
        b.iter(|| {
            let mut h = hits.clone();
            learned.take_back(&mut h, |slot| &keys[slot as usize]);
            h
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
