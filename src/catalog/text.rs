//! Words from identifiers and prose, and the one text per tool that search indexes.
//!
//! The search text is `"<name words>: <description> Parameters: <prop words> (<prop description>), …"`.
//! Name words come from [`split_identifier`] so `createPullRequest`, `create_pull_request` and
//! `create-pull-request` read the same to both the model and BM25. docs/search.md has the
//! measurements behind this form.

use rmcp::model::Tool;

use super::schema_properties;

/// Splits an identifier on `_`, `-`, `.`, `/`, spaces and camelCase boundaries, lower-cased.
pub fn split_identifier(ident: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let chars: Vec<char> = ident.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        let boundary = !word.is_empty() && {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            (c.is_uppercase() && (prev.is_lowercase() || prev.is_ascii_digit()))
                || (c.is_uppercase() && prev.is_uppercase() && next_lower)
                || (c.is_ascii_digit() != prev.is_ascii_digit())
        };
        if boundary {
            words.push(std::mem::take(&mut word));
        }
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Words that say what a tool does rather than to what (`get`, `create`, `cancel`, …), as tool
/// names begin with them.
const ACTION_WORDS: &[&str] = &[
    "get",
    "list",
    "create",
    "update",
    "delete",
    "remove",
    "add",
    "set",
    "search",
    "find",
    "run",
    "fetch",
    "read",
    "write",
    "send",
    "post",
    "put",
    "make",
    "do",
    "check",
    "query",
    "edit",
    "modify",
    "merge",
    "open",
    "close",
    "start",
    "stop",
    "cancel",
    "submit",
    "upload",
    "download",
    "show",
    "view",
    "describe",
    "lookup",
    "retrieve",
    "execute",
    "call",
    "invoke",
    "generate",
    "convert",
    "compute",
    "calculate",
    "count",
    "move",
    "copy",
    "rename",
    "assign",
    "approve",
    "reject",
    "enable",
    "disable",
    "toggle",
    "manage",
    "use",
    "acknowledge",
    "book",
    "apply",
    "archive",
    "compress",
    "decompress",
    "explain",
    "scan",
    "extract",
    "export",
    "import",
    "analyze",
    "analyse",
    "validate",
    "sync",
    "schedule",
    "publish",
    "share",
    "invite",
    "reply",
    "forward",
    "mark",
];

/// Whether `word` (lower case) is one of the [`ACTION_WORDS`].
pub fn is_action_word(word: &str) -> bool {
    ACTION_WORDS.contains(&word)
}

/// Lower-cased alphanumeric tokens of free text, identifiers inside it split too.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || (!c.is_alphanumeric() && c != '_' && c != '-'))
        .filter(|w| !w.is_empty())
        .flat_map(split_identifier)
        .collect()
}

/// The reference gateway's form, `name: <name> description: <description>`, kept for
/// `toolmux eval --text-form name-description` comparisons.
pub fn name_description_text(tool: &Tool) -> String {
    format!("name: {} description: {}", tool.name, tool.description.as_deref().unwrap_or_default())
}

/// The text of a tool that both search arms index. `server` is the label of the server that
/// offers it ([`server_label`]); it is added unless the name already says it.
pub fn search_text(tool: &Tool, server: Option<&str>) -> String {
    let name_words = split_identifier(&tool.name);
    let mut s = name_words.join(" ");
    if let Some(title) = tool.title.as_deref().map(|t| first_words(t, LABEL_WORDS)).filter(|t| !t.is_empty())
        && !covered(&title, &tool.name)
    {
        s.push_str(", ");
        s.push_str(&title);
    }
    s.push_str(": ");
    if let Some(d) = tool.description.as_deref() {
        s.push_str(d.trim());
    }
    if let Some(server) = server.map(str::trim).filter(|l| !l.is_empty())
        && !covered(server, &tool.name)
    {
        s.push_str(" (");
        s.push_str(server);
        s.push(')');
    }
    let props = schema_properties(tool);
    if !props.is_empty() {
        s.push_str(" Parameters: ");
        let parts: Vec<String> = props
            .iter()
            .map(|(name, desc)| {
                let n = split_identifier(name).join(" ");
                if desc.is_empty() { n } else { format!("{n} ({})", desc.trim()) }
            })
            .collect();
        s.push_str(&parts.join(", "));
    }
    s
}

/// Whether every word of `extra` is already in `name`, case and separators aside (`GitHub` is
/// in `github_create_issue`).
fn covered(extra: &str, name: &str) -> bool {
    let compact = |s: &str| s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>();
    let name = compact(name);
    extra.split_whitespace().map(compact).filter(|w| !w.is_empty()).all(|w| name.contains(&w))
}

