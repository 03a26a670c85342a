//! `[results]`: what is done to what backends answer before a client sees it: secrets scrubbed
//! (`scrub`, on by default), which each backend may turn off or extend with rules of its own
//! (`[[backends]] scrub`, `scrub_rules`), run by [`crate::scrub`]; and results bounded
//! (`max_tokens`, `max_bytes`, overridden per backend, per tool and per `[[policy]]` rule) with
//! the whole kept for a while (`keep_for`, `keep_bytes`, `keep_bytes_per_principal`), run by
//! [`crate::results`].

use std::collections::BTreeMap;
use std::time::Duration;

use super::{PolicyRule, Validator, raw};

/// Claude Code's own default cap on an MCP result, in tokens: toolmux's default matches it.
pub const DEFAULT_MAX_TOKENS: u64 = 25_000;
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
pub const DEFAULT_KEEP_FOR: Duration = Duration::from_secs(600);
pub const DEFAULT_KEEP_BYTES: u64 = 256 << 20;
pub const DEFAULT_KEEP_BYTES_PER_PRINCIPAL: u64 = 32 << 20;

/// What one result may hold; a limit left out is the next one's (policy rule, tool, backend,
/// `[results]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResultLimit {
    /// Tokens of text (a JSON's or a text's bytes / 4, as the token metrics count them).
    pub tokens: Option<u64>,
    /// Bytes of one image, audio or blob (decoded).
    pub bytes: Option<u64>,
}

impl ResultLimit {
    fn is_set(&self) -> bool {
        self.tokens.is_some() || self.bytes.is_some()
    }
}

/// A `[[policy]]` rule's result limits, with whom and what it covers.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRule {
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    pub backends: Vec<String>,
    pub tools: Vec<String>,
    pub limit: ResultLimit,
}

/// `[results]`' bounds and where results over them are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultsConfig {
    /// The default limit: `max_tokens` (0: none) and `max_bytes` (0: none).
    pub max_tokens: u64,
    pub max_bytes: u64,
    pub keep_for: Duration,
    /// Bytes kept in all (0: nothing is kept, and a cut says so).
    pub keep_bytes: u64,
    pub keep_bytes_per_principal: u64,
    /// By backend name.
    pub backends: BTreeMap<String, ResultLimit>,
    /// By (backend, original tool name): `[[aggregation.tools]] overrides.TOOL`.
    pub tools: BTreeMap<(String, String), ResultLimit>,
    /// `[[policy]]` rules that set a limit, in file order: the first that covers a call decides.
    pub rules: Vec<ResultRule>,
    /// Backends with `untrusted = true`: their result texts are wrapped in an envelope.
    pub untrusted: std::collections::BTreeSet<String>,
}

impl Default for ResultsConfig {
    fn default() -> Self {
        Self {
            max_tokens: DEFAULT_MAX_TOKENS,
            max_bytes: DEFAULT_MAX_BYTES,
            keep_for: DEFAULT_KEEP_FOR,
            keep_bytes: DEFAULT_KEEP_BYTES,
            keep_bytes_per_principal: DEFAULT_KEEP_BYTES_PER_PRINCIPAL,
            backends: BTreeMap::new(),
            tools: BTreeMap::new(),
            rules: Vec::new(),
            untrusted: Default::default(),
        }
    }
}

/// The result limits written beside other settings, taken before those are validated.
#[derive(Default)]
pub(super) struct WrittenLimits {
    /// `[[backends]]`: (name, limits), by index.
    backends: Vec<(String, Option<i64>, Option<i64>)>,
    /// `[[backends]]` with `untrusted = true`.
    untrusted: Vec<String>,
    /// `[[aggregation.tools]]`' overrides that set one.
    tools: Vec<ToolLimits>,
    /// `[[policy]]`, by rule index.
    policy: Vec<(Option<i64>, Option<i64>)>,
}

/// One tool's limits as written: `[[aggregation.tools]] overrides.TOOL`.
struct ToolLimits {
    backend: String,
    tool: String,
    /// Where it was written, for errors.
    key: String,
    tokens: Option<i64>,
    bytes: Option<i64>,
}

impl WrittenLimits {
    pub(super) fn take(raw: &mut raw::File) -> Self {
        let backends = raw
            .backends
            .iter_mut()
            .map(|b| (b.name.clone(), b.max_result_tokens.take(), b.max_result_bytes.take()))
            .collect();
        let untrusted = raw
            .backends
            .iter_mut()
            .filter_map(|b| (b.untrusted.take() == Some(true)).then(|| b.name.clone()))
            .collect();
        let mut out = WrittenLimits { backends, untrusted, ..Default::default() };
        if let Some(a) = &mut raw.aggregation {
            for (i, t) in a.tools.iter_mut().enumerate() {
                for (tool, o) in t.overrides.iter_mut().flatten() {
                    let key = format!("aggregation.tools[{i}].overrides.{tool}");
                    let (tokens, bytes) = (o.max_result_tokens.take(), o.max_result_bytes.take());
                    if tokens.is_some() || bytes.is_some() {
                        out.tools.push(ToolLimits {
                            backend: t.backend.clone(),
                            tool: tool.clone(),
                            key,
                            tokens,
                            bytes,
                        });
                    }
                }
            }
        }
        out.policy = raw.policy.iter_mut().map(|r| (r.max_result_tokens.take(), r.max_result_bytes.take())).collect();
        out
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScrubConfig {
    /// Secrets in results and error texts replaced by a typed marker (`[results] scrub`).
    pub on: bool,
    /// Backends with a setting of their own, by name.
    pub backends: BTreeMap<String, BackendScrub>,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        Self { on: true, backends: BTreeMap::new() }
    }
}

/// One backend's `scrub` and `scrub_rules`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BackendScrub {
    /// On or off for this backend; none: as `[results] scrub`.
    pub on: Option<bool>,
    /// Rules of its own, beside the built-in ones, as (id, regex).
    pub rules: Vec<(String, String)>,
}

