//! Authentication at the edge: every request to the MCP endpoint (and to the health endpoints
//! unless `auth.public_health`) carries a verified [`Caller`] in its extensions, or is answered
//! 401 with `WWW-Authenticate` pointing at the protected-resource metadata (RFC 9728), which
//! `/.well-known/oauth-protected-resource` serves so that MCP clients can find the
//! authorization server. The reason for a refusal goes to the log; the wire says only
//! `invalid_token`.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::{Authenticator, Refusal};

pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

pub struct Edge {
    /// Replaced whole by a reload that changes tokens or JWT settings.
    pub auth: Arc<arc_swap::ArcSwap<Authenticator>>,
    /// The MCP endpoint's public URL, when configured; else derived from `Host`.
    pub resource_url: Option<String>,
    pub path: String,
}

impl Edge {
    /// The MCP endpoint's URL as the client reached it.
    pub fn resource(&self, headers: &HeaderMap) -> String {
        if let Some(url) = &self.resource_url {
            return url.clone();
        }
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        format!("http://{host}{}", self.path)
    }

    fn metadata_url(&self, headers: &HeaderMap) -> String {
        let resource = self.resource(headers);
        // RFC 9728: the well-known path goes between the host and the resource's path.
        match resource.split_once("://").and_then(|(scheme, rest)| rest.split_once('/').map(|(h, p)| (scheme, h, p))) {
            Some((scheme, host, path)) => format!("{scheme}://{host}{METADATA_PATH}/{path}"),
            None => format!("{resource}{METADATA_PATH}"),
        }
    }

    /// Lets the request through with its [`crate::session::Caller`], or answers 401.
    pub async fn check(&self, mut req: Request, next: Next) -> Response {
        let authorization = req.headers().get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or("(not text)"));
        let auth = self.auth.load_full();
        match auth.authenticate(authorization).await {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                next.run(req).await
            }
            Err(refusal) => {
                tracing::info!(reason = refusal.reason(), path = %req.uri().path(), "request refused: 401");
                let mut challenge = format!("Bearer resource_metadata=\"{}\"", self.metadata_url(req.headers()));
                if let Refusal::Invalid(_) = refusal {
                    challenge.push_str(", error=\"invalid_token\"");
                }
                (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], "unauthorized\n").into_response()
            }
        }
    }

    /// The protected-resource metadata document.
    pub fn metadata(&self, headers: &HeaderMap) -> Response {
        axum::Json(self.auth.load().metadata(&self.resource(headers))).into_response()
    }
}
