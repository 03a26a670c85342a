//! Credentials out of what backends return. A tool that reads a config file, a log or a
//! database may print a cloud key, a token or a connection string with its password; what it
//! prints reaches the model, the host's transcript and whatever the host logs. Each text of a
//! result (and each error text) is searched by gitleaks' rules (`rules.rs`: a maintained set of
//! regexes with keywords, entropy thresholds and allowlists, run as gitleaks runs them) and a
//! few of toolmux's own, and each secret found is replaced by a typed marker,
//! `[redacted: aws-access-token]`, leaving the text around it as it was.
//!
//! A rule runs only when one of its keywords is in the text (one Aho-Corasick pass finds which),
//! so a clean result costs one pass and, for the few rules whose keywords are common words, one
//! regex search each. [`Scrubbing`] holds the gateway's settings (on by default; off or with
//! rules of the operator's own per backend) and counts what it replaced per backend and rule.

mod results;
mod rules;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};

pub use results::{Redaction, Redactions, Row, Scrubbing};
use rules::{Allowlist, Rule, Target};

/// What replaces a secret found by rule `id`.
pub fn marker(id: &str) -> String {
    format!("[redacted: {id}]")
}

/// A set of rules, ready to search text.
pub struct Scrubber {
    rules: Vec<Rule>,
    global: Vec<Allowlist>,
    /// Every rule's keywords, found case-insensitively in one pass.
    keywords: AhoCorasick,
    /// For each keyword (by pattern id), the rules it lets run.
    keyword_rules: Vec<Vec<usize>>,
    /// Rules without keywords: they always run.
    always: Vec<usize>,
}

/// One secret in a text: its byte range and the rule that found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub start: usize,
    pub end: usize,
    pub rule: String,
}

static BUILT_IN: LazyLock<Arc<Scrubber>> = LazyLock::new(|| {
    let (rules, global, _) = rules::compile();
    Arc::new(Scrubber::new(rules, global))
});

impl Scrubber {
    /// gitleaks' rules and toolmux's own, compiled once per process.
    pub fn built_in() -> Arc<Scrubber> {
        BUILT_IN.clone()
    }

    /// The built-in rules and `extra` ones (`(id, regex)`); an error names the rule whose regex
    /// does not compile.
    pub fn with_extra(extra: &[(String, String)]) -> Result<Scrubber, String> {
        let (mut rules, global, _) = rules::compile();
        for (id, pattern) in extra {
            rules.push(rules::custom(id, pattern).map_err(|e| format!("rule `{id}`: {e}"))?);
        }
        Ok(Scrubber::new(rules, global))
    }

