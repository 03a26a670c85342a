//! Secrets out of error text. A backend's URL may carry credentials (`https://user:pw@host`,
//! `?api_key=…`), and the HTTP client's errors quote the URL whole; such text goes to the log and
//! `/status` only through [`urls`], and never to a client (clients get a message naming the
//! backend).

/// `text` with every URL's user information and query replaced by `***`:
/// `https://u:p@h/mcp?key=s` → `https://***@h/mcp?***`.
pub fn urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme runs back over letters, digits, `+`, `-` and `.`.
        let scheme_start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let after = at + 3;
        let end = rest[after..].find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | ')'));
        let end = end.map_or(rest.len(), |e| after + e);
        out.push_str(&rest[..scheme_start]);
        if scheme_start == at {
            // No scheme: not a URL.
            out.push_str(&rest[at..after]);
            rest = &rest[after..];
            continue;
        }
        out.push_str(&rest[scheme_start..after]);
        out.push_str(&redact_one(&rest[after..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// One URL after its `scheme://`.
fn redact_one(url: &str) -> String {
    let (authority_end, _) =
        url.char_indices().find(|&(_, c)| matches!(c, '/' | '?' | '#')).unwrap_or((url.len(), ' '));
    let (authority, path) = url.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_string(),
    };
    let path = match path.split_once('?') {
        Some((before, after)) => {
            let fragment = after.find('#').map_or("", |i| &after[i..]);
            format!("{before}?***{fragment}")
        }
        None => path.to_string(),
    };
    authority + &path
}

#[cfg(test)]
mod tests {
    use super::urls;

    #[test]
    fn user_information_and_queries_are_hidden() {
        assert_eq!(
            urls("error sending request for url (http://127.0.0.1:9/mcp?api_key=s3cret&x=1): connection refused"),
            "error sending request for url (http://127.0.0.1:9/mcp?***): connection refused"
        );
        assert_eq!(urls("redis://user:pw@cache:6379/0 down"), "redis://***@cache:6379/0 down");
        assert_eq!(urls("see https://h/p#frag and ftp://h2"), "see https://h/p#frag and ftp://h2");
        assert_eq!(urls("https://h?k=v#f"), "https://h?***#f");
        assert_eq!(urls("no url here :// at all"), "no url here :// at all");
        assert_eq!(urls("ends with http://u:p@h"), "ends with http://***@h");
    }
}
