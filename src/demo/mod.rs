//! Built-in demo backends: MCP servers modelled on the ones people connect (a code host, chat,
//! an issue tracker, files, a SQL database, a calendar, a cloud, monitoring, …) with realistic
//! tools that return plausible results. `toolmux demo` puts the gateway in front of them; tests
//! and benchmarks use the same servers, plus the `testkit` backend whose tools misbehave on
//! purpose (sleep, exit mid-call, add a tool at run time).

mod server;

use std::sync::Arc;

use rmcp::model::Tool;
use serde_json::{Map, Value, json};

pub use server::{DemoServer, serve_http, serve_stdio};

const CATALOG: &str = include_str!("catalog.txt");

/// One demo backend's definition.
#[derive(Debug, Clone)]
pub struct DemoBackend {
    pub name: String,
    /// The server's `serverInfo.title`, if any (the catalog format has none; tests set it).
    pub title: Option<String>,
    pub description: String,
    pub tools: Vec<Tool>,
    /// How long every `tools/list` takes (a slow server, for tests of start-up and health).
    pub list_delay: std::time::Duration,
}

/// Every demo backend in the built-in catalog (not `testkit`).
pub fn backends() -> Vec<DemoBackend> {
    parse(CATALOG).expect("the built-in demo catalog parses")
}

/// A demo backend by name, `testkit` included.
pub fn backend(name: &str) -> Option<DemoBackend> {
    if name == "testkit" {
        return Some(testkit());
    }
    backends().into_iter().find(|b| b.name == name)
}

/// Tools whose behaviour tests rely on.
fn testkit() -> DemoBackend {
    let text = "== testkit | Test tools that misbehave on purpose\n\
        echo | Repeat or echo back a message exactly as given. | input*: The message to echo back\n\
        sleep | Wait for a number of milliseconds, then answer. | ms*:integer: How long to wait\n\
        exit | Exit the server process at once, in the middle of the call. | \n\
        add_tool | Add a tool to this server at run time and announce the change. | name*: The new tool's name\n\
        set_description | Change the description of one of this server's tools (or of its prompt or resource) at run time and announce the change. | tool*: The tool's name (ignored for a prompt or resource); description*: Its new description; kind: tool (the default), prompt or resource\n\
        cancelled_calls | How many calls were cancelled by the client before they finished. | \n\
        ask | Wait, then ask the calling client's model a question (sampling) and return its answer: with a request to the client (2025-11-25) or an input-required result (2026-07-28). | prompt*: The question; delay_ms:integer: How long to wait before asking; rounds:integer: How many times to ask (default 1); answers joined by ` | `; unlinked:boolean: Send the request on no call's stream (2025-11-25), as servers that ask from background work do; elicit:boolean: Ask with an elicitation form instead of sampling\n\
        remember | Remember a value in this MCP session. | value*: What to remember\n\
        recall | Recall the value remembered in this MCP session. | \n\
        whoami | Return the X-User and Authorization headers of the HTTP request that made this call, and its traceparent if any. | \n\
        progress | Report progress several times, then answer. | steps*:integer: How many progress notifications; label: Put in each progress message\n\
        log | Send a log message at a level, if the session's logging/setLevel lets it through. | level*: debug, info, warning or error; message*: The text; after_ms:integer: Send it this long after answering, outside the call (on the session's standalone stream)\n\
        job | Work for a number of milliseconds and answer; run as a task (SEP-2663) when the client supports tasks, until done or cancelled. | ms*:integer: How long the work takes; label: Put in the answer\n\
        big | Return a large result: numbered lines of text, a JSON array of numbers as text, or an image. | kind*: text, json or image; bytes*:integer: About how many bytes\n\
        rows | Return rows as structured content that its output schema describes. | count*:integer: How many rows\n\
        flood | Send progress notifications without end, never answering, until cancelled. | \n";
    let mut testkit = parse(text).expect("testkit parses").remove(0);
    if let Some(rows) = testkit.tools.iter_mut().find(|t| t.name == "rows") {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "rows": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                        "required": ["id", "name"]
                    }
                },
                "total": {"type": "integer"}
            },
            "required": ["rows", "total"]
        });
        rows.output_schema = schema.as_object().cloned().map(std::sync::Arc::new);
    }
    testkit
}

/// Parses the catalog format described at the top of `catalog.txt`.
pub fn parse(text: &str) -> Result<Vec<DemoBackend>, String> {
    let mut out: Vec<DemoBackend> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix("==") {
            let (name, description) =
                rest.split_once('|').ok_or(format!("line {}: backend needs `| description`", i + 1))?;
            out.push(DemoBackend {
                name: name.trim().into(),
                title: None,
                description: description.trim().into(),
                tools: Vec::new(),
                list_delay: std::time::Duration::ZERO,
            });
            continue;
        }
        let backend = out.last_mut().ok_or(format!("line {}: tool before any backend", i + 1))?;
        let mut fields = line.splitn(3, '|');
        let name = fields.next().unwrap_or_default().trim();
        let description = fields.next().ok_or(format!("line {}: tool needs a description", i + 1))?.trim();
        let params = fields.next().unwrap_or_default().trim();
        backend.tools.push(tool(name, description, params).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(out)
}

fn tool(name: &str, description: &str, params: &str) -> Result<Tool, String> {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for p in params.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        // `name*:type: description`: the head ends at the first colon followed by a space.
        let (head, desc) = p.split_once(": ").unwrap_or((p, ""));
        let desc = desc.trim();
        let (pname, ty) = head.split_once(':').unwrap_or((head, "string"));
        let (pname, req) = match pname.strip_suffix('*') {
            Some(n) => (n, true),
            None => (pname, false),
        };
        if !is_type(ty) {
            return Err(format!("parameter `{pname}` has unknown type `{ty}`"));
        }
        let mut schema = json!({"type": ty, "description": desc});
        if ty == "array" {
            schema["items"] = json!({"type": "string"});
        }
        properties.insert(pname.to_string(), schema);
        if req {
            required.push(Value::String(pname.to_string()));
        }
    }
    let schema = json!({"type": "object", "properties": properties, "required": required});
    Ok(Tool::new(name.to_string(), description.to_string(), Arc::new(schema.as_object().cloned().unwrap_or_default())))
}

fn is_type(t: &str) -> bool {
    matches!(t, "string" | "integer" | "number" | "boolean" | "array" | "object")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_catalog_is_large_and_well_formed() {
        let bs = backends();
        assert!(bs.len() >= 8, "{} backends", bs.len());
        let n: usize = bs.iter().map(|b| b.tools.len()).sum();
        assert!(n >= 150, "{n} tools");
        let pr = bs
            .iter()
            .find(|b| b.name == "github")
            .unwrap()
            .tools
            .iter()
            .find(|t| t.name == "create_pull_request")
            .unwrap();
        let schema = Value::Object((*pr.input_schema).clone());
        assert_eq!(schema["properties"]["draft"]["type"], "boolean");
        assert_eq!(schema["properties"]["owner"]["description"], "Repository owner, a user or organisation");
        assert!(schema["required"].as_array().unwrap().contains(&json!("head")));
        assert!(!schema["required"].as_array().unwrap().contains(&json!("body")));
        let sleep = backend("testkit").unwrap().tools.into_iter().find(|t| t.name == "sleep").unwrap();
        assert_eq!(Value::Object((*sleep.input_schema).clone())["properties"]["ms"]["type"], "integer");
    }
}
