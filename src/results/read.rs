//! Reading a kept result: the `read_result` tool (its definition, its arguments, its answer)
//! and `resources/read` on `toolmux://results/ID/PART`. Both read the same bytes: a read from
//! an offset (moved down to a char boundary) or a numbered page; reads that each start where
//! the last ended, or pages read in turn, put the part back together byte for byte.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ReadResourceResult, ResourceContents, Tool, ToolAnnotations,
};
use serde_json::{Value, json};

use super::kept::{Kept, Miss, Part, page_span, span};
use super::{PAGE_BYTES, READ_RESULT, URI_PREFIX};

/// `_meta` key of a read's answer: the bytes it holds and where the next read starts.
pub const META_KEY: &str = "toolmux/read";

pub fn tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "The id a cut result's marker gave."},
            "part": {"type": "string", "description": "Which part: the content block's number (\"0\", \"1\", …) or \"structured\"; the marker names it. Default: the first part kept."},
            "offset": {"type": "integer", "minimum": 0, "description": "The byte to read from (the marker gives it); default 0."},
            "length": {"type": "integer", "minimum": 1, "description": "Bytes to read; default 40000 (about 10,000 tokens)."},
            "page": {"type": "integer", "minimum": 1, "description": "Instead of offset: the page to read, from 1, in pages of `length` bytes."}
        },
        "required": ["id"]
    });
    Tool::new(
        READ_RESULT,
        "Read the rest of a tool result that toolmux cut because it was too long: give the id (and part and offset) \
         its marker names. Returns the next piece and where the one after it starts.",
        Arc::new(schema.as_object().cloned().expect("an object")),
    )
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false))
}

/// Where a read starts and how much it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub id: String,
    pub part: Option<String>,
    pub at: At,
    pub length: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Offset(usize),
    Page(usize),
}

/// read_result's arguments; an error says how to fix the call.
pub fn parse(args: Option<&JsonObject>) -> Result<Read, String> {
    let empty = JsonObject::new();
    let args = args.unwrap_or(&empty);
    if let Some(k) = args.keys().find(|k| !["id", "part", "offset", "length", "page"].contains(&k.as_str())) {
        return Err(format!(
            "read_result has no argument `{k}`: give id, and optionally part, offset (or page) and length"
        ));
    }
    let id = match args.get("id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err("read_result needs `id`: the id the cut result's marker gave".into()),
    };
    let part = match args.get("part") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(format!("`part` must be a string such as \"0\", not {}", crate::mcp::meta::kind(other)));
        }
    };
    let number = |key: &str, min: u64| -> Result<Option<usize>, String> {
        match args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= min => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
                _ => Err(format!("`{key}` must be a whole number of at least {min}, not {v}")),
            },
        }
    };
    let at = match (number("offset", 0)?, number("page", 1)?) {
        (Some(_), Some(_)) => return Err("give `offset` or `page`, not both".into()),
        (_, Some(p)) => At::Page(p),
        (o, None) => At::Offset(o.unwrap_or(0)),
    };
    Ok(Read { id, part, at, length: number("length", 1)?.unwrap_or(PAGE_BYTES) })
}

/// What a miss says, the same for a result that never existed and another caller's.
pub fn miss_message(kept: &Kept, id: &str, miss: &Miss) -> String {
    let minutes = kept.keep_for().as_secs().div_ceil(60);
    match miss {
        Miss::Gone => format!(
            "no kept result `{id}`: results are kept {minutes} minutes for the caller that made the call, then dropped. Call the tool again."
        ),
        Miss::Elsewhere(tag) => format!(
            "result `{id}` is kept by another replica of this gateway ({tag}; this is {}): a kept result is read on the replica that made the call. Keep a session on one replica (the balancer's affinity on Mcp-Session-Id), or call the tool again.",
            kept.replica()
        ),
        Miss::NoPart(parts) => format!("result `{id}` has no such part; its parts are: {}", parts.join(", ")),
    }
}

