//! The two optimizer meta-tools: their definitions (names and input schemas as the reference
//! gateway's users know them), the parsing of their arguments with call_tool's leniency, and the
//! shape of find_tool's answer. Pure: no I/O.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::store::Verdict;

pub const FIND_TOOL: &str = "find_tool";
pub const CALL_TOOL: &str = "call_tool";

pub const FIND_TOOL_DESCRIPTION: &str = "Search the tools this gateway can run. Call it whenever you need a capability \
you do not already have a tool for: before guessing a tool name, and again with other words when the results do not \
fit. Say in tool_description what you want done, in plain language (\"create an issue in a GitHub repository\", not \
a tool name), and add distinctive words such as product names to tool_keywords. Returns the best-matching tools, best \
first, with how well they match (match: good, weak or none); each has its name, what it does and its parameters \
(required ones in full, optional ones by type: set describe to true for every parameter's description). Then run \
one with call_tool, giving its exact name and arguments.";
pub const CALL_TOOL_DESCRIPTION: &str = "Run a tool found by find_tool. Give its exact name as tool_name and its \
arguments, matching the tool's inputSchema, as parameters. Returns the tool's own result.";

fn schema(v: Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().expect("schema literal is an object"))
}

/// `find_tool`, with an optional operator-written description (hinting at what is available).
pub fn find_tool(description: Option<&str>) -> Tool {
    Tool::new(
        FIND_TOOL,
        description.unwrap_or(FIND_TOOL_DESCRIPTION).to_string(),
        schema(json!({
            "type": "object",
            "properties": {
                "tool_description": {
                    "type": "string",
                    "description": "The capability you need, in natural language, e.g. \"create a pull request on a code repository\"."
                },
                "tool_keywords": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Optional keywords for the keyword search, e.g. [\"github\", \"pull request\"]."
                },
                "describe": {
                    "type": "boolean",
                    "description": "Optional: true returns each tool's full definition, every parameter with its description."
                }
            },
            "required": ["tool_description"]
        })),
    )
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false))
}

pub fn call_tool() -> Tool {
    Tool::new(
        CALL_TOOL,
        CALL_TOOL_DESCRIPTION,
        schema(json!({
            "type": "object",
            "properties": {
                "tool_name": {
                    "type": "string",
                    "description": "The exact name of a tool returned by find_tool."
                },
                "parameters": {
                    "type": "object",
                    "description": "The tool's arguments, matching its inputSchema."
                }
            },
            "required": ["tool_name", "parameters"]
        })),
    )
}

/// A tool error result: what went wrong and how to fix the call.
pub fn error_result(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// find_tool's arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct FindArgs {
    pub description: String,
    pub keywords: Vec<String>,
    /// `describe`: whole tool definitions instead of the compact form.
    pub describe: bool,
}

pub fn parse_find(args: Option<&JsonObject>) -> Result<FindArgs, String> {
    let empty = Map::new();
    let args = args.unwrap_or(&empty);
    let description = match get_ci(args, "tool_description") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(Value::String(_)) | None | Some(Value::Null) => return Err("tool_description is required".into()),
        Some(other) => {
            return Err(format!(
                "tool_description must be a string describing the capability you need; got {}",
                kind(other)
            ));
        }
    };
    let keywords = match get_ci(args, "tool_keywords") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        // A single string is read as space-separated keywords rather than refused.
        Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
        Some(other) => return Err(format!("tool_keywords must be an array of strings; got {}", kind(other))),
    };
    let describe = match get_ci(args, "describe") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => true,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => false,
        Some(other) => return Err(format!("describe must be true or false; got {}", kind(other))),
    };
    Ok(FindArgs { description, keywords, describe })
}

/// call_tool's arguments, after leniency.
#[derive(Debug, Clone, PartialEq)]
pub struct CallArgs {
    pub tool_name: String,
    pub parameters: JsonObject,
}

