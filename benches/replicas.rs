//! What sharing sessions through Redis costs (`[sessions] store = "redis"`).
//!
//! A `redis-server` on 127.0.0.1 (scripts/redis.sh installs it), one testkit backend served over
//! HTTP by this process, and three `toolmux serve` children in passthrough mode: `memory` (no
//! store), and replicas `a` and `b` sharing Redis. Measured, from send to the answer's last byte:
//! 1. a new session (initialize) with and without the store: the added cost is the write;
//! 2. a request on a session its replica holds, and the first request on `b` for a session `a`
//!    created: the added cost is the store lookup and the rebuild (handshake replayed);
//! 3. sessions a replica rebuilds per second: 1,000 sessions made on `a`, then each one's
//!    first request on `b`, 32 at a time;
//! 4. with a `per_client` backend, the first call on another replica after a call on the first:
//!    the backend session taken over (`sessions.secret`) or opened afresh (no secret).
//!
//! Figures are reported with ratios measured in the same run.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{ChildGateway, RawSession, ms, percentile};
use tokio_util::sync::CancellationToken;

const SAMPLES: usize = 300;
const REHYDRATE: usize = 1_000;
const PARALLEL: usize = 32;

fn config(backend: &str, redis: Option<u16>) -> String {
    config_with(backend, redis, "shared", "")
}

/// The gateway over `backend` in `session` mode, sharing sessions through Redis at `redis`
/// with `sessions` (more `[sessions]` keys).
fn config_with(backend: &str, redis: Option<u16>, session: &str, sessions: &str) -> String {
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\nmax_sessions = 5000\n\
         [[backends]]\nname = \"kit\"\nurl = \"{backend}\"\nsession = \"{session}\"\n"
    );
    if let Some(port) = redis {
        toml += &format!("[sessions]\nstore = \"redis\"\nredis_url = \"redis://127.0.0.1:{port}/0\"\n{sessions}");
    }
    toml
}

fn echo() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "kit_echo", "arguments": {"input": "x"}}})
}

/// The first call to a `per_client` backend on `b` of sessions that called it on `a`: the
/// client session is rebuilt, and its backend session taken over (with a secret) or opened.
async fn first_call_after_a_move(http: &reqwest::Client, a: &ChildGateway, b: &ChildGateway) -> Vec<Duration> {
    let (_, sessions) = time_opens(http, &a.url, SAMPLES).await;
    for s in &sessions {
        assert!(s.post(&echo()).await.contains("\"x\""));
    }
    let mut took = Vec::with_capacity(sessions.len());
    for s in &sessions {
        let s = s.at(&b.url);
        let start = Instant::now();
        let answer = s.post(&echo()).await;
        took.push(start.elapsed());
        assert!(answer.contains("\"x\""), "{answer}");
    }
    took.sort();
    took
}

fn list() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
}

/// Times `n` new sessions on `url`, one after another.
async fn time_opens(http: &reqwest::Client, url: &str, n: usize) -> (Vec<Duration>, Vec<RawSession>) {
    let mut took = Vec::with_capacity(n);
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        sessions.push(RawSession::open(http.clone(), url).await);
        took.push(start.elapsed());
    }
    took.sort();
    (took, sessions)
}

/// Times one `tools/list` per session, each sent to `url`.
async fn time_requests(sessions: &[RawSession], url: &str) -> Vec<Duration> {
    let mut took = Vec::with_capacity(sessions.len());
    for s in sessions {
        let s = s.at(url);
        let start = Instant::now();
        let answer = s.post(&list()).await;
        took.push(start.elapsed());
        assert!(answer.contains("kit_echo"), "{answer}");
    }
    took.sort();
    took
}

