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

/// The text of a tool that both search arms index.
pub fn search_text(tool: &Tool) -> String {
    let mut s = split_identifier(&tool.name).join(" ");
    s.push_str(": ");
    if let Some(d) = tool.description.as_deref() {
        s.push_str(d.trim());
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