/// Reads `tool_name` and `parameters`, case-insensitively. A name missing at the top level is
/// taken from inside `parameters` (and removed from the forwarded arguments); a top-level name
/// always wins.
pub fn parse_call(args: Option<&JsonObject>) -> Result<CallArgs, String> {
    let empty = Map::new();
    let args = args.unwrap_or(&empty);
    let mut parameters = match get_ci(args, "parameters") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(other) => {
            return Err(format!(
                "parameters must be an object holding the tool's arguments, e.g. {{\"tool_name\": \"<name from find_tool>\", \"parameters\": {{\"input\": \"hello\"}}}}; got {}",
                kind(other)
            ));
        }
    };
    let top = get_ci(args, "tool_name").and_then(Value::as_str).filter(|s| !s.is_empty());
    let nested_key = parameters.keys().find(|k| k.eq_ignore_ascii_case("tool_name")).cloned();
    let tool_name = match (top, nested_key) {
        (Some(name), nested) => {
            if let Some(k) = nested
                && parameters.get(&k).and_then(Value::as_str) == Some(name)
            {
                parameters.remove(&k);
            }
            name.to_string()
        }
        (None, Some(k)) => match parameters.remove(&k) {
            Some(Value::String(s)) if !s.is_empty() => s,
            _ => return Err(missing_name(args)),
        },
        (None, None) => return Err(missing_name(args)),
    };
    Ok(CallArgs { tool_name, parameters })
}

fn missing_name(args: &JsonObject) -> String {
    let keys: Vec<&str> = args.keys().map(String::as_str).collect();
    format!(
        "tool_name is required. Call call_tool as {{\"tool_name\": \"<name from find_tool>\", \"parameters\": {{…the tool's arguments…}}}}; the call had keys [{}]",
        keys.join(", ")
    )
}

fn get_ci<'a>(args: &'a JsonObject, key: &str) -> Option<&'a Value> {
    args.get(key).or_else(|| args.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
}

/// What kind of JSON value `v` is, for error messages ("a number").
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenMetrics {
    pub baseline_tokens: u64,
    pub returned_tokens: u64,
    pub savings_percent: f64,
}

impl TokenMetrics {
    pub fn new(baseline: u64, returned: u64) -> Self {
        let savings =
            if baseline == 0 { 0.0 } else { (baseline.saturating_sub(returned)) as f64 / baseline as f64 * 100.0 };
        Self {
            baseline_tokens: baseline,
            returned_tokens: returned,
            savings_percent: (savings * 100.0).round() / 100.0,
        }
    }
}

/// A matched tool that cannot be used now, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Unavailable {
    pub name: String,
    pub backend: String,
    pub status: String,
    /// Seconds since the backend entered that status.
    pub since_secs: u64,
    /// Seconds until the next connection attempt or probe, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_retry_secs: Option<u64>,
}

/// How well a find_tool answer matched: the verdict, each tool's similarity (in `tools` order;
/// empty when only the keyword arm ran) and whether the request was in a script the model cannot
/// read.
#[derive(Debug, Clone)]
pub struct Match {
    pub verdict: Verdict,
    pub scores: Vec<f32>,
    pub non_english: bool,
}

impl Match {
    /// What the agent should know beyond the verdict's name; nothing when the match is good.
    fn note(&self) -> Option<&'static str> {
        match (self.verdict, self.non_english) {
            (Verdict::Good, _) => None,
            (_, true) => Some(
                "Tool search reads English only: describe the capability you need in English and call find_tool again.",
            ),
            (Verdict::Weak, false) => Some(
                "These tools are only loosely related to the request: read a tool's description before calling it, or call find_tool again with other words.",
            ),
            (Verdict::None, false) => Some(
                "No tool available to you fits this request; the closest ones are listed anyway. Do not call them for this request unless a description says they do what you need.",
            ),
        }
    }
}

/// Longest one-line description in a compact answer, in characters.
const COMPACT_DESCRIPTION_CHARS: usize = 200;

