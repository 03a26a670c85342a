//! The HTTP listener: MCP streamable HTTP at `server.path`, `/healthz` (alive) and `/readyz`
//! (every backend listed or failed once, and the tool index built). Host and Origin checks are
//! rmcp's: on a loopback bind, a non-local Host or Origin gets 403. In front of rmcp, toolmux
//! answers what rmcp would answer in plain text or with the wrong code: an oversized body (413),
//! a body that does not arrive within `server.body_timeout` (408), a body that is not one
//! well-formed message ([`jsonrpc`]), a new session past `server.max_sessions` (503), and
//! `DELETE` (200 when a session ends, 404 for one that does not exist). Connection limits are
//! [`serve`]'s.

pub mod jsonrpc;
pub mod params;
pub mod serve;
pub mod sessions;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::SessionManager;

use self::sessions::Sessions;
use crate::auth::edge;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::{AuthConfig, ServerConfig};
use crate::mcp::{Gateway, GatewayHandler};
use crate::session::Caller;
use crate::session::shared::{Record, Restored, RmcpStore, SessionKey, SharedSessions};

pub fn router(
    gw: Arc<Gateway>,
    server: &ServerConfig,
    auth: (&AuthConfig, Arc<arc_swap::ArcSwap<crate::auth::Authenticator>>),
    bound: SocketAddr,
    ct: &CancellationToken,
) -> Router {
    // The names a loopback bind answers to (DNS-rebinding protection); `None`: any.
    let local_hosts = bound.ip().is_loopback().then(|| {
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        hosts.extend(server.allowed_origins.iter().map(|o| host_of(o).to_string()));
        hosts
    });
    let mut cfg = StreamableHttpServerConfig::default()
        .with_cancellation_token(ct.child_token())
        .with_max_request_body_bytes(server.max_body);
    let shared = gw.shared_sessions().cloned();
    // rmcp replays the `initialize` of a session this replica has not seen from the store.
    cfg.session_store = shared.clone().map(|s| Arc::new(RmcpStore(s)) as _);
    if let Some(hosts) = local_hosts.clone() {
        // DNS-rebinding protection: only local names, plus what the operator allows.
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
    // A session ends after this long without a message; its upstream sessions end with it.
    let settings = sessions::Settings { idle_timeout: server.limits.session_idle_timeout, sse_retry: cfg.sse_retry };
    let sessions = Arc::new(Sessions::new(settings, gw.registry().clone(), shared.clone()));
    let mcp = StreamableHttpService::new(move || Ok(GatewayHandler::new(handler_gw.clone())), sessions.clone(), cfg);
    let ready_gw = gw.clone();
    let status_gw = gw.clone();
    let console_gw = gw.clone();
    let edge = Arc::new(Edge {
        gw,
        sessions,
        max_body: server.max_body,
        body_timeout: server.limits.body_timeout,
        max_sessions: server.limits.max_sessions,
        max_sessions_per_principal: server.limits.max_sessions_per_principal,
        shared,
    });
    if let Some(shared) = edge.shared.clone() {
        tokio::spawn(sweep_ended(edge.clone(), shared, ct.child_token()));
    }
    tokio::spawn(give_back_memory(edge.sessions.clone(), ct.child_token()));
    let gate =
        Arc::new(edge::Edge { auth: auth.1, resource_url: auth.0.resource_url.clone(), path: server.path.clone() });
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
            get(move |caller: Option<axum::Extension<Caller>>| {
                let gw = status_gw.clone();
                let caller = caller.map_or_else(Caller::anonymous, |c| c.0);
                async move { axum::Json(gw.status_for(&caller)) }
            }),
        )
        .layer(checked);
    let console = server.console.then(|| crate::console::router(console_gw, gate.clone(), local_hosts));
    let metadata = get(move |headers: axum::http::HeaderMap| {
        let gate = gate.clone();
        async move { gate.metadata(&headers) }
    });
    let router = Router::new()
        .nest_service(&server.path, mcp)
        .merge(health)
        .merge(status)
        .route(edge::METADATA_PATH, metadata.clone())
        .route(&format!("{}{}", edge::METADATA_PATH, server.path), metadata);
    match console {
        Some(console) => router.merge(console),
        None => router,
    }
}

