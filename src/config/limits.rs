//! `[[limits]]`: how much a caller may use. Each rule matches callers (principals or groups, as
//! `[[policy]]` does) and the calls it counts (backends and tools), and sets a rate (a token
//! bucket), quotas per clock hour and UTC day (calls, result tokens), and find_tool's own rate.
//! Enforced by [`crate::limits`].

use std::collections::HashSet;
use std::time::Duration;

use super::auth::RuleScope;
use super::{Validator, raw};

#[derive(Debug, Clone, PartialEq)]
pub struct LimitRule {
    /// Names the rule in refusals, `/metrics` and the console; `limits[i]` unless given.
    pub name: String,
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    pub backends: Vec<String>,
    pub tools: Vec<String>,
    /// Everyone the rule matches shares one budget (`per = "rule"`); otherwise (`per =
    /// "principal"`, the default) each principal has their own.
    pub shared: bool,
    /// Tool calls (and resource reads, prompt gets) the rule counts.
    pub rate: Option<Rate>,
    /// find_tool searches, whatever backends and tools the rule names.
    pub find_tool_rate: Option<Rate>,
    pub calls_per_hour: Option<u64>,
    pub calls_per_day: Option<u64>,
    /// Result tokens (the result's JSON bytes / 4, as the token metrics count).
    pub result_tokens_per_hour: Option<u64>,
    pub result_tokens_per_day: Option<u64>,
}

/// A token bucket: `count` requests per `per` on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
    pub burst: u32,
}

impl Rate {
    /// The time one token takes to come back.
    pub fn refill(&self) -> Duration {
        self.per / self.count.max(1)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "min",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)?;
        if self.burst != self.count {
            write!(f, " (burst {})", self.burst)?;
        }
        Ok(())
    }
}

/// What a check does while the shared store (`[sessions] store = "redis"`) does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenUnreachable {
    /// Each replica counts alone until the store is back: limits hold, per replica.
    #[default]
    Local,
    /// Refuse every call a rule covers.
    Refuse,
    /// Let every call through uncounted.
    Allow,
}

/// Parses `10/s`, `600/min`, `5000/h` (also `second`, `minute`, `hour`).
pub fn parse_rate(text: &str) -> Result<(u32, Duration), String> {
    let bad = || format!("`{text}` is not a rate; write e.g. \"10/s\", \"600/min\" or \"5000/h\"");
    let (count, unit) = text.split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    if count == 0 {
        return Err(format!("`{text}` allows nothing; to refuse a tool, use a [[policy]] deny rule"));
    }
    let per = match unit.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3600),
        _ => return Err(bad()),
    };
    Ok((count, per))
}