/// How many words of a tool's title or a server's label are indexed: a label names, it does not
/// describe, and a server cannot make every tool's text long by sending a long title.
const LABEL_WORDS: usize = 8;

fn first_words(text: &str, n: usize) -> String {
    text.split_whitespace().take(n).collect::<Vec<_>>().join(" ")
}

/// Words of a server's name that say nothing of what it does.
const SERVER_NOISE: &[&str] = &["mcp", "server", "srv", "model", "context", "protocol"];

/// The label of a server for its tools' search text: its `serverInfo` title, else its name,
/// without the words every server name carries (`mcp`, `server`), at most [`LABEL_WORDS`] words;
/// `None` when nothing is left.
pub fn server_label(title: Option<&str>, name: &str) -> Option<String> {
    let raw = title.map(str::trim).filter(|t| !t.is_empty()).unwrap_or(name);
    let kept: Vec<&str> = raw
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_' || c == '/' || c == '@')
        .filter(|w| !w.is_empty() && !SERVER_NOISE.contains(&w.to_lowercase().as_str()))
        .take(LABEL_WORDS)
        .collect();
    (!kept.is_empty()).then(|| kept.join(" "))
}

/// The keyword arm's document: the search text with the name's words once more, so a request
/// that names what a tool is called outranks one that only shares its parameter vocabulary.
pub fn keyword_text(text: &str, name: &str) -> String {
    format!("{text} {}", split_identifier(name).join(" "))
}

/// Words that open a second request after "and": `… and fetch …`, `… and what is …`.
const REQUEST_WORDS: &[&str] = &[
    "what",
    "how",
    "which",
    "who",
    "where",
    "when",
    "is",
    "are",
    "can",
    "could",
    "get",
    "find",
    "fetch",
    "list",
    "search",
    "check",
    "show",
    "tell",
    "identify",
    "calculate",
    "compute",
    "retrieve",
    "provide",
    "give",
    "create",
    "generate",
    "convert",
    "let",
    "look",
    "determine",
    "obtain",
    "send",
    "make",
    "also",
    "i",
];

/// Joins that end one request and start another.
const JOINS: &[&str] = &[" and also ", ", and then ", " and then ", ", also ", " as well as ", ", and "];

/// The separate requests in one: its sentences, split again at joins such as `, and also` or an
/// `and` followed by a request word. Pieces of fewer than two words are dropped; a request with
/// one clause comes back as that clause.
pub fn clauses(request: &str) -> Vec<String> {
    let mut sentences: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut chars = request.chars().peekable();
    while let Some(c) = chars.next() {
        current.push(c);
        if matches!(c, '.' | '?' | '!' | ';') && chars.peek().is_none_or(|n| n.is_whitespace()) {
            sentences.push(std::mem::take(&mut current));
        }
    }
    sentences.push(current);
    let mut out = Vec::new();
    for sentence in sentences {
        let mut pieces = vec![sentence];
        for join in JOINS {
            pieces = pieces.iter().flat_map(|p| p.split(join).map(str::to_string).collect::<Vec<_>>()).collect();
        }
        for piece in pieces.iter().flat_map(|p| split_before_requests(p)) {
            let piece = piece.trim();
            if piece.split_whitespace().count() >= 2 {
                out.push(piece.to_string());
            }
        }
    }
    out
}

/// Splits at each `and` whose next word opens a request.
fn split_before_requests(s: &str) -> Vec<String> {
    let words: Vec<&str> = s.split(' ').collect();
    let mut out = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let next = words.get(i + 1).map(|n| n.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase());
        let opens = next.as_deref().is_some_and(|n| REQUEST_WORDS.contains(&n));
        if word.trim_end_matches(',') == "and" && !current.is_empty() && opens {
            out.push(current.join(" "));
            current.clear();
        } else {
            current.push(word);
        }
    }
    out.push(current.join(" "));
    out
}

