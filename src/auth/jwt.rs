//! JWT (OIDC access token) verification against a JWKS: keys from a URL (fetched with a timeout,
//! refreshed on a schedule and when a token names an unknown `kid`, at most every
//! [`REFETCH_GAP`]; a failed refresh keeps the last good keys) or from a file.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use tokio::time::Instant;

use crate::config::{JwksSource, JwtConfig};
use crate::session::Caller;

/// The shortest time between two fetches triggered by unknown key ids: a stream of tokens with
/// made-up `kid`s cannot turn toolmux into a load generator against the identity provider.
const REFETCH_GAP: Duration = Duration::from_secs(10);
/// The same while there are no keys at all (the first fetch failed): retry sooner.
const REFETCH_GAP_EMPTY: Duration = Duration::from_secs(1);
/// The largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1 << 20;

struct Key {
    kid: Option<String>,
    key: DecodingKey,
}

pub struct Verifier {
    cfg: JwtConfig,
    algorithms: Vec<Algorithm>,
    keys: ArcSwap<Vec<Key>>,
    http: reqwest::Client,
    /// When the last fetch started; serialises fetches.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl Verifier {
    /// Loads the keys once; a failure is logged and leaves no keys (every token is refused until
    /// a refresh succeeds).
    pub async fn new(cfg: JwtConfig) -> Arc<Self> {
        let algorithms = cfg.algorithms.iter().filter_map(|a| a.parse().ok()).collect();
        let http = reqwest::Client::builder().timeout(cfg.fetch_timeout).build().unwrap_or_default();
        let v = Arc::new(Self {
            cfg,
            algorithms,
            keys: ArcSwap::from_pointee(Vec::new()),
            http,
            last_fetch: tokio::sync::Mutex::new(None),
        });
        v.refresh().await;
        v
    }

    /// Re-reads the key set; keeps the last good one when that fails.
    pub async fn refresh(&self) {
        *self.last_fetch.lock().await = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => {
                tracing::debug!(keys = keys.len(), "JWKS loaded");
                self.keys.store(Arc::new(keys));
            }
            Err(e) => tracing::warn!(error = %e, "JWKS not loaded; keeping the last good keys"),
        }
    }

    /// Refreshes every `jwks_refresh` until `ct` is cancelled.
    pub async fn run_refresh(self: Arc<Self>, ct: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                _ = ct.cancelled() => return,
                _ = tokio::time::sleep(self.cfg.refresh) => self.refresh().await,
            }
        }
    }

    async fn fetch(&self) -> Result<Vec<Key>, String> {
        let text = match &self.cfg.jwks {
            JwksSource::File(path) => {
                std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?
            }
            JwksSource::Url(url) => {
                let r = self.http.get(url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
                if !r.status().is_success() {
                    return Err(format!("GET {url}: {}", r.status()));
                }
                let bytes = r.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
                if bytes.len() > MAX_JWKS_BYTES {
                    return Err(format!("GET {url}: the key set is over {MAX_JWKS_BYTES} bytes"));
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let set: JwkSet = serde_json::from_str(&text).map_err(|e| format!("not a JWKS: {e}"))?;
        let keys: Vec<Key> = set
            .keys
            .iter()
            .filter_map(|jwk| Some(Key { kid: jwk.common.key_id.clone(), key: DecodingKey::from_jwk(jwk).ok()? }))
            .collect();
        if keys.is_empty() {
            return Err("the key set has no usable key".into());
        }
        Ok(keys)
    }

    /// The key for `kid`, refreshing once if it is unknown (and the last fetch is old enough).
    async fn key(&self, kid: Option<&str>) -> Result<DecodingKey, String> {
        let find = |keys: &[Key]| match kid {
            Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)).map(|k| k.key.clone()),
            // No `kid`: only a set of one key is unambiguous.
            None => (keys.len() == 1).then(|| keys[0].key.clone()),
        };
        if let Some(k) = find(&self.keys.load()) {
            return Ok(k);
        }
        let gap = if self.keys.load().is_empty() { REFETCH_GAP_EMPTY } else { REFETCH_GAP };
        let recent = self.last_fetch.lock().await.is_some_and(|t| t.elapsed() < gap);
        if !recent {
            self.refresh().await;
            if let Some(k) = find(&self.keys.load()) {
                return Ok(k);
            }
        }
        Err(match kid {
            Some(kid) => format!("no key `{kid}` in the issuer's key set"),
            None => "the token names no key (`kid`) and the key set has several".into(),
        })
    }

    /// Verifies `token` and returns its caller; the error is the reason, for the log.
    pub async fn verify(&self, token: &str) -> Result<Caller, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(format!("algorithm {:?} is not accepted (auth.jwt.algorithms)", header.alg));
        }
        let key = self.key(header.kid.as_deref()).await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.cfg.issuer]);
        validation.set_audience(&self.cfg.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = self.cfg.leeway.as_secs();
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &validation)
            .map_err(|e| format!("rejected: {e}"))?;
        let claims = data.claims;
        let principal = match claims.get(&self.cfg.principal_claim) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(format!("no `{}` claim to name the caller", self.cfg.principal_claim)),
        };
        let groups = match claims.get(&self.cfg.groups_claim) {
            Some(Value::Array(items)) => items.iter().filter_map(|g| g.as_str().map(str::to_string)).collect(),
            Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
            _ => Vec::new(),
        };
        Ok(Caller { principal, groups, token: Some(token.into()) })
    }
}
