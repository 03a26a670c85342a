//! `[results]`: what is done to what backends answer before a client sees it. Today: secrets
//! scrubbed (`scrub`, on by default), which each backend may turn off or extend with rules of
//! its own (`[[backends]] scrub`, `scrub_rules`); run by [`crate::scrub`].

use std::collections::BTreeMap;

use super::{Validator, raw};

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
    pub(super) fn results(&mut self, raw: raw::Results, backends: &[raw::Backend]) -> ScrubConfig {
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
