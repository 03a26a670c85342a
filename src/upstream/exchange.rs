//! Per-caller credentials for a backend (`auth = "token_exchange"`): the caller's token is
//! exchanged at the configured OAuth 2.0 token endpoint (RFC 8693) for a token of the backend's
//! own, which is what the backend is sent; the caller's token never is.
//!
//! The gateway authenticates to the endpoint as a client (HTTP Basic, `client_secret_basic`).
//! Exchanged tokens are cached per caller token until shortly before they expire (a quarter of
//! their lifetime, at most 30 s, before), so a busy caller costs one exchange per token
//! lifetime, and a refreshed caller token gets an exchange of its own. An exchange that fails
//! fails the request with an error naming the backend and the endpoint's OAuth error code.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::config::TokenExchange;

const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
/// Callers whose exchanged tokens are kept (least recently used out first).
const CACHED: usize = 4096;
/// Deadline for one exchange, and the largest answer read.
const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_ANSWER: usize = 64 * 1024;
/// Lifetime assumed when the endpoint gives none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

pub struct Exchanger {
    cfg: TokenExchange,
    http: reqwest::Client,
    /// By the sha256 of the caller's token: the token itself is not kept as a key.
    cache: Mutex<lru::LruCache<[u8; 32], Exchanged>>,
}

#[derive(Clone)]
struct Exchanged {
    token: Arc<str>,
    /// From when the next request exchanges it again.
    refresh_at: Instant,
    /// Until when it is sent at all (what the connection sends between calls included).
    expires_at: Instant,
}

/// Why no token could be had; its text is for the client and names no secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExchangeError {
    #[error("the caller presented no token to exchange (toolmux has auth.mode = \"none\")")]
    NoToken,
    #[error("the token endpoint refused the exchange ({0})")]
    Refused(String),
    #[error("the token endpoint could not be reached")]
    Unreachable,
    #[error("the token endpoint's answer was not a token")]
    Malformed,
}

#[derive(Deserialize)]
struct Answer {
    access_token: String,
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct Refusal {
    error: String,
}

impl Exchanger {
    pub fn new(cfg: TokenExchange) -> Self {
        let http = reqwest::Client::builder().timeout(TIMEOUT).build().unwrap_or_default();
        let cache = Mutex::new(lru::LruCache::new(NonZeroUsize::new(CACHED).expect("a positive capacity")));
        Self { cfg, http, cache }
    }

    /// The backend's token for the caller who presented `subject`, exchanged now unless a
    /// fresh one is cached.
    pub async fn token_for(&self, subject: Option<&str>) -> Result<Arc<str>, ExchangeError> {
        let subject = subject.ok_or(ExchangeError::NoToken)?;
        let fresh = {
            let mut cache = self.cache.lock().expect("exchange cache lock");
            cache.get(&key(subject)).filter(|e| Instant::now() < e.refresh_at).map(|e| e.token.clone())
        };
        if let Some(token) = fresh {
            return Ok(token);
        }
        let exchanged = self.exchange(subject).await?;
        let token = exchanged.token.clone();
        self.cache.lock().expect("exchange cache lock").put(key(subject), exchanged);
        Ok(token)
    }

    /// The cached token for `subject`, if it has not expired: what each HTTP request to the
    /// backend is sent ([`Exchanger::token_for`] refreshes it before it gets there).
    pub fn cached(&self, subject: Option<&str>) -> Option<Arc<str>> {
        let mut cache = self.cache.lock().expect("exchange cache lock");
        cache.get(&key(subject?)).filter(|e| Instant::now() < e.expires_at).map(|e| e.token.clone())
    }

    async fn exchange(&self, subject: &str) -> Result<Exchanged, ExchangeError> {
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", GRANT_TYPE)
                .append_pair("subject_token", subject)
                .append_pair("subject_token_type", ACCESS_TOKEN)
                .append_pair("requested_token_type", ACCESS_TOKEN);
            if let Some(a) = &self.cfg.audience {
                form.append_pair("audience", a);
            }
            if let Some(s) = &self.cfg.scope {
                form.append_pair("scope", s);
            }
            form.finish()
        };
        let asked = Instant::now();
        let response = self
            .http
            .post(&self.cfg.token_url)
            .basic_auth(&self.cfg.client_id, Some(&self.cfg.client_secret))
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                tracing::warn!(error = %crate::redact::urls(&e.to_string()), "token exchange: no answer");
                ExchangeError::Unreachable
            })?;
        let status = response.status();
        let body = read_capped(response).await.ok_or(ExchangeError::Malformed)?;
        if !status.is_success() {
            // RFC 6749 §5.2: an error code; its description is the endpoint's and goes to the log only.
            let code = serde_json::from_slice::<Refusal>(&body).map(|r| r.error).unwrap_or_else(|_| status.to_string());
            let code: String = code.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
            tracing::info!(%status, %code, "token exchange refused");
            return Err(ExchangeError::Refused(code));
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|_| ExchangeError::Malformed)?;
        if answer.access_token.is_empty() {
            return Err(ExchangeError::Malformed);
        }
        let lifetime = answer.expires_in.map_or(DEFAULT_LIFETIME, Duration::from_secs);
        let margin = (lifetime / 4).min(Duration::from_secs(30));
        let token = Arc::from(answer.access_token);
        Ok(Exchanged { token, refresh_at: asked + lifetime - margin, expires_at: asked + lifetime })
    }
}

fn key(subject: &str) -> [u8; 32] {
    Sha256::digest(subject.as_bytes()).into()
}

/// The body, unless it is larger than [`MAX_ANSWER`].
async fn read_capped(mut response: reqwest::Response) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}