impl Validator<'_> {
    /// `[results]`' bounds, each backend's and tool's, and the policy rules' (`policy`, as
    /// validated; `written` as they were written).
    pub(super) fn result_limits(
        &mut self,
        raw: &raw::Results,
        written: WrittenLimits,
        policy: &[PolicyRule],
    ) -> ResultsConfig {
        let d = ResultsConfig::default();
        let mut out = ResultsConfig {
            max_tokens: self.size("results.max_tokens", raw.max_tokens, d.max_tokens),
            max_bytes: self.size("results.max_bytes", raw.max_bytes, d.max_bytes),
            keep_for: self.duration("results.keep_for", raw.keep_for.as_deref(), d.keep_for),
            keep_bytes: self.size("results.keep_bytes", raw.keep_bytes, d.keep_bytes),
            keep_bytes_per_principal: self.size(
                "results.keep_bytes_per_principal",
                raw.keep_bytes_per_principal,
                d.keep_bytes_per_principal,
            ),
            ..d
        };
        if out.keep_bytes_per_principal > out.keep_bytes {
            self.problem(
                "results.keep_bytes_per_principal",
                format!("{} is more than results.keep_bytes ({})", out.keep_bytes_per_principal, out.keep_bytes),
            );
        }
        out.untrusted = written.untrusted.into_iter().collect();
        for (i, (name, tokens, bytes)) in written.backends.into_iter().enumerate() {
            let limit = self.limit(&format!("backends[{i}].max_result_"), tokens, bytes);
            if limit.is_set() {
                out.backends.insert(name, limit);
            }
        }
        for ToolLimits { backend, tool, key, tokens, bytes } in written.tools {
            let limit = self.limit(&format!("{key}.max_result_"), tokens, bytes);
            out.tools.insert((backend, tool), limit);
        }
        for (i, (rule, (tokens, bytes))) in policy.iter().zip(written.policy).enumerate() {
            let limit = self.limit(&format!("policy[{i}].max_result_"), tokens, bytes);
            if !limit.is_set() {
                continue;
            }
            if rule.deny {
                self.problem(
                    format!("policy[{i}].max_result_tokens"),
                    "a deny rule lets no result through: set result limits on an allow rule",
                );
                continue;
            }
            out.rules.push(ResultRule {
                principals: rule.principals.clone(),
                groups: rule.groups.clone(),
                backends: rule.backends.clone(),
                tools: rule.tools.clone(),
                limit,
            });
        }
        out
    }

    /// `{prefix}tokens` and `{prefix}bytes`, each 0 or more (0: no limit).
    fn limit(&mut self, prefix: &str, tokens: Option<i64>, bytes: Option<i64>) -> ResultLimit {
        let mut one = |what: &str, v: Option<i64>| {
            v.map(|v| {
                let key = format!("{prefix}{what}");
                self.size(&key, Some(v), 0)
            })
        };
        ResultLimit { tokens: one("tokens", tokens), bytes: one("bytes", bytes) }
    }

    /// A size at `key`: 0 or more.
    fn size(&mut self, key: &str, value: Option<i64>, default: u64) -> u64 {
        match value {
            None => default,
            Some(v) if v < 0 => {
                self.problem(key, format!("{v} is negative: give 0 (no limit) or more"));
                default
            }
            Some(v) => v as u64,
        }
    }

    pub(super) fn results(&mut self, raw: &raw::Results, backends: &[raw::Backend]) -> ScrubConfig {
        let mut out = ScrubConfig { on: raw.scrub.unwrap_or(true), backends: BTreeMap::new() };
        for (i, b) in backends.iter().enumerate() {
            if b.scrub.is_none() && b.scrub_rules.is_none() {
                continue;
            }
            let mut rules = Vec::new();
            for (id, pattern) in b.scrub_rules.iter().flatten() {
                let key = format!("backends[{i}].scrub_rules.{id}");
                if id.is_empty() || !id.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-') {
                    self.problem(
                        &key,
                        format!("the rule's name `{id}` must match [a-z0-9-]+ (it is put in the marker)"),
                    );
                } else if let Err(e) = regex::Regex::new(pattern) {
                    self.problem(&key, format!("not a regular expression: {e}"));
                } else {
                    rules.push((id.clone(), pattern.clone()));
                }
            }
            if b.scrub == Some(false) && !rules.is_empty() {
                self.problem(
                    format!("backends[{i}].scrub_rules"),
                    "scrub = false turns scrubbing off: leave the rules out, or scrub on",
                );
            }
            out.backends.insert(b.name.clone(), BackendScrub { on: b.scrub, rules });
        }
        out
    }
}
