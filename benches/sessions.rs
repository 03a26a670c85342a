//! What a client session costs the gateway, per backend session mode (`per_client`, `shared`).
//!
//! The gateway is the real `toolmux` binary in a child process (passthrough mode), so its
//! resident memory is its own; in front of it, ten testkit backends served over HTTP by this
//! process. For each mode, a fresh gateway:
//! 1. 1,000 idle sessions (initialize + initialized, raw HTTP): RSS per session.
//! 2. 100 of them call one tool on each of the 10 backends: the first call's latency on each
//!    (in `per_client` mode it opens that session's upstream session) and RSS per session after.
//! 3. 200 sequential calls on one warm session: the warm call's latency.
//! 4. In `per_client` mode only (an idle session holds no upstream session, so the modes do not
//!    differ there): 9,000 more idle sessions, RSS at 10,000; then RSS after they are deleted,
//!    and after each further round of 10,000 sessions opened and deleted (a leak grows by the
//!    same amount every round; an allocator's retained pages level off).
//!
//! 5. Waves, in optimizer mode with sessions that expire after 3 s idle: ten waves of 1,000
//!    sessions, each asking find_tool and calling the tool through call_tool, then left to
//!    expire; RSS after each wave has expired. Then one wave of 20,000: RSS before it, at its
//!    peak, and after it has expired (memory must follow the live sessions, not the history).
//!
//! Latency is from send to the last byte of the answer; memory is VmRSS (Linux).

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{ChildGateway, RawSession, ms, percentile};
use tokio_util::sync::CancellationToken;

const BACKENDS: usize = 10;
const IDLE: usize = 1_000;
const CALLING: usize = 100;
const WARM_CALLS: usize = 200;
const MANY: usize = 10_000;
const CHURN_ROUNDS: usize = 5;
const WAVES: usize = 10;
const WAVE: usize = 1_000;
const BIG_WAVE: usize = 20_000;
/// Idle time after which the gateway ends a session, in the wave runs.
const EXPIRY: Duration = Duration::from_secs(3);
/// Sessions opened at once while filling the gateway.
const PARALLEL: usize = 32;

/// The gateway in passthrough mode over `backends`, each in `session` mode.
fn start_gateway(backends: &[String], session: &str) -> ChildGateway {
    let mut toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\nmax_sessions = {}\n", MANY + 100);
    for (i, url) in backends.iter().enumerate() {
        toml += &format!("\n[[backends]]\nname = \"kit{i}\"\nurl = \"{url}\"\nsession = \"{session}\"\n");
    }
    ChildGateway::start(&toml)
}

/// Opens `n` sessions, `PARALLEL` at a time.
async fn open_sessions(http: &reqwest::Client, url: &str, n: usize) -> Vec<RawSession> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let batch = PARALLEL.min(n - out.len());
        out.extend(futures::future::join_all((0..batch).map(|_| RawSession::open(http.clone(), url))).await);
    }
    out
}

fn call(backend: usize, input: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": format!("kit{backend}_echo"), "arguments": {"input": input}}})
}

/// Calls `kit{backend}_echo` and checks the answer is the backend's.
async fn timed_call(s: &RawSession, backend: usize) -> Duration {
    let start = Instant::now();
    let answer = s.post(&call(backend, "ping")).await;
    let took = start.elapsed();
    assert!(answer.contains("ping") && !answer.contains("\"isError\":true"), "kit{backend}: {answer}");
    took
}

struct Figures {
    base: f64,
    idle_kib: f64,
    called_kib: f64,
    first: Vec<Duration>,
    warm: Vec<Duration>,
}

async fn measure(backends: &[String], mode: &str, http: &reqwest::Client) -> (Figures, ChildGateway, Vec<RawSession>) {
    let gw = start_gateway(backends, mode);
    gw.ready().await;
    let base = gw.rss();
    let sessions = open_sessions(http, &gw.url, IDLE).await;
    let idle = gw.rss();
    let mut first = Vec::with_capacity(CALLING * BACKENDS);
    for s in &sessions[..CALLING] {
        for b in 0..BACKENDS {
            first.push(timed_call(s, b).await);
        }
    }
    let called = gw.rss();
    let mut warm = Vec::with_capacity(WARM_CALLS);
    for _ in 0..WARM_CALLS {
        warm.push(timed_call(&sessions[0], 0).await);
    }
    first.sort();
    warm.sort();
    let kib = |mib: f64, n: usize| mib * 1024.0 / n as f64;
    let idle_kib = kib(idle - base, IDLE);
    let figures = Figures { base, idle_kib, called_kib: idle_kib + kib(called - idle, CALLING), first, warm };
    (figures, gw, sessions)
}

/// Sessions that each ask find_tool and call the tool it names through call_tool.
async fn wave(http: &reqwest::Client, url: &str, n: usize) {
    let mut done = 0;
    while done < n {
        let batch = PARALLEL.min(n - done);
        futures::future::join_all((0..batch).map(|i| async move {
            let s = RawSession::open(http.clone(), url).await;
            let found = s
                .post(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "find_tool",
                    "arguments": {"tool_description": "echo back a message"}}}))
                .await;
            assert!(found.contains("echo"), "find_tool: {found}");
            let called = s
                .post(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "call_tool",
                    "arguments": {"tool_name": format!("kit{}_echo", (done + i) % BACKENDS), "parameters": {"input": "wave"}}}}))
                .await;
            assert!(called.contains("wave") && !called.contains("\"isError\":true"), "call_tool: {called}");
        }))
        .await;
        done += batch;
    }
}

