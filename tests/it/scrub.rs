//! Secrets out of what backends answer (`[results] scrub`): a credential a tool prints reaches
//! no client, in passthrough and through call_tool, with a session and without one, in a
//! resource read and a prompt; a backend with `scrub = false` is passed through as it is; each
//! replacement is counted by backend and rule. Progress and log messages a backend sends
//! during a call, and log messages it sends between calls, are scrubbed on their way too.

use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams};
use serde_json::json;
use toolmux::app::EmbedderChoice;

use crate::harness::*;
use crate::sessions::{Who, call_with_progress, connect};

/// Correctly formatted, random, opens nothing.
const KEY: &str = "AKIAZ7VRSQ5NWXKQ2JMF";
const URL: &str = "postgres://app:Xq9-vT7pL2wR@db.internal:5432/app";

fn config(mode: &str, kit: &str, raw: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n{}{}scrub = false\n",
        http_backend_toml("kit", kit),
        http_backend_toml("raw", raw),
    )
}

#[tokio::test]
async fn a_credential_a_tool_prints_reaches_no_client() {
    let (kit, raw) = (http_backend("testkit").await, http_backend("testkit").await);
    let printed = format!("aws_access_key_id = {KEY}\nDATABASE_URL={URL}\nregion = eu-west-1");

    // Passthrough, with a session: the tool's own name.
    let app = gateway(&config("passthrough", &kit.url, &raw.url), EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let out = text(&call(&c, "kit_echo", json!({"input": printed})).await);
    assert!(!out.contains(KEY) && !out.contains("Xq9-vT7pL2wR"), "{out}");
    assert!(out.contains("[redacted: aws-access-token]") && out.contains("[redacted: url-password]"), "{out}");
    assert!(out.contains("region = eu-west-1") && out.contains("postgres://app:"), "the rest is kept: {out}");
    // A backend with scrub = false: as it printed it.
    assert_eq!(text(&call(&c, "raw_echo", json!({"input": printed})).await), printed);
    // A resource read and a prompt carry what the backend said too.
    let read = c.read_resource(ReadResourceRequestParams::new(format!("demo://testkit/items/{KEY}"))).await.unwrap();
    let read = serde_json::to_string(&read).unwrap();
    assert!(!read.contains(KEY) && read.contains("[redacted: aws-access-token]"), "{read}");
    let mut args = serde_json::Map::new();
    args.insert("topic".into(), json!(format!("the logs with {URL}")));
    let prompt = c.get_prompt(GetPromptRequestParams::new("kit_summarize").with_arguments(args)).await.unwrap();
    let prompt = serde_json::to_string(&prompt).unwrap();
    assert!(!prompt.contains("Xq9-vT7pL2wR") && prompt.contains("[redacted: url-password]"), "{prompt}");
    // The key: once in the echo, and in the item read three times (its URI, id and title).
    let metrics = app.gateway.render_metrics();
    assert!(
        metrics.contains("toolmux_redactions_total{backend=\"kit\",rule=\"aws-access-token\"} 4"),
        "counted by backend and rule: {metrics}"
    );
    assert!(!metrics.contains("backend=\"raw\",rule="), "nothing scrubbed from raw: {metrics}");
    c.cancel().await.unwrap();
    app.shutdown().await;

    // Optimizer: through call_tool, with a session and without one.
    let app = gateway(&config("optimizer", &kit.url, &raw.url), EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let through = call(&c, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": printed}})).await;
    let out = serde_json::to_string(&through).unwrap();
    assert!(!out.contains(KEY) && out.contains("[redacted: aws-access-token]"), "{out}");
    let sessionless = stateless_client(&app, Recorder::default(), None).await;
    let out = call(&sessionless, "call_tool", json!({"tool_name": "kit_echo", "parameters": {"input": printed}})).await;
    let out = serde_json::to_string(&out).unwrap();
    assert!(!out.contains(KEY) && out.contains("[redacted: aws-access-token]"), "{out}");
    c.cancel().await.unwrap();
    sessionless.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn progress_and_log_messages_are_scrubbed_on_their_way() {
    let kit = http_backend("testkit").await;
    let toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}", http_backend_toml("kit", &kit.url));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let who = Who::new("A");
    let c = connect(&app, who.clone()).await;
    call_with_progress(&c, "kit_progress", json!({"steps": 2, "label": format!("reading {KEY}")})).await;
    assert_eq!(
        text(&call(&c, "kit_log", json!({"level": "info", "message": format!("connected to {URL}")})).await),
        "sent"
    );
    let progress = who.progress.lock().unwrap().clone();
    assert_eq!(progress.len(), 2, "{progress:?}");
    assert!(progress.iter().all(|m| m.starts_with("reading [redacted: aws-access-token] ")), "{progress:?}");
    let logs = who.logs.lock().unwrap().clone();
    assert_eq!(logs, ["connected to postgres://app:[redacted: url-password]@db.internal:5432/app"]);
    // Sent after the call answered, tied to no call: it comes on the session's standalone
    // stream, scrubbed all the same.
    let later = json!({"level": "info", "message": format!("key {KEY}"), "after_ms": 50});
    assert_eq!(text(&call(&c, "kit_log", later).await), "scheduled");
    let arrived =
        eventually(std::time::Duration::from_secs(10), || async { who.logs.lock().unwrap().len() == 2 }).await;
    let logs = who.logs.lock().unwrap().clone();
    assert!(arrived, "{logs:?}");
    assert_eq!(logs[1], "key [redacted: aws-access-token]");
    c.cancel().await.unwrap();
    app.shutdown().await;
}
