//! The process's descriptor limit, as a shell or service manager leaves it: `toolmux serve` runs
//! with its soft limit raised to the hard one, says so in `/status`, starts its stdio backends
//! with the limit it was given, and at the limit answers new connections 503 (counted) instead
//! of leaving them in the backlog or spinning its accept loop.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::Served;

/// The hard limit this test process may give a child: its own, capped so the test stays small.
fn hard_limit(cap: u64) -> u64 {
    rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap().1.min(cap)
}

#[tokio::test]
async fn the_soft_limit_is_raised_to_the_hard_one_and_backends_start_with_the_old_one() {
    let hard = hard_limit(4096);
    assert!(hard > 256, "this test needs a hard limit above 256 (have {hard})");
    let dir = tempfile::tempdir().unwrap();
    // A stdio "backend" that records the limit it was started with, then never answers.
    let seen = dir.path().join("backend-limit");
    let config = dir.path().join("toolmux.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n\n[[backends]]\nname = \"probe\"\n\
             command = \"sh\"\nargs = [\"-c\", \"ulimit -n > '{}'; exec sleep 60\"]\n",
            seen.display()
        ),
    )
    .unwrap();
    let served = Served::start_limited(&config, &[], &[], Some((256, hard))).await;
    let status = served.status().await;
    let d = &status["descriptors"];
    assert_eq!(d["limit"], hard, "the soft limit is raised to the hard one: {d}");
    assert_eq!(d["hard"], hard, "{d}");
    assert_eq!(d["started_with"], 256, "{d}");
    assert!(d["open"].as_u64().is_some_and(|n| n > 3), "{d}");
    let (_, metrics) = served.get("/metrics").await;
    assert!(metrics.contains(&format!("toolmux_descriptor_limit {hard}")), "{metrics}");
    let backend = crate::harness::eventually(Duration::from_secs(30), || async {
        std::fs::read_to_string(&seen).is_ok_and(|s| !s.trim().is_empty())
    })
    .await;
    assert!(backend, "the stdio backend started");
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "256", "a backend gets the limit toolmux was given");
}

/// Connects and sends half a request, as a slow or hostile client does.
async fn half_request(addr: &str) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    tcp
}

/// What the gateway said on `tcp` within a second (nothing, for a connection it holds).
async fn answer(tcp: &mut tokio::net::TcpStream) -> String {
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn at_the_limit_new_connections_are_refused_with_503_and_the_gateway_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\nheader_timeout = \"5m\"\nbody_timeout = \"5m\"\n",
    )
    .unwrap();
    // No room to raise: soft and hard both 64.
    let served = Served::start_limited(&config, &[], &[], Some((64, 64))).await;
    let addr = served.base.trim_start_matches("http://").to_string();
    let mut connections = Vec::new();
    for _ in 0..120 {
        connections.push(half_request(&addr).await);
    }
    let answers = futures::future::join_all(connections.iter_mut().map(answer)).await;
    let (refused, held): (Vec<&String>, Vec<&String>) = answers.iter().partition(|a| !a.is_empty());
    assert!(held.len() > 20, "the gateway held connections up to its limit: {}", held.len());
    assert!(!refused.is_empty(), "nothing was refused past the limit ({} held)", held.len());
    for said in &refused {
        assert!(said.starts_with("HTTP/1.1 503"), "{said}");
        assert!(said.contains("retry-after: 1") && said.contains("file descriptors"), "{said}");
    }
    // The connections close; the loop accepts again at once, and counted what it refused.
    drop(connections);
    // (The gateway notices each closed connection as it reads its end; until it has noticed
    // enough of them, a request may still be refused.)
    let served_again = |path: &'static str| {
        let served = &served;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let (status, body) = served.get(path).await;
                if status == 200 {
                    break body;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the gateway still refuses once connections closed: {body}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let metrics = served_again("/metrics").await;
    let counted: u64 = metrics
        .lines()
        .find(|l| l.starts_with("toolmux_connections_refused_total{reason=\"descriptors\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no refusal counted: {metrics}"));
    assert!(counted >= refused.len() as u64, "{counted} counted, {} seen", refused.len());
    // Under load the gateway may notice the last closed connections only now: asked again
    // until served, as for the metrics.
    let status: serde_json::Value = serde_json::from_str(&served_again("/status").await).unwrap();
    assert_eq!(status["descriptors"]["limit"], 64);
    assert!(status["descriptors"].get("started_with").is_none(), "{}", status["descriptors"]);
}
