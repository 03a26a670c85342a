//! Who is calling (`[auth]`) and what they may use (`[[policy]]`).
//!
//! [`Authenticator`] turns a request's `Authorization` header into a [`Caller`]: everyone is
//! `anonymous` without authentication; a static bearer token is looked up by its sha256 digest
//! (every configured digest compared in constant time); a JWT is verified against the issuer's
//! keys ([`jwt`]). [`edge::Edge`] runs it before every request to the MCP endpoint and the
//! console. [`policy::Rules`] is the [`crate::session::Policy`] built from `[[policy]]`.

pub mod edge;
pub mod jwt;
pub mod policy;

use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthConfig, AuthMode, BearerToken};
use crate::session::Caller;

pub struct Authenticator {
    mode: Mode,
    /// Advertised in the protected-resource metadata.
    authorization_servers: Vec<String>,
}

enum Mode {
    None,
    Bearer(Vec<BearerToken>),
    Jwt(Arc<jwt::Verifier>),
}

/// Why a request was refused; [`Refusal::reason`] is for the log only.
#[derive(Debug)]
pub enum Refusal {
    /// No bearer token at all.
    Missing,
    /// A token that is not valid, and why.
    Invalid(String),
}

impl Refusal {
    pub fn reason(&self) -> &str {
        match self {
            Refusal::Missing => "no bearer token",
            Refusal::Invalid(why) => why,
        }
    }
}

impl Authenticator {
    /// Builds it; with JWT, loads the issuer's keys once (see [`jwt::Verifier::new`]).
    pub async fn new(cfg: &AuthConfig) -> Self {
        let (mode, authorization_servers) = match &cfg.mode {
            AuthMode::None => (Mode::None, Vec::new()),
            AuthMode::Bearer(tokens) => (Mode::Bearer(tokens.clone()), Vec::new()),
            AuthMode::Jwt(j) => (Mode::Jwt(jwt::Verifier::new(j.clone()).await), j.authorization_servers.clone()),
        };
        Self { mode, authorization_servers }
    }

    pub fn none() -> Self {
        Self { mode: Mode::None, authorization_servers: Vec::new() }
    }

    /// True when callers must present credentials.
    pub fn required(&self) -> bool {
        !matches!(self.mode, Mode::None)
    }

    /// The JWT verifier, whose keys the app refreshes on a schedule.
    pub fn jwt(&self) -> Option<Arc<jwt::Verifier>> {
        match &self.mode {
            Mode::Jwt(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// The caller behind an `Authorization` header value.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Refusal> {
        if let Mode::None = self.mode {
            return Ok(Caller::anonymous());
        }
        let token = match authorization {
            None => return Err(Refusal::Missing),
            Some(h) => match h.split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
                    token.trim()
                }
                _ => return Err(Refusal::Invalid("the Authorization header is not `Bearer <token>`".into())),
            },
        };
        match &self.mode {
            Mode::None => unreachable!("answered above"),
            Mode::Bearer(tokens) => {
                let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
                // Every digest is compared, so the time taken does not say which one matched.
                let mut found = None;
                for t in tokens {
                    if bool::from(t.sha256.ct_eq(&digest)) {
                        found = Some(t);
                    }
                }
                let t = found.ok_or_else(|| Refusal::Invalid("unknown bearer token".into()))?;
                Ok(Caller { principal: t.principal.clone(), groups: t.groups.clone(), token: Some(token.into()) })
            }
            Mode::Jwt(v) => v.verify(token).await.map_err(Refusal::Invalid),
        }
    }

    /// The OAuth protected-resource metadata (RFC 9728) for the MCP endpoint at `resource`.
    pub fn metadata(&self, resource: &str) -> serde_json::Value {
        serde_json::json!({
            "resource": resource,
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolmux",
        })
    }
}
