//! The HTTP listener: MCP streamable HTTP at `server.path`, `/healthz` (alive) and `/readyz`
//! (every backend listed or failed once, and the tool index built). Host and Origin checks are
//! rmcp's: on a loopback bind, a non-local Host or Origin gets 403. In front of rmcp, toolmux
//! answers what rmcp would answer in plain text or with the wrong code: an oversized body (413),
//! a body that is not one well-formed message ([`jsonrpc`]), and `DELETE` (200 when a session
//! ends, 404 for one that does not exist).

pub mod jsonrpc;

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
    let sessions = Arc::new(LocalSessionManager::default());
    let mcp = StreamableHttpService::new(move || Ok(GatewayHandler::new(handler_gw.clone())), sessions.clone(), cfg);
    let ready_gw = gw;
    let max_body = server.max_body;
    let mcp = Router::new()
        .fallback_service(mcp)
        .layer(axum::middleware::from_fn(move |req, next| check_json_rpc(req, next, max_body)))
        .layer(axum::middleware::from_fn(move |req, next| end_session(req, next, sessions.clone())));
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

/// Answers a POST body that is not one well-formed message with its JSON-RPC error (see
/// [`jsonrpc`]), and one over `max_body` with 413, before the MCP service sees it.
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
    if let Err(rejection) = jsonrpc::check(&bytes) {
        return (rejection.http_status(), axum::Json(rejection.body())).into_response();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// `DELETE` of a session: 404 when there is no such session (the spec's answer for any request
/// on an ended session), and 200 when it ends. rmcp answers 202 either way, which clients read
/// as a failed termination (the Python SDK accepts only 200 and 204).
async fn end_session(req: Request, next: Next, sessions: Arc<LocalSessionManager>) -> Response {
    if req.method() != axum::http::Method::DELETE {
        return next.run(req).await;
    }
    let id = req.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let Some(id) = id {
        let known = sessions.sessions.read().await.contains_key(id.as_str());
        if !known {
            return (StatusCode::NOT_FOUND, "no such session\n").into_response();
        }
    }
    let mut response = next.run(req).await;
    if response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// `https://app.example.com:8443` → `app.example.com:8443`.
fn host_of(origin: &str) -> &str {
    let s = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    s.trim_end_matches('/')
}