/// What toolmux checks before rmcp sees a request.
struct Edge {
    /// With the registry of the sessions held here: whose each one is.
    gw: Arc<Gateway>,
    sessions: Arc<Sessions>,
    max_body: usize,
    body_timeout: Duration,
    max_sessions: usize,
    /// Sessions one authenticated principal may hold here (the anonymous principal of a
    /// gateway without authentication is everyone: `max_sessions` bounds it).
    max_sessions_per_principal: usize,
    /// Where sessions other replicas created are found ([`SharedSessions`]).
    shared: Option<Arc<SharedSessions>>,
}

impl Edge {
    async fn check(self: Arc<Self>, mut req: Request, next: Next) -> Response {
        let principal =
            req.extensions().get::<Caller>().map_or(crate::config::ANONYMOUS, |c| c.principal.as_str()).to_string();
        let session = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut restoring = false;
        if let Some(id) = &session {
            // Every session held here is claimed for its principal before its id is known to
            // anyone ([`Sessions`]): a request for a session held with no owner never reaches it.
            match self.gw.registry().owner(id) {
                // Another principal's session is answered like one that does not exist.
                Some(owner) if *owner != *principal => {
                    tracing::info!(%principal, "request refused: 404 for another principal's session");
                    return no_such_session();
                }
                Some(_) => self.refresh(id),
                None if self.sessions.holds(id) => {
                    tracing::info!(%principal, "request refused: 404 for a session whose owner is not recorded");
                    return no_such_session();
                }
                None => {
                    // Not held here (never, or no longer): the store says whose it is, if anyone's.
                    if let Some(shared) = &self.shared {
                        match self.restorable(shared, id, &principal).await {
                            Ok(record) => {
                                req.extensions_mut().insert(Restored(Arc::new(record)));
                                // Claimed before rmcp replays it, for requests that arrive meanwhile.
                                let _ = self.gw.registry().claim(id, &principal);
                                restoring = true;
                            }
                            Err(refusal) => return refusal,
                        }
                    }
                }
            }
            req.extensions_mut().insert(SessionKey(Arc::from(id.as_str())));
        }
        let response = match *req.method() {
            axum::http::Method::POST => self.post(req, next).await,
            axum::http::Method::DELETE => self.delete(req, next).await,
            _ => next.run(req).await,
        };
        let created = if session.is_none() {
            response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned)
        } else {
            None
        };
        if let Some(id) = created {
            if let Some(shared) = &self.shared {
                // Written before the client has the id: its next request may go to another replica.
                shared.created(&id, &principal).await;
            }
        } else if restoring
            && let Some(id) = session
            && !self.sessions.holds(&id)
        {
            // The rebuild failed: nothing is held here under the claim.
            self.gw.registry().end(&id);
            if let Some(shared) = &self.shared {
                shared.ended_here(&id);
            }
        }
        response
    }

    /// Checks a session this replica has not seen against the store: it must be there and be
    /// `principal`'s. Answers 404 otherwise, and 503 when the store cannot say.
    async fn restorable(&self, shared: &SharedSessions, id: &str, principal: &str) -> Result<Record, Response> {
        let record = match shared.fetch(id).await {
            Err(e) => {
                tracing::warn!(error = %e.0, "a session unknown here could not be looked up");
                let message =
                    "this replica does not hold the session, and the session store did not answer; retry shortly\n";
                return Err((StatusCode::SERVICE_UNAVAILABLE, [(axum::http::header::RETRY_AFTER, "1")], message)
                    .into_response());
            }
            Ok(None) => return Err(no_such_session()),
            Ok(Some(r)) => r,
        };
        if record.principal != principal {
            tracing::info!(%principal, "request refused: 404 for another principal's stored session");
            return Err(no_such_session());
        }
        if self.gw.is_draining() {
            let message = "toolmux is stopping; send the session's requests to another replica\n";
            return Err((StatusCode::SERVICE_UNAVAILABLE, message).into_response());
        }
        let open = self.sessions.count();
        if open >= self.max_sessions {
            let message = format!("toolmux already serves {open} sessions, its limit (server.max_sessions)\n");
            return Err(
                (StatusCode::SERVICE_UNAVAILABLE, [(axum::http::header::RETRY_AFTER, "5")], message).into_response()
            );
        }
        shared.restoring(id, &record);
        Ok(record)
    }

    /// Pushes a shared session's expiry back now and then, and ends it here if it was ended
    /// on another replica.
    fn refresh(self: &Arc<Self>, id: &str) {
        let Some(shared) = self.shared.clone() else { return };
        if !shared.due(id) {
            return;
        }
        let edge = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            if !shared.refresh(&id).await {
                tracing::debug!("a session ended on another replica is ended here too");
                let _ = edge.sessions.close_session(&id.into()).await;
            }
        });
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
        if let Some(refusal) = self.param_headers(&parts, &bytes) {
            return refusal;
        }
        if !parts.headers.contains_key(SESSION_HEADER)
            && let Some(id) = jsonrpc::initialize_id(&bytes)
        {
            if self.gw.is_draining() {
                let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": SERVER_BUSY, "message": "toolmux is stopping; connect again (to another replica, or once it has restarted)"}});
                return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            }
            let open = self.sessions.count();
            if open >= self.max_sessions {
                let message = format!(
                    "toolmux already serves {open} sessions, its limit (server.max_sessions); close a session you no longer use, or try again later"
                );
                let body =
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": SERVER_BUSY, "message": message}});
                return (StatusCode::SERVICE_UNAVAILABLE, [(axum::http::header::RETRY_AFTER, "5")], axum::Json(body))
                    .into_response();
            }
            let caller = parts.extensions.get::<Caller>();
            if let Some(caller) = caller.filter(|c| c.principal != crate::config::ANONYMOUS) {
                let held = self.gw.registry().count_of(&caller.principal);
                if held >= self.max_sessions_per_principal {
                    tracing::info!(principal = %caller.principal, held, "initialize refused: the principal's session limit");
                    let message = format!(
                        "you hold {held} sessions, the most one principal may (server.max_sessions_per_principal); \
                         end one you no longer use (DELETE), or let one expire, then connect again"
                    );
                    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": SERVER_BUSY, "message": message}});
                    return (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response();
                }
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

    /// A `tools/call` of a revision with `Mcp-Param-*` headers whose headers do not match its
    /// arguments, for the tool as the caller's own scope has it: 400 with JSON-RPC -32020
    /// ([`params`]). Such revisions have no sessions, so an `Mcp-Session-Id` sent beside one
    /// changes nothing: the check is never skipped for it.
    fn param_headers(&self, parts: &axum::http::request::Parts, bytes: &[u8]) -> Option<Response> {
        let revision = parts.headers.get("mcp-protocol-version").and_then(|v| v.to_str().ok())?;
        if revision < params::FIRST_REVISION {
            return None;
        }
        let message: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        if message.get("method")?.as_str()? != "tools/call" {
            return None;
        }
        let name = message.pointer("/params/name")?.as_str()?;
        if self.gw.mode != crate::config::Mode::Passthrough && !self.gw.is_pinned(name) {
            return None;
        }
        let caller = parts.extensions.get::<Caller>().cloned().unwrap_or_else(Caller::anonymous);
        let scope = self.gw.scope_for(&caller);
        let tool = scope.tool(name)?;
        let arguments = message.pointer("/params/arguments");
        let why = params::check(&parts.headers, arguments, &tool.tool.input_schema).err()?;
        let body =
            serde_json::json!({"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": -32020, "message": why}});
        Some((StatusCode::BAD_REQUEST, axum::Json(body)).into_response())
    }

    /// `DELETE` of a session: 404 when there is no such session (the spec's answer for any
    /// request on an ended session), and 200 when it ends. rmcp answers 202 either way, which
    /// clients read as a failed termination (the Python SDK accepts only 200 and 204).
    async fn delete(&self, req: Request, next: Next) -> Response {
        let id = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Some(id) = id {
            let known = self.sessions.holds(&id);
            if !known {
                // A stored session (checked in `check`) ends in the store; nothing runs here.
                if let Some(shared) = &self.shared
                    && req.extensions().get::<Restored>().is_some()
                {
                    shared.delete(&id).await;
                    return (StatusCode::OK, "session ended\n").into_response();
                }
                return no_such_session();
            }
        }
        let mut response = next.run(req).await;
        if response.status() == StatusCode::ACCEPTED {
            *response.status_mut() = StatusCode::OK;
        }
        response
    }
}

/// Hands the memory of ended sessions back to the system. glibc's allocator keeps freed pages
/// for reuse, so a gateway that once held many sessions kept their peak for good. The live
/// count is sampled every second and every fall is added up (a wave that comes and goes between
/// two looks at a high-water mark would be missed); once `FALL` sessions have ended since the
/// last trim, `malloc_trim` returns what is free (at most every `TRIM_EVERY`; a trim walks the
/// heap once, milliseconds).
async fn give_back_memory(sessions: Arc<sessions::Sessions>, ct: CancellationToken) {
    /// Sessions that must have ended since the last trim before another one.
    const FALL: usize = 64;
    const TRIM_EVERY: Duration = Duration::from_secs(5);
    let mut last = 0usize;
    let mut ended = 0usize;
    let mut trimmed_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = ct.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let live = sessions.count();
        ended += last.saturating_sub(live);
        last = live;
        if ended >= FALL && trimmed_at.elapsed() >= TRIM_EVERY {
            let started = std::time::Instant::now();
            let trimmed = tokio::task::spawn_blocking(crate::memory::trim).await.unwrap_or(false);
            tracing::debug!(live, ended, trimmed, took = ?started.elapsed(), "handed freed session memory back");
            ended = 0;
            trimmed_at = tokio::time::Instant::now();
        }
    }
}

