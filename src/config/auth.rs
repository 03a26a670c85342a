//! `[auth]` (who may connect) and `[[policy]]` (what each caller may use), validated.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Validator, raw};

#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// The MCP endpoint's public URL, for the protected-resource metadata; `None` derives it
    /// from the request.
    pub resource_url: Option<String>,
    /// `/healthz` and `/readyz` answer without a token.
    pub public_health: bool,
    /// Who the client of `serve --stdio` is (it runs as the user who started it).
    pub stdio_principal: String,
    pub stdio_groups: Vec<String>,
    /// Who sees the gateway's details (tool names, errors, the tool ledger) in `/status`: a
    /// principal's name, or `group:NAME` for a group. Without authentication, everyone.
    pub admins: Vec<String>,
}

impl AuthConfig {
    /// Whether `principal` (in `groups`) is one of [`AuthConfig::admins`]; without
    /// authentication every caller is the one trusted user.
    pub fn is_admin(&self, principal: &str, groups: &[String]) -> bool {
        matches!(self.mode, AuthMode::None)
            || self.admins.iter().any(|a| match a.strip_prefix("group:") {
                Some(group) => groups.iter().any(|g| g == group),
                None => a == principal,
            })
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::None,
            resource_url: None,
            public_health: true,
            stdio_principal: ANONYMOUS.into(),
            stdio_groups: Vec::new(),
            admins: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum AuthMode {
    /// Every caller is `anonymous` (loopback binds only, unless the operator opts out loudly).
    None,
    /// Static tokens, kept as sha256 digests.
    Bearer(Vec<BearerToken>),
    Jwt(JwtConfig),
}

#[derive(Debug, Clone, PartialEq)]
pub struct BearerToken {
    pub principal: String,
    pub groups: Vec<String>,
    pub sha256: [u8; 32],
}

#[derive(Debug, Clone, PartialEq)]
pub struct JwtConfig {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub jwks: JwksSource,
    /// Time between scheduled JWKS refreshes.
    pub refresh: Duration,
    /// Deadline for one JWKS fetch.
    pub fetch_timeout: Duration,
    /// Accepted signature algorithms (asymmetric only): a subset of RS256, ES256, EdDSA.
    pub algorithms: Vec<String>,
    pub principal_claim: String,
    pub groups_claim: String,
    pub leeway: Duration,
    /// Advertised in the protected-resource metadata; the issuer unless set.
    pub authorization_servers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum JwksSource {
    Url(String),
    File(PathBuf),
}

/// Who a caller is when nothing authenticated it: every caller without `[auth]`, and the
/// client of `serve --stdio` unless `auth.stdio_principal` names another.
pub const ANONYMOUS: &str = "anonymous";

pub const JWT_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];

/// One `[[policy]]` rule: who it is for, what it covers, and whether it allows or denies.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRule {
    /// Principal names or globs; `*` is every caller.
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    /// Backend names or globs.
    pub backends: Vec<String>,
    /// Original tool names or globs; `*` (the default) is every tool, and also the backend's
    /// resources and prompts.
    pub tools: Vec<String>,
    pub deny: bool,
}

/// The caller-identity placeholders a backend header may carry.
pub const CLIENT_TOKEN: &str = "${client.token}";
pub const CLIENT_PRINCIPAL: &str = "${client.principal}";

impl Validator<'_> {
    pub(super) fn auth(&mut self, raw: raw::Auth, listen: SocketAddr) -> AuthConfig {
        let public_health = raw.public_health.unwrap_or(true);
        let tokens_given = !raw.tokens.is_empty();
        let jwt_given = raw.jwt.is_some();
        let mode = match raw.mode.as_deref() {
            None | Some("none") => {
                if !listen.ip().is_loopback() && raw.insecure_no_auth_on_network != Some(true) {
                    self.problem(
                        "auth.mode",
                        format!(
                            "toolmux would listen on {listen}, beyond this machine, with no authentication: anyone who \
                             reaches it could use every backend with its credentials. Set auth.mode = \"bearer\" or \
                             \"jwt\", or accept that with auth.insecure_no_auth_on_network = true"
                        ),
                    );
                }
                AuthMode::None
            }
            Some("bearer") => AuthMode::Bearer(self.bearer_tokens(raw.tokens)),
            Some("jwt") => match raw.jwt {
                Some(jwt) => AuthMode::Jwt(self.jwt(jwt)),
                None => {
                    self.problem("auth.mode", "mode \"jwt\" needs an [auth.jwt] table (issuer, audiences, jwks_url)");
                    AuthMode::None
                }
            },
            Some(other) => {
                self.problem("auth.mode", format!("`{other}` is not one of \"none\", \"bearer\", \"jwt\""));
                AuthMode::None
            }
        };
        if tokens_given && !matches!(mode, AuthMode::Bearer(_)) {
            self.problem("auth.tokens", "only auth.mode = \"bearer\" takes tokens");
        }
        if jwt_given && !matches!(mode, AuthMode::Jwt(_)) {
            self.problem("auth.jwt", "only auth.mode = \"jwt\" takes this table");
        }
        if let Some(url) = &raw.resource_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            self.problem("auth.resource_url", format!("`{url}` must be an http:// or https:// URL"));
        }
        let admins = raw.admins.unwrap_or_default();
        for (i, a) in admins.iter().enumerate() {
            if a.trim().is_empty() || a == "group:" {
                self.problem(format!("auth.admins[{i}]"), "an admin is a principal's name, or group:NAME");
            }
        }
        AuthConfig {
            mode,
            resource_url: raw.resource_url,
            public_health,
            stdio_principal: raw.stdio_principal.unwrap_or_else(|| ANONYMOUS.into()),
            stdio_groups: raw.stdio_groups.unwrap_or_default(),
            admins,
        }
    }

    fn bearer_tokens(&mut self, raws: Vec<raw::Token>) -> Vec<BearerToken> {
        if raws.is_empty() {
            self.problem("auth.mode", "mode \"bearer\" needs at least one [[auth.tokens]] entry");
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (i, t) in raws.into_iter().enumerate() {
            let key = |k: &str| format!("auth.tokens[{i}].{k}");
            if t.principal.trim().is_empty() {
                self.problem(key("principal"), "must name the caller");
            }
            let digest = match (t.sha256, t.env, t.file) {
                (Some(hex), None, None) => match parse_digest(&hex) {
                    Some(d) => Some(d),
                    None => {
                        self.problem(key("sha256"), "must be 64 hex digits: the sha256 of the token");
                        None
                    }
                },
                (None, Some(var), None) => match self.var(&var) {
                    Some(token) if !token.is_empty() => Some(Sha256::digest(token.trim().as_bytes()).into()),
                    _ => {
                        self.problem(key("env"), format!("environment variable `{var}` is not set"));
                        None
                    }
                },
                (None, None, Some(path)) => match std::fs::read_to_string(&path) {
                    Ok(token) if !token.trim().is_empty() => Some(Sha256::digest(token.trim().as_bytes()).into()),
                    Ok(_) => {
                        self.problem(key("file"), format!("{path} is empty"));
                        None
                    }
                    Err(e) => {
                        self.problem(key("file"), format!("cannot read {path}: {e}"));
                        None
                    }
                },
                _ => {
                    self.problem(key("principal"), "give exactly one of `sha256`, `env` or `file`");
                    None
                }
            };
            if let Some(sha256) = digest {
                if !seen.insert(sha256) {
                    self.problem(key("principal"), "this token is given to another principal already");
                }
                out.push(BearerToken { principal: t.principal, groups: t.groups.unwrap_or_default(), sha256 });
            }
        }
        out
    }

    fn jwt(&mut self, raw: raw::Jwt) -> JwtConfig {
        let issuer = raw.issuer.unwrap_or_default();
        if issuer.is_empty() {
            self.problem("auth.jwt.issuer", "must name the issuer (the `iss` tokens carry)");
        }
        let audiences = raw.audiences.unwrap_or_default();
        if audiences.is_empty() {
            self.problem("auth.jwt.audiences", "must list at least one audience (an `aud` accepted tokens carry)");
        }
        let jwks = match (raw.jwks_url, raw.jwks_file) {
            (Some(url), None) => {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    self.problem("auth.jwt.jwks_url", format!("`{url}` must be an http:// or https:// URL"));
                }
                JwksSource::Url(url)
            }
            (None, Some(file)) => JwksSource::File(PathBuf::from(file)),
            _ => {
                self.problem("auth.jwt", "give exactly one of `jwks_url` or `jwks_file`");
                JwksSource::Url(String::new())
            }
        };
        let algorithms = raw.algorithms.unwrap_or_else(|| JWT_ALGORITHMS.iter().map(|a| a.to_string()).collect());
        for a in &algorithms {
            if !JWT_ALGORITHMS.contains(&a.as_str()) {
                self.problem(
                    "auth.jwt.algorithms",
                    format!("`{a}` is not accepted; choose from {}", JWT_ALGORITHMS.join(", ")),
                );
            }
        }
        let authorization_servers = raw.authorization_servers.unwrap_or_else(|| vec![issuer.clone()]);
        JwtConfig {
            refresh: self.positive("auth.jwt.jwks_refresh", raw.jwks_refresh.as_deref(), Duration::from_secs(600)),
            fetch_timeout: self.positive("auth.jwt.jwks_timeout", raw.jwks_timeout.as_deref(), Duration::from_secs(5)),
            leeway: self.duration("auth.jwt.leeway", raw.leeway.as_deref(), Duration::from_secs(30)),
            principal_claim: raw.principal_claim.unwrap_or_else(|| "sub".into()),
            groups_claim: raw.groups_claim.unwrap_or_else(|| "groups".into()),
            issuer,
            audiences,
            jwks,
            algorithms,
            authorization_servers,
        }
    }

    pub(super) fn policy(&mut self, raws: Vec<raw::PolicyRule>, backends: &HashSet<&str>) -> Vec<PolicyRule> {
        let mut out = Vec::new();
        for (i, r) in raws.into_iter().enumerate() {
            let key = |k: &str| format!("policy[{i}].{k}");
            let rule_backends = r.backends.unwrap_or_default();
            if rule_backends.is_empty() {
                self.problem(key("backends"), "name the backends the rule covers (\"*\" is every backend)");
            }
            let rule = RuleScope {
                principals: r.principals.unwrap_or_default(),
                groups: r.groups.unwrap_or_default(),
                backends: rule_backends,
                tools: r.tools.unwrap_or_else(|| vec!["*".into()]),
            };
            self.rule_scope(&format!("policy[{i}]"), &rule, backends, true);
            let RuleScope { principals, groups, backends: rule_backends, tools } = rule;
            let deny = match r.effect.as_deref() {
                None | Some("allow") => false,
                Some("deny") => true,
                Some(other) => {
                    self.problem(key("effect"), format!("`{other}` is not one of \"allow\", \"deny\""));
                    false
                }
            };
            out.push(PolicyRule { principals, groups, backends: rule_backends, tools, deny });
        }
        out
    }
}

