//! The operator console at `/ui`: one page (HTML, CSS and JS compiled into the binary, no build
//! step) that reads the JSON endpoints under `/ui/api/` and draws them. The page itself holds no
//! data and needs no credentials; every endpoint is authenticated like MCP requests
//! (`auth::edge`) and answers per caller ([`views`]).
//!
//! Browser safety: on a loopback bind only local `Host` names (and `server.allowed_origins`) are
//! served, so a web page elsewhere cannot reach the console through DNS rebinding; nothing changes
//! state on GET; a POST must carry the console's own header (`X-Toolmux-Console`, which no form
//! can set and no other origin may send without a preflight toolmux never approves) and, when the
//! browser names one, an `Origin` equal to the page's own; every answer carries a strict
//! Content-Security-Policy (scripts and styles from the page's origin only, no inline code).

pub mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::mcp::Gateway;
use crate::session::Caller;

/// Where the console is served.
pub const PATH: &str = "/ui";
/// The header a state-changing console request must carry.
pub const CSRF_HEADER: &str = "x-toolmux-console";
/// Largest request body the console reads (a playground request is a few hundred bytes; the
/// query itself is held to find_tool's own `optimizer.max_query_chars`).
const MAX_BODY: usize = 64 * 1024;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// The console's routes. `gate` authenticates each API request (the MCP endpoint's own check);
/// `local_hosts` is the list of `Host` names accepted on a loopback bind (`None`: any).
pub fn router(gw: Arc<Gateway>, gate: Arc<crate::auth::edge::Edge>, local_hosts: Option<Vec<String>>) -> Router {
    let checked = axum::middleware::from_fn(move |req, next| {
        let gate = gate.clone();
        async move { gate.check(req, next).await }
    });
    let api = Router::new()
        .route("/overview", get(overview))
        .route("/search", post(search))
        .route("/tools", get(tools))
        .route("/tools/accept", post(accept))
        .route("/traffic", get(traffic))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(same_origin_posts))
        .layer(checked)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(gw);
    let hosts = Arc::new(local_hosts);
    Router::new()
        .route(PATH, get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route(&format!("{PATH}/"), get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route(&format!("{PATH}/console.js"), get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route(&format!("{PATH}/console.css"), get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .nest(&format!("{PATH}/api"), api)
        .route(&format!("{PATH}/{{*rest}}"), get(not_found).post(not_found))
        .layer(axum::middleware::from_fn(move |req, next| {
            let hosts = hosts.clone();
            async move { guard(hosts.as_ref().as_deref(), req, next).await }
        }))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such console page or endpoint")
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// Every console answer: local `Host` names only on a loopback bind, and the security headers.
async fn guard(local_hosts: Option<&[String]>, req: Request, next: Next) -> Response {
    if let Some(allowed) = local_hosts {
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(host_name);
        if !host.is_some_and(|h| allowed.iter().any(|a| a.eq_ignore_ascii_case(h))) {
            tracing::info!(host = ?host, "console request refused: 403 for a Host that is not local");
            return error(StatusCode::FORBIDDEN, "the console answers local host names only on a loopback bind");
        }
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    res
}

/// `host[:port]` (or `[v6]:port`) without its port.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// A POST must come from the console's own page: its header, and its own origin when the
/// browser says one.
async fn same_origin_posts(req: Request, next: Next) -> Response {
    if req.method() == axum::http::Method::POST {
        if !req.headers().contains_key(CSRF_HEADER) {
            return error(StatusCode::FORBIDDEN, "a console change must come from the console page");
        }
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
            let origin = origin.to_str().unwrap_or_default();
            let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
            if origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host) {
                tracing::info!(origin, "console request refused: 403 for another origin");
                return error(StatusCode::FORBIDDEN, "a console change must come from the console's own origin");
            }
        }
    }
    next.run(req).await
}

fn caller_of(ext: Option<axum::Extension<Caller>>) -> Caller {
    ext.map_or_else(Caller::anonymous, |c| c.0)
}

type State = axum::extract::State<Arc<Gateway>>;
type Who = Option<axum::Extension<Caller>>;

async fn overview(gw: State, who: Who) -> Response {
    let caller = caller_of(who);
    // Admins see everyone's use of their limits; anyone else, their own.
    let only = (!gw.is_admin(&caller)).then_some(caller.principal.as_str());
    let limits = gw.limiter.usage(only).await;
    axum::Json(views::overview(&gw, &caller, &limits)).into_response()
}

async fn tools(gw: State, who: Who) -> Response {
    axum::Json(views::tools(&gw, &caller_of(who))).into_response()
}

async fn traffic(gw: State, who: Who) -> Response {
    axum::Json(views::traffic(&gw, &caller_of(who))).into_response()
}

fn refused(r: views::Refused) -> Response {
    match r {
        views::Refused::Forbidden(why) => error(StatusCode::FORBIDDEN, why),
        views::Refused::Invalid(why) => error(StatusCode::BAD_REQUEST, &why),
    }
}

/// A JSON body, or a 400/413/415 that says what is wrong with it.
fn body<T: serde::de::DeserializeOwned>(
    parsed: Result<axum::Json<T>, axum::extract::rejection::JsonRejection>,
) -> Result<T, Box<Response>> {
    parsed.map(|j| j.0).map_err(|e| Box::new(error(e.status(), &e.body_text())))
}

async fn search(
    gw: State,
    who: Who,
    parsed: Result<axum::Json<views::SearchRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let req = match body(parsed) {
        Ok(r) => r,
        Err(res) => return *res,
    };
    match views::search(&gw, &caller_of(who), req).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => refused(r),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AcceptRequest {
    backend: String,
    tool: Option<String>,
}

async fn accept(
    gw: State,
    who: Who,
    parsed: Result<axum::Json<AcceptRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let req = match body(parsed) {
        Ok(r) => r,
        Err(res) => return *res,
    };
    let caller = caller_of(who);
    let answer = views::accept(&gw, &caller, &req.backend, req.tool.as_deref()).await;
    let decision = match &answer {
        Ok(_) => "allowed",
        Err(views::Refused::Forbidden(_)) => "denied",
        Err(views::Refused::Invalid(_)) => "refused",
    };
    let mut e = crate::audit::Entry::new("console/accept", &caller.principal, decision);
    e.backend = Some(req.backend.clone());
    e.tool = req.tool.clone();
    if let Err(views::Refused::Invalid(why)) = &answer {
        e.detail = Some(why.clone());
    }
    gw.audit().record(e);
    match answer {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => refused(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_port() {
        assert_eq!(host_name("127.0.0.1:4483"), "127.0.0.1");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:80"), "::1");
    }
}
