//! The file as written: serde types one to one with the TOML, and the mapping from a key path
//! back to the line it stands on (for error messages).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};

use super::Problem;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Values for `${VAR}` references (`NAME=value` lines), beside the process's environment.
    pub env_file: Option<String>,
    pub server: Option<Server>,
    #[serde(default)]
    pub backends: Vec<Backend>,
    pub aggregation: Option<Aggregation>,
    pub optimizer: Option<Optimizer>,
    pub health: Option<Health>,
    pub auth: Option<Auth>,
    pub sessions: Option<Sessions>,
    pub groups: Option<Groups>,
    #[serde(default)]
    pub policy: Vec<PolicyRule>,
    #[serde(default)]
    pub limits: Vec<LimitRule>,
    pub audit: Option<Audit>,
    #[serde(default)]
    pub hooks: Vec<Hook>,
    pub results: Option<Results>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Results {
    pub scrub: Option<bool>,
    pub max_tokens: Option<i64>,
    pub max_bytes: Option<i64>,
    pub keep_for: Option<String>,
    pub keep_bytes: Option<i64>,
    pub keep_bytes_per_principal: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    pub name: Option<String>,
    pub url: Option<String>,
    pub when: Option<Vec<String>>,
    pub principals: Option<Vec<String>>,
    pub groups: Option<Vec<String>>,
    pub backends: Option<Vec<String>>,
    pub tools: Option<Vec<String>>,
    pub timeout: Option<String>,
    pub max_in_flight: Option<i64>,
    pub on_failure: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Audit {
    pub file: Option<String>,
    pub max_bytes: Option<i64>,
    pub max_age: Option<String>,
    pub arguments: Option<bool>,
    pub requests: Option<bool>,
    pub queue: Option<i64>,
    pub on_failure: Option<String>,
    pub key: Option<String>,
    pub otlp: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Groups {
    pub enabled: Option<bool>,
    pub top_level: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    pub mode: Option<String>,
    pub insecure_no_auth_on_network: Option<bool>,
    pub resource_url: Option<String>,
    pub public_health: Option<bool>,
    pub stdio_principal: Option<String>,
    pub stdio_groups: Option<Vec<String>>,
    pub admins: Option<Vec<String>>,
    #[serde(default)]
    pub tokens: Vec<Token>,
    pub jwt: Option<Jwt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    pub principal: String,
    pub groups: Option<Vec<String>>,
    pub sha256: Option<String>,
    pub env: Option<String>,
    pub file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jwt {
    pub issuer: Option<String>,
    pub audiences: Option<Vec<String>>,
    pub jwks_url: Option<String>,
    pub jwks_file: Option<String>,
    pub jwks_refresh: Option<String>,
    pub jwks_timeout: Option<String>,
    pub algorithms: Option<Vec<String>>,
    pub principal_claim: Option<String>,
    pub groups_claim: Option<String>,
    pub leeway: Option<String>,
    pub authorization_servers: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sessions {
    pub store: Option<String>,
    pub redis_url: Option<String>,
    pub key_prefix: Option<String>,
    pub timeout: Option<String>,
    pub tls_ca_file: Option<String>,
    pub secret: Option<String>,
    pub limits_when_unreachable: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    pub principals: Option<Vec<String>>,
    pub groups: Option<Vec<String>>,
    pub backends: Option<Vec<String>>,
    pub tools: Option<Vec<String>>,
    pub effect: Option<String>,
    /// What a result of the tools it allows may hold (`[results] max_tokens`, `max_bytes`).
    pub max_result_tokens: Option<i64>,
    pub max_result_bytes: Option<i64>,
    /// The surface of the callers it names (`[optimizer] surface`).
    pub surface: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRule {
    pub name: Option<String>,
    pub principals: Option<Vec<String>>,
    pub groups: Option<Vec<String>>,
    pub backends: Option<Vec<String>>,
    pub tools: Option<Vec<String>>,
    pub per: Option<String>,
    pub rate: Option<String>,
    pub burst: Option<i64>,
    pub find_tool_rate: Option<String>,
    pub calls_per_hour: Option<i64>,
    pub calls_per_day: Option<i64>,
    pub result_tokens_per_hour: Option<i64>,
    pub result_tokens_per_day: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub listen: Option<String>,
    pub path: Option<String>,
    pub mode: Option<String>,
    pub max_body: Option<u64>,
    pub allowed_origins: Option<Vec<String>>,
    pub max_sessions: Option<i64>,
    pub max_sessions_per_principal: Option<i64>,
    pub session_idle_timeout: Option<String>,
    pub max_calls_per_session: Option<i64>,
    pub max_sessionless_principals: Option<i64>,
    pub max_connections: Option<i64>,
    pub header_timeout: Option<String>,
    pub body_timeout: Option<String>,
    pub shutdown_grace: Option<String>,
    pub console: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    pub name: String,
    pub url: Option<String>,
    pub transport: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub cwd: Option<String>,
    pub timeout: Option<String>,
    pub protocol: Option<String>,
    pub session: Option<String>,
    pub max_instances: Option<i64>,
    pub idle_stop: Option<String>,
    /// `"token_exchange"`: each caller's token is exchanged for the backend's own.
    pub auth: Option<String>,
    pub token_exchange: Option<TokenExchange>,
    pub oauth: Option<OAuth>,
    /// Secrets in its answers scrubbed (`[results] scrub` by default), and its own rules.
    pub scrub: Option<bool>,
    pub scrub_rules: Option<BTreeMap<String, String>>,
    /// What one of its results may hold (`[results] max_tokens`, `max_bytes` by default).
    pub max_result_tokens: Option<i64>,
    pub max_result_bytes: Option<i64>,
    /// Its result texts wrapped in an envelope that says they are data, not instructions.
    pub untrusted: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuth {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub client_metadata_url: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub redirect_port: Option<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenExchange {
    pub token_url: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub audience: Option<String>,
    pub scope: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Aggregation {
    pub conflict_resolution: Option<String>,
    pub prefix_format: Option<String>,
    #[serde(default)]
    pub tools: Vec<BackendTools>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendTools {
    pub backend: String,
    pub filter: Option<Vec<String>>,
    pub overrides: Option<BTreeMap<String, Override>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    pub name: Option<String>,
    pub description: Option<String>,
    pub max_result_tokens: Option<i64>,
    pub max_result_bytes: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Optimizer {
    pub max_tools_to_return: Option<i64>,
    pub model: Option<String>,
    pub model_dir: Option<String>,
    pub cache_dir: Option<String>,
    pub find_tool_description: Option<String>,
    pub max_query_chars: Option<i64>,
    pub pinned: Option<Vec<String>>,
    pub answer: Option<String>,
    pub learning: Option<bool>,
    pub learning_file: Option<String>,
    pub precision: Option<String>,
    pub surface: Option<String>,
    pub always_load: Option<i64>,
    pub clients: Option<Vec<ClientSurface>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSurface {
    pub name: Option<String>,
    pub surface: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub degraded_threshold: Option<String>,
    pub unhealthy_threshold: Option<i64>,
    pub circuit_breaker: Option<CircuitBreaker>,
    pub freeze_tools: Option<bool>,
    pub trust_first_listing: Option<bool>,
    pub tool_ledger: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitBreaker {
    pub enabled: Option<bool>,
    pub failure_threshold: Option<i64>,
    pub timeout: Option<String>,
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Turns a serde/TOML error into a problem naming the key where we can find one.
pub fn problem_from_toml(text: &str, e: &toml::de::Error) -> Problem {
    let line = e.span().map(|s| line_at(text, s.start));
    let message = e.message().to_string();
    // serde names the offending key in its messages (`unknown field `x``); the span locates it.
    let key = e
        .span()
        .and_then(|s| text.get(s.clone()))
        .map(|k| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.contains('\n') && k.len() < 80)
        .unwrap_or_else(|| "(file)".into());
    Problem { key, line, message }
}

/// The 1-based line of a dotted key path such as `backends[1].headers.Authorization`.
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let root = DeValue::Table(DeTable::parse(text).ok()?.into_inner());
    let mut current = &root;
    let mut span = None;
    for segment in split_path(path) {
        let (name, index) = segment;
        let DeValue::Table(t) = current else {
            break;
        };
        let Some((k, v)) = t.iter().find(|(k, _)| k.get_ref().as_ref() == name) else {
            break;
        };
        span = Some(k.span());
        current = v.get_ref();
        if let Some(i) = index {
            let DeValue::Array(items) = current else {
                break;
            };
            let Some(item) = items.get(i) else {
                break;
            };
            span = Some(item.span());
            current = item.get_ref();
        }
    }
    span.map(|s| line_at(text, s.start))
}

fn split_path(path: &str) -> impl Iterator<Item = (&str, Option<usize>)> {
    path.split('.').map(|seg| match seg.split_once('[') {
        Some((name, rest)) => (name, rest.trim_end_matches(']').parse().ok()),
        None => (seg, None),
    })
}
