//! `[sessions]`: where client sessions are kept, so that replicas can share them.

use std::time::Duration;

use sha2::Digest;

use super::{Validator, WhenUnreachable, raw};

/// Where client sessions live besides the memory of the replica serving them.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionsConfig {
    pub store: SessionStore,
    /// What `[[limits]]` checks do while the Redis store does not answer.
    pub limits_when_unreachable: WhenUnreachable,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub enum SessionStore {
    /// In this process only: a request on another replica gets 404.
    #[default]
    Memory,
    /// In Redis, so that any replica can rebuild a session it has not seen.
    Redis(RedisConfig),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS; `${ENV}` expanded.
    pub url: String,
    /// Put before every key toolmux writes, so that several deployments can share one Redis.
    pub key_prefix: String,
    /// Deadline of every Redis command (and of a connection attempt).
    pub timeout: Duration,
    /// PEM certificates that verify a `rediss://` server instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// The key that seals backend session ids in the store (SHA-256 of `secret`); without it they
    /// are not stored, and a replica that takes a session over opens its backend sessions afresh.
    pub seal_key: Option<SealKey>,
}

/// A key derived from `sessions.secret`; its `Debug` does not show it.
#[derive(Clone, PartialEq)]
pub struct SealKey(pub [u8; 32]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// Shortest `sessions.secret` accepted.
pub const MIN_SECRET_CHARS: usize = 32;

impl Default for SessionsConfig {
    fn default() -> Self {
        Self { store: SessionStore::Memory, limits_when_unreachable: WhenUnreachable::Local }
    }
}

pub const DEFAULT_KEY_PREFIX: &str = "toolmux:";
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(500);

impl Validator<'_> {
    pub(super) fn sessions(&mut self, raw: raw::Sessions) -> SessionsConfig {
        let redis_keys_given = raw.redis_url.is_some()
            || raw.key_prefix.is_some()
            || raw.timeout.is_some()
            || raw.tls_ca_file.is_some()
            || raw.secret.is_some()
            || raw.limits_when_unreachable.is_some();
        let store = match raw.store.as_deref() {
            None | Some("memory") => {
                if redis_keys_given {
                    self.problem(
                        "sessions.store",
                        "redis_url, key_prefix, timeout, tls_ca_file, secret and limits_when_unreachable need store = \"redis\"",
                    );
                }
                SessionStore::Memory
            }
            Some("redis") => {
                let url = match raw.redis_url.as_deref().map(|v| self.expand(v)) {
                    None => {
                        self.problem(
                            "sessions.redis_url",
                            "store = \"redis\" needs the server's address, e.g. \"redis://127.0.0.1:6379/0\"",
                        );
                        String::new()
                    }
                    Some(Err(var)) => {
                        self.problem("sessions.redis_url", super::unset(&var));
                        String::new()
                    }
                    Some(Ok(url)) => {
                        if let Err(e) = redis::Client::open(url.as_str()) {
                            // The error may quote the URL; the URL may hold a password.
                            self.problem(
                                "sessions.redis_url",
                                format!(
                                    "not a Redis URL ({}); write redis://[user:password@]host:port[/db], or rediss:// for TLS",
                                    e.detail().unwrap_or(e.category())
                                ),
                            );
                        }
                        url
                    }
                };
                let key_prefix = raw.key_prefix.unwrap_or_else(|| DEFAULT_KEY_PREFIX.into());
                let timeout = self.positive("sessions.timeout", raw.timeout.as_deref(), DEFAULT_REDIS_TIMEOUT);
                let tls_ca = raw.tls_ca_file.and_then(|path| {
                    if !url.starts_with("rediss://") {
                        self.problem("sessions.tls_ca_file", "only a rediss:// (TLS) redis_url is verified with it");
                    }
                    match std::fs::read(&path) {
                        Ok(pem) if pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") => Some(pem),
                        Ok(_) => {
                            self.problem("sessions.tls_ca_file", format!("{path} holds no PEM certificate"));
                            None
                        }
                        Err(e) => {
                            self.problem("sessions.tls_ca_file", format!("cannot read {path}: {e}"));
                            None
                        }
                    }
                });
                let seal_key = match raw.secret.as_deref().map(|v| self.expand(v)) {
                    None => None,
                    Some(Err(var)) => {
                        self.problem("sessions.secret", super::unset(&var));
                        None
                    }
                    Some(Ok(secret)) if secret.chars().count() < MIN_SECRET_CHARS => {
                        self.problem(
                            "sessions.secret",
                            format!(
                                "at least {MIN_SECRET_CHARS} characters, the same on every replica; e.g. \"${{TOOLMUX_SESSION_SECRET}}\" set to `openssl rand -hex 32`"
                            ),
                        );
                        None
                    }
                    Some(Ok(secret)) => Some(SealKey(sha2::Sha256::digest(secret.as_bytes()).into())),
                };
                SessionStore::Redis(RedisConfig { url, key_prefix, timeout, tls_ca, seal_key })
            }
            Some(other) => {
                self.problem("sessions.store", format!("`{other}` is not one of \"memory\", \"redis\""));
                SessionStore::Memory
            }
        };
        let limits_when_unreachable = self.when_unreachable(raw.limits_when_unreachable.as_deref());
        SessionsConfig { store, limits_when_unreachable }
    }
}
