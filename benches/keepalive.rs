//! Request latency on one kept-alive HTTP connection, as Node-based agents and the TypeScript SDK
//! use the gateway, against a fresh connection per request. The gateway runs in front of the
//! demo catalog (13 backends, 152 tools) in optimizer mode with the real model.
//!
//! For each of `tools/list` and a repeated `find_tool`: 200 sequential requests on one session,
//! each timed from send to the last byte of its (streamed) answer; p50, p90 and p99, and the
//! kept-alive / fresh p50 ratio. Target: kept-alive p50 ≤ 2 ms. Without TCP_NODELAY on accepted
//! sockets a streamed answer's last write waits for the client's delayed ACK (~40 ms).

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{RawSession as Session, ms, percentile};

const REQUESTS: usize = 200;

/// Times `REQUESTS` sequential requests; returns the sorted latencies.
async fn run(s: &Session, body: &Value) -> Vec<Duration> {
    s.post(body).await; // warm: the query vector is cached after this one
    let mut times = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let start = Instant::now();
        let n = s.post(body).await.len();
        times.push(start.elapsed());
        assert!(n > 0);
    }
    times.sort();
    times
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let app = toolmux::app::demo("127.0.0.1:0", "optimizer").await.expect("demo gateway starts");
        assert!(app.ready(Duration::from_secs(120)).await, "demo ready");
        let url = format!("http://{}/mcp", app.addr.unwrap());
        let kept = Session::open(reqwest::Client::new(), &url).await;
        let fresh = Session::open(reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap(), &url).await;
        let requests = [
            ("tools/list", json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
            (
                "find_tool (repeated)",
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "find_tool",
                    "arguments": {"tool_description": "send a chat message to a channel"}}}),
            ),
        ];
        println!("{REQUESTS} sequential requests each; latency from send to the last byte of the answer");
        println!(
            "{:<22} {:>10} {:>8} {:>8} {:>8} {:>14}",
            "request", "connection", "p50 ms", "p90 ms", "p99 ms", "kept/fresh p50"
        );
        for (name, body) in &requests {
            let k = run(&kept, body).await;
            let f = run(&fresh, body).await;
            for (label, t) in [("kept-alive", &k), ("fresh", &f)] {
                let ratio = if label == "kept-alive" {
                    format!("{:.2}", ms(percentile(&k, 0.5)) / ms(percentile(&f, 0.5)))
                } else {
                    String::new()
                };
                println!(
                    "{name:<22} {label:>10} {:>8.2} {:>8.2} {:>8.2} {ratio:>14}",
                    ms(percentile(t, 0.5)),
                    ms(percentile(t, 0.9)),
                    ms(percentile(t, 0.99)),
                );
            }
            let p50 = percentile(&k, 0.5);
            let verdict = if p50 <= Duration::from_millis(2) { "met" } else { "MISSED" };
            println!("{name:<22} target kept-alive p50 ≤ 2 ms: {verdict}");
        }
        app.shutdown().await;
    });
}