/// The bytes of `part` a read takes, and the position after them (`None` at the end).
fn take(part: &Part, at: At, length: usize) -> Result<(usize, usize), String> {
    let total = part.text.len();
    match at {
        At::Offset(o) if o > total => Err(format!("offset {o} is past the end: the part has {total} bytes")),
        At::Offset(o) => Ok(span(&part.text, o, length)),
        At::Page(p) => page_span(&part.text, p, length).ok_or_else(|| {
            format!("page {p} is past the end: the part has {} pages of {length} bytes", total.div_ceil(length.max(4)))
        }),
    }
}

/// read_result's answer: the piece of `found` (the part `read` names, or why there is none)
/// read, then a note saying where it is and how to go on.
pub fn answer(found: Result<Part, String>, read: &Read, max_length: usize) -> CallToolResult {
    let error = |m: String| CallToolResult::error(vec![ContentBlock::text(m)]);
    let part = match found {
        Ok(p) => p,
        Err(why) => return error(why),
    };
    let length = read.length.min(max_length.max(1));
    let (start, end) = match take(&part, read.at, length) {
        Ok(r) => r,
        Err(m) => return error(m),
    };
    let total = part.text.len();
    let (id, name) = (&read.id, &part.name);
    let next = match read.at {
        _ if end >= total => "That is the end of it.".to_string(),
        At::Page(p) => format!(
            "Next: read_result {{\"id\": \"{id}\", \"part\": \"{name}\", \"page\": {}, \"length\": {length}}}.",
            p + 1
        ),
        At::Offset(_) => format!("Next: read_result {{\"id\": \"{id}\", \"part\": \"{name}\", \"offset\": {end}}}."),
    };
    let what = if part.binary { " (base64)" } else { "" };
    let note = format!("[toolmux: bytes {start} to {end} of the {total}{what} of part {name} of result {id}. {next}]");
    let mut result =
        CallToolResult::success(vec![ContentBlock::text(&part.text[start..end]), ContentBlock::text(note)]);
    let mut meta = rmcp::model::MetaObject::default();
    meta.0.insert(
        META_KEY.into(),
        json!({"part": name, "offset": start, "end": end, "total": total, "next": (end < total).then_some(end)}),
    );
    result.meta = Some(meta);
    result
}

/// The read a `toolmux://results/ID/PART[?offset=N&length=M | ?page=K&length=M]` URI asks
/// for (the first page when it names none).
pub fn parse_uri(uri: &str) -> Result<Read, ErrorData> {
    let bad = |m: String| ErrorData::invalid_params(m, None);
    let rest = uri.strip_prefix(URI_PREFIX).unwrap_or_default();
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (id, name) = path.split_once('/').unwrap_or((path, ""));
    let mut args = JsonObject::new();
    args.insert("id".into(), id.into());
    if !name.is_empty() {
        args.insert("part".into(), name.into());
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n: u64 = v.parse().map_err(|_| bad(format!("`{k}={v}` in {uri}: give a whole number")))?;
        args.insert(k.into(), n.into());
    }
    let mut read = parse(Some(&args)).map_err(bad)?;
    if query.is_empty() {
        read.at = At::Page(1);
    }
    Ok(read)
}

/// `resources/read` of a kept result: a text part's piece, a binary part whole. `found` is the
/// part the URI names, or why there is none.
pub fn resource(found: Result<Part, String>, uri: &str, read: &Read) -> Result<ReadResourceResult, ErrorData> {
    let bad = |m: String| ErrorData::invalid_params(m, None);
    let part = found.map_err(|why| ErrorData::resource_not_found(why, None))?;
    if part.binary {
        return Ok(ReadResourceResult::new(vec![ResourceContents::BlobResourceContents {
            uri: uri.into(),
            mime_type: part.mime_type.clone(),
            blob: part.text.to_string(),
            meta: None,
        }]));
    }
    let (start, end) = take(&part, read.at, read.length).map_err(bad)?;
    let total = part.text.len();
    let mut meta = rmcp::model::MetaObject::default();
    meta.0.insert(
        META_KEY.into(),
        json!({"part": part.name, "offset": start, "end": end, "total": total, "next": (end < total).then_some(end)}),
    );
    Ok(ReadResourceResult::new(vec![ResourceContents::TextResourceContents {
        uri: uri.into(),
        mime_type: Some(part.mime_type.clone().unwrap_or_else(|| "text/plain".into())),
        text: part.text[start..end].to_string(),
        meta: Some(meta),
    }]))
}