    fn new(rules: Vec<Rule>, global: Vec<Allowlist>) -> Scrubber {
        let mut words: Vec<String> = Vec::new();
        let mut keyword_rules: Vec<Vec<usize>> = Vec::new();
        let mut always = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            if r.keywords.is_empty() {
                always.push(i);
            }
            for k in &r.keywords {
                match words.iter().position(|w| w == k) {
                    Some(at) => keyword_rules[at].push(i),
                    None => {
                        words.push(k.clone());
                        keyword_rules.push(vec![i]);
                    }
                }
            }
        }
        let keywords = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            // A few hundred keywords: the DFA (a few hundred KB, built once) searches several
            // times faster than the default NFA.
            .kind(Some(AhoCorasickKind::DFA))
            .build(&words)
            .expect("the rules' keywords build an automaton");
        Scrubber { rules, global, keywords, keyword_rules, always }
    }

    /// How many rules run.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The secrets in `text`, in order, none overlapping (of two that overlap, the one that
    /// starts first covers both).
    pub fn find(&self, text: &str) -> Vec<Finding> {
        let mut run = vec![false; self.rules.len()];
        for &i in &self.always {
            run[i] = true;
        }
        // For rules that run line by line: the lines (byte ranges) that hold one of their keywords.
        let mut lines: Vec<(usize, (usize, usize))> = Vec::new();
        // The line of the last keyword: the next is often on it (a long line is looked over once).
        let mut line = (0, 0);
        for m in self.keywords.find_overlapping_iter(text) {
            for &i in &self.keyword_rules[m.pattern().as_usize()] {
                if !self.rules[i].lines {
                    run[i] = true;
                    continue;
                }
                if !(line.0 <= m.start() && m.end() <= line.1) {
                    line = line_at(text, m.start(), m.end());
                }
                lines.push((i, line));
            }
        }
        lines.sort_unstable();
        lines.dedup();
        let mut found: Vec<Finding> = Vec::new();
        for (rule, _) in self.rules.iter().zip(&run).filter(|(_, run)| **run) {
            self.search(rule, text, 0, &mut found);
        }
        for &(i, (from, to)) in &lines {
            self.search(&self.rules[i], &text[from..to], from, &mut found);
        }
        found.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
        let mut merged: Vec<Finding> = Vec::with_capacity(found.len());
        for f in found {
            match merged.last_mut() {
                Some(last) if f.start < last.end => last.end = last.end.max(f.end),
                _ => merged.push(f),
            }
        }
        merged
    }

    /// `rule`'s secrets in `text` (which starts at byte `offset` of what is searched).
    fn search(&self, rule: &Rule, text: &str, offset: usize, found: &mut Vec<Finding>) {
        for caps in rule.regex.captures_iter(text) {
            let whole = caps.get(0).expect("a match has group 0");
            let secret = match rule.secret_group {
                0 => caps.iter().skip(1).flatten().find(|g| !g.is_empty()).unwrap_or(whole),
                n => match caps.get(n) {
                    Some(g) => g,
                    None => continue,
                },
            };
            if secret.is_empty() || (rule.entropy > 0.0 && entropy(secret.as_str()) <= rule.entropy) {
                continue;
            }
            let (from, to) = line_at(text, whole.start(), whole.end());
            let line = &text[from..to];
            let allowed = |lists: &[Allowlist]| lists.iter().any(|a| a.allows(secret.as_str(), whole.as_str(), line));
            if allowed(&self.global) || allowed(&rule.allowlists) {
                continue;
            }
            found.push(Finding { start: offset + secret.start(), end: offset + secret.end(), rule: rule.id.clone() });
        }
    }

    /// `text` with each secret replaced by its [`marker`], and the rules that found them (one
    /// entry per secret); borrowed when there is none.
    pub fn scrub<'t>(&self, text: &'t str) -> (Cow<'t, str>, Vec<String>) {
        let found = self.find(text);
        if found.is_empty() {
            return (Cow::Borrowed(text), Vec::new());
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        let mut rules = Vec::with_capacity(found.len());
        for f in found {
            out.push_str(&text[at..f.start]);
            out.push_str(&marker(&f.rule));
            at = f.end;
            rules.push(f.rule);
        }
        out.push_str(&text[at..]);
        (Cow::Owned(out), rules)
    }
}

impl Allowlist {
    fn allows(&self, secret: &str, whole: &str, line: &str) -> bool {
        let target = match self.target {
            Target::Secret => secret,
            Target::Match => whole,
            Target::Line => line,
        };
        let regex = (!self.regexes.is_empty()).then(|| self.regexes.iter().any(|r| r.is_match(target)));
        let stopword = (!self.stopwords.is_empty()).then(|| {
            let lower = secret.to_lowercase();
            self.stopwords.iter().any(|w| lower.contains(w.as_str()))
        });
        if self.all {
            // Every check given must hold; a path never does.
            !self.needs_path && regex.unwrap_or(true) && stopword.unwrap_or(true)
        } else {
            regex.unwrap_or(false) || stopword.unwrap_or(false)
        }
    }
}

/// The byte range of the line(s) of `text` that hold `start..end`.
fn line_at(text: &str, start: usize, end: usize) -> (usize, usize) {
    let from = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let to = text[end..].find('\n').map_or(text.len(), |i| end + i);
    (from, to)
}

/// Shannon entropy of `s`'s characters, in bits per character.
fn entropy(s: &str) -> f64 {
    let mut counts = std::collections::HashMap::<char, u32>::new();
    let mut n = 0u32;
    for c in s.chars() {
        *counts.entry(c).or_default() += 1;
        n += 1;
    }
    let n = f64::from(n);
    counts.values().map(|&c| f64::from(c) / n).map(|p| -p * p.log2()).sum()
}
