//! `[[hooks]]`: guard services called over HTTP before a tool call (its arguments) and/or after
//! it (its result), which allow, deny with a reason, or replace what passes (run by
//! [`crate::hooks`]).

use std::collections::HashSet;
use std::time::Duration;

use super::auth::RuleScope;
use super::{Validator, raw};

#[derive(Debug, Clone, PartialEq)]
pub struct HookConfig {
    pub name: String,
    pub url: String,
    /// Called with the arguments before the call.
    pub before: bool,
    /// Called with the result after the call.
    pub after: bool,
    /// Which calls it sees (globs, as `[[policy]]`): everyone's, every tool's by default.
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    pub backends: Vec<String>,
    pub tools: Vec<String>,
    pub timeout: Duration,
    /// Requests to the hook at once; a call waits for a place within `timeout`.
    pub max_in_flight: usize,
    /// A hook that does not answer, or answers nonsense: deny the call (`true`, the default)
    /// or let it through.
    pub fail_closed: bool,
    /// Sent with every request (`${VAR}` expanded), e.g. the guard service's credentials.
    pub headers: Vec<(String, String)>,
}

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_IN_FLIGHT: usize = 32;

impl Validator<'_> {
    pub(super) fn hooks(&mut self, raws: Vec<raw::Hook>, backends: &HashSet<&str>) -> Vec<HookConfig> {
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for (i, r) in raws.into_iter().enumerate() {
            let key = |k: &str| format!("hooks[{i}].{k}");
            let name = r.name.unwrap_or_else(|| format!("hooks[{i}]"));
            if !names.insert(name.clone()) {
                self.problem(key("name"), format!("`{name}` names another hook already"));
            }
            let url = match r.url.as_deref().map(|u| self.expand(u)) {
                None => {
                    self.problem(key("url"), "the guard service's address, e.g. \"http://127.0.0.1:9000/check\"");
                    String::new()
                }
                Some(Err(var)) => {
                    self.problem(key("url"), super::unset(&var));
                    String::new()
                }
                Some(Ok(u)) => {
                    let ok = u.parse::<http::Uri>().is_ok_and(|p| {
                        matches!(p.scheme_str(), Some("http" | "https")) && p.host().is_some_and(|h| !h.is_empty())
                    });
                    if !ok {
                        let shown = crate::redact::urls(&u);
                        self.problem(key("url"), format!("`{shown}` is not an http:// or https:// URL"));
                    }
                    u
                }
            };
            let when = r.when.unwrap_or_else(|| vec!["before".into()]);
            let (mut before, mut after) = (false, false);
            for w in &when {
                match w.as_str() {
                    "before" => before = true,
                    "after" => after = true,
                    other => self.problem(key("when"), format!("`{other}` is not one of \"before\", \"after\"")),
                }
            }
            if when.is_empty() {
                self.problem(key("when"), "name when the hook is called: [\"before\"], [\"after\"] or both");
            }
            let scope = RuleScope {
                principals: r.principals.unwrap_or_else(|| vec!["*".into()]),
                groups: r.groups.unwrap_or_default(),
                backends: r.backends.unwrap_or_else(|| vec!["*".into()]),
                tools: r.tools.unwrap_or_else(|| vec!["*".into()]),
            };
            self.rule_scope(&format!("hooks[{i}]"), &scope, backends, false);
            let RuleScope { principals, groups, backends: rule_backends, tools } = scope;
            let timeout = self.positive(&key("timeout"), r.timeout.as_deref(), DEFAULT_TIMEOUT);
            let max_in_flight = match r.max_in_flight {
                None => DEFAULT_IN_FLIGHT,
                Some(n) if (1..=10_000).contains(&n) => n as usize,
                Some(_) => {
                    self.problem(key("max_in_flight"), "must be between 1 and 10000");
                    DEFAULT_IN_FLIGHT
                }
            };
            let fail_closed = match r.on_failure.as_deref() {
                None | Some("deny") => true,
                Some("allow") => false,
                Some(other) => {
                    self.problem(key("on_failure"), format!("`{other}` is not one of \"deny\", \"allow\""));
                    true
                }
            };
            let mut headers = Vec::new();
            for (h, v) in r.headers.unwrap_or_default() {
                match self.expand(&v) {
                    Ok(v) => headers.push((h, v)),
                    Err(var) => self.problem(key(&format!("headers.{h}")), super::unset(&var)),
                }
            }
            out.push(HookConfig {
                name,
                url,
                before,
                after,
                principals,
                groups,
                backends: rule_backends,
                tools,
                timeout,
                max_in_flight,
                fail_closed,
                headers,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn a_hook_reads_with_safe_defaults_and_mistakes_name_their_key() {
        let c = Config::parse("[[hooks]]\nname = \"pii\"\nurl = \"http://127.0.0.1:9000/check\"\n").unwrap();
        let h = &c.hooks[0];
        assert!(h.before && !h.after && h.fail_closed, "{h:?}");
        assert_eq!((h.timeout, h.max_in_flight), (super::DEFAULT_TIMEOUT, super::DEFAULT_IN_FLIGHT));
        assert_eq!(h.principals, ["*"]);
        for (body, key) in [
            ("", "hooks[0].url"),
            ("url = \"file:///etc/passwd\"", "hooks[0].url"),
            ("url = \"http://h/x\"\nwhen = [\"during\"]", "hooks[0].when"),
            ("url = \"http://h/x\"\nwhen = []", "hooks[0].when"),
            ("url = \"http://h/x\"\non_failure = \"maybe\"", "hooks[0].on_failure"),
            ("url = \"http://h/x\"\ntimeout = \"0s\"", "hooks[0].timeout"),
            ("url = \"http://h/x\"\nmax_in_flight = 0", "hooks[0].max_in_flight"),
            ("url = \"http://h/x\"\nbackends = [\"nope\"]", "hooks[0].backends"),
        ] {
            let err = Config::parse(&format!("[[hooks]]\n{body}\n")).unwrap_err().to_string();
            assert!(err.contains(key), "{body:?}: {err}");
        }
    }
}
