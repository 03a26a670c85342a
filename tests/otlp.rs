//! Traces exported over OTLP: one trace runs from the client through toolmux to the backend.
//! A test binary of its own, built only with `--features otlp` (scripts/test.sh runs it), so
//! that the feature does not rebuild the whole integration-test binary `it`.

#[path = "it/harness.rs"]
#[allow(dead_code)] // the shared harness, of which these tests use a part
mod harness;

use std::time::Duration;

use serde_json::json;

use harness::*;

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A client's `traceparent` becomes the parent of toolmux's request span, and the backend gets
/// toolmux's own span (same trace, another span id) as its parent; the collector receives
/// toolmux's spans in that trace when the gateway stops.
#[tokio::test]
async fn toolmux_joins_the_clients_trace_and_parents_the_backends() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let (logs_tx, mut logs_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let collector = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(body.to_vec());
                }
            }),
        )
        .route(
            "/v1/logs",
            axum::routing::post(move |body: axum::body::Bytes| {
                let tx = logs_tx.clone();
                async move {
                    let _ = tx.send(body.to_vec());
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, collector).await });

    let kit = http_backend("testkit").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    // The audit trail goes to a file and, as log records, to the same collector.
    let trail = dir.path().join("audit.jsonl");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[audit]\nfile = {:?}\notlp = true\n{}",
        trail.display().to_string(),
        http_backend_toml("kit", &kit.url)
    );
    std::fs::write(&config, toml).unwrap();
    let mut served = Served::start_env(&config, &[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]).await;

    let (trace_id, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let session = RawSession::open_url(&served.url).await;
    let r = session
        .request(
            "tools/call",
            json!({"name": "kit_whoami", "arguments": {}, "_meta": {"traceparent": format!("00-{trace_id}-{client_span}-01")}}),
        )
        .await;
    let said = r["content"][0]["text"].as_str().unwrap_or_default().to_string();
    let parent = said.rsplit("traceparent=").next().unwrap_or_default();
    let fields: Vec<&str> = parent.split('-').collect();
    assert_eq!(fields.len(), 4, "the backend got a traceparent: {said}");
    assert_eq!(fields[1], trace_id, "the backend's parent is in the client's trace: {said}");
    assert_ne!(fields[2], client_span, "the backend's parent is toolmux's span, not the client's: {said}");
    let backend_call_span = fields[2].to_string();

    served.signal(nix::sys::signal::Signal::SIGTERM);
    let exit = tokio::time::timeout(Duration::from_secs(30), served.child.wait()).await.expect("it stops").unwrap();
    assert!(exit.success(), "{exit:?}");
    let mut exported = Vec::new();
    while let Ok(body) = rx.try_recv() {
        exported.extend(body);
    }
    assert!(holds(&exported, &bytes(trace_id)), "spans in the client's trace were exported ({} bytes)", exported.len());
    assert!(holds(&exported, &bytes(client_span)), "the client's span is a parent in what was exported");
    assert!(holds(&exported, &bytes(&backend_call_span)), "the span the backend was given was exported");

    // The call's audit line was exported as a log record, whole (its chain hash included).
    let mut logs = Vec::new();
    while let Ok(body) = logs_rx.try_recv() {
        logs.extend(body);
    }
    let line =
        std::fs::read_to_string(&trail).unwrap().lines().find(|l| l.contains("\"tools/call\"")).unwrap().to_string();
    assert!(holds(&logs, line.as_bytes()), "the audit line was exported as a log record ({} bytes)", logs.len());
    assert!(holds(&logs, b"toolmux.audit"), "under the audit's event name");
}