fn main() {
    let server = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("redis-server")).find(|f| f.is_file()))
        .expect("redis-server is not installed; scripts/redis.sh installs it");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut redis = std::process::Command::new(server)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let ct = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(toolmux::demo::serve_http(toolmux::demo::backend("testkit").unwrap(), listener, ct.clone()));
        let memory = ChildGateway::start(&config(&backend, None));
        let a = ChildGateway::start(&config(&backend, Some(port)));
        let b = ChildGateway::start(&config(&backend, Some(port)));
        for g in [&memory, &a, &b] {
            g.ready().await;
        }
        let http = reqwest::Client::new();
        // Warm up connections and code paths.
        let _ = time_opens(&http, &memory.url, 20).await;
        let (warm, _) = time_opens(&http, &a.url, 20).await;
        drop(warm);

        let (open_memory, held_memory) = time_opens(&http, &memory.url, SAMPLES).await;
        let (open_shared, made_on_a) = time_opens(&http, &a.url, SAMPLES).await;
        let held = time_requests(&made_on_a, &a.url).await;
        let held_memory = time_requests(&held_memory, &memory.url).await;
        let moved = time_requests(&made_on_a, &b.url).await;
        let after_move = time_requests(&made_on_a, &b.url).await;

        let (_, many) = time_opens(&http, &a.url, REHYDRATE).await;
        let start = Instant::now();
        for chunk in many.chunks(PARALLEL) {
            let answers = futures::future::join_all(
                chunk.iter().map(|s| s.at(&b.url)).map(|s| async move { s.post(&list()).await }),
            )
            .await;
            assert!(answers.iter().all(|a| a.contains("kit_echo")));
        }
        let rate = REHYDRATE as f64 / start.elapsed().as_secs_f64();

        // per_client backend sessions after a move: taken over (sessions.secret) or opened afresh.
        let secret = "secret = \"bench-secret-0123456789abcdef0123456789\"\n";
        let (c, d) = (
            ChildGateway::start(&config_with(&backend, Some(port), "per_client", secret)),
            ChildGateway::start(&config_with(&backend, Some(port), "per_client", secret)),
        );
        let (e, f) = (
            ChildGateway::start(&config_with(&backend, Some(port), "per_client", "")),
            ChildGateway::start(&config_with(&backend, Some(port), "per_client", "")),
        );
        for g in [&c, &d, &e, &f] {
            g.ready().await;
        }
        let taken_over = first_call_after_a_move(&http, &c, &d).await;
        let reopened = first_call_after_a_move(&http, &e, &f).await;

        let p = |d: &[Duration], q| ms(percentile(d, q));
        println!("passthrough, one HTTP backend, a local redis-server; {SAMPLES} samples each, times in ms");
        println!("{:<52} {:>8} {:>8}", "", "p50", "p90");
        for (name, d) in [
            ("new session, memory store", &open_memory),
            ("new session, redis store (written before the answer)", &open_shared),
            ("request on a held session, memory store", &held_memory),
            ("request on a held session, redis store", &held),
            ("first request on another replica (lookup + rebuild)", &moved),
            ("next request there (now held)", &after_move),
        ] {
            println!("{name:<52} {:>8.3} {:>8.3}", p(d, 0.5), p(d, 0.9));
        }
        println!(
            "redis against memory (p50): new session {:.2}× (+{:.3} ms), held request {:.2}×",
            p(&open_shared, 0.5) / p(&open_memory, 0.5),
            p(&open_shared, 0.5) - p(&open_memory, 0.5),
            p(&held, 0.5) / p(&held_memory, 0.5),
        );
        println!(
            "first request on another replica against a held one (p50): {:.2}× (+{:.3} ms)",
            p(&moved, 0.5) / p(&held, 0.5),
            p(&moved, 0.5) - p(&held, 0.5),
        );
        for (name, d) in [
            ("first per_client call after a move, taken over", &taken_over),
            ("first per_client call after a move, opened afresh", &reopened),
        ] {
            println!("{name:<52} {:>8.3} {:>8.3}", p(d, 0.5), p(d, 0.9));
        }
        println!(
            "taking the backend session over against opening one (p50): {:.2}× ({:+.3} ms)",
            p(&taken_over, 0.5) / p(&reopened, 0.5),
            p(&taken_over, 0.5) - p(&reopened, 0.5),
        );
        println!(
            "sessions rebuilt per second by one replica ({PARALLEL} at a time, 2 cores shared with the rest): {rate:.0}"
        );
        ct.cancel();
    });
    let _ = redis.kill();
    let _ = redis.wait();
}
