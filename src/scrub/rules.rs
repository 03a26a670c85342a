//! The rules [`super::Scrubber`] runs: gitleaks' (`gitleaks.toml` beside this file, read at
//! build time) and toolmux's own for what gitleaks has no rule for, each compiled once.

use regex::Regex;
use serde::Deserialize;

/// gitleaks' rule file, as its configuration format has it (only what matters to text).
#[derive(Deserialize)]
struct File {
    allowlist: Option<RawAllowlist>,
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRule {
    id: String,
    regex: Option<String>,
    #[serde(default)]
    entropy: f64,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    secret_group: usize,
    /// A rule that needs a file path: not for text without one.
    path: Option<String>,
    #[serde(default)]
    allowlists: Vec<RawAllowlist>,
    /// toolmux's own: a match never spans lines, so the rule runs on the lines that hold one of
    /// its keywords rather than on the whole text.
    #[serde(default)]
    lines: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAllowlist {
    #[serde(default)]
    regexes: Vec<String>,
    regex_target: Option<String>,
    #[serde(default)]
    stopwords: Vec<String>,
    condition: Option<String>,
    #[serde(default)]
    paths: Vec<String>,
}

/// One rule, ready to run.
pub(super) struct Rule {
    pub id: String,
    pub regex: Regex,
    /// The capture group that is the secret; 0: the first group that matched, else the match.
    pub secret_group: usize,
    /// The secret's Shannon entropy must be above this (0: no check).
    pub entropy: f64,
    /// Lower-case words one of which must be in the text for the rule to run (none: always).
    pub keywords: Vec<String>,
    /// It runs on the lines that hold a keyword only (a match never spans lines).
    pub lines: bool,
    pub allowlists: Vec<Allowlist>,
}

/// What a finding is allowed by (not a secret after all).
pub(super) struct Allowlist {
    pub target: Target,
    pub regexes: Vec<Regex>,
    /// Lower-case words that, inside the secret, mark it as not one.
    pub stopwords: Vec<String>,
    /// Every check given must hold ("AND"), rather than any.
    pub all: bool,
    /// It names file paths, which text never matches: with "AND" it can never allow.
    pub needs_path: bool,
}

/// What an allowlist's regexes look at.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Secret,
    Match,
    Line,
}

const GITLEAKS: &str = include_str!("gitleaks.toml");

/// gitleaks' rules not run. `generic-api-key` (any name with `key`, `token`, `auth`… and a
/// value of some entropy) is made for scanning repositories, where a person reviews each
/// finding; on tool output it touched 6.9 % of the results without a credential in the corpus
/// (`cache_key=c814f72fc39ade6e`, a request id after `auth::token`). Names that say secret are
/// covered by `secret-assignment` below.
const LEFT_OUT: [&str; 1] = ["generic-api-key"];

/// toolmux's own rules, beside gitleaks' (same format): a password in a URL's user information,
/// a value assigned to a name that says it is secret (`Password=…;` in a connection string,
/// `"token": "…"` in JSON, `DB_PASSWORD=…` in an env file) however short, and the value of an
/// `Authorization` header or a bearer token.
const OWN: &str = r#"
[[rules]]
id = "url-password"
regex = '''[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s/:@?#'"<>\[]{1,128}:([^\s/@?#'"<>\]]{3,256})@'''
keywords = ["://"]
lines = true
[[rules.allowlists]]
# A placeholder, as documentation writes one.
regexes = ['''(?i)^(?:password|passwd|pass|pwd|secret|changeme|example|\$\{?\w+\}?|<[^>]+>|\*+|x+)$''']

[[rules]]
id = "secret-assignment"
regex = '''(?i)[a-z0-9_-]{0,30}?(?:passw(?:or)?d|pwd|passphrase|secret|token|(?:access|secret|private|account|api|auth|client|encryption|signing|master)[_-]?key)["']?[ \t]*[:=][ \t]*["']?([^:=;\s"'`{}()\[\]$<>,][^;\s"'`{}()\[\]$<>,]{3,255})\(?'''
keywords = ["passw", "pwd", "passphrase", "secret", "token", "key"]
lines = true
[[rules.allowlists]]
# Words and placeholders; code on the right of a typed name or a `let`: a path, a method chain,
# a macro, a reference, a closure.
regexes = [
    '''^[a-zA-Z_.-]+$''',
    '''^\*+$''',
    '''^%[a-zA-Z_]+%?$''',
    '''^&?[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)+(?:::|\.)?!?$''',
    '''^[A-Za-z_][A-Za-z0-9_]*::$''',
    '''^[a-z_]+!$''',
    '''^&[A-Za-z_'][A-Za-z0-9_<>':.]*$''',
    '''^\|[A-Za-z_][A-Za-z0-9_]*[:|,]?$''',
    '''^[A-Za-z_][A-Za-z0-9_]*\|$''',
]
[[rules.allowlists]]
# A function called (`let token = make_token(…)`), and names that are not secrets: MCP's
# progress tokens, paging and sync cursors.
regexTarget = "match"
regexes = ['''\($''', '''(?i)^["']?(?:progress|page|next_?page|continuation|sync|cursor)[_-]?token''']

[[rules]]
id = "authorization-header"
regex = '''(?i)\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?(?:(?:bearer|basic|token|bot|digest|negotiate)[ \t]+)?([A-Za-z0-9._~+/-]{12,4096}=*)'''
entropy = 3.0
keywords = ["authorization"]
lines = true
[[rules.allowlists]]
regexes = ['''^[a-zA-Z_.-]+$''']

[[rules]]
id = "bearer-token"
regex = '''(?i)\bbearer\s+([A-Za-z0-9._~+/-]{16,4096}=*)'''
entropy = 3.0
keywords = ["bearer"]
lines = true
[[rules.allowlists]]
# Words: a challenge's parameters (`Bearer resource_metadata="…"`), prose.
regexes = ['''^[a-zA-Z_.-]+=*$''']
"#;

/// Every rule, and the global allowlist. A rule gitleaks has for file paths only is left out,
/// and those in [`LEFT_OUT`]; so is one whose regex this regex engine refuses (none today: a
/// unit test says so), returned by name.
pub(super) fn compile() -> (Vec<Rule>, Vec<Allowlist>, Vec<String>) {
    let mut rules = Vec::new();
    let mut refused = Vec::new();
    let mut global = Vec::new();
    for text in [GITLEAKS, OWN] {
        let file: File = toml::from_str(text).expect("the built-in secret rules parse");
        if let Some(a) = file.allowlist {
            global.extend(allowlist(&a));
        }
        for r in file.rules {
            let Some(pattern) = r.regex.as_deref() else { continue };
            if r.path.is_some() || LEFT_OUT.contains(&r.id.as_str()) {
                continue;
            }
            match Regex::new(&ascii(&lean(pattern))) {
                Ok(regex) => rules.push(Rule {
                    id: r.id,
                    regex,
                    secret_group: r.secret_group,
                    entropy: r.entropy,
                    keywords: r.keywords.iter().map(|k| k.to_lowercase()).collect(),
                    lines: r.lines && !r.keywords.is_empty(),
                    allowlists: r.allowlists.iter().filter_map(allowlist).collect(),
                }),
                Err(_) => refused.push(r.id),
            }
        }
    }
    (rules, global, refused)
}

/// A rule of an operator's own (`scrub_rules`): the secret is the first group, else the match.
pub(super) fn custom(id: &str, pattern: &str) -> Result<Rule, regex::Error> {
    Ok(Rule {
        id: id.to_string(),
        regex: Regex::new(pattern)?,
        secret_group: 0,
        entropy: 0.0,
        keywords: Vec::new(),
        lines: false,
        allowlists: Vec::new(),
    })
}

fn allowlist(a: &RawAllowlist) -> Option<Allowlist> {
    let regexes: Vec<Regex> = a.regexes.iter().filter_map(|r| Regex::new(&ascii(r)).ok()).collect();
    if regexes.is_empty() && a.stopwords.is_empty() {
        // Paths alone: nothing in a text matches them.
        return None;
    }
    Some(Allowlist {
        target: match a.regex_target.as_deref() {
            Some("match") => Target::Match,
            Some("line") => Target::Line,
            _ => Target::Secret,
        },
        regexes,
        stopwords: a.stopwords.iter().map(|s| s.to_lowercase()).collect(),
        all: a.condition.as_deref().is_some_and(|c| c.eq_ignore_ascii_case("and")),
        needs_path: !a.paths.is_empty(),
    })
}

/// A gitleaks pattern without its leading `[\w.-]{0,50}?` (a hundred rules open with it, to take
/// in the name before a keyword): optional and lazy, it changes where a match starts and never
/// whether there is one or what its secret is, and it hides the literal that lets the engine
/// skip ahead: without it such a rule searches 100 KB in a few µs instead of 300.
fn lean(pattern: &str) -> String {
    pattern.replace(r"[\w.-]{0,50}?", "")
}

/// A gitleaks (Go RE2) pattern with RE2's meaning in this engine: there `\w`, `\d`, `\s` and
/// `\b` are ASCII, here Unicode unless said otherwise. Said otherwise, the automata stay small
/// (`[\w-]{50,1000}` is too big in Unicode) and fast on any text.
fn ascii(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push(c);
                    break;
                };
                let posix = match next {
                    'w' => Some("word"),
                    'W' => Some("^word"),
                    'd' => Some("digit"),
                    'D' => Some("^digit"),
                    's' => Some("space"),
                    'S' => Some("^space"),
                    _ => None,
                };
                match (posix, in_class) {
                    (Some(class), true) => out.push_str(&format!("[:{class}:]")),
                    (Some(class), false) => out.push_str(&format!("[[:{class}:]]")),
                    (None, false) if next == 'b' || next == 'B' => out.push_str(&format!("(?-u:\\{next})")),
                    (None, _) => {
                        out.push('\\');
                        out.push(next);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push(c);
                // A `]` or `^]` right after the opening is a literal, not the end.
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().expect("peeked"));
                }
                if chars.peek() == Some(&']') {
                    out.push(chars.next().expect("peeked"));
                }
            }
            '[' if in_class && chars.peek() == Some(&':') => {
                // A POSIX class inside a class: copy it whole.
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == ']' {
                        break;
                    }
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ascii;

    #[test]
    fn re2_classes_become_ascii() {
        assert_eq!(ascii(r"\b[\w.-]{3}\s\d"), r"(?-u:\b)[[:word:].-]{3}[[:space:]][[:digit:]]");
        assert_eq!(ascii(r"[^\S\]x]\\w"), r"[^[:^space:]\]x]\\w");
        assert_eq!(ascii(r"[]a][[:alpha:]\W]"), r"[]a][[:alpha:][:^word:]]");
    }
}