/// Whether most letters of `text` are outside the Latin script (Han, Kana, Cyrillic, Arabic, …):
/// the search model reads English, so such a request cannot be matched with any confidence.
pub fn mostly_non_latin(text: &str) -> bool {
    let (mut latin, mut other) = (0usize, 0usize);
    for c in text.chars().filter(|c| c.is_alphabetic()) {
        // Basic Latin through Latin Extended-B, and Latin Extended Additional.
        if (c as u32) < 0x0250 || (0x1E00..0x1F00).contains(&(c as u32)) {
            latin += 1;
        } else {
            other += 1;
        }
    }
    other > latin
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, title: Option<&str>, description: &str) -> Tool {
        let schema = serde_json::json!({"type": "object", "properties": {"q": {"type": "string", "description": "Search words"}}});
        let mut t = Tool::new(
            name.to_string(),
            description.to_string(),
            std::sync::Arc::new(schema.as_object().cloned().unwrap()),
        );
        t.title = title.map(str::to_string);
        t
    }

    #[test]
    fn a_name_begins_with_an_action_word_or_not() {
        let first = |name: &str| split_identifier(name).into_iter().next().unwrap();
        assert!(is_action_word(&first("createPullRequest")));
        assert!(!is_action_word(&first("pull_request_get")));
        assert!(!is_action_word("new"), "a filler, not an action");
    }

    #[test]
    fn server_and_title_join_the_text_unless_the_name_says_them() {
        let plain = tool("search", None, "Search for items.");
        assert_eq!(search_text(&plain, None), "search: Search for items. Parameters: q (Search words)");
        assert_eq!(
            search_text(&plain, Some("Spotify Web API")),
            "search: Search for items. (Spotify Web API) Parameters: q (Search words)"
        );
        // The prefixed name already carries the server: nothing is repeated.
        let prefixed = tool("github_search", Some("Search GitHub"), "Search for items.");
        assert_eq!(
            search_text(&prefixed, Some("GitHub")),
            "github search: Search for items. Parameters: q (Search words)"
        );
        let titled = tool("q1", Some("Look up flights"), "Search for items.");
        assert!(
            search_text(&titled, None).starts_with("q 1, Look up flights: Search"),
            "{}",
            search_text(&titled, None)
        );
    }

    #[test]
    fn server_labels_drop_what_every_server_name_says() {
        assert_eq!(server_label(Some("GitHub MCP Server"), "github-mcp-server").as_deref(), Some("GitHub"));
        assert_eq!(server_label(None, "mcp-server-fetch").as_deref(), Some("fetch"));
        assert_eq!(server_label(Some("  "), "@acme/jira-mcp").as_deref(), Some("acme jira"));
        assert_eq!(server_label(None, "mcp-server"), None);
        let long = "word ".repeat(10_000);
        assert_eq!(server_label(Some(&long), "x").unwrap().split(' ').count(), LABEL_WORDS, "a label is kept short");
    }

    #[test]
    fn splits_every_identifier_style_alike() {
        let want = vec!["create", "pull", "request"];
        assert_eq!(split_identifier("create_pull_request"), want);
        assert_eq!(split_identifier("createPullRequest"), want);
        assert_eq!(split_identifier("create-pull-request"), want);
        assert_eq!(split_identifier("CreatePullRequest"), want);
        assert_eq!(split_identifier("HTTPServer2Go"), vec!["http", "server", "2", "go"]);
        assert_eq!(split_identifier("getURL"), vec!["get", "url"]);
        assert!(split_identifier("__").is_empty());
    }

    #[test]
    fn clauses_split_multi_requests_only() {
        assert_eq!(
            clauses("Find the anime with ID 87654. Also, can you search for movies with the keyword 'comedy'?"),
            vec!["Find the anime with ID 87654.", "Also, can you search for movies with the keyword 'comedy'?"]
        );
        assert_eq!(
            clauses("What moves can Bulbasaur learn and what is the ZIP code for 1.2.3.4?"),
            vec!["What moves can Bulbasaur learn", "what is the ZIP code for 1.2.3.4?"]
        );
        assert_eq!(clauses("songs by Beyoncé and also list countries"), vec!["songs by Beyoncé", "list countries"]);
        // One request, even with "and" in it; a version number is not a sentence end.
        assert_eq!(
            clauses("angle between the hour and minute hands at 3.15"),
            vec!["angle between the hour and minute hands at 3.15"]
        );
        assert_eq!(clauses("Weather? Now."), Vec::<String>::new(), "one-word pieces are dropped");
    }

    #[test]
    fn non_latin_scripts_are_told_apart() {
        assert!(mostly_non_latin("查找明天的天气预报"));
        assert!(mostly_non_latin("Найди погоду на завтра"));
        assert!(!mostly_non_latin("Wie wird das Wetter morgen in München?"));
        assert!(!mostly_non_latin("weather in 東京"));
    }

    #[test]
    fn words_split_prose_and_identifiers() {
        assert_eq!(words("Open a pullRequest, now!"), vec!["open", "a", "pull", "request", "now"]);
    }
}
