//! What `[results] scrub` adds to a result: `Scrubber::scrub` over 100 KB of tool output
//! without a credential (logs, JSON answers, SQL rows, lock files, a base64 image: the clean
//! corpus of tests/fixtures/scrub), and over the same with ten credentials in it. Goal: under
//! 1 ms per 100 KB. `baseline` copies the text once, as the gateway already does with every
//! result it relays, for scale.
//!
//! `cargo bench --bench scrub`

use criterion::{Criterion, criterion_group, criterion_main};
use toolmux::scrub::Scrubber;

const SIZE: usize = 100 * 1024;

/// About `SIZE` bytes of the clean corpus, whole results end to end.
fn clean() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/scrub/clean.jsonl");
    let mut out = String::with_capacity(SIZE + 16 * 1024);
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        out.push_str(v["text"].as_str().unwrap());
        out.push('\n');
        if out.len() >= SIZE {
            break;
        }
    }
    out.truncate(floor(&out, SIZE));
    out
}

/// The char boundary at or before byte `i` of `s`.
fn floor(s: &str, i: usize) -> usize {
    (0..=i.min(s.len())).rev().find(|&b| s.is_char_boundary(b)).unwrap_or(0)
}

/// `text` with the first ten credentials of the secrets corpus spread through it.
fn with_secrets(text: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/scrub/secrets.jsonl");
    let secrets: Vec<String> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .step_by(55)
        .take(10)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string())
        .collect();
    let step = text.len() / secrets.len();
    let mut out = String::with_capacity(text.len() + 4096);
    for (i, s) in secrets.iter().enumerate() {
        let from = floor(text, i * step);
        let to = floor(text, (i + 1) * step);
        out.push_str(&text[from..to]);
        out.push('\n');
        out.push_str(s);
        out.push('\n');
    }
    out
}

fn bench(c: &mut Criterion) {
    let scrubber = Scrubber::built_in();
    let clean = clean();
    let dirty = with_secrets(&clean);
    assert!(scrubber.find(&clean).is_empty(), "the clean text has no credential");
    assert_eq!(scrubber.scrub(&dirty).1.len(), 10, "each credential is found once");
    let mut g = c.benchmark_group("scrub_100kb");
    g.bench_function("baseline_copy", |b| b.iter(|| std::hint::black_box(clean.clone())));
    g.bench_function("clean", |b| b.iter(|| scrubber.scrub(std::hint::black_box(&clean)).1.len()));
    g.bench_function("ten_secrets", |b| b.iter(|| scrubber.scrub(std::hint::black_box(&dirty)).1.len()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
