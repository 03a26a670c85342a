//! The caller behind a client's own upstream sessions, as backends that ask for it see it
//! (`${client.principal}`, `${client.token}` in a backend's `headers`).
//!
//! The identity is live: each request of the client session presents its caller's credential
//! ([`crate::session::SessionHandle::present`]), and every HTTP request to the backend fills the
//! headers from the identity as it is then ([`CallerHeaders::fill`]). So a refreshed token
//! reaches the backend on the next call, and an expired one is never sent again after its
//! replacement was seen. Headers are sent exactly as configured: `Authorization = "Basic …"`
//! stays Basic.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{HeaderName, HeaderValue};

use super::exchange::Exchanger;
use crate::config::{CLIENT_PRINCIPAL, CLIENT_TOKEN};

/// Who the client is.
#[derive(Clone, Default)]
pub struct Identity {
    pub principal: String,
    pub token: Option<Arc<str>>,
}

/// One client session's identity, shared by all its upstream sessions and replaced whole.
pub type LiveIdentity = Arc<ArcSwap<Identity>>;

/// A backend's headers that carry the caller's identity, with the identity to fill them from.
#[derive(Clone)]
pub struct CallerHeaders {
    live: LiveIdentity,
    templates: Arc<[(HeaderName, String)]>,
    /// `auth = "token_exchange"`: `Authorization` carries the caller's exchanged token.
    exchange: Option<Arc<Exchanger>>,
}

impl CallerHeaders {
    pub fn new(live: LiveIdentity, templates: Vec<(HeaderName, String)>, exchange: Option<Arc<Exchanger>>) -> Self {
        Self { live, templates: templates.into(), exchange }
    }

    /// `headers` with the caller's headers added, filled from the identity as it is now.
    pub fn fill(&self, mut headers: HashMap<HeaderName, HeaderValue>) -> HashMap<HeaderName, HeaderValue> {
        if self.templates.is_empty() && self.exchange.is_none() {
            return headers;
        }
        let id = self.live.load();
        if let Some(exchange) = &self.exchange {
            // Exchanged before the request (`ClientUpstreams::link`); none cached means none is
            // sent, never the caller's own token.
            let token = exchange.cached(id.token.as_deref());
            if let Some(v) = token.and_then(|t| HeaderValue::try_from(format!("Bearer {t}")).ok()) {
                headers.insert(http::header::AUTHORIZATION, v);
            }
        }
        for (name, template) in self.templates.iter() {
            let filled = template
                .replace(CLIENT_PRINCIPAL, &id.principal)
                .replace(CLIENT_TOKEN, id.token.as_deref().unwrap_or_default());
            match HeaderValue::try_from(filled) {
                Ok(v) => {
                    headers.insert(name.clone(), v);
                }
                // A principal or token that cannot be a header value is left out, not mangled.
                Err(_) => tracing::warn!(header = %name, "a caller header could not be filled; it is not sent"),
            }
        }
        headers
    }
}

/// A backend's configured headers: those sent as they are, and those filled from the caller's
/// identity on each request.
#[allow(clippy::type_complexity)]
pub(super) fn split_headers(
    headers: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<(HashMap<http::HeaderName, http::HeaderValue>, Vec<(http::HeaderName, String)>)> {
    let mut fixed = HashMap::new();
    let mut per_caller = Vec::new();
    for (k, v) in headers {
        let name = http::HeaderName::try_from(k.as_str())?;
        if crate::config::carries_identity(v) {
            per_caller.push((name, v.clone()));
        } else {
            fixed.insert(name, http::HeaderValue::try_from(v.as_str())?);
        }
    }
    Ok((fixed, per_caller))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_follow_the_identity_and_keep_their_scheme() {
        let live: LiveIdentity =
            Arc::new(ArcSwap::from_pointee(Identity { principal: "alice".into(), token: Some(Arc::from("t1")) }));
        let headers = CallerHeaders::new(
            live.clone(),
            vec![
                (HeaderName::from_static("authorization"), "Basic ${client.token}".into()),
                (HeaderName::from_static("x-user"), "${client.principal}".into()),
            ],
            None,
        );
        let (authorization, user) = (HeaderName::from_static("authorization"), HeaderName::from_static("x-user"));
        let first = headers.fill(HashMap::new());
        assert_eq!(first[&authorization], "Basic t1");
        assert_eq!(first[&user], "alice");
        live.store(Arc::new(Identity { principal: "alice".into(), token: Some(Arc::from("t2")) }));
        assert_eq!(headers.fill(HashMap::new())[&authorization], "Basic t2");
    }
}
