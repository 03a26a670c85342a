//! Health-driven resync: the time from a backend's health flip to every session's swapped
//! snapshot, for 10, 100 and 1,000 sessions over 1k and 10k tools, and the memory of a caller's
//! snapshot (shared by that caller's sessions).
//! Then the same for 1,000 sessions of 10 principals under `[[policy]]` rules (each principal
//! two whole backends and part of a third), against everyone allowed everything. Checks that no
//! swap embeds anything.
//! Last, what old catalogs cost: 20 catalog changes and health flips over 10k tools, with 100
//! sessions (half never send a request) and session-less callers that come once, must leave one
//! generation in memory and resident memory within 10 % of where it started.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use toolmux::catalog::{Catalog, CatalogTool, ToolKey};
use toolmux::config::PolicyRule;
use toolmux::config::{BackendConfig, HealthConfig, Transport};
use toolmux::embed::fake::FakeEmbedder;
use toolmux::health::Monitor;
use toolmux::mcp::Gateway;
use toolmux::mcp::gateway::Parts;
use toolmux::session::{AllowAll, Caller, Policy};
use toolmux::store::Store;
use toolmux::upstream::{NoRelay, Upstream};

mod support;

const BACKENDS: usize = 10;

/// `tools` tools over the backends, their descriptions marked with `round` (a new round is a
/// changed catalog).
fn catalog(tools: usize, round: usize) -> Catalog {
    let catalog: Vec<CatalogTool> = (0..tools)
        .map(|i| {
            let b = format!("b{}", i % BACKENDS);
            let t = rmcp::model::Tool::new(
                format!("{b}_tool_{i}"),
                format!("does thing {i} in round {round}"),
                Arc::new(Default::default()),
            );
            CatalogTool::new(
                ToolKey { backend: Arc::from(b.as_str()), tool: Arc::from(format!("tool_{i}").as_str()) },
                t,
                None,
            )
        })
        .collect();
    Catalog::from_tools(catalog)
}

fn gateway(rt: &tokio::runtime::Runtime, tools: usize, policy: Arc<dyn Policy>) -> Arc<Gateway> {
    let configs: Vec<BackendConfig> = (0..BACKENDS)
        .map(|i| BackendConfig {
            name: format!("b{i}"),
            transport: Transport::Http {
                url: "http://127.0.0.1:9/mcp".into(),
                headers: Default::default(),
                sse: false,
            },
            timeout: Duration::from_secs(1),
            protocol: Default::default(),
            session: toolmux::config::SessionMode::Shared,
            max_instances: 1,
            idle_stop: None,
            token_exchange: None,
            oauth: None,
        })
        .collect();
    let upstream = Arc::new(Upstream::new(&configs, Arc::new(NoRelay), Default::default()));
    let health_cfg = HealthConfig { unhealthy_threshold: 1, ..HealthConfig::default() };
    let health = Monitor::new(health_cfg, &upstream);
    for i in 0..BACKENDS {
        health.record(&format!("b{i}"), Some(Duration::from_millis(1)));
    }
    let store = Arc::new(Store::new(Some(Arc::new(FakeEmbedder { dim: 384 })), None));
    rt.block_on(store.rebuild(catalog(tools, 0)));
    Gateway::new(Parts::optimizer(store, upstream, health, policy))
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut g = c.benchmark_group("resync");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for tools in [1_000, 10_000] {
        let gw = gateway(&rt, tools, Arc::new(AllowAll));
        for sessions in [10, 100, 1_000] {
            let handles: Vec<_> = rt
                .block_on(async { (0..sessions).map(|_| gw.open_session(Caller::anonymous(), None, None)).collect() });
            let per_session = handles[0].snapshot().heap_bytes();
            eprintln!("{sessions} sessions over {tools} tools: {per_session} bytes per caller's snapshot");
            let embedded = gw.store.counters.texts_embedded.load(Ordering::Relaxed);
            let mut down = false;
            g.bench_function(BenchmarkId::new(format!("{tools}_tools"), sessions), |b| {
                // b3 flips each iteration.
                b.iter_custom(|iters| (0..iters).map(|_| flip(&rt, &gw, "b3", &mut down, sessions)).sum())
            });
            assert_eq!(gw.store.counters.texts_embedded.load(Ordering::Relaxed), embedded, "a swap embedded something");
            let expect_b3 = !down;
            assert_eq!(
                handles[0].snapshot().tools().any(|t| &*t.key.backend == "b3"),
                expect_b3,
                "swapped to the right scope"
            );
            drop(handles);
        }
    }
    g.finish();
}