/// A tool as a compact find_tool answer shows it: its name, the first sentence of its
/// description, and its input schema with the required properties whole and each optional one
/// reduced to its type (so the model knows it exists; `describe` gives the rest). Everything
/// else (title, output schema, annotations, icons, `_meta`) is left out, but the link to the
/// tool's App (`_meta.ui`, MCP Apps), without which a host could not render it.
pub fn compact(tool: &Tool) -> Tool {
    // A flagged tool's warning (see `crate::fence`) is kept whole in front of the sentence.
    let description = match tool.description.as_deref() {
        Some(d) if d.starts_with("[toolmux:") && d.contains("] ") => {
            let (warning, rest) = d.split_once("] ").expect("checked");
            format!("{warning}] {}", first_sentence(rest))
        }
        Some(d) => first_sentence(d),
        None => String::new(),
    };
    let schema = &tool.input_schema;
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let mut properties = Map::new();
    if let Some(all) = schema.get("properties").and_then(Value::as_object) {
        for (name, definition) in all {
            let kept = if required.contains(&name.as_str()) {
                definition.clone()
            } else {
                match definition.get("type") {
                    Some(t) => json!({"type": t}),
                    None => json!({}),
                }
            };
            properties.insert(name.clone(), kept);
        }
    }
    let mut input = Map::new();
    if let Some(t) = schema.get("type") {
        input.insert("type".into(), t.clone());
    }
    if !properties.is_empty() {
        input.insert("properties".into(), Value::Object(properties));
    }
    if !required.is_empty() {
        input.insert("required".into(), json!(required));
    }
    let mut out = Tool::new(tool.name.clone(), description, Arc::new(input));
    out.meta = crate::catalog::apps::meta_of(tool).map(rmcp::model::MetaObject);
    out
}

/// The first sentence (or line) of `text`, at most [`COMPACT_DESCRIPTION_CHARS`] characters.
fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let line = text.lines().next().unwrap_or_default().trim();
    // A stop ends the sentence before a space and a capital, or at the end of the line (so
    // "e.g. a.txt" and "v1.2" do not).
    let end = line.char_indices().find_map(|(i, c)| {
        let after = i + c.len_utf8();
        let rest = &line[after..];
        let ends = rest.is_empty()
            || (rest.starts_with(char::is_whitespace)
                && rest.trim_start().chars().next().is_some_and(|n| n.is_uppercase() || n.is_ascii_digit()));
        (matches!(c, '.' | '!' | '?') && ends).then_some(after)
    });
    let sentence = &line[..end.unwrap_or(line.len())];
    if sentence.chars().count() <= COMPACT_DESCRIPTION_CHARS {
        return sentence.to_string();
    }
    let cut: String = sentence.chars().take(COMPACT_DESCRIPTION_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// find_tool's answer, as JSON text and as structuredContent.
pub fn find_result(
    tools: &[Tool],
    matched: &Match,
    metrics: TokenMetrics,
    mode: &str,
    unavailable: Vec<Unavailable>,
    needs_login: Vec<String>,
) -> CallToolResult {
    let mut body = json!({
        "tools": tools,
        "match": matched.verdict,
        "token_metrics": metrics,
        "search_mode": mode,
    });
    if !matched.scores.is_empty() {
        let scores: Vec<f64> = matched.scores.iter().map(|s| (*s as f64 * 1000.0).round() / 1000.0).collect();
        body["scores"] = json!(scores);
    }
    if let Some(note) = matched.note() {
        body["note"] = json!(note);
    }
    if !unavailable.is_empty() {
        body["unavailable"] = serde_json::to_value(unavailable).expect("serialisable");
    }
    // Backends whose tools cannot be searched until someone logs in: said, not silently missing.
    if !needs_login.is_empty() {
        body["needs_login"] = json!(needs_login);
    }
    let mut r = CallToolResult::success(vec![ContentBlock::text(body.to_string())]);
    r.structured_content = Some(body);
    r
}
