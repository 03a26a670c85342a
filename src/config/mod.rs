//! Configuration: the TOML file, read in two stages.
//!
//! [`raw`] mirrors the file one to one (serde, `deny_unknown_fields`), so a typo in a key is an
//! error that names it. [`Config::parse`] then validates the raw values into the types the rest of
//! the gateway uses, collecting every problem instead of stopping at the first, each named by its
//! key path and the line it stands on. Nothing binds or spawns before this succeeds.

mod aggregation;
mod audit;
mod auth;
mod backends;
pub mod envfile;
mod hooks;
mod limits;
mod raw;
mod results;
mod sessions;
mod surface;

pub use aggregation::{Aggregation, BackendTools, ConflictResolution, Override};
pub use audit::{AuditConfig, AuditKey, OnFailure};
pub use auth::{
    ANONYMOUS, AuthConfig, AuthMode, BearerToken, CLIENT_PRINCIPAL, CLIENT_TOKEN, JWT_ALGORITHMS, JwksSource,
    JwtConfig, PolicyRule,
};
pub use backends::{
    BackendConfig, DEFAULT_MAX_INSTANCES, OAuthClient, Protocol, SessionMode, TokenExchange, Transport,
};
pub use hooks::HookConfig;
pub use limits::{LimitRule, Rate, WhenUnreachable};
pub use results::{BackendScrub, ResultLimit, ResultRule, ResultsConfig, ScrubConfig};
pub use sessions::{RedisConfig, SealKey, SessionStore, SessionsConfig};
pub use surface::{ClientSurface, SurfaceConfig, SurfaceRule, SurfaceSetting};

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::simd::int8::Kernel;

/// How the gateway advertises the backends' tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every backend tool, under its resolved name.
    Passthrough,
    /// Only `find_tool` and `call_tool`.
    Optimizer,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub backends: Vec<BackendConfig>,
    pub aggregation: Aggregation,
    pub optimizer: OptimizerConfig,
    pub health: HealthConfig,
    pub auth: AuthConfig,
    pub policy: Vec<PolicyRule>,
    pub limits: Vec<LimitRule>,
    pub audit: AuditConfig,
    pub hooks: Vec<HookConfig>,
    pub sessions: SessionsConfig,
    pub groups: GroupsConfig,
    /// What optimizer-mode clients are shown (`optimizer.surface` and where it is narrowed).
    pub surface: SurfaceConfig,
    /// `[results] scrub` and each backend's `scrub`, `scrub_rules`.
    pub scrub: ScrubConfig,
    /// `[results]`' bounds and keeping, with the backends', tools' and policy rules' limits.
    pub results: ResultsConfig,
}

/// `[groups]`: each backend offered as a group (the progressive-disclosure extension,
/// `io.modelcontextprotocol/groups`) to clients that declare it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupsConfig {
    pub enabled: bool,
    /// Globs over exposed tool names that stay in `tools/list` for such clients (passthrough);
    /// every other tool is in its backend's group.
    pub top_level: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub path: String,
    pub mode: Mode,
    /// Largest accepted request body, in bytes.
    pub max_body: usize,
    /// Extra `Host`/`Origin` values accepted besides the loopback names.
    pub allowed_origins: Vec<String>,
    pub limits: Limits,
    /// How long a stop lets running calls finish before cancelling them.
    pub shutdown_grace: Duration,
    /// The operator console at `/ui` (`server.console`, on by default).
    pub console: bool,
}

