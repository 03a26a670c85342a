//! The HTTP listener: MCP streamable HTTP at `server.path`, `/healthz` (alive) and `/readyz`
//! (every backend listed or failed once, and the tool index built). Host and Origin checks are
//! rmcp's: on a loopback bind, a non-local Host or Origin gets 403. In front of rmcp, toolmux
//! answers what rmcp would answer in plain text or with the wrong code: an oversized body (413),
//! a body that does not arrive within `server.body_timeout` (408), a body that is not one
//! well-formed message ([`jsonrpc`]), a new session past `server.max_sessions` (503), and
//! `DELETE` (200 when a session ends, 404 for one that does not exist). Connection limits are
//! [`serve`]'s.

pub mod auth;
pub mod jsonrpc;
pub mod serve;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::{AuthConfig, ServerConfig};
use crate::mcp::{Gateway, GatewayHandler};
use crate::session::Caller;

pub fn router(
    gw: Arc<Gateway>,
    server: &ServerConfig,
    auth: (&AuthConfig, Arc<crate::auth::Authenticator>),
    bound: SocketAddr,
    ct: &CancellationToken,
) -> Router {
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
    let mut sessions = LocalSessionManager::default();
    // rmcp ends a session after this long without a message; its upstream sessions end with it.
    sessions.session_config.keep_alive = Some(server.limits.session_idle_timeout);
    let sessions = Arc::new(sessions);
    let mcp = StreamableHttpService::new(move || Ok(GatewayHandler::new(handler_gw.clone())), sessions.clone(), cfg);
    let ready_gw = gw.clone();
    let status_gw = gw.clone();
    let edge = Arc::new(Edge {
        gw,
        sessions,
        max_body: server.max_body,
        body_timeout: server.limits.body_timeout,
        max_sessions: server.limits.max_sessions,
        owners: Default::default(),
    });
    let gate =
        Arc::new(auth::Edge { auth: auth.1, resource_url: auth.0.resource_url.clone(), path: server.path.clone() });
    let checked = {
        let gate = gate.clone();
        axum::middleware::from_fn(move |req, next| {
            let gate = gate.clone();
            async move { gate.check(req, next).await }
        })
    };
    let mcp = Router::new()
        .fallback_service(mcp)
        .layer(axum::middleware::from_fn(move |req, next| {
            let edge = edge.clone();
            async move { edge.check(req, next).await }
        }))
        .layer(checked.clone());
    let health = Router::new().route("/healthz", get(|| async { "ok\n" })).route(
        "/readyz",
        get(move || {
            let gw = ready_gw.clone();
            async move {
                if gw.is_draining() {
                    (StatusCode::SERVICE_UNAVAILABLE, "stopping: running calls are finishing\n")
                } else if gw.is_ready() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting: backends are being tried and the tool index built\n")
                }
            }
        }),
    );
    let metrics_gw = status_gw.clone();
    let health = health.route(
        "/metrics",
        get(move || {
            let gw = metrics_gw.clone();
            async move {
                ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], gw.render_metrics())
            }
        }),
    );
    let health = if auth.0.public_health { health } else { health.layer(checked.clone()) };
    // Backend names and errors: only for authenticated callers when authentication is on.
    let status = Router::new()
        .route(
            "/status",
            get(move || {
                let gw = status_gw.clone();
                async move { axum::Json(gw.status()) }
            }),
        )
        .layer(checked);
    let metadata = get(move |headers: axum::http::HeaderMap| {
        let gate = gate.clone();
        async move { gate.metadata(&headers) }
    });
    Router::new()
        .nest_service(&server.path, mcp)
        .merge(health)
        .merge(status)
        .route(auth::METADATA_PATH, metadata.clone())
        .route(&format!("{}{}", auth::METADATA_PATH, server.path), metadata)
}

