//! The HTTP edge, spoken to raw: JSON-RPC errors, sessions, limits, health endpoints, and the
//! CLI's configuration errors.

use std::sync::Arc;

use serde_json::{Value, json};
use toolmux::app::EmbedderChoice;

use crate::harness::*;

const ACCEPT: &str = "application/json, text/event-stream";

async fn app_with(extra: &str) -> toolmux::app::App {
    gateway(&format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{extra}"), EmbedderChoice::None).await
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

#[tokio::test]
async fn malformed_json_rpc_gets_a_json_rpc_parse_error() {
    let app = app_with("").await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let r = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .body("{this is not json")
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert!(status.is_client_error(), "{status} {body}");
    assert!(body.contains("-32700"), "a JSON-RPC parse error: {status} {body}");
    app.shutdown().await;
}

#[tokio::test]
async fn unknown_session_id_gets_404() {
    let app = app_with("").await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let http = reqwest::Client::new();
    // A real session first, so the server is known to speak sessions.
    let r = http.post(&url).header("accept", ACCEPT).json(&initialize()).send().await.unwrap();
    assert!(r.status().is_success());
    assert!(r.headers().get("mcp-session-id").is_some());
    let r = http
        .post(&url)
        .header("accept", ACCEPT)
        .header("mcp-session-id", "no-such-session")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    app.shutdown().await;
}

#[tokio::test]
async fn oversized_body_gets_413() {
    let app = app_with("max_body = 2048\n").await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let mut big = initialize();
    big["params"]["clientInfo"]["name"] = json!("x".repeat(4096));
    let r = reqwest::Client::new().post(&url).header("accept", ACCEPT).json(&big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    // Just under the limit is fine.
    let r = reqwest::Client::new().post(&url).header("accept", ACCEPT).json(&initialize()).send().await.unwrap();
    assert!(r.status().is_success());
    app.shutdown().await;
}

#[tokio::test]
async fn healthz_and_readyz() {
    let app = app_with("").await;
    let base = format!("http://{}", app.addr.unwrap());
    assert_eq!(reqwest::get(format!("{base}/healthz")).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(format!("{base}/readyz")).await.unwrap().status(), 200);
    app.shutdown().await;
}

#[tokio::test]
async fn a_non_local_host_header_is_refused() {
    let app = app_with("").await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let r = reqwest::Client::new()
        .post(&url)
        .header("host", "evil.example.com")
        .header("accept", ACCEPT)
        .json(&initialize())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    app.shutdown().await;
}

#[test]
fn an_invalid_config_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[server]\nmode = \"turbo\"\n\n[[backends]]\nname = \"x\"\nurl = \"http://127.0.0.1:1/mcp\"\ntimeout = \"soon\"\n").unwrap();
    let out = std::process::Command::new(BIN).args(["check-config", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2: `server.mode`"), "{err}");
    assert!(err.contains("line 7: `backends[0].timeout`"), "{err}");

    std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let out = std::process::Command::new(BIN).args(["check-config", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_example_config_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            toolmux::config::Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 2, "examples found: {n}");
}

async fn post_initialize(app: &toolmux::app::App, origin: Option<&str>) -> reqwest::StatusCode {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let mut r = reqwest::Client::new().post(&url).header("accept", ACCEPT).json(&initialize());
    if let Some(o) = origin {
        r = r.header("origin", o);
    }
    r.send().await.unwrap().status()
}

#[tokio::test]
async fn a_foreign_origin_is_refused_unless_allowed() {
    let app = app_with("").await;
    assert_eq!(post_initialize(&app, Some("http://evil.example.com")).await, 403, "a page from elsewhere");
    assert_eq!(post_initialize(&app, Some("http://localhost:5173")).await, 200, "a local page");
    assert_eq!(post_initialize(&app, None).await, 200, "a client that is not a browser");
    app.shutdown().await;

    let app = app_with("allowed_origins = [\"https://app.example.com:443\"]\n").await;
    assert_eq!(post_initialize(&app, Some("https://app.example.com")).await, 200, "allowed by the operator");
    assert_eq!(post_initialize(&app, Some("http://evil.example.com")).await, 403);
    app.shutdown().await;
}

/// Opens a session over raw HTTP; returns its id.
async fn open_session(http: &reqwest::Client, url: &str) -> String {
    let r = http.post(url).header("accept", ACCEPT).json(&initialize()).send().await.unwrap();
    assert!(r.status().is_success());
    let id = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let r = http
        .post(url)
        .header("accept", ACCEPT)
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    id
}

/// Posts `body` as it is on session `id`; returns the status and the JSON-RPC error, if any.
async fn post_raw(http: &reqwest::Client, url: &str, id: &str, body: &str) -> (u16, Value) {
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-session-id", id)
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    // A JSON answer, or the JSON event of a streamed one (after its empty primer).
    let answer = serde_json::from_str(&text).ok().or_else(|| {
        text.lines().filter_map(|l| l.strip_prefix("data:")).find_map(|d| serde_json::from_str(d.trim()).ok())
    });
    (status, answer.unwrap_or_else(|| json!({"raw": text})))
}

#[tokio::test]
async fn malformed_messages_get_the_json_rpc_error_that_names_the_problem() {
    let kit = http_backend("testkit").await;
    let app = app_with(&http_backend_toml("kit", &kit.url)).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let http = reqwest::Client::new();
    let id = open_session(&http, &url).await;
    for (body, code, words) in [
        (r#"{"jsonrpc":"2.0","id":1}"#, -32600, "no `method`"),
        (r#"{"jsonrpc":"2.0","id":{"x":1},"method":"tools/list"}"#, -32600, "`id` must be"),
        (r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#, -32600, "duplicate key `id`"),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#, -32600, "batches are not supported"),
        (r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{}}"#, -32602, "`name` is required"),
        (r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":3}}"#, -32602, "`name` must be a string"),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"kit_echo","arguments":"{}"}}"#,
            -32602,
            "`arguments` must be an object",
        ),
    ] {
        let (status, answer) = post_raw(&http, &url, &id, body).await;
        assert_eq!(answer["error"]["code"], code, "{body} → {status} {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{body} → {message}");
        let expected_status = if code == -32602 { 200 } else { 400 };
        assert_eq!(status, expected_status, "{body}");
        if code == -32602 {
            assert_eq!(answer["id"], 5, "the error answers the request");
        }
    }
    // The session is unharmed: a good call still works.
    let (status, answer) = post_raw(
        &http,
        &url,
        &id,
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"kit_echo","arguments":{"input":"still here"}}}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["result"]["content"][0]["text"], "still here", "{answer}");
    app.shutdown().await;
}

#[tokio::test]
async fn delete_ends_a_session_with_200_and_an_unknown_one_gets_404() {
    let app = app_with("").await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let http = reqwest::Client::new();
    let id = open_session(&http, &url).await;
    let delete = || http.delete(&url).header("mcp-session-id", &id).header("mcp-protocol-version", "2025-11-25").send();
    assert_eq!(delete().await.unwrap().status(), 200, "the session ends");
    assert_eq!(delete().await.unwrap().status(), 404, "it is gone");
    let (status, _) = post_raw(&http, &url, &id, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).await;
    assert_eq!(status, 404, "and takes no more requests");
    app.shutdown().await;
}

/// Opens a TCP connection to `app` and sends `head`, then nothing more.
async fn trickle(app: &toolmux::app::App, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(app.addr.unwrap()).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_to_close(tcp: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn half_sent_headers_are_cut_off_and_cannot_starve_a_real_client() {
    let app = app_with("max_connections = 4\nheader_timeout = \"1s\"\n").await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    // Every connection slot taken by a client that sends nothing or never finishes its headers.
    let mut stuck = Vec::new();
    for head in ["", "POST /mcp HTTP/1.1\r\n", "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n", "P"] {
        stuck.push(trickle(&app, head).await);
    }
    // A real client waits in the backlog until the header timeout frees a slot, then gets in.
    let http = reqwest::Client::new();
    let real = tokio::spawn(async move { http.post(&url).header("accept", ACCEPT).json(&initialize()).send().await });
    for tcp in &mut stuck {
        let closed = tokio::time::timeout(std::time::Duration::from_secs(20), read_to_close(tcp)).await;
        assert!(closed.is_ok(), "a connection with half-sent headers stays open past server.header_timeout");
    }
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), real).await.expect("the real client got in");
    assert!(r.unwrap().unwrap().status().is_success());
    app.shutdown().await;
}

/// Headers that keep coming, a line or a byte at a time, are cut off at `server.header_timeout`
/// too: the deadline runs from a request's first byte, not from the last one, for a
/// connection's first request and for a later one on the same connection alike; twenty such
/// connections at once are all closed.
#[tokio::test]
async fn headers_trickled_a_line_at_a_time_are_cut_off() {
    use tokio::io::AsyncWriteExt;
    let app = app_with("header_timeout = \"3s\"\n").await;
    let one = |first: bool, bytes: bool| {
        let app = &app;
        async move {
            let mut tcp = trickle(app, "").await;
            if !first {
                // A whole request first: the deadline holds for the next one on the connection.
                let body = serde_json::to_string(&initialize()).unwrap();
                let request = format!(
                    "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                     Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                tcp.write_all(request.as_bytes()).await.unwrap();
                let mut answer = [0u8; 12];
                tokio::io::AsyncReadExt::read_exact(&mut tcp, &mut answer).await.unwrap();
                assert_eq!(&answer, b"HTTP/1.1 200");
            }
            let started = std::time::Instant::now();
            tcp.write_all(b"POST /mcp HTTP/1.1\r\n").await.unwrap();
            let lines = (0..40).map(|i| format!("X-Line-{i}: {i}\r\n"));
            let pieces: Vec<String> = match bytes {
                true => lines.flat_map(|l| l.chars().map(String::from).collect::<Vec<_>>()).collect(),
                false => lines.collect(),
            };
            let every = std::time::Duration::from_millis(if bytes { 200 } else { 1500 });
            let mut cut_off = false;
            for piece in pieces {
                tokio::time::sleep(every).await;
                if tcp.write_all(piece.as_bytes()).await.is_err() || started.elapsed().as_secs() > 20 {
                    cut_off = tcp.write_all(b"x").await.is_err();
                    break;
                }
            }
            let elapsed = started.elapsed();
            assert!(cut_off, "first request {first}, bytes {bytes}: kept open for {elapsed:?}");
            assert!(
                elapsed < std::time::Duration::from_secs(8),
                "first {first}, bytes {bytes}: cut off after {elapsed:?}"
            );
        }
    };
    let all = (0..20).map(|i| one(i % 2 == 0, i % 4 < 2));
    futures::future::join_all(all).await;
    app.shutdown().await;
}

/// The pattern of a crowded network or an attacker, exactly: 500 connections at once to a
/// `toolmux serve` with the default `server.header_timeout` (10 s), each sending its request line
/// and `Host` header first, then one `X-Slow-<n>: <unix time>` line every 2 seconds, never the
/// empty line that ends the headers. Every one is closed by the gateway between 10 and 14 s
/// after its first byte (the timeout, plus one line's wait to notice), none before.
#[tokio::test]
async fn five_hundred_connections_trickling_a_header_every_two_seconds_are_all_cut_at_the_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // 500 sockets here and 500 in the gateway's process: a limit of 1,024 would not do.
    rlimit::increase_nofile_limit(4096).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n").unwrap();
    let served = Served::start(&config).await;
    let addr = served.base.trim_start_matches("http://").to_string();
    let one = |n: usize| {
        let addr = addr.clone();
        async move {
            let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let started = std::time::Instant::now();
            tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
            let (mut read, mut write) = tcp.split();
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::now() + std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(2),
            );
            let mut sink = [0u8; 512];
            loop {
                tokio::select! {
                    // EOF, a reset or an answer: the gateway is done with this connection.
                    _ = read.read(&mut sink) => return started.elapsed(),
                    _ = tick.tick() => {
                        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
                        if write.write_all(format!("X-Slow-{n}: {now}\r\n").as_bytes()).await.is_err() {
                            return started.elapsed();
                        }
                        if started.elapsed() > std::time::Duration::from_secs(30) {
                            return started.elapsed();
                        }
                    }
                }
            }
        }
    };
    let closed = futures::future::join_all((0..500).map(one)).await;
    let early = closed.iter().filter(|t| t.as_secs_f64() < 9.5).count();
    let late: Vec<_> = closed.iter().filter(|t| t.as_secs_f64() > 14.0).collect();
    assert_eq!(early, 0, "closed before server.header_timeout");
    assert!(late.is_empty(), "{} of 500 stayed open past 14 s: {:?}", late.len(), &late[..late.len().min(5)]);
    let (_, metrics) = served.get("/metrics").await;
    let cut: u64 = metrics
        .lines()
        .find(|l| l.starts_with("toolmux_connections_cut_total{reason=\"header_timeout\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(cut >= 500, "the cuts are counted: {cut}");
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408_naming_the_limit() {
    let app = app_with("body_timeout = \"1s\"\n").await;
    let head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Accept: application/json, text/event-stream\r\nContent-Length: 200\r\n\r\n{\"jsonrpc\":";
    let mut tcp = trickle(&app, head).await;
    let answer = tokio::time::timeout(std::time::Duration::from_secs(20), read_to_close(&mut tcp))
        .await
        .expect("the server answers and closes a stalled body");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("server.body_timeout"), "{answer}");
    app.shutdown().await;
}

/// A backend whose one tool, `region`, mirrors its `region` argument into `Mcp-Param-Region`.
#[derive(Clone)]
struct Regional;

impl rmcp::ServerHandler for Regional {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(rmcp::model::ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _r: Option<rmcp::model::PaginatedRequestParams>,
        _c: rmcp::service::RequestContext<rmcp::service::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        let schema = json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}});
        let tool = rmcp::model::Tool::new(
            "region",
            "Runs in a region",
            std::sync::Arc::new(schema.as_object().unwrap().clone()),
        );
        Ok(rmcp::model::ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        p: rmcp::model::CallToolRequestParams,
        _c: rmcp::service::RequestContext<rmcp::service::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let region = p.arguments.and_then(|a| a.get("region").cloned()).unwrap_or_default();
        Ok(rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(format!("ran in {region}"))])
            .into())
    }
}

/// SEP-2243: a session-less caller's `Mcp-Param-*` headers are checked against its arguments
/// for the tool in its own scope, under a policy that is not open too (-32020 on a mismatch); a
/// caller without the tool gets "not found", never a header verdict that would say it exists.
#[tokio::test]
async fn param_headers_are_checked_for_the_callers_own_tool() {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let service = StreamableHttpService::new(
        || Ok(Regional),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await });
    let policy = "[[policy]]\nprincipals = [\"alice\"]\nbackends = [\"geo\"]\n";
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}{policy}{}",
        bearer_tokens(&["alice", "bob"]),
        http_backend_toml("geo", &backend_url)
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let post = |token: &'static str, header: Option<&'static str>| {
        let url = url.clone();
        async move {
            let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "geo_region", "arguments": {"region": "eu-west"},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
                          "io.modelcontextprotocol/clientCapabilities": {}}}});
            let mut req = reqwest::Client::new()
                .post(&url)
                .bearer_auth(token)
                .header("accept", ACCEPT)
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "geo_region")
                .json(&body);
            if let Some(h) = header {
                req = req.header("mcp-param-region", h);
            }
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, body) = post("alice", Some("us-east")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("-32020") && body.contains("Mcp-Param-Region"), "{body}");
    let (status, body) = post("alice", None).await;
    assert!(status == 400 && body.contains("-32020") && body.contains("missing"), "{status} {body}");
    let (status, body) = post("alice", Some("eu-west")).await;
    assert!(status == 200 && body.contains("ran in"), "{status} {body}");
    // Bob may not use the tool: what he hears is that it does not exist, whatever his header.
    let (_, body) = post("bob", Some("us-east")).await;
    assert!(!body.contains("-32020") && body.contains("not found"), "{body}");
    // A session id beside a 2026-07-28 request does not waive the check.
    let mut auth = reqwest::header::HeaderMap::new();
    auth.insert("authorization", "Bearer alice".parse().unwrap());
    let alice = reqwest::Client::builder().default_headers(auth).build().unwrap();
    let session = open_session(&alice, &url).await;
    let r = alice
        .post(&url)
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-session-id", &session)
        .header("mcp-param-region", "us-east")
        .json(&json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                      "params": {"name": "geo_region", "arguments": {"region": "eu-west"}}}))
        .send()
        .await
        .unwrap();
    let (status, body) = (r.status().as_u16(), r.text().await.unwrap());
    assert!(status == 400 && body.contains("-32020"), "a session header skipped the check: {status} {body}");
    app.shutdown().await;
}