/// What one client, or all of them together, can make the gateway hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Live client sessions; a new one past it is refused.
    pub max_sessions: usize,
    /// Live client sessions of one authenticated principal; a new one past it is refused.
    pub max_sessions_per_principal: usize,
    /// A client session, and each upstream session opened for it, ends after this long unused.
    pub session_idle_timeout: Duration,
    /// Forwarded calls one session may have running at once.
    pub max_calls_per_session: usize,
    /// Principals without a session that may hold backend sessions of their own (on
    /// `per_client` backends) at once.
    pub max_sessionless_principals: usize,
    /// Open HTTP connections; more wait in the listen backlog.
    pub max_connections: usize,
    /// Deadline for a request's headers, from the connection's first byte.
    pub header_timeout: Duration,
    /// Deadline for a request's body, once its headers are in.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 1000,
            max_sessions_per_principal: 100,
            session_idle_timeout: Duration::from_secs(30 * 60),
            max_calls_per_session: 32,
            max_sessionless_principals: 256,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerConfig {
    pub max_tools_to_return: usize,
    /// Name of the embedding model (a folder under `models/`).
    pub model: String,
    /// A folder holding the model files, looked at first.
    pub model_dir: Option<PathBuf>,
    /// Where embedded vectors are cached; `None` picks the user cache folder.
    pub cache_dir: Option<PathBuf>,
    /// Replaces find_tool's description (a hint of what is available helps agents use it).
    pub find_tool_description: Option<String>,
    /// Longest `tool_description`, and longest `tool_keywords` joined, find_tool accepts.
    pub max_query_chars: usize,
    /// Globs over exposed tool names: tools listed beside find_tool and call_tool, callable
    /// by name (each still under policy and health).
    pub pinned: Vec<String>,
    /// How find_tool describes the tools it found, unless asked for more (`describe`).
    pub answer: AnswerForm,
    /// Learn from calls that follow a find_tool (`store::learned`).
    pub learning: bool,
    /// Where what was learned is kept between runs; in memory without it.
    pub learning_file: Option<PathBuf>,
    /// The encoder's arithmetic.
    pub precision: Precision,
}

/// The arithmetic of the encoder's dense layers (`optimizer.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 32-bit floats, as the model was trained.
    F32,
    /// Weights and activations in signed bytes per block of 32, sums in 32-bit integers, on this
    /// kernel ([`crate::simd::int8::choice`]: the widest this CPU runs unless forced).
    Int8(Kernel),
}

impl Default for Precision {
    /// `"auto"`: int8 where its kernel on this CPU was measured faster than f32
    /// ([`Kernel::beats_f32`]: the outer-product kernels of AVX-512 VNNI, AVX-VNNI and AVX2), f32
    /// elsewhere (the row kernels lose to f32: docs/performance.md).
    fn default() -> Self {
        let kernel = crate::simd::int8::choice().kernel;
        if kernel.beats_f32() { Precision::Int8(kernel) } else { Precision::F32 }
    }
}

impl Precision {
    /// int8 on this process's kernel.
    pub fn int8() -> Self {
        Precision::Int8(crate::simd::int8::choice().kernel)
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Int8(_) => "int8",
        }
    }

    /// The int8 kernel, if any.
    pub fn kernel(self) -> Option<Kernel> {
        match self {
            Precision::F32 => None,
            Precision::Int8(k) => Some(k),
        }
    }
}

/// How much of each tool find_tool's answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnswerForm {
    /// Name, the description's first sentence, and the input schema with its required
    /// properties whole and the optional ones reduced to their type.
    #[default]
    Compact,
    /// Every tool's whole definition (the reference gateway's answer).
    Full,
}

pub const DEFAULT_MAX_QUERY_CHARS: usize = 2000;
/// `optimizer.max_tools_to_return` when the configuration does not say.
pub const DEFAULT_MAX_TOOLS: usize = 8;

#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// Zero turns monitoring off: every backend is advertised.
    pub interval: Duration,
    pub timeout: Duration,
    pub degraded_threshold: Duration,
    pub unhealthy_threshold: u32,
    pub circuit_breaker: Option<BreakerConfig>,
    /// Serve each tool as first seen (or as last accepted) until an operator accepts a change.
    pub freeze_tools: bool,
    /// With `freeze_tools`: a backend never seen before is accepted whole on its first listing
    /// (trust on first use) rather than held until accepted.
    pub trust_first_listing: bool,
    /// Where the tool ledger is kept (first-seen versions, held changes); in memory without it.
    pub tool_ledger: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    pub failure_threshold: u32,
    pub timeout: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            degraded_threshold: Duration::from_secs(5),
            unhealthy_threshold: 3,
            circuit_breaker: None,
            freeze_tools: false,
            trust_first_listing: false,
            tool_ledger: None,
        }
    }
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:4483";
pub const DEFAULT_MAX_BODY: usize = 4 * 1024 * 1024;
/// `server.shutdown_grace` when unset.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
pub const DEFAULT_MODEL: &str = "all-MiniLM-L6-v2";

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key path, e.g. `backends[1].name`.
    pub key: String,
    /// 1-based line, where the key could be found in the file.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: `{}`: {}", self.key, self.message),
            None => write!(f, "`{}`: {}", self.key, self.message),
        }
    }
}