/// The one name a pattern matches when it has no wildcard (escapes `\x` read as `x`); `None`
/// for a glob.
fn literal(pattern: &str) -> Option<String> {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            '*' | '?' | '[' | '{' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// Whom a rule is for and what it covers, as `[[policy]]`, `[[limits]]` and `[[hooks]]` write
/// it: globs over principals, groups, backends and the backends' own tool names.
pub(super) struct RuleScope {
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    pub backends: Vec<String>,
    pub tools: Vec<String>,
}

impl Validator<'_> {
    /// Checks a rule's scope (`at` is its key, e.g. `limits[2]`): every pattern valid, every
    /// plain backend name configured, and, when `who_required`, someone named.
    pub(super) fn rule_scope(&mut self, at: &str, rule: &RuleScope, configured: &HashSet<&str>, who_required: bool) {
        if who_required && rule.principals.is_empty() && rule.groups.is_empty() {
            self.problem(
                format!("{at}.principals"),
                "name who the rule is for: `principals` or `groups` (\"*\" is everyone)",
            );
        }
        for b in &rule.backends {
            if literal(b).is_some_and(|name| !configured.contains(name.as_str())) {
                self.problem(format!("{at}.backends"), format!("`{b}` is not a configured backend"));
            }
        }
        let fields = [
            ("principals", &rule.principals),
            ("groups", &rule.groups),
            ("backends", &rule.backends),
            ("tools", &rule.tools),
        ];
        for (field, patterns) in fields {
            for p in patterns {
                if let Err(e) = globset::Glob::new(p) {
                    self.problem(format!("{at}.{field}"), format!("`{p}` is not a valid pattern: {}", e.kind()));
                }
            }
        }
    }
}

/// A sha256 digest written as 64 hex digits, either case.
fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    let decoded = base16ct::mixed::decode(hex.trim(), &mut out).ok()?;
    (decoded.len() == 32).then_some(out)
}
