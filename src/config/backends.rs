//! `[[backends]]`: each backend MCP server, how to reach it (HTTP, SSE or a stdio child), how
//! its sessions are kept, and the credentials it is called with (OAuth, token exchange).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::{Validator, carries_identity, raw, unset};

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub name: String,
    pub transport: Transport,
    /// Deadline for one forwarded call.
    pub timeout: Duration,
    /// Which protocol revision toolmux speaks to it.
    pub protocol: Protocol,
    /// Whether each client session gets a backend session of its own.
    pub session: SessionMode,
    /// For `per_client` stdio backends: child processes at once, over all client sessions.
    pub max_instances: usize,
    /// A stdio backend unused this long is stopped until a call needs it; `None`: never.
    pub idle_stop: Option<Duration>,
    /// `auth = "token_exchange"`: what each caller's token is exchanged for, and where.
    pub token_exchange: Option<TokenExchange>,
    /// `auth = "oauth"`: the backend is an OAuth-protected resource the user logs in to
    /// (`toolmux login`); how toolmux registers with its authorization server.
    pub oauth: Option<OAuthClient>,
}

/// How toolmux presents itself to an OAuth backend's authorization server. With nothing set it
/// registers itself dynamically, or uses `client_metadata_url` where the server accepts Client
/// ID Metadata Documents.
#[derive(Clone, Default, PartialEq)]
pub struct OAuthClient {
    /// A client registered beforehand with the authorization server.
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// An https URL of a Client ID Metadata Document that names toolmux.
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for; none: what the server's challenge or metadata suggests.
    pub scopes: Vec<String>,
    /// The loopback port `toolmux login` listens on for the redirect (0: any free port; a
    /// pre-registered client usually needs a fixed one).
    pub redirect_port: u16,
}

impl fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthClient")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "***"))
            .field("client_metadata_url", &self.client_metadata_url)
            .field("scopes", &self.scopes)
            .field("redirect_port", &self.redirect_port)
            .finish()
    }
}

/// An OAuth 2.0 token exchange (RFC 8693) at `token_url`: the caller's token in, a token for
/// the backend out, the gateway authenticating as a client (HTTP Basic).
#[derive(Clone, PartialEq)]
pub struct TokenExchange {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    pub audience: Option<String>,
    pub scope: Option<String>,
}

impl fmt::Debug for TokenExchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenExchange")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("audience", &self.audience)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Whose backend session a client's requests use (`backends[].session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionMode {
    /// An upstream session per (client session, backend), opened on first use: what the
    /// backend keeps per session (a browser page, a working directory) stays one client's.
    PerClient,
    /// One connection for every client: for stateless backends.
    Shared,
}

pub const DEFAULT_MAX_INSTANCES: usize = 16;

/// A stdio backend's `idle_stop` unless set. An idle MCP server child holds tens of MiB (37-67
/// MB per child, measured by another gateway) and wakes its runtime's timers; starting one again
/// costs about a second (much more for `npx`/`uvx` on a cold cache). Ten minutes outlasts the
/// pauses inside one task (the model thinking, the user reading) and lets a server a working
/// session did not touch give its memory back.
pub const DEFAULT_IDLE_STOP: Duration = Duration::from_secs(600);

/// The protocol revision toolmux speaks to a backend (`backends[].protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// `2025-11-25`: the initialize handshake and a session; what every MCP server speaks today.
    #[default]
    Session,
    /// `2026-07-28`: `server/discover` and self-contained requests; input-required results
    /// instead of server-to-client requests; list changes through `subscriptions/listen`.
    Stateless,
    /// `auto`: 2026-07-28 if the backend offers it, else 2025-11-25.
    Auto,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Http {
        url: String,
        /// Header values with `${ENV}` already expanded.
        headers: BTreeMap<String, String>,
        /// The 2024-11-05 HTTP+SSE transport (`transport = "sse"`) instead of streamable HTTP.
        sse: bool,
    },
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
}

