//! `[[policy]]` as a [`Policy`]: rules map principals and groups to the backends and tools they
//! may use. A deny rule that matches wins over any allow rule; with no matching allow rule a
//! caller may use nothing. Without authentication and without rules, everything is allowed (one
//! trusted local user); as soon as rules exist they apply, to `anonymous` too.

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::config::PolicyRule;
use crate::session::{Access, Caller, Policy};

pub struct Rules {
    rules: Vec<Rule>,
    /// No rules and no authentication: everything is allowed.
    open: bool,
}

struct Rule {
    scope: Scope,
    /// `tools` is `*`: the rule covers the whole backend (resources and prompts too).
    whole: bool,
    deny: bool,
}

/// Whom a rule is for and what it covers, compiled: principals or groups, backends, and the
/// backends' own tool names, each as globs.
pub(crate) struct Scope {
    principals: GlobSet,
    groups: GlobSet,
    backends: GlobSet,
    tools: GlobSet,
}

impl Scope {
    pub(crate) fn new(principals: &[String], groups: &[String], backends: &[String], tools: &[String]) -> Self {
        Self { principals: set(principals), groups: set(groups), backends: set(backends), tools: set(tools) }
    }

    /// Whether the rule is for `caller` on `backend` (whatever the tool).
    fn applies(&self, caller: &Caller, backend: &str) -> bool {
        self.backends.is_match(backend)
            && (self.principals.is_match(&caller.principal) || caller.groups.iter().any(|g| self.groups.is_match(g)))
    }

    /// Whether the rule covers `caller`'s use of `tool` on `backend`.
    pub(crate) fn covers(&self, caller: &Caller, backend: &str, tool: &str) -> bool {
        self.applies(caller, backend) && self.tools.is_match(tool)
    }
}

impl Rules {
    /// Compiles validated rules (patterns were checked when the config was read).
    pub fn new(rules: &[PolicyRule], authenticated: bool) -> Self {
        let rules = rules
            .iter()
            .map(|r| Rule {
                scope: Scope::new(&r.principals, &r.groups, &r.backends, &r.tools),
                whole: r.tools.iter().any(|t| t == "*"),
                deny: r.deny,
            })
            .collect::<Vec<_>>();
        Self { open: rules.is_empty() && !authenticated, rules }
    }

    /// The rules that apply to `caller` on `backend`.
    fn applying<'a>(&'a self, caller: &'a Caller, backend: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules.iter().filter(move |r| r.scope.applies(caller, backend))
    }
}

impl Policy for Rules {
    fn backend(&self, caller: &Caller, backend: &str) -> Access {
        if self.open {
            return Access::All;
        }
        let (mut whole_allow, mut some_allow, mut some_deny) = (false, false, false);
        for r in self.applying(caller, backend) {
            match (r.deny, r.whole) {
                (true, true) => return Access::Nothing,
                (true, false) => some_deny = true,
                (false, true) => whole_allow = true,
                (false, false) => some_allow = true,
            }
        }
        match (whole_allow, some_allow, some_deny) {
            (true, _, false) => Access::All,
            (false, false, _) => Access::Nothing,
            _ => Access::Some,
        }
    }

    fn allows(&self, caller: &Caller, backend: &str, tool: &str) -> bool {
        if self.open {
            return true;
        }
        let mut allowed = false;
        for r in self.applying(caller, backend).filter(|r| r.scope.tools.is_match(tool)) {
            if r.deny {
                return false;
            }
            allowed = true;
        }
        allowed
    }
}

/// The patterns as one set (each was checked when the config was read; a bad one matches nothing).
pub(crate) fn set(patterns: &[String]) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        if let Ok(g) = Glob::new(p) {
            b.add(g);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(principals: &[&str], groups: &[&str], backends: &[&str], tools: &[&str], deny: bool) -> PolicyRule {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect();
        PolicyRule { principals: v(principals), groups: v(groups), backends: v(backends), tools: v(tools), deny }
    }

    fn alice() -> Caller {
        Caller::named("alice", vec!["dev".into()])
    }

    #[test]
    fn no_rule_means_nothing_once_callers_are_authenticated() {
        let open = Rules::new(&[], false);
        assert_eq!(open.backend(&alice(), "github"), Access::All);
        let closed = Rules::new(&[], true);
        assert_eq!(closed.backend(&alice(), "github"), Access::Nothing);
        assert!(!closed.allows(&alice(), "github", "create_issue"));
    }

    #[test]
    fn groups_and_globs_allow_and_a_deny_wins() {
        let rules = Rules::new(
            &[
                rule(&[], &["dev"], &["git*"], &["*"], false),
                rule(&["alice"], &[], &["github"], &["delete_*"], true),
                rule(&["bob"], &[], &["slack"], &["post_message"], false),
            ],
            true,
        );
        let a = alice();
        assert_eq!(rules.backend(&a, "gitlab"), Access::All);
        assert_eq!(rules.backend(&a, "github"), Access::Some, "a tool-level deny narrows the backend");
        assert!(rules.allows(&a, "github", "create_issue"));
        assert!(!rules.allows(&a, "github", "delete_repo"));
        assert_eq!(rules.backend(&a, "slack"), Access::Nothing, "bob's rule is not alice's");
        let bob = Caller::named("bob", vec![]);
        assert_eq!(rules.backend(&bob, "slack"), Access::Some);
        assert!(rules.allows(&bob, "slack", "post_message"));
        assert!(!rules.allows(&bob, "slack", "delete_message"));
        assert_eq!(rules.backend(&bob, "github"), Access::Nothing);
    }

    #[test]
    fn a_whole_backend_deny_beats_every_allow() {
        let rules = Rules::new(
            &[rule(&["*"], &[], &["*"], &["*"], false), rule(&[], &["dev"], &["shell"], &["*"], true)],
            true,
        );
        assert_eq!(rules.backend(&alice(), "shell"), Access::Nothing);
        assert!(!rules.allows(&alice(), "shell", "run"));
        assert_eq!(rules.backend(&Caller::named("carol", vec![]), "shell"), Access::All);
    }
}
