//! The HTTP listener: MCP streamable HTTP at `server.path`, `/healthz` (alive) and `/readyz`
//! (every backend tried once and the tool index built). Body size, Host and Origin checks are
//! rmcp's: an oversized body gets 413; on a loopback bind, a non-local Host or Origin gets 403.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::mcp::{Gateway, GatewayHandler};

pub fn router(gw: Arc<Gateway>, server: &ServerConfig, bound: SocketAddr, ct: &CancellationToken) -> Router {
    let mut cfg = StreamableHttpServerConfig::default()
        .with_cancellation_token(ct.child_token())
        .with_max_request_body_bytes(server.max_body);
    if bound.ip().is_loopback() {
        // DNS-rebinding protection: only local names, plus what the operator allows.
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        hosts.extend(server.allowed_origins.iter().map(|o| host_of(o).to_string()));
        cfg = cfg.with_allowed_hosts(hosts);
        // rmcp checks `Origin` only when given a list: always give one, so that a web page from
        // elsewhere cannot drive a local gateway through the browser. No `Origin` (a non-browser
        // client) is accepted.
        let mut origins: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .flat_map(|h| [format!("http://{h}:*"), format!("https://{h}:*")])
            .collect();
        origins.extend(server.allowed_origins.iter().cloned());
        cfg = cfg.with_allowed_origins(origins);
    } else {
        cfg = cfg.disable_allowed_hosts();
    }
    let handler_gw = gw.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(GatewayHandler::new(handler_gw.clone())),
        Arc::new(LocalSessionManager::default()),
        cfg,
    );
    let ready_gw = gw;
    let max_body = server.max_body;
    let mcp = Router::new()
        .fallback_service(mcp)
        .layer(axum::middleware::from_fn(move |req, next| check_json_rpc(req, next, max_body)));
    Router::new().nest_service(&server.path, mcp).route("/healthz", get(|| async { "ok\n" })).route(
        "/readyz",
        get(move || {
            let gw = ready_gw.clone();
            async move {
                if gw.is_ready() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting: backends are being tried and the tool index built\n")
                }
            }
        }),
    )
}

/// Answers a POST body that is not JSON-RPC with a JSON-RPC error (rmcp would answer in plain
/// text), and one over `max_body` with 413, before the MCP service sees it.
async fn check_json_rpc(req: Request, next: Next, max_body: usize) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, max_body).await {
        Ok(b) => b,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, format!("request body over server.max_body ({max_body} bytes)\n"))
                .into_response();
        }
    };
    let problem = match serde_json::from_slice::<Value>(&bytes) {
        Err(e) => Some((-32700, format!("Parse error: {e}"))),
        Ok(v) => {
            let one = |m: &Value| m.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
            let ok = match &v {
                Value::Object(_) => one(&v),
                Value::Array(items) => !items.is_empty() && items.iter().all(one),
                _ => false,
            };
            (!ok).then(|| (-32600, "Invalid Request: expected a JSON-RPC 2.0 message object".to_string()))
        }
    };
    if let Some((code, message)) = problem {
        let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// `https://app.example.com:8443` → `app.example.com:8443`.
fn host_of(origin: &str) -> &str {
    let s = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    s.trim_end_matches('/')
}
