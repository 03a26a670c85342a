//! Per-caller credentials for a backend (`auth = "token_exchange"`): the caller's token is
//! exchanged at the configured OAuth 2.0 token endpoint (RFC 8693) for a token of the backend's
//! own, which is what the backend is sent; the caller's token never is.
//!
//! The gateway authenticates to the endpoint as a client (HTTP Basic, `client_secret_basic`,
//! its id and secret form-encoded first as RFC 6749 §2.3.1 asks). Exchanged tokens are cached
//! per caller token until shortly before they expire (a quarter of their lifetime, at most 30 s,
//! before), so a busy caller costs one exchange per token lifetime, and a refreshed caller token
//! gets an exchange of its own. Concurrent first requests of one caller share one exchange. An
//! exchange that fails fails the request with an error naming the backend and the endpoint's
//! OAuth error code; a refusal is remembered for [`REFUSAL_MEMORY`], so a refused caller cannot
//! make the gateway hammer the endpoint. The endpoint's redirects are not followed, and a
//! lifetime it gives is clamped to [`MIN_LIFETIME`]..[`MAX_LIFETIME`]: a token said to expire at
//! once is still sent with the request it was exchanged for (the backend then judges it).

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
/// The shortest and longest lifetime believed.
pub const MIN_LIFETIME: Duration = Duration::from_secs(5);
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a refused caller token is refused without asking the endpoint again.
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(10);

pub struct Exchanger {
    cfg: TokenExchange,
    http: reqwest::Client,
    /// By the sha256 of the caller's token: the token itself is not kept as a key.
    cache: Mutex<lru::LruCache<[u8; 32], Exchanged>>,
    /// Refusals, by the same key, until when they stand.
    refused: Mutex<lru::LruCache<[u8; 32], (Instant, ExchangeError)>>,
    /// One lock per caller token being exchanged: concurrent requests wait for the first.
    exchanging: Mutex<std::collections::HashMap<[u8; 32], Arc<tokio::sync::Mutex<()>>>>,
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
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        let capacity = NonZeroUsize::new(CACHED).expect("a positive capacity");
        Self {
            cfg,
            http,
            cache: Mutex::new(lru::LruCache::new(capacity)),
            refused: Mutex::new(lru::LruCache::new(capacity)),
            exchanging: Mutex::default(),
        }
    }

    /// The backend's token for the caller who presented `subject`, exchanged now unless a
    /// fresh one is cached (or the endpoint refused it a moment ago).
    pub async fn token_for(&self, subject: Option<&str>) -> Result<Arc<str>, ExchangeError> {
        let subject = subject.ok_or(ExchangeError::NoToken)?;
        let key = key(subject);
        if let Some(ready) = self.ready(&key) {
            return ready;
        }
        // The first request for this token exchanges it; the others wait and take its answer.
        let lock = self.exchanging.lock().expect("exchanging lock").entry(key).or_default().clone();
        let answer = {
            let _turn = lock.lock().await;
            match self.ready(&key) {
                Some(ready) => ready,
                None => match self.exchange(subject).await {
                    Ok(exchanged) => {
                        let token = exchanged.token.clone();
                        self.cache.lock().expect("exchange cache lock").put(key, exchanged);
                        Ok(token)
                    }
                    Err(e) => {
                        if matches!(e, ExchangeError::Refused(_)) {
                            let until = Instant::now() + REFUSAL_MEMORY;
                            self.refused.lock().expect("exchange cache lock").put(key, (until, e.clone()));
                        }
                        Err(e)
                    }
                },
            }
        };
        let mut exchanging = self.exchanging.lock().expect("exchanging lock");
        if Arc::strong_count(&lock) <= 2 {
            exchanging.remove(&key);
        }
        answer
    }

    /// A fresh cached token for `key`, or its standing refusal.
    fn ready(&self, key: &[u8; 32]) -> Option<Result<Arc<str>, ExchangeError>> {
        let now = Instant::now();
        if let Some(token) = self.cache.lock().expect("exchange cache lock").get(key).filter(|e| now < e.refresh_at) {
            return Some(Ok(token.token.clone()));
        }
        let refused =
            self.refused.lock().expect("exchange cache lock").get(key).filter(|(until, _)| now < *until).cloned();
        refused.map(|(_, e)| Err(e))
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
            .basic_auth(form_encoded(&self.cfg.client_id), Some(form_encoded(&self.cfg.client_secret)))
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
        // A lifetime of 0 (or none worth the name) is exchanged again by the next request, but
        // still sent with this one; a huge one is not believed.
        let said = answer.expires_in.map_or(DEFAULT_LIFETIME, Duration::from_secs).min(MAX_LIFETIME);
        let lifetime = said.max(MIN_LIFETIME);
        let margin = (said / 4).min(Duration::from_secs(30));
        let token = Arc::from(answer.access_token);
        Ok(Exchanged { token, refresh_at: asked + said - margin, expires_at: asked + lifetime })
    }
}

