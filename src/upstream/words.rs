//! A backend's failure to connect, in words a user acts on: what happened at which URL or to
//! which command, and what to do about it — not the transport's type names. Used for the log,
//! `/status`, the console and `toolmux status` alike.

use crate::config::{BackendConfig, Transport};

/// Words already written for a failure (a stdio child's story), carried in an error's chain.
#[derive(Debug)]
pub struct Told(pub String);

impl std::fmt::Display for Told {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Told {}

/// `err`, a failure to connect to `backend`, in words.
pub fn explain(err: &anyhow::Error, backend: &BackendConfig) -> String {
    // As a context (anyhow's own downcast sees it) or as an error in the chain.
    if let Some(told) = err.downcast_ref::<Told>().or_else(|| err.chain().find_map(|e| e.downcast_ref::<Told>())) {
        return told.0.clone();
    }
    let Transport::Http { url, .. } = &backend.transport else { return plain(err) };
    let url = crate::redact::urls(url);
    // The transport's errors keep their causes in their Debug form only.
    let seen: String = err.chain().map(|e| format!("{e:?} {e}\n")).collect();
    let has = |needle: &str| seen.contains(needle);
    let name = &backend.name;
    if has("ConnectionRefused") || has("Connection refused") {
        format!("nothing is listening at {url} (connection refused): is the server running, on that port?")
    } else if has("dns error") || has("failed to lookup address") || has("Name or service not known") {
        format!("the host in {url} could not be found (DNS): check the name")
    } else if has("InvalidCertificate") || has("certificate") || has("tls handshake") || has("TlsError") {
        format!("the TLS handshake with {url} failed (the server's certificate was not accepted): {}", leaf(err))
    } else if has("AuthRequired") || has("Auth required") || has("401") && has("Unauthorized") {
        format!(
            "the server at {url} answered 401 Unauthorized: it needs credentials. If it uses OAuth, set \
             `auth = \"oauth\"` on backend `{name}` and run `toolmux login {name}`; otherwise give it a token in `headers`"
        )
    } else if has("InsufficientScope") || has("Insufficient scope") {
        format!(
            "the server at {url} answered 403: the credentials lack a scope it needs (`toolmux login {name}` again)"
        )
    } else if let Some(status) = http_status(&seen) {
        let hint = match status {
            404 | 405 => ": check the path (MCP servers usually serve `/mcp`; an SSE server wants `sse = true`)",
            500..=599 => ": the server failed; its own log says why",
            _ => "",
        };
        format!("the server at {url} answered HTTP {status}{hint}")
    } else if has("Unexpected content type") {
        format!("{url} did not answer as an MCP server (unexpected content type): is this the MCP endpoint?")
    } else if has("TimedOut") || has("timed out") || has("no answer within") {
        format!("no answer from {url} in time: {}", leaf(err))
    } else if has("error sending request") || has("connection closed") || has("ConnectionReset") {
        format!("the connection to {url} failed: {}", leaf(err))
    } else {
        format!("{url}: {}", plain(err))
    }
}

/// The first `HTTP nnn` status in `text`.
fn http_status(text: &str) -> Option<u16> {
    text.match_indices("HTTP ").find_map(|(at, _)| {
        let digits = text.get(at + 5..at + 8)?;
        digits.parse().ok().filter(|s| (400..600).contains(s))
    })
}

/// The error without the transport's type names: its innermost cause's words.
fn leaf(err: &anyhow::Error) -> String {
    crate::redact::urls(&err.root_cause().to_string())
}

/// The error's own words with anything in `[...]` that names a Rust type taken out.
fn plain(err: &anyhow::Error) -> String {
    let text = crate::redact::urls(&format!("{err:#}"));
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|c| open + c) else { break };
        let inside = &rest[open + 1..close];
        out.push_str(&rest[..open]);
        if !inside.contains("::") {
            out.push_str(&rest[open..=close]);
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_taken_out_of_what_is_left() {
        let err = anyhow::anyhow!(
            "Send message error Transport [rmcp::transport::worker::WorkerTransport<rmcp::X<toolmux::Y>>] error: Broken pipe (os error 32)"
        );
        assert_eq!(plain(&err), "Send message error Transport error: Broken pipe (os error 32)");
    }

    #[test]
    fn an_http_status_is_read_from_the_text() {
        assert_eq!(http_status("unexpected server response: HTTP 404 Not Found: nope"), Some(404));
        assert_eq!(http_status("HTTP 200 fine, HTTP/1.1 and then HTTP 503"), Some(503));
        assert_eq!(http_status("no status"), None);
    }
}