/// Ends here, every [`SharedSessions::refresh_every`], the held sessions that a `DELETE` on
/// another replica ended, whether or not they are in use: the bound docs/operations.md states.
async fn sweep_ended(edge: Arc<Edge>, shared: Arc<SharedSessions>, ct: CancellationToken) {
    let mut tick = tokio::time::interval(shared.refresh_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ct.cancelled() => return,
            _ = tick.tick() => {}
        }
        let sweep = shared.sweep_starts();
        let held = edge.sessions.ids();
        for id in shared.ended_among(&held).await {
            tracing::debug!("a session ended on another replica is ended here too");
            let _ = edge.sessions.close_session(&id.into()).await;
            shared.sweep_ended_one(sweep);
        }
    }
}

/// The answer for a session that does not exist, has ended, or is another principal's: the
/// spec's 404, the same in every case so that an id reveals nothing.
fn no_such_session() -> Response {
    (StatusCode::NOT_FOUND, "no such session\n").into_response()
}

const SESSION_HEADER: &str = "mcp-session-id";
/// JSON-RPC's implementation-defined server error, for a refused new session.
pub const SERVER_BUSY: i32 = -32000;

/// `https://app.example.com:8443` → `app.example.com:8443`.
fn host_of(origin: &str) -> &str {
    let s = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    s.trim_end_matches('/')
}