impl Validator<'_> {
    pub(super) fn backends(&mut self, raws: Vec<raw::Backend>) -> Vec<BackendConfig> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (i, b) in raws.into_iter().enumerate() {
            let key = |k: &str| format!("backends[{i}].{k}");
            let name = b.name.clone();
            if name.is_empty()
                || !name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
            {
                self.problem(key("name"), format!("`{name}` must match [a-z0-9_-]+"));
            } else if !seen.insert(name.clone()) {
                self.problem(key("name"), format!("`{name}` names another backend already"));
            }
            let timeout = self.duration(&key("timeout"), b.timeout.as_deref(), Duration::from_secs(30));
            if timeout.is_zero() {
                self.problem(key("timeout"), "must be more than zero");
            }
            let protocol = match b.protocol.as_deref() {
                None | Some("2025-11-25") => Protocol::Session,
                Some("2026-07-28") => Protocol::Stateless,
                Some("auto") => Protocol::Auto,
                Some(other) => {
                    self.problem(
                        key("protocol"),
                        format!("`{other}` is not one of \"2025-11-25\", \"2026-07-28\", \"auto\""),
                    );
                    Protocol::Session
                }
            };
            let transport = match (b.url, b.command) {
                (Some(_), Some(_)) => {
                    self.problem(key("url"), "give either `url` (HTTP) or `command` (stdio), not both");
                    continue;
                }
                (None, None) => {
                    self.problem(key("name"), format!("backend `{name}` needs `url` (HTTP) or `command` (stdio)"));
                    continue;
                }
                (Some(url), None) => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        self.problem(key("url"), format!("`{url}` must be an http:// or https:// URL"));
                    }
                    for k in ["args", "env", "cwd"] {
                        let given = match k {
                            "args" => b.args.is_some(),
                            "env" => b.env.is_some(),
                            _ => b.cwd.is_some(),
                        };
                        if given {
                            self.problem(key(k), "only stdio backends (with `command`) take this key");
                        }
                    }
                    let mut headers = BTreeMap::new();
                    for (h, v) in b.headers.unwrap_or_default() {
                        match self.expand(&v) {
                            Ok(v) => {
                                headers.insert(h, v);
                            }
                            Err(var) => self.problem(format!("backends[{i}].headers.{h}"), unset(&var)),
                        }
                    }
                    let sse = match b.transport.as_deref() {
                        None | Some("streamable-http") => false,
                        Some("sse") => true,
                        Some(other) => {
                            self.problem(
                                key("transport"),
                                format!("`{other}` is not one of \"streamable-http\", \"sse\" (the 2024-11-05 HTTP+SSE transport)"),
                            );
                            false
                        }
                    };
                    if sse && protocol != Protocol::Session {
                        self.problem(
                            key("protocol"),
                            "a transport = \"sse\" backend speaks 2024-11-05 to 2025-11-25 servers: leave protocol out",
                        );
                    }
                    Transport::Http { url, headers, sse }
                }
                (None, Some(command)) => {
                    if b.transport.as_deref().is_some_and(|t| t != "stdio") {
                        self.problem(
                            key("transport"),
                            "a backend with `command` speaks stdio; `transport` is for `url` backends",
                        );
                    }
                    if b.headers.is_some() {
                        self.problem(key("headers"), "only HTTP backends (with `url`) take this key");
                    }
                    if command.trim().is_empty() {
                        self.problem(key("command"), "must not be empty");
                    }
                    let mut env = BTreeMap::new();
                    for (k, v) in b.env.unwrap_or_default() {
                        match self.expand(&v) {
                            Ok(v) if carries_identity(&v) => self.problem(
                                format!("backends[{i}].env.{k}"),
                                "the caller's identity can only go in an HTTP backend's headers",
                            ),
                            Ok(v) => {
                                env.insert(k, v);
                            }
                            Err(var) => self.problem(format!("backends[{i}].env.{k}"), unset(&var)),
                        }
                    }
                    Transport::Stdio { command, args: b.args.unwrap_or_default(), env, cwd: b.cwd.map(PathBuf::from) }
                }
            };
            let session = match b.session.as_deref() {
                // A stdio child serves one client anyway; a child per client session costs a
                // process each, so it is chosen, not assumed.
                None if matches!(transport, Transport::Stdio { .. }) => SessionMode::Shared,
                None | Some("per_client") => SessionMode::PerClient,
                Some("shared") => SessionMode::Shared,
                Some(other) => {
                    self.problem(key("session"), format!("`{other}` is not one of \"per_client\", \"shared\""));
                    SessionMode::Shared
                }
            };
            if let Transport::Http { headers, .. } = &transport {
                for (h, v) in headers.iter().filter(|(_, v)| carries_identity(v)) {
                    let why = if session == SessionMode::Shared {
                        "the backend is `session = \"shared\"`: one backend session serves every caller, so it can \
                         only carry static credentials; set `session = \"per_client\"`"
                    } else if protocol == Protocol::Stateless {
                        "the backend speaks 2026-07-28, where toolmux keeps one connection for every caller; use \
                         protocol = \"2025-11-25\" or \"auto\""
                    } else {
                        continue;
                    };
                    self.problem(
                        format!("backends[{i}].headers.{h}"),
                        format!("`{v}` carries the caller's identity, but {why}"),
                    );
                }
            }
            let max_instances = self.count(&key("max_instances"), b.max_instances, DEFAULT_MAX_INSTANCES);
            if b.max_instances.is_some() && !matches!(transport, Transport::Stdio { .. }) {
                self.problem(key("max_instances"), "only stdio backends (with `command`) take this key");
            }
            let idle_stop = match (b.idle_stop.as_deref(), &transport) {
                (Some(_), Transport::Http { .. }) => {
                    self.problem(
                        key("idle_stop"),
                        "only stdio backends (with `command`) take this key: toolmux does not run an HTTP server, so it cannot stop one",
                    );
                    None
                }
                (None, Transport::Http { .. }) => None,
                (None, _) => Some(DEFAULT_IDLE_STOP),
                (Some("off"), _) => None,
                (Some(text), _) => match self.duration(&key("idle_stop"), Some(text), DEFAULT_IDLE_STOP) {
                    d if d.is_zero() => {
                        self.problem(
                            key("idle_stop"),
                            "write \"off\" to keep it running, or a duration such as \"10m\"",
                        );
                        None
                    }
                    d => Some(d),
                },
            };
            let oauth = self.oauth(i, b.auth.as_deref(), b.oauth, &transport);
            let auth = b.auth.filter(|a| a != "oauth");
            let token_exchange = self.token_exchange(i, auth, b.token_exchange, &transport, session, protocol);
            out.push(BackendConfig {
                name,
                transport,
                timeout,
                protocol,
                session,
                max_instances,
                idle_stop,
                token_exchange,
                oauth,
            });
        }
        out
    }

    /// `backends[i].auth = "oauth"` and `backends[i].oauth`, checked together.
    fn oauth(
        &mut self,
        i: usize,
        auth: Option<&str>,
        raw: Option<raw::OAuth>,
        transport: &Transport,
    ) -> Option<OAuthClient> {
        let key = |k: &str| format!("backends[{i}].{k}");
        if auth != Some("oauth") {
            if raw.is_some() {
                self.problem(key("oauth"), "is used only with auth = \"oauth\"");
            }
            return None;
        }
        match transport {
            Transport::Stdio { .. } => {
                self.problem(key("auth"), "only an HTTP backend (with `url`) can be an OAuth-protected resource");
                return None;
            }
            Transport::Http { headers, sse, .. } => {
                if *sse {
                    self.problem(key("transport"), "an OAuth backend speaks streamable HTTP; transport = \"sse\" with auth = \"oauth\" is not supported");
                }
                if let Some(h) = headers.keys().find(|h| h.eq_ignore_ascii_case("authorization")) {
                    self.problem(
                        format!("backends[{i}].headers.{h}"),
                        "with auth = \"oauth\" the backend's Authorization is the token from `toolmux login`; remove this header",
                    );
                }
            }
        }
        let raw = raw.unwrap_or_default();
        let mut field = |name: &str, v: Option<String>| -> Option<String> {
            match v.map(|v| self.expand(&v)) {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(var)) => {
                    self.problem(format!("backends[{i}].oauth.{name}"), unset(&var));
                    None
                }
            }
        };
        let client_id = field("client_id", raw.client_id);
        let client_secret = field("client_secret", raw.client_secret);
        if client_secret.is_some() && client_id.is_none() {
            self.problem(
                key("oauth.client_secret"),
                "goes with the client_id it was issued for; set oauth.client_id too",
            );
        }
        let client_metadata_url = raw.client_metadata_url;
        if let Some(u) = &client_metadata_url {
            let path = u.strip_prefix("https://").and_then(|r| r.split_once('/')).map(|(_, p)| p);
            if path.is_none_or(str::is_empty) {
                self.problem(
                    key("oauth.client_metadata_url"),
                    format!("`{u}` must be an https:// URL with a path (the Client ID Metadata Document)"),
                );
            }
        }
        Some(OAuthClient {
            client_id,
            client_secret,
            client_metadata_url,
            scopes: raw.scopes.unwrap_or_default(),
            redirect_port: raw.redirect_port.unwrap_or(0),
        })
    }

    /// `backends[i].auth` and `backends[i].token_exchange`, checked together.
    fn token_exchange(
        &mut self,
        i: usize,
        auth: Option<String>,
        raw: Option<raw::TokenExchange>,
        transport: &Transport,
        session: SessionMode,
        protocol: Protocol,
    ) -> Option<TokenExchange> {
        let key = |k: &str| format!("backends[{i}].{k}");
        match auth.as_deref() {
            None | Some("none") => {
                if raw.is_some() {
                    self.problem(key("token_exchange"), "is used only with auth = \"token_exchange\"");
                }
                return None;
            }
            Some("token_exchange") => {}
            Some(other) => {
                self.problem(key("auth"), format!("`{other}` is not one of \"none\", \"token_exchange\", \"oauth\""));
                return None;
            }
        }
        let Some(raw) = raw else {
            self.problem(key("token_exchange"), "auth = \"token_exchange\" needs a [backends.token_exchange] table with token_url, client_id and client_secret");
            return None;
        };
        match transport {
            Transport::Stdio { .. } => self.problem(key("auth"), "a token can only be sent to an HTTP backend"),
            Transport::Http { headers, .. } => {
                if let Some(h) = headers.keys().find(|h| h.eq_ignore_ascii_case("authorization")) {
                    self.problem(
                        format!("backends[{i}].headers.{h}"),
                        "the exchanged token is the backend's Authorization; remove this header",
                    );
                }
            }
        }
        if session == SessionMode::Shared {
            self.problem(
                key("session"),
                "each caller gets a token of its own, so the backend must be `session = \"per_client\"`",
            );
        }
        if protocol == Protocol::Stateless {
            self.problem(key("protocol"), "the backend speaks 2026-07-28, where toolmux keeps one connection for every caller; use protocol = \"2025-11-25\" or \"auto\"");
        }
        let mut field = |name: &str, v: Option<String>| -> String {
            match v.map(|v| self.expand(&v)) {
                None => {
                    self.problem(format!("backends[{i}].token_exchange.{name}"), "is required");
                    String::new()
                }
                Some(Err(var)) => {
                    self.problem(format!("backends[{i}].token_exchange.{name}"), unset(&var));
                    String::new()
                }
                Some(Ok(v)) => v,
            }
        };
        let token_url = field("token_url", raw.token_url);
        let client_id = field("client_id", raw.client_id);
        let client_secret = field("client_secret", raw.client_secret);
        // The gateway's client secret and every caller's token go there: in the clear only to
        // this machine.
        let loopback = |u: &str| {
            u.parse::<http::Uri>().ok().and_then(|u| u.host().map(str::to_string)).is_some_and(|h| {
                let h = h.trim_start_matches('[').trim_end_matches(']');
                h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            })
        };
        let fine = token_url.is_empty()
            || token_url.starts_with("https://")
            || (token_url.starts_with("http://") && loopback(&token_url));
        if !fine {
            self.problem(
                key("token_exchange.token_url"),
                format!(
                    "`{token_url}` must be an https:// URL (http:// only to this machine: localhost, 127.0.0.1, [::1])"
                ),
            );
        }
        Some(TokenExchange { token_url, client_id, client_secret, audience: raw.audience, scope: raw.scope })
    }
}
