//! Secrets out of error text. A backend's URL may carry credentials (`https://user:pw@host`,
//! `?api_key=…`, or a key as a path segment: `https://h/sk-live-…/mcp`), and the HTTP client's
//! errors quote the URL whole; such text goes to the log and `/status` only through [`urls`],
//! and never to a client (clients get a message naming the backend).

/// `text` with every URL's user information, query and secret-looking path segments replaced by
/// `***`: `https://u:p@h/k3y0123456789abcdef/mcp?key=s` → `https://***@h/***/mcp?***`.
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
            format!("{}?***{fragment}", segments(before))
        }
        None => match path.split_once('#') {
            Some((before, fragment)) => format!("{}#{fragment}", segments(before)),
            None => segments(path),
        },
    };
    authority + &path
}

/// A path with each segment that looks like a key replaced by `***`.
fn segments(path: &str) -> String {
    path.split('/').map(|s| if looks_secret(s) { "***" } else { s }).collect::<Vec<_>>().join("/")
}

/// A path segment that may be a credential: long and mixing letters with digits (API keys,
/// tokens, UUIDs), or very long whatever it holds. Words (`mcp`, `sse`, `v1`, `servers`) are not.
fn looks_secret(segment: &str) -> bool {
    let letters = segment.chars().any(|c| c.is_ascii_alphabetic());
    let digits = segment.chars().any(|c| c.is_ascii_digit());
    (segment.len() >= 16 && letters && digits) || segment.len() >= 40
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

    #[test]
    fn keys_in_the_path_are_hidden_and_words_are_not() {
        assert_eq!(
            urls("GET https://actions.example/mcp/sk-ak-0123456789abcdef/sse failed"),
            "GET https://actions.example/mcp/***/sse failed"
        );
        assert_eq!(urls("http://h/v1/servers/github/mcp"), "http://h/v1/servers/github/mcp");
        assert_eq!(urls("http://h/ab12cd34ef56ab78cd90?x=1#f"), "http://h/***?***#f");
        assert_eq!(urls("http://h/5f0c6b2e-3a1d-4c8e-9b7a-0d2e4f6a8b1c#top"), "http://h/***#top");
    }
}