/// `application/x-www-form-urlencoded`, as RFC 6749 §2.3.1 asks of Basic credentials.
fn form_encoded(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A token endpoint on 127.0.0.1 that counts the exchanges it was asked for, checks the
    /// client's form-encoded Basic credentials, refuses `mallory` and answers `zero` and `huge`
    /// with those lifetimes.
    async fn endpoint() -> (Exchanger, Arc<AtomicUsize>) {
        use axum::http::{HeaderMap, StatusCode};
        use base64::Engine;
        let asked = Arc::new(AtomicUsize::new(0));
        let count = asked.clone();
        let app = axum::Router::new().route(
            "/token",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let basic = base64::engine::general_purpose::STANDARD.encode("my+id%3A1:p%40ss+word");
                    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Basic {basic}")) {
                        return (StatusCode::UNAUTHORIZED, axum::Json(serde_json::json!({"error": "invalid_client"})));
                    }
                    // Slow enough that concurrent requests overlap.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let form: std::collections::HashMap<String, String> =
                        form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                    let subject = form["subject_token"].clone();
                    let lifetime = match subject.as_str() {
                        "mallory" => {
                            return (
                                StatusCode::BAD_REQUEST,
                                axum::Json(serde_json::json!({"error": "invalid_grant"})),
                            );
                        }
                        "zero" => 0,
                        "huge" => u64::MAX,
                        _ => 60,
                    };
                    (
                        StatusCode::OK,
                        axum::Json(serde_json::json!({"access_token": format!("x-{subject}"), "expires_in": lifetime})),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let token_url = format!("http://{}/token", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let cfg = TokenExchange {
            token_url,
            client_id: "my id:1".into(),
            client_secret: "p@ss word".into(),
            audience: None,
            scope: None,
        };
        (Exchanger::new(cfg), asked)
    }

    #[tokio::test]
    async fn concurrent_first_requests_share_one_exchange() {
        let (ex, asked) = endpoint().await;
        let all = futures::future::join_all((0..8).map(|_| ex.token_for(Some("alice")))).await;
        assert!(all.iter().all(|t| t.as_deref().ok() == Some("x-alice")), "{all:?}");
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        assert!(ex.exchanging.lock().unwrap().is_empty(), "no lock left behind");
    }

    #[tokio::test]
    async fn a_refusal_is_remembered_briefly() {
        let (ex, asked) = endpoint().await;
        for _ in 0..5 {
            assert!(
                matches!(ex.token_for(Some("mallory")).await, Err(ExchangeError::Refused(c)) if c == "invalid_grant")
            );
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once, then refused from memory");
    }

    #[tokio::test]
    async fn lifetimes_are_clamped_and_a_token_is_always_sent_with_its_request() {
        let (ex, asked) = endpoint().await;
        // Said to expire at once: sent with this request, exchanged again by the next.
        assert_eq!(ex.token_for(Some("zero")).await.unwrap().as_ref(), "x-zero");
        assert_eq!(ex.cached(Some("zero")).as_deref(), Some("x-zero"));
        ex.token_for(Some("zero")).await.unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        // Said to live for ever: no overflow, and believed for a day at most.
        assert_eq!(ex.token_for(Some("huge")).await.unwrap().as_ref(), "x-huge");
        let cache = ex.cache.lock().unwrap().peek(&key("huge")).cloned().unwrap();
        assert!(cache.expires_at <= Instant::now() + MAX_LIFETIME);
    }
}
