//! `[[hooks]]` against a guard service the test runs: a call denied by pattern, arguments and a
//! result rewritten, a hook that times out or answers garbage failing closed, then (after a
//! reload) open.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use serde_json::{Value, json};
use toolmux::app::EmbedderChoice;

use crate::harness::*;

/// A guard service on 127.0.0.1: denies an input that mentions an SSN, rewrites `rewrite-me`,
/// redacts a result that holds a secret, sleeps on `slow`, answers garbage on `garbage`.
async fn guard() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    // `pause` requests being answered now, and the most there ever were at once.
    let (now, busiest) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, most) = (now.clone(), busiest.clone());
    let app = axum::Router::new().route(
        "/check",
        axum::routing::post(move |Json(body): Json<Value>| {
            let (count, now, most) = (count.clone(), n.clone(), most.clone());
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let pausing = body["arguments"]["input"] == "pause";
                if pausing {
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                }
                let answer = decide(&body).await;
                if pausing {
                    now.fetch_sub(1, Ordering::SeqCst);
                }
                answer
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/check", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, asked, busiest)
}

/// The guard's answer to one request.
async fn decide(body: &Value) -> String {
    let input = body["arguments"]["input"].as_str().unwrap_or_default().to_string();
    let answer = match body["phase"].as_str() {
        Some("before") if input.contains("ssn") => {
            json!({"decision": "deny", "reason": "the input holds an SSN"})
        }
        Some("before") if input == "rewrite-me" => {
            json!({"decision": "replace", "arguments": {"input": "rewritten"}})
        }
        Some("before") if input == "pause" => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            json!({"decision": "allow"})
        }
        Some("before") if input == "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            json!({"decision": "allow"})
        }
        Some("before") if input == "garbage" => return "this is not a decision".to_string(),
        Some("after") if body["result"]["content"][0]["text"].as_str().unwrap_or_default().contains("secret") => {
            json!({"decision": "replace", "result": {"content": [{"type": "text", "text": "[redacted]"}]}})
        }
        _ => json!({"decision": "allow"}),
    };
    answer.to_string()
}

fn config(kit: &str, guard: &str, on_failure: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}\
         [[hooks]]\nname = \"guard\"\nurl = \"{guard}\"\nwhen = [\"before\", \"after\"]\ntimeout = \"500ms\"\nmax_in_flight = 1\non_failure = \"{on_failure}\"\n",
        http_backend_toml("kit", kit)
    )
}

#[tokio::test]
async fn a_guard_denies_rewrites_and_fails_closed_then_open() {
    let kit = http_backend("testkit").await;
    let (url, asked, busiest) = guard().await;
    let app = gateway(&config(&kit.url, &url, "deny"), EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let echo = |input: &'static str| call(&c, "kit_echo", json!({"input": input}));

    assert_eq!(text(&echo("hello").await), "hello");
    assert_eq!(asked.load(Ordering::SeqCst), 2, "the guard saw the call and its result");

    let denied = echo("my ssn is 078-05-1120").await;
    assert_eq!(denied.is_error, Some(true));
    assert!(text(&denied).contains("denied by the guardrail `guard`: the input holds an SSN"), "{}", text(&denied));
    assert_eq!(text(&echo("rewrite-me").await), "rewritten", "the guard's arguments were sent");
    assert_eq!(text(&echo("the secret is 42").await), "[redacted]", "the guard's result was returned");

    let slow = echo("slow").await;
    assert_eq!(slow.is_error, Some(true));
    assert!(
        text(&slow).contains("did not answer within 500ms") && text(&slow).contains("fails closed"),
        "{}",
        text(&slow)
    );
    let garbage = echo("garbage").await;
    assert_eq!(garbage.is_error, Some(true));
    assert!(text(&garbage).contains("not a decision"), "{}", text(&garbage));

    // One place (max_in_flight = 1): three calls at once reach the guard one at a time.
    let (a, b, c3) = tokio::join!(echo("pause"), echo("pause"), echo("pause"));
    for r in [a, b, c3] {
        assert_eq!(text(&r), "pause", "each waits for the place, within the timeout");
    }
    assert_eq!(busiest.load(Ordering::SeqCst), 1, "never more than one request at the guard at once");

    // Open: a hook that fails lets the call through.
    let done = app.reload(toolmux::config::Config::parse(&config(&kit.url, &url, "allow")).unwrap()).await;
    assert!(done.hooks, "{done}");
    assert_eq!(text(&echo("slow").await), "slow");
    assert_eq!(text(&echo("garbage").await), "garbage");
    assert_eq!(echo("an ssn").await.is_error, Some(true), "a denial still denies");
    app.shutdown().await;
}