/// Ten principals `p0`..`p9`: `pN` may use backends `bN` and `b(N+1)` whole, and the tools of
/// `b(N+2)` whose names start with `tool_1` (a per-tool walk).
fn ten_principals() -> Vec<PolicyRule> {
    let v = |xs: &[String]| xs.to_vec();
    (0..BACKENDS)
        .flat_map(|n| {
            let who = vec![format!("p{n}")];
            [
                PolicyRule {
                    principals: v(&who),
                    groups: vec![],
                    backends: vec![format!("b{n}"), format!("b{}", (n + 1) % BACKENDS)],
                    tools: vec!["*".into()],
                    deny: false,
                },
                PolicyRule {
                    principals: who,
                    groups: vec![],
                    backends: vec![format!("b{}", (n + 2) % BACKENDS)],
                    tools: vec!["tool_1*".into()],
                    deny: false,
                },
            ]
        })
        .collect()
}

fn with_policy(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut g = c.benchmark_group("resync_policy");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    let sessions = 1_000;
    let tools = 10_000;
    let policies: [(&str, Arc<dyn Policy>); 2] = [
        ("allow_all", Arc::new(AllowAll)),
        ("ten_principals", Arc::new(toolmux::auth::policy::Rules::new(&ten_principals(), true))),
    ];
    for (name, policy) in policies {
        let gw = gateway(&rt, tools, policy);
        let handles: Vec<_> = rt.block_on(async {
            (0..sessions).map(|i| gw.open_session(Caller::named(&format!("p{}", i % 10), vec![]), None, None)).collect()
        });
        let bytes = handles[0].snapshot().heap_bytes();
        let visible = handles[0].snapshot().tools().count();
        eprintln!(
            "{name}: {sessions} sessions over {tools} tools: {bytes} bytes per snapshot, {visible} tools visible to p0"
        );
        let mut down = false;
        g.bench_function(BenchmarkId::new(name, sessions), |b| {
            // b1 is whole to p0 and p9, part of p8's scope.
            b.iter_custom(|iters| (0..iters).map(|_| flip(&rt, &gw, "b1", &mut down, sessions)).sum())
        });
        drop(handles);
    }
    g.finish();
}

/// Flips `backend`'s health, starts the fan-out the catalog task would, and returns the time
/// until all `sessions` workers have swapped.
fn flip(rt: &tokio::runtime::Runtime, gw: &Gateway, backend: &str, down: &mut bool, sessions: usize) -> Duration {
    *down = !*down;
    let before = gw.counters.resyncs.load(Ordering::Relaxed);
    let start = Instant::now();
    gw.health.record(backend, if *down { None } else { Some(Duration::from_millis(1)) });
    gw.scopes_changed();
    rt.block_on(async {
        while gw.counters.resyncs.load(Ordering::Relaxed) < before + sessions as u64 {
            tokio::task::yield_now().await;
        }
    });
    start.elapsed()
}

/// Old generations are freed: each of 20 rounds changes the catalog (a new generation: catalog,
/// vectors, indexes) and flips a backend's health; 50 of 100 sessions send a request each round,
/// 50 never do, and 5 session-less callers come once. Reports the generations still in memory
/// and resident memory before and after.
fn generations(_c: &mut Criterion) {
    const TOOLS: usize = 10_000;
    const SESSIONS: usize = 100;
    const ROUNDS: usize = 20;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let gw = gateway(&rt, TOOLS, Arc::new(AllowAll));
    let handles: Vec<_> = rt.block_on(async {
        (0..SESSIONS).map(|i| gw.open_session(Caller::named(&format!("p{}", i % 10), vec![]), None, None)).collect()
    });
    let mut down = false;
    // One round first, so that the allocator has seen a change before the baseline is taken.
    let change = |round: usize, down: &mut bool| {
        rt.block_on(gw.store.rebuild(catalog(TOOLS, round)));
        flip(&rt, &gw, "b3", down, SESSIONS);
        for h in handles.iter().step_by(2) {
            let _ = gw.session_snapshot(h);
        }
        for i in 0..5 {
            let _ = gw.scope_for(&Caller::named(&format!("once-{round}-{i}"), vec![]));
        }
    };
    change(1, &mut down);
    let start = support::rss_mib();
    for round in 2..=ROUNDS + 1 {
        change(round, &mut down);
    }
    let live = gw.store.live_generations();
    let end = support::rss_mib();
    eprintln!(
        "{ROUNDS} changes over {TOOLS} tools, {SESSIONS} sessions (half idle): {live} generation(s) in memory, \
         RSS {start:.0} MiB → {end:.0} MiB ({:+.1} %)",
        (end / start - 1.0) * 100.0
    );
    assert_eq!(live, 1, "an old generation is still held");
    assert!(end <= start * 1.10, "RSS grew past 10 %: {start:.0} → {end:.0} MiB");
    drop(handles);
}

criterion_group!(resync, benches, with_policy, generations);
criterion_main!(resync);
