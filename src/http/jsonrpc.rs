//! The first look at a POST body, before rmcp parses it: whatever is not one well-formed MCP
//! message gets the JSON-RPC error that names what is wrong. rmcp answers such bodies with
//! HTTP 415 and plain text, or parses a `tools/call` with a bad `name` as an unknown method
//! (-32601); clients and models can act only on a precise -32700, -32600 or -32602.
//!
//! Checked here: JSON syntax, duplicate keys, batches (removed from MCP in 2025-06-18), the
//! envelope (`jsonrpc`, `id`, `method` or `result`/`error`), and the parameters of the requests
//! whose names a gateway routes on (`tools/call`, `prompts/get`, `resources/read`). Methods that
//! exist only in some revisions (`resources/subscribe` is gone from 2026-07-28) are left to rmcp,
//! which knows the request's revision and answers a removed method with -32601.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::mcp::meta::kind;

pub const PARSE_ERROR: i32 = -32700;
pub const INVALID_REQUEST: i32 = -32600;
pub const INVALID_PARAMS: i32 = -32602;

/// Why a body is not passed on.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub code: i32,
    /// The offending request's id where it had a valid one, else null.
    pub id: Value,
    pub message: String,
}

impl Rejection {
    fn new(code: i32, id: Value, message: impl Into<String>) -> Self {
        Self { code, id, message: message.into() }
    }

    /// A malformed message is an HTTP 400; a well-formed request with bad parameters is answered
    /// like any other request, with 200 and its JSON-RPC error.
    pub fn http_status(&self) -> http::StatusCode {
        if self.code == INVALID_PARAMS { http::StatusCode::OK } else { http::StatusCode::BAD_REQUEST }
    }

    pub fn body(&self) -> Value {
        serde_json::json!({"jsonrpc": "2.0", "id": self.id, "error": {"code": self.code, "message": self.message}})
    }
}

/// Checks one POST body.
/// The id of `body` if it is an `initialize` request (call after [`check`] accepted it).
pub fn initialize_id(body: &[u8]) -> Option<Value> {
    let msg: serde_json::Map<String, Value> = serde_json::from_slice(body).ok()?;
    (msg.get("method")?.as_str()? == "initialize").then(|| msg.get("id").cloned().unwrap_or(Value::Null))
}

/// Whether `body` opens a stream that lasts as long as the client wants (a 2026-07-28
/// `subscriptions/listen`): a stop does not wait for it.
pub fn is_listen(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<&'a str>,
    }
    serde_json::from_slice::<Method<'_>>(body).is_ok_and(|m| m.method == Some("subscriptions/listen"))
}

pub fn check(body: &[u8]) -> Result<(), Rejection> {
    let value = parse_strict(body)?;
    let msg = match value {
        Value::Object(m) => m,
        Value::Array(_) => {
            return Err(Rejection::new(
                INVALID_REQUEST,
                Value::Null,
                "Invalid Request: JSON-RPC batches are not supported (MCP removed them in 2025-06-18); send one message per POST",
            ));
        }
        _ => {
            return Err(Rejection::new(
                INVALID_REQUEST,
                Value::Null,
                "Invalid Request: expected a JSON-RPC message object",
            ));
        }
    };
    let id = match msg.get("id") {
        None => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(v @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(v.clone()),
        Some(other) => {
            return Err(Rejection::new(
                INVALID_REQUEST,
                Value::Null,
                format!("Invalid Request: `id` must be a string or an integer, got {}", kind(other)),
            ));
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Rejection::new(INVALID_REQUEST, reply_id, "Invalid Request: `jsonrpc` must be \"2.0\""));
    }
    match msg.get("method") {
        Some(Value::String(method)) => match id {
            Some(id) => check_params(method, msg.get("params"), id),
            None => Ok(()),
        },
        Some(other) => Err(Rejection::new(
            INVALID_REQUEST,
            reply_id,
            format!("Invalid Request: `method` must be a string, got {}", kind(other)),
        )),
        None if msg.contains_key("result") || msg.contains_key("error") => match id {
            Some(_) => Ok(()),
            None => Err(Rejection::new(
                INVALID_REQUEST,
                Value::Null,
                "Invalid Request: a response needs the `id` it answers",
            )),
        },
        None => Err(Rejection::new(
            INVALID_REQUEST,
            reply_id,
            "Invalid Request: no `method` (a request or notification needs one; a response needs `result` or `error`)",
        )),
    }
}

/// A field a request's params must (or may) hold, and its JSON type.
struct Field {
    name: &'static str,
    required: bool,
    object: bool,
}

const fn string(name: &'static str) -> Field {
    Field { name, required: true, object: false }
}

const fn optional_object(name: &'static str) -> Field {
    Field { name, required: false, object: true }
}

fn fields_of(method: &str) -> &'static [Field] {
    const CALL: &[Field] = &[string("name"), optional_object("arguments")];
    const PROMPT: &[Field] = &[string("name"), optional_object("arguments")];
    const URI: &[Field] = &[string("uri")];
    match method {
        "tools/call" => CALL,
        "prompts/get" => PROMPT,
        "resources/read" => URI,
        _ => &[],
    }
}

