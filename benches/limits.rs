//! What `[[limits]]` add to a call: `Limiter::check` as the call path makes it, for a caller
//! covered by two rules (a rate, an hourly and a daily quota, and a daily result-token quota:
//! four keys), counted in this process and in a `redis-server` on 127.0.0.1 (one script run per
//! check; scripts/redis.sh installs it). `none` is the same check with no rule in force: what a
//! deployment without limits pays. Goals: under 5 µs local, under 0.3 ms through Redis.
//!
//! `cargo bench --bench limits`

use std::process::Stdio;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use toolmux::config::{Config, RedisConfig, WhenUnreachable};
use toolmux::limits::{Action, Limiter};
use toolmux::metrics::LimitCounters;
use toolmux::session::Caller;
use toolmux::session::shared::SharedSessions;

const RULES: &str = "[[limits]]\nname = \"everyone\"\nprincipals = [\"*\"]\nrate = \"1000000/s\"\ncalls_per_hour = 1000000000\ncalls_per_day = 1000000000\n\
                     [[limits]]\nname = \"tokens\"\ngroups = [\"agents\"]\nresult_tokens_per_day = 1000000000\n";

/// A `redis-server` at a free port, stopped when dropped.
struct RedisServer(std::process::Child, u16);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_server() -> RedisServer {
    let server = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("redis-server")).find(|f| f.is_file()))
        .expect("redis-server is not installed; scripts/redis.sh installs it");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = std::process::Command::new(server)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    RedisServer(child, port)
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let rules = Config::parse(RULES).unwrap().limits;
    let callers: Vec<Caller> = (0..100).map(|i| Caller::named(&format!("agent-{i}"), vec!["agents".into()])).collect();
    let action = Action::Call { backend: "github", tool: "create_issue" };
    let mut g = c.benchmark_group("limits_check");
    g.measurement_time(Duration::from_secs(3));

    let none = Limiter::new(&[], LimitCounters::default());
    let local = Limiter::new(&rules, LimitCounters::default());
    for (name, limiter) in [("none", &none), ("local", &local)] {
        let mut i = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % callers.len();
                rt.block_on(limiter.check(&callers[i], action)).unwrap()
            })
        });
    }

    let server = redis_server();
    let cfg = RedisConfig {
        url: format!("redis://127.0.0.1:{}/0", server.1),
        key_prefix: "toolmux-bench:".into(),
        timeout: Duration::from_secs(2),
        tls_ca: None,
        seal_key: None,
    };
    let shared = rt.block_on(async { SharedSessions::new(&cfg, Duration::from_secs(60)).unwrap() });
    let redis = Limiter::new(&rules, LimitCounters::default());
    redis.share(shared, WhenUnreachable::Refuse);
    // The server starts in the background: wait until a check goes through it.
    let up = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        rt.block_on(redis.check(&callers[0], action)).is_ok()
    });
    assert!(up, "redis-server answers");
    let mut i = 0;
    g.bench_function("redis", |b| {
        b.iter(|| {
            i = (i + 1) % callers.len();
            rt.block_on(redis.check(&callers[i], action)).unwrap()
        })
    });
    g.finish();
}

criterion_group!(limits, benches);
criterion_main!(limits);