/// Ten waves of [`WAVE`] sessions, then one of [`BIG_WAVE`], each left to expire.
async fn waves(backends: &[String], http: &reqwest::Client) {
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\nmax_sessions = {}\nsession_idle_timeout = \"{}s\"\n",
        BIG_WAVE + 100,
        EXPIRY.as_secs()
    );
    for (i, url) in backends.iter().enumerate() {
        toml += &format!("\n[[backends]]\nname = \"kit{i}\"\nurl = \"{url}\"\nsession = \"per_client\"\n");
    }
    let gw = ChildGateway::start(&toml);
    gw.ready().await;
    let base = gw.rss();
    // Expiry, then the gateway's next check for memory to hand back (every 5 s), with margin.
    let settle = EXPIRY + Duration::from_secs(8);
    let mut after = Vec::new();
    for _ in 0..WAVES {
        wave(http, &gw.url, WAVE).await;
        tokio::time::sleep(settle).await;
        after.push(gw.rss());
    }
    let list = after.iter().map(|r| format!("{r:.1}")).collect::<Vec<_>>().join(", ");
    println!(
        "waves (optimizer, per_client, {EXPIRY:?} expiry): base {base:.1} MiB; RSS after each of {WAVES} waves of {WAVE} expired: {list} MiB"
    );
    println!("  after wave {WAVES} against after wave 1: {:+.1} %", (after[WAVES - 1] / after[0] - 1.0) * 100.0);
    let before = gw.rss();
    wave(http, &gw.url, BIG_WAVE).await;
    let peak = gw.rss();
    tokio::time::sleep(settle).await;
    let expired = gw.rss();
    println!(
        "  a wave of {BIG_WAVE}: before {before:.1} MiB, at its end {peak:.1} MiB, expired {expired:.1} MiB ({:+.1} % of before)",
        (expired / before - 1.0) * 100.0
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let ct = CancellationToken::new();
        let mut backends = Vec::new();
        for _ in 0..BACKENDS {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            backends.push(format!("http://{}/mcp", listener.local_addr().unwrap()));
            let kit = toolmux::demo::backend("testkit").expect("the testkit backend");
            tokio::spawn(toolmux::demo::serve_http(kit, listener, ct.clone()));
        }
        let http = reqwest::Client::new();
        println!("gateway: the toolmux binary, passthrough, {BACKENDS} HTTP backends; RSS is the gateway's VmRSS");
        println!(
            "{:<11} {:>9} {:>14} {:>22} {:>15} {:>15} {:>14} {:>14}",
            "mode", "base MiB", "idle KiB/sess", "after 10 calls KiB/sess", "first call p50", "first call p90",
            "warm call p50", "warm call p90"
        );
        let mut per_client = None;
        let mut warm_shared = Duration::ZERO;
        for mode in ["shared", "per_client"] {
            let (f, gw, sessions) = measure(&backends, mode, &http).await;
            println!(
                "{mode:<11} {:>9.1} {:>14.1} {:>23.1} {:>12.2} ms {:>12.2} ms {:>11.2} ms {:>11.2} ms",
                f.base,
                f.idle_kib,
                f.called_kib,
                ms(percentile(&f.first, 0.5)),
                ms(percentile(&f.first, 0.9)),
                ms(percentile(&f.warm, 0.5)),
                ms(percentile(&f.warm, 0.9)),
            );
            if mode == "shared" {
                warm_shared = percentile(&f.warm, 0.5);
            } else {
                let ratio = |d: Duration| d.as_secs_f64() / warm_shared.as_secs_f64();
                println!(
                    "per_client against shared (warm p50): first call {:.2}×, warm call {:.2}×",
                    ratio(percentile(&f.first, 0.5)),
                    ratio(percentile(&f.warm, 0.5))
                );
                per_client = Some((gw, sessions, f.base));
            }
        }
        let (gw, mut sessions, base) = per_client.unwrap();
        sessions.extend(open_sessions(&http, &gw.url, MANY - IDLE).await);
        let many = gw.rss();
        println!(
            "per_client: RSS with {IDLE} idle sessions (100 of them after calls) + {} more idle = {MANY}: {many:.1} MiB \
             ({:.1} KiB a session over the base)",
            MANY - IDLE,
            (many - base) * 1024.0 / MANY as f64
        );
        // Churn: delete them all, then open and delete 10,000 more, round after round. A leak grows from
        // round to round; freed pages the allocator keeps for reuse do not.
        let mut rounds = Vec::new();
        for round in 0..CHURN_ROUNDS {
            if round > 0 {
                sessions = open_sessions(&http, &gw.url, MANY).await;
            }
            for chunk in sessions.chunks(PARALLEL) {
                futures::future::join_all(chunk.iter().map(RawSession::delete)).await;
            }
            // Deleting a session ends its upstream sessions; give the gateway a moment to close them
            // and to hand the freed memory back (it checks every 5 s: `http::give_back_memory`).
            tokio::time::sleep(Duration::from_secs(7)).await;
            rounds.push(format!("{:.1}", gw.rss()));
        }
        println!("per_client: RSS after each of {CHURN_ROUNDS} rounds of {MANY} sessions deleted: {} MiB", rounds.join(", "));
        drop(gw);
        waves(&backends, &http).await;
        ct.cancel();
    });
}