/// Every problem found in one file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(f, "invalid configuration ({n} problem{}):", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

impl Config {
    /// Reads and validates a file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            problems: vec![Problem {
                key: "(file)".into(),
                line: None,
                message: format!("cannot read {}: {e}", path.display()),
            }],
        })?;
        Self::parse_in(&text, path.parent())
    }

    /// Parses and validates TOML text; a relative `env_file` is taken from the current folder.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, None)
    }

    /// Parses and validates TOML text read from a file in `folder` (where a relative
    /// `env_file` is looked for).
    pub fn parse_in(text: &str, folder: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        let mut raw: raw::File =
            toml::from_str(text).map_err(|e| ConfigError { problems: vec![raw::problem_from_toml(text, &e)] })?;
        let mut v = Validator { text, problems: Vec::new(), vars: BTreeMap::new() };
        if let Some(file) = raw.env_file.take() {
            let path =
                folder.filter(|f| !f.as_os_str().is_empty()).map_or_else(|| PathBuf::from(&file), |f| f.join(&file));
            match envfile::read(&path) {
                Ok(vars) => v.vars = vars,
                Err(e) => v.problem("env_file", e),
            }
        }
        let config = v.validate(raw);
        if v.problems.is_empty() { Ok(config) } else { Err(ConfigError { problems: v.problems }) }
    }
}

struct Validator<'t> {
    text: &'t str,
    problems: Vec<Problem>,
    /// `${VAR}` values from `env_file`, for variables the process's environment does not set.
    vars: BTreeMap<String, String>,
}