fn check_params(method: &str, params: Option<&Value>, id: Value) -> Result<(), Rejection> {
    let invalid = |message: String| Err(Rejection::new(INVALID_PARAMS, id.clone(), message));
    let empty = Map::new();
    let params = match params {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(other) => {
            return invalid(format!("Invalid params for {method}: `params` must be an object, got {}", kind(other)));
        }
    };
    for f in fields_of(method) {
        match params.get(f.name) {
            None | Some(Value::Null) if f.required => {
                return invalid(format!("Invalid params for {method}: `{}` is required", f.name));
            }
            None | Some(Value::Null) => {}
            Some(Value::String(_)) if !f.object => {}
            Some(Value::Object(_)) if f.object => {}
            Some(other) => {
                let want = if f.object { "an object" } else { "a string" };
                return invalid(format!(
                    "Invalid params for {method}: `{}` must be {want}, got {}",
                    f.name,
                    kind(other)
                ));
            }
        }
    }
    Ok(())
}

/// Parses JSON, refusing an object with the same key twice (serde_json keeps the last one,
/// so two readers of one message could disagree on what it says).
fn parse_strict(body: &[u8]) -> Result<Value, Rejection> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = de.deserialize_any(StrictVisitor).and_then(|v| de.end().map(|()| v));
    parsed.map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            Rejection::new(INVALID_REQUEST, Value::Null, format!("Invalid Request: {e}"))
        }
        _ => Rejection::new(PARSE_ERROR, Value::Null, format!("Parse error: {e}")),
    })
}

struct StrictVisitor;

impl<'de> de::DeserializeSeed<'de> for StrictVisitor {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictVisitor)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format_args!("duplicate key `{key}`")));
            }
            let v = map.next_value_seed(StrictVisitor)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn code(body: &str) -> Option<i32> {
        check(body.as_bytes()).err().map(|r| r.code)
    }

    #[test]
    fn well_formed_messages_pass() {
        for ok in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x","arguments":{"a":1}}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#,
        ] {
            assert_eq!(check(ok.as_bytes()), Ok(()), "{ok}");
        }
    }

    #[test]
    fn malformed_envelopes_are_invalid_requests() {
        assert_eq!(code("{"), Some(PARSE_ERROR));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1}"#), Some(INVALID_REQUEST), "no method");
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":7}"#), Some(INVALID_REQUEST));
        assert_eq!(code(r#"{"jsonrpc":"2.0","result":{}}"#), Some(INVALID_REQUEST));
        assert_eq!(code("7"), Some(INVALID_REQUEST));
    }

    #[test]
    fn bad_tool_call_params_name_the_problem() {
        let r = check(br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{}}"#).unwrap_err();
        assert_eq!((r.code, r.id.clone()), (INVALID_PARAMS, json!(9)));
        assert!(r.message.contains("`name` is required"), "{}", r.message);
        assert_eq!(r.http_status(), http::StatusCode::OK);
        let r = check(br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":5}}"#).unwrap_err();
        assert!(r.message.contains("`name` must be a string, got a number"), "{}", r.message);
        let r = check(br#"{"jsonrpc":"2.0","id":"q","method":"tools/call","params":{"name":"x","arguments":"{}"}}"#)
            .unwrap_err();
        assert_eq!(r.id, json!("q"));
        assert!(r.message.contains("`arguments` must be an object, got a string"), "{}", r.message);
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#), Some(INVALID_PARAMS));
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#), Some(INVALID_PARAMS));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":1}}"#),
            Some(INVALID_PARAMS)
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{}}"#), Some(INVALID_PARAMS));
        // Removed in 2026-07-28: rmcp answers it by the request's revision (-32601 there).
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{}}"#), None);
    }

    #[test]
    fn a_rejection_is_a_json_rpc_error() {
        let r = check(b"[]").unwrap_err();
        assert_eq!(r.http_status(), http::StatusCode::BAD_REQUEST);
        let body = r.body();
        assert_eq!(body["jsonrpc"], "2.0");
        assert_eq!(body["id"], Value::Null);
        assert_eq!(body["error"]["code"], INVALID_REQUEST);
    }
}