/// What toolmux checks before rmcp sees a request.
struct Edge {
    gw: Arc<Gateway>,
    sessions: Arc<LocalSessionManager>,
    max_body: usize,
    body_timeout: Duration,
    max_sessions: usize,
    /// The principal that created each session: only it may use the session.
    owners: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Edge {
    async fn check(&self, req: Request, next: Next) -> Response {
        let principal =
            req.extensions().get::<Caller>().map_or(crate::config::ANONYMOUS, |c| c.principal.as_str()).to_string();
        let session = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Some(id) = &session {
            // Another principal's session is answered like one that does not exist.
            let owner = self.owners.lock().expect("owners lock").get(id).cloned();
            if owner.is_some_and(|o| o != principal) {
                tracing::info!(%principal, "request refused: 404 for another principal's session");
                return (StatusCode::NOT_FOUND, "no such session\n").into_response();
            }
        }
        let response = match *req.method() {
            axum::http::Method::POST => self.post(req, next).await,
            axum::http::Method::DELETE => self.delete(req, next).await,
            _ => next.run(req).await,
        };
        if session.is_none()
            && let Some(id) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok())
        {
            self.own(id, principal).await;
        }
        response
    }

    /// Records `principal` as the owner of the new session `id`, and forgets sessions that ended.
    async fn own(&self, id: &str, principal: String) {
        let known = self.owners.lock().expect("owners lock").len();
        if known >= 64 && known >= 2 * self.sessions.sessions.read().await.len() {
            let live = self.sessions.sessions.read().await;
            self.owners.lock().expect("owners lock").retain(|id, _| live.contains_key(id.as_str()));
        }
        self.owners.lock().expect("owners lock").insert(id.to_string(), principal);
    }

    /// Answers a body over `max_body` with 413, one that does not arrive in time with 408, one
    /// that is not one well-formed message with its JSON-RPC error (see [`jsonrpc`]), and an
    /// `initialize` past `max_sessions` with 503.
    async fn post(&self, req: Request, next: Next) -> Response {
        let (parts, body) = req.into_parts();
        let max_body = self.max_body;
        let bytes = match tokio::time::timeout(self.body_timeout, axum::body::to_bytes(body, max_body)).await {
            Err(_) => {
                let after = humantime::format_duration(self.body_timeout);
                return (
                    StatusCode::REQUEST_TIMEOUT,
                    format!("request body not received within {after} (server.body_timeout)\n"),
                )
                    .into_response();
            }
            Ok(Err(_)) => {
                return (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body over server.max_body ({max_body} bytes)\n"),
                )
                    .into_response();
            }
            Ok(Ok(b)) => b,
        };
        if let Err(rejection) = jsonrpc::check(&bytes) {
            return (rejection.http_status(), axum::Json(rejection.body())).into_response();
        }
        if !parts.headers.contains_key(SESSION_HEADER)
            && let Some(id) = jsonrpc::initialize_id(&bytes)
        {
            if self.gw.is_draining() {
                let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": SERVER_BUSY, "message": "toolmux is stopping; connect again (to another replica, or once it has restarted)"}});
                return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            }
            let open = self.sessions.sessions.read().await.len();
            if open >= self.max_sessions {
                let message = format!(
                    "toolmux already serves {open} sessions, its limit (server.max_sessions); close a session you no longer use, or try again later"
                );
                let body =
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": SERVER_BUSY, "message": message}});
                return (StatusCode::SERVICE_UNAVAILABLE, [(axum::http::header::RETRY_AFTER, "5")], axum::Json(body))
                    .into_response();
            }
        }
        if jsonrpc::is_listen(&bytes) {
            return next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await;
        }
        // Counted until the answer's last byte is written: a stop waits for it.
        let inflight = self.gw.inflight.token();
        let response = next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await;
        response.map(|body| {
            use futures::StreamExt;
            axum::body::Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _ = &inflight;
                chunk
            }))
        })
    }

    /// `DELETE` of a session: 404 when there is no such session (the spec's answer for any
    /// request on an ended session), and 200 when it ends. rmcp answers 202 either way, which
    /// clients read as a failed termination (the Python SDK accepts only 200 and 204).
    async fn delete(&self, req: Request, next: Next) -> Response {
        let id = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Some(id) = id {
            let known = self.sessions.sessions.read().await.contains_key(id.as_str());
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
}

const SESSION_HEADER: &str = "mcp-session-id";
/// JSON-RPC's implementation-defined server error, for a refused new session.
pub const SERVER_BUSY: i32 = -32000;

/// `https://app.example.com:8443` → `app.example.com:8443`.
fn host_of(origin: &str) -> &str {
    let s = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    s.trim_end_matches('/')
}