impl Validator<'_> {
    /// Expands `${VAR}` (see [`expand_env`]) from the environment, then from `env_file`.
    fn expand(&self, value: &str) -> Result<String, String> {
        expand_env(value, |var| self.var(var))
    }

    /// A variable from the environment, else from `env_file`.
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().or_else(|| self.vars.get(name).cloned())
    }

    fn problem(&mut self, key: impl Into<String>, message: impl Into<String>) {
        let key = key.into();
        let line = raw::line_of(self.text, &key);
        self.problems.push(Problem { key, line, message: message.into() });
    }

    fn duration(&mut self, key: &str, value: Option<&str>, default: Duration) -> Duration {
        match value {
            None => default,
            Some(s) => match humantime::parse_duration(s) {
                Ok(d) => d,
                Err(e) => {
                    self.problem(key, format!("`{s}` is not a duration ({e}); write e.g. \"30s\" or \"500ms\""));
                    default
                }
            },
        }
    }

    fn validate(&mut self, mut raw: raw::File) -> Config {
        let written = results::WrittenLimits::take(&mut raw);
        let surfaces = surface::WrittenSurfaces::take(&mut raw);
        let server = self.server(raw.server.unwrap_or_default());
        let raw_results = raw.results.unwrap_or_default();
        let scrub = self.results(&raw_results, &raw.backends);
        let backends = self.backends(raw.backends);
        let names: HashSet<&str> = backends.iter().map(|b| b.name.as_str()).collect();
        let aggregation = self.aggregation(raw.aggregation.unwrap_or_default(), &names);
        let mut raw_optimizer = raw.optimizer.unwrap_or_default();
        let optimizer = self.optimizer(&mut raw_optimizer);
        let health = self.health(raw.health.unwrap_or_default());
        let auth = self.auth(raw.auth.unwrap_or_default(), server.listen);
        let policy = self.policy(raw.policy, &names);
        let results = self.result_limits(&raw_results, written, &policy);
        let surface = self.surface(&mut raw_optimizer, surfaces, &policy, server.mode);
        let limits = self.limits(raw.limits, &names);
        let audit = self.audit(raw.audit.unwrap_or_default());
        let hooks = self.hooks(raw.hooks, &names);
        let sessions = self.sessions(raw.sessions.unwrap_or_default());
        let groups = raw.groups.unwrap_or_default();
        let groups = GroupsConfig {
            enabled: groups.enabled.unwrap_or(false),
            top_level: self.globs("groups.top_level", groups.top_level.unwrap_or_default()),
        };
        Config {
            server,
            backends,
            aggregation,
            optimizer,
            health,
            auth,
            policy,
            limits,
            audit,
            hooks,
            sessions,
            groups,
            scrub,
            results,
            surface,
        }
    }

    fn server(&mut self, raw: raw::Server) -> ServerConfig {
        let listen_text = raw.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen = listen_text.parse().unwrap_or_else(|_| {
            self.problem(
                "server.listen",
                format!("`{listen_text}` is not an address; write host:port, e.g. \"127.0.0.1:4483\""),
            );
            DEFAULT_LISTEN.parse().expect("default address parses")
        });
        let path = raw.path.unwrap_or_else(|| "/mcp".into());
        if !path.starts_with('/') || path.len() < 2 {
            self.problem("server.path", format!("`{path}` must start with `/` and name a path, e.g. \"/mcp\""));
        }
        let mode = match raw.mode.as_deref() {
            None | Some("optimizer") => Mode::Optimizer,
            Some("passthrough") => Mode::Passthrough,
            Some(other) => {
                self.problem("server.mode", format!("`{other}` is not a mode; use \"optimizer\" or \"passthrough\""));
                Mode::Optimizer
            }
        };
        let max_body = match raw.max_body {
            None => DEFAULT_MAX_BODY,
            Some(n) if n >= 1024 => n as usize,
            Some(n) => {
                self.problem("server.max_body", format!("{n} bytes is too small; at least 1024"));
                DEFAULT_MAX_BODY
            }
        };
        let d = Limits::default();
        let limits = Limits {
            max_sessions: self.count("server.max_sessions", raw.max_sessions, d.max_sessions),
            max_sessions_per_principal: self.count(
                "server.max_sessions_per_principal",
                raw.max_sessions_per_principal,
                d.max_sessions_per_principal,
            ),
            session_idle_timeout: self.positive(
                "server.session_idle_timeout",
                raw.session_idle_timeout.as_deref(),
                d.session_idle_timeout,
            ),
            max_calls_per_session: self.count(
                "server.max_calls_per_session",
                raw.max_calls_per_session,
                d.max_calls_per_session,
            ),
            max_sessionless_principals: self.count(
                "server.max_sessionless_principals",
                raw.max_sessionless_principals,
                d.max_sessionless_principals,
            ),
            max_connections: self.count("server.max_connections", raw.max_connections, d.max_connections),
            header_timeout: self.positive("server.header_timeout", raw.header_timeout.as_deref(), d.header_timeout),
            body_timeout: self.positive("server.body_timeout", raw.body_timeout.as_deref(), d.body_timeout),
        };
        let shutdown_grace =
            self.positive("server.shutdown_grace", raw.shutdown_grace.as_deref(), DEFAULT_SHUTDOWN_GRACE);
        let console = raw.console.unwrap_or(true);
        if console && (path == "/ui" || path.starts_with("/ui/")) {
            self.problem(
                "server.path",
                format!("`{path}` is where the console is served; choose another path, or set server.console = false"),
            );
        }
        ServerConfig {
            listen,
            path,
            mode,
            max_body,
            allowed_origins: raw.allowed_origins.unwrap_or_default(),
            limits,
            shutdown_grace,
            console,
        }
    }

    /// A count of at least 1.
    fn count(&mut self, key: &str, value: Option<i64>, default: usize) -> usize {
        match value {
            None => default,
            Some(n) if n >= 1 => n as usize,
            Some(n) => {
                self.problem(key, format!("{n} must be at least 1"));
                default
            }
        }
    }

    /// A duration of more than zero.
    fn positive(&mut self, key: &str, value: Option<&str>, default: Duration) -> Duration {
        let d = self.duration(key, value, default);
        if d.is_zero() {
            self.problem(key, "must be more than zero");
            return default;
        }
        d
    }

    fn aggregation(&mut self, raw: raw::Aggregation, names: &HashSet<&str>) -> Aggregation {
        let conflict_resolution = match raw.conflict_resolution.as_deref() {
            None | Some("prefix") => ConflictResolution::Prefix,
            Some("priority") => ConflictResolution::Priority,
            Some("manual") => ConflictResolution::Manual,
            Some(other) => {
                self.problem(
                    "aggregation.conflict_resolution",
                    format!("`{other}` is not a strategy; use \"prefix\", \"priority\" or \"manual\""),
                );
                ConflictResolution::Prefix
            }
        };
        let prefix_format = raw.prefix_format.unwrap_or_else(|| "{backend}_".into());
        if !prefix_format.contains("{backend}") {
            self.problem("aggregation.prefix_format", format!("`{prefix_format}` must contain `{{backend}}`"));
        }
        let mut per_backend = BTreeMap::new();
        for (i, t) in raw.tools.into_iter().enumerate() {
            if !names.contains(t.backend.as_str()) {
                self.problem(
                    format!("aggregation.tools[{i}].backend"),
                    format!("`{}` is not the name of a configured backend", t.backend),
                );
                continue;
            }
            let overrides = t
                .overrides
                .unwrap_or_default()
                .into_iter()
                .map(|(tool, o)| (tool, Override { name: o.name, description: o.description }))
                .collect();
            if per_backend.contains_key(&t.backend) {
                self.problem(
                    format!("aggregation.tools[{i}].backend"),
                    format!("`{}` has another [[aggregation.tools]] entry already", t.backend),
                );
                continue;
            }
            per_backend.insert(t.backend, BackendTools { filter: t.filter, overrides });
        }
        Aggregation { conflict_resolution, prefix_format, per_backend }
    }

    fn optimizer(&mut self, raw: &mut raw::Optimizer) -> OptimizerConfig {
        let max = raw.max_tools_to_return.unwrap_or(DEFAULT_MAX_TOOLS as i64);
        if !(1..=50).contains(&max) {
            self.problem("optimizer.max_tools_to_return", format!("{max} is out of range 1..50"));
        }
        OptimizerConfig {
            max_tools_to_return: max.clamp(1, 50) as usize,
            model: raw.model.take().unwrap_or_else(|| DEFAULT_MODEL.into()),
            model_dir: raw.model_dir.take().map(PathBuf::from),
            cache_dir: raw.cache_dir.take().map(PathBuf::from),
            find_tool_description: raw.find_tool_description.take(),
            max_query_chars: self.count("optimizer.max_query_chars", raw.max_query_chars, DEFAULT_MAX_QUERY_CHARS),
            pinned: self.globs("optimizer.pinned", raw.pinned.take().unwrap_or_default()),
            learning: raw.learning.unwrap_or(true),
            learning_file: raw.learning_file.take().filter(|p| !p.trim().is_empty()).map(PathBuf::from),
            precision: match (&crate::simd::int8::choice().problem, raw.precision.as_deref()) {
                (Some(problem), _) => {
                    self.problem(crate::simd::int8::FORCE, problem.clone());
                    Precision::F32
                }
                (None, None | Some("auto")) => Precision::default(),
                (None, Some("f32")) => Precision::F32,
                (None, Some("int8")) => Precision::int8(),
                (None, Some(other)) => {
                    self.problem("optimizer.precision", format!("`{other}` is not \"auto\", \"f32\" or \"int8\""));
                    Precision::F32
                }
            },
            answer: match raw.answer.as_deref() {
                None | Some("compact") => AnswerForm::Compact,
                Some("full") => AnswerForm::Full,
                Some(other) => {
                    self.problem("optimizer.answer", format!("`{other}` is not compact or full"));
                    AnswerForm::Compact
                }
            },
        }
    }

    /// Globs over exposed tool names at `key` (`optimizer.pinned`, `groups.top_level`), each
    /// checked here.
    fn globs(&mut self, key: &str, globs: Vec<String>) -> Vec<String> {
        for (i, g) in globs.iter().enumerate() {
            if g.trim().is_empty() {
                self.problem(format!("{key}[{i}]"), "is empty; give a tool name or a glob such as \"github_*\"");
            } else if let Err(e) = globset::Glob::new(g) {
                self.problem(format!("{key}[{i}]"), format!("`{g}` is not a glob: {}", e.kind()));
            }
        }
        globs
    }

    fn health(&mut self, raw: raw::Health) -> HealthConfig {
        let d = HealthConfig::default();
        let interval = self.duration("health.interval", raw.interval.as_deref(), d.interval);
        let timeout = self.duration("health.timeout", raw.timeout.as_deref(), d.timeout);
        let degraded_threshold =
            self.duration("health.degraded_threshold", raw.degraded_threshold.as_deref(), d.degraded_threshold);
        let unhealthy_threshold = raw.unhealthy_threshold.unwrap_or(d.unhealthy_threshold as i64);
        if unhealthy_threshold < 1 {
            self.problem("health.unhealthy_threshold", "must be at least 1");
        }
        if !interval.is_zero() && timeout.is_zero() {
            self.problem("health.timeout", "must be more than zero");
        }
        let circuit_breaker = match raw.circuit_breaker {
            Some(cb) if cb.enabled.unwrap_or(true) => {
                let failure_threshold = cb.failure_threshold.unwrap_or(5);
                if failure_threshold < 1 {
                    self.problem("health.circuit_breaker.failure_threshold", "must be at least 1");
                }
                let timeout =
                    self.duration("health.circuit_breaker.timeout", cb.timeout.as_deref(), Duration::from_secs(60));
                Some(BreakerConfig { failure_threshold: failure_threshold.max(1) as u32, timeout })
            }
            _ => None,
        };
        let freeze_tools = raw.freeze_tools.unwrap_or(false);
        let tool_ledger = raw.tool_ledger.filter(|p| !p.trim().is_empty()).map(PathBuf::from);
        if freeze_tools && tool_ledger.is_none() {
            self.problem(
                "health.freeze_tools",
                "needs health.tool_ledger, the file where first-seen tools are kept (and where `toolmux tools accept` accepts changes)",
            );
        }
        let trust_first_listing = raw.trust_first_listing.unwrap_or(false);
        if trust_first_listing && !freeze_tools {
            self.problem("health.trust_first_listing", "only means something with health.freeze_tools = true");
        }
        HealthConfig {
            interval,
            timeout,
            degraded_threshold,
            unhealthy_threshold: unhealthy_threshold.max(1) as u32,
            circuit_breaker,
            freeze_tools,
            trust_first_listing,
            tool_ledger,
        }
    }
}

/// Whether a header value uses the caller's identity (filled in per upstream session).
pub fn carries_identity(value: &str) -> bool {
    value.contains(CLIENT_TOKEN) || value.contains(CLIENT_PRINCIPAL)
}

fn unset(var: &str) -> String {
    match var.strip_prefix("client.") {
        Some(field) => format!("`{field}` is not a caller field; use ${{client.token}} or ${{client.principal}}"),
        None => format!("environment variable `{var}` is not set"),
    }
}

/// Expands `${VAR}` through `lookup`, leaving the caller placeholders `${client.token}` and
/// `${client.principal}` for each upstream session to fill; returns the name of a variable that
/// is not set.
fn expand_env(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let var = &after[..end];
        match var {
            "client.token" | "client.principal" => out.push_str(&rest[start..start + 2 + end + 1]),
            _ if var.starts_with("client.") => return Err(var.to_string()),
            _ => out.push_str(&lookup(var).ok_or_else(|| var.to_string())?),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
