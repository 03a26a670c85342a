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
    fn words_split_prose_and_identifiers() {
        assert_eq!(words("Open a pullRequest, now!"), vec!["open", "a", "pull", "request", "now"]);
    }
}
