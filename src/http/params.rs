//! SEP-2243's `Mcp-Param-*` headers of a `tools/call`, checked against its arguments.
//!
//! A tool's input schema may mark a property with `x-mcp-header: NAME`: a client then sends the
//! argument's value in the `Mcp-Param-NAME` header too (so that a proxy can route on it without
//! reading the body), Base64-wrapped as `=?base64?…?=` when it is not a plain header value. A
//! header must match the body: present exactly when the argument is, with the same value.
//!
//! Checked at the edge, where the caller is known, against the tool in that caller's own scope
//! (a tool outside it is not looked at: the handler then answers that it does not exist, and the
//! check says nothing of it). Only requests of a revision that has these headers (2026-07-28 and
//! later) are checked; they have no session.

use base64::Engine;
use http::HeaderMap;
use serde_json::{Map, Value};

/// The first revision whose requests carry the headers.
pub const FIRST_REVISION: &str = "2026-07-28";
const PREFIX: &str = "mcp-param-";

/// Why the headers do not match the body, for a JSON-RPC `-32020` (header mismatch).
pub fn check(headers: &HeaderMap, arguments: Option<&Value>, schema: &Map<String, Value>) -> Result<(), String> {
    let mut annotated = Vec::new();
    collect(schema.get("properties"), &mut Vec::new(), &mut annotated);
    for (path, name) in annotated {
        let header = format!("Mcp-Param-{name}");
        let sent = single(headers, &format!("{PREFIX}{}", name.to_ascii_lowercase()))?;
        let value = arguments.and_then(|a| path.iter().try_fold(a, |v, k| v.get(k))).filter(|v| !v.is_null());
        let expected = value.and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        let prop = path.join(".");
        match (sent, expected) {
            (None, None) => {}
            (Some(_), None) => {
                return Err(format!("{header} header sent for `{prop}`, which the arguments do not have"));
            }
            (None, Some(_)) => return Err(format!("{header} header missing for `{prop}`")),
            (Some(raw), Some(expected)) => {
                let got = decode(raw).ok_or_else(|| format!("{header} header is not valid Base64"))?;
                if got != expected {
                    return Err(format!("{header} header `{got}` does not match the argument `{prop}`: `{expected}`"));
                }
            }
        }
    }
    Ok(())
}

/// Each property reached from the root through `properties` alone that names a header, with
/// its path.
fn collect<'a>(properties: Option<&'a Value>, path: &mut Vec<&'a str>, out: &mut Vec<(Vec<&'a str>, &'a str)>) {
    let Some(Value::Object(properties)) = properties else { return };
    for (name, schema) in properties {
        path.push(name);
        if let Some(Value::String(header)) = schema.get("x-mcp-header").filter(|h| h.as_str() != Some("")) {
            out.push((path.clone(), header));
        }
        collect(schema.get("properties"), path, out);
        path.pop();
    }
}

/// The one value of header `name`; two are an error (an intermediary could pick either).
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(format!("{name} header sent twice"));
    }
    first.to_str().map(Some).map_err(|_| format!("{name} header holds characters a header value may not"))
}

/// A header value, unwrapped from `=?base64?…?=` if it is wrapped.
fn decode(raw: &str) -> Option<String> {
    match raw.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(inner) => String::from_utf8(base64::engine::general_purpose::STANDARD.decode(inner).ok()?).ok(),
        None => Some(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Map<String, Value> {
        json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "opts": {"type": "object", "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry"}}},
            "plain": {"type": "string"}
        }})
        .as_object()
        .unwrap()
        .clone()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn headers_must_match_the_arguments() {
        let args = json!({"region": "eu-west", "opts": {"dry": true}, "plain": "x"});
        let ok = headers(&[("Mcp-Param-Region", "eu-west"), ("mcp-param-dry", "true")]);
        assert_eq!(check(&ok, Some(&args), &schema()), Ok(()));
        let wrapped = headers(&[("Mcp-Param-Region", "=?base64?ZXUtd2VzdA==?="), ("Mcp-Param-Dry", "true")]);
        assert_eq!(check(&wrapped, Some(&args), &schema()), Ok(()));
        let wrong = headers(&[("Mcp-Param-Region", "us-east"), ("Mcp-Param-Dry", "true")]);
        assert!(check(&wrong, Some(&args), &schema()).unwrap_err().contains("does not match"));
        let missing = headers(&[("Mcp-Param-Region", "eu-west")]);
        assert!(check(&missing, Some(&args), &schema()).unwrap_err().contains("Mcp-Param-Dry header missing"));
        let extra = headers(&[("Mcp-Param-Region", "eu-west")]);
        assert!(check(&extra, Some(&json!({})), &schema()).unwrap_err().contains("do not have"));
        let twice =
            headers(&[("Mcp-Param-Region", "eu-west"), ("Mcp-Param-Region", "eu-west"), ("Mcp-Param-Dry", "true")]);
        assert!(check(&twice, Some(&args), &schema()).unwrap_err().contains("twice"));
        let bad = headers(&[("Mcp-Param-Region", "=?base64?!!?="), ("Mcp-Param-Dry", "true")]);
        assert!(check(&bad, Some(&args), &schema()).unwrap_err().contains("Base64"));
        assert_eq!(check(&HeaderMap::new(), Some(&json!({"plain": "x"})), &schema()), Ok(()));
    }
}