impl Validator<'_> {
    pub(super) fn limits(&mut self, raws: Vec<raw::LimitRule>, backends: &HashSet<&str>) -> Vec<LimitRule> {
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for (i, r) in raws.into_iter().enumerate() {
            let key = |k: &str| format!("limits[{i}].{k}");
            let name = r.name.unwrap_or_else(|| format!("limits[{i}]"));
            if name.is_empty() || !name.bytes().all(|c| c.is_ascii_alphanumeric() || b"_-.[]".contains(&c)) {
                self.problem(key("name"), format!("`{name}` must match [A-Za-z0-9_.-]+"));
            } else if !names.insert(name.clone()) {
                self.problem(key("name"), format!("`{name}` names another [[limits]] rule already"));
            }
            let scope = RuleScope {
                principals: r.principals.unwrap_or_default(),
                groups: r.groups.unwrap_or_default(),
                backends: r.backends.unwrap_or_else(|| vec!["*".into()]),
                tools: r.tools.unwrap_or_else(|| vec!["*".into()]),
            };
            self.rule_scope(&format!("limits[{i}]"), &scope, backends, true);
            let RuleScope { principals, groups, backends: rule_backends, tools } = scope;
            let shared = match r.per.as_deref() {
                None | Some("principal") => false,
                Some("rule") => true,
                Some(other) => {
                    self.problem(key("per"), format!("`{other}` is not one of \"principal\", \"rule\""));
                    false
                }
            };
            let rate_of = |v: &mut Self, field: &str, text: Option<String>| {
                text.and_then(|t| match parse_rate(&t) {
                    Ok((count, per)) => Some(Rate { count, per, burst: count }),
                    Err(e) => {
                        v.problem(key(field), e);
                        None
                    }
                })
            };
            let mut rate = rate_of(self, "rate", r.rate);
            let find_tool_rate = rate_of(self, "find_tool_rate", r.find_tool_rate);
            match (r.burst, rate.as_mut()) {
                (None, _) => {}
                (Some(b), Some(rate)) if b >= 1 && b <= u32::MAX as i64 => rate.burst = b as u32,
                (Some(_), Some(_)) => self.problem(key("burst"), "must be at least 1"),
                (Some(_), None) => self.problem(key("burst"), "sets the burst of `rate`; give `rate` too"),
            }
            if find_tool_rate.is_some() && (rule_backends != ["*"] || tools != ["*"]) {
                self.problem(
                    key("find_tool_rate"),
                    "find_tool searches every backend: put find_tool_rate in a rule without `backends` or `tools`",
                );
            }
            let quota = |v: &mut Self, field: &str, n: Option<i64>| {
                n.and_then(|n| {
                    if n < 1 {
                        v.problem(key(field), "must be at least 1; to refuse a tool, use a [[policy]] deny rule");
                        None
                    } else {
                        Some(n as u64)
                    }
                })
            };
            let rule = LimitRule {
                name,
                principals,
                groups,
                backends: rule_backends,
                tools,
                shared,
                rate,
                find_tool_rate,
                calls_per_hour: quota(self, "calls_per_hour", r.calls_per_hour),
                calls_per_day: quota(self, "calls_per_day", r.calls_per_day),
                result_tokens_per_hour: quota(self, "result_tokens_per_hour", r.result_tokens_per_hour),
                result_tokens_per_day: quota(self, "result_tokens_per_day", r.result_tokens_per_day),
            };
            if rule.rate.is_none()
                && rule.find_tool_rate.is_none()
                && rule.calls_per_hour.is_none()
                && rule.calls_per_day.is_none()
                && rule.result_tokens_per_hour.is_none()
                && rule.result_tokens_per_day.is_none()
            {
                self.problem(
                    key("rate"),
                    "the rule limits nothing: give `rate`, `find_tool_rate`, `calls_per_hour`, `calls_per_day`, `result_tokens_per_hour` or `result_tokens_per_day`",
                );
            }
            out.push(rule);
        }
        out
    }

    pub(super) fn when_unreachable(&mut self, value: Option<&str>) -> WhenUnreachable {
        match value {
            None | Some("local") => WhenUnreachable::Local,
            Some("refuse") => WhenUnreachable::Refuse,
            Some("allow") => WhenUnreachable::Allow,
            Some(other) => {
                self.problem(
                    "sessions.limits_when_unreachable",
                    format!("`{other}` is not one of \"local\", \"refuse\", \"allow\""),
                );
                WhenUnreachable::Local
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn problems(toml: &str) -> String {
        Config::parse(toml).map(|_| String::new()).unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn rates_read_as_written() {
        assert_eq!(parse_rate("10/s"), Ok((10, Duration::from_secs(1))));
        assert_eq!(parse_rate(" 600 / min"), Ok((600, Duration::from_secs(60))));
        assert_eq!(parse_rate("5000/hour"), Ok((5000, Duration::from_secs(3600))));
        for bad in ["10", "ten/s", "10/week", "0/s", "-1/s"] {
            assert!(parse_rate(bad).is_err(), "{bad} was read as a rate");
        }
        let r = Rate { count: 600, per: Duration::from_secs(60), burst: 50 };
        assert_eq!(r.refill(), Duration::from_millis(100));
        assert_eq!(r.to_string(), "600/min (burst 50)");
    }

    #[test]
    fn a_rule_reads_whole_with_its_defaults() {
        let c = Config::parse(
            r#"
[[backends]]
name = "github"
url = "http://127.0.0.1:1/mcp"

[[limits]]
name = "agents"
groups = ["agents"]
backends = ["github"]
rate = "5/s"
burst = 10
calls_per_day = 1000

[[limits]]
principals = ["*"]
find_tool_rate = "2/s"
per = "rule"
"#,
        )
        .unwrap();
        let [a, b] = c.limits.as_slice() else { panic!("two rules: {:?}", c.limits) };
        assert_eq!(a.name, "agents");
        assert_eq!(a.tools, ["*"]);
        assert_eq!(a.rate, Some(Rate { count: 5, per: Duration::from_secs(1), burst: 10 }));
        assert_eq!(a.calls_per_day, Some(1000));
        assert!(!a.shared);
        assert_eq!(b.name, "limits[1]");
        assert_eq!(b.backends, ["*"]);
        assert!(b.shared);
        assert_eq!(b.find_tool_rate.map(|r| r.burst), Some(2));
    }

    #[test]
    fn each_mistake_names_its_key() {
        let cases = [
            ("principals = [\"*\"]", "limits[0].rate"),
            ("rate = \"1/s\"", "limits[0].principals"),
            ("principals = [\"*\"]\nrate = \"fast\"", "limits[0].rate"),
            ("principals = [\"*\"]\nburst = 3\ncalls_per_day = 5", "limits[0].burst"),
            ("principals = [\"*\"]\nrate = \"1/s\"\nburst = 0", "limits[0].burst"),
            ("principals = [\"*\"]\ncalls_per_hour = 0", "limits[0].calls_per_hour"),
            ("principals = [\"*\"]\nbackends = [\"nope\"]\nrate = \"1/s\"", "limits[0].backends"),
            ("principals = [\"*\"]\ntools = [\"x\"]\nfind_tool_rate = \"1/s\"", "limits[0].find_tool_rate"),
            ("principals = [\"*\"]\nper = \"team\"\nrate = \"1/s\"", "limits[0].per"),
            ("name = \"a b\"\nprincipals = [\"*\"]\nrate = \"1/s\"", "limits[0].name"),
            ("principals = [\"[\"]\nrate = \"1/s\"", "limits[0].principals"),
        ];
        for (body, key) in cases {
            let text = format!("[[limits]]\n{body}\n");
            let got = problems(&text);
            assert!(got.contains(key), "{body:?}: expected a problem at {key}, got {got}");
        }
        let twice = "[[limits]]\nname = \"a\"\nprincipals = [\"*\"]\nrate = \"1/s\"\n".repeat(2);
        assert!(problems(&twice).contains("limits[1].name"));
        let store = "[sessions]\nlimits_when_unreachable = \"maybe\"\n";
        assert!(problems(store).contains("sessions.limits_when_unreachable"));
    }
}
