//! Cutting one text or one JSON value down to a number of bytes.
//!
//! A text keeps its head and its tail (3:1), cut at line ends where one is near, with a marker
//! between them that the caller writes. A JSON value is never cut in half: its largest array
//! loses entries from the middle (keeping the first and the last, 3:1, and never fewer than the
//! schema's `minItems`), and a long string the schema does not constrain is cut as a text is,
//! until the whole fits; what was shortened, and by how much, is reported so that the marker
//! can say it. What comes out is always valid JSON, and valid against the schema it was given.

use std::borrow::Cow;

use serde_json::Value;

/// Of a cut text's bytes, the share kept from its head; the rest comes from its tail.
const HEAD_SHARE: f64 = 0.75;
/// A line end this close to a cut point (as a share of the part kept) moves the cut to it.
const LINE_SLACK: f64 = 0.1;
/// Rounds of shrinking a JSON value: each shortens its largest array or string.
const MAX_ROUNDS: usize = 64;
/// Strings shorter than this are left whole.
const MIN_CUT_STRING: usize = 256;

/// The kept head `text[..head]` and tail `text[tail..]` of a text cut to about `budget` bytes
/// (both at char boundaries, at line ends where one is near).
pub fn head_tail(text: &str, budget: usize) -> (usize, usize) {
    if text.len() <= budget {
        return (text.len(), text.len());
    }
    let head_len = (budget as f64 * HEAD_SHARE) as usize;
    let tail_len = budget - head_len;
    let mut head = floor_boundary(text, head_len);
    if let Some(nl) = text[..head].rfind('\n')
        && head - nl <= (head_len as f64 * LINE_SLACK) as usize
    {
        head = nl + 1;
    }
    let mut tail = ceil_boundary(text, text.len() - tail_len);
    if let Some(nl) = text[tail..].find('\n')
        && nl <= (tail_len as f64 * LINE_SLACK) as usize
        && tail + nl + 1 < text.len()
    {
        tail += nl + 1;
    }
    (head, tail.max(head))
}

/// The char boundary at or before `i` (`str::floor_char_boundary`, newer than this crate's MSRV).
pub fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The char boundary at or after `i`.
pub fn ceil_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// One shortening of a JSON value, for the marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortened {
    /// The array at `path` kept `head` entries from its start and `tail` from its end, of `was`.
    Array { path: String, was: usize, head: usize, tail: usize },
    /// The string at `path` kept `kept` of its `was` bytes.
    String { path: String, was: usize, kept: usize },
}

impl std::fmt::Display for Shortened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shortened::Array { path, was, head, tail } => write!(
                f,
                "{path} shortened from {was} to {} entries (the first {head} and the last {tail}; {} left out)",
                head + tail,
                was - head - tail
            ),
            Shortened::String { path, was, kept } => {
                write!(f, "the string at {path} cut from {was} to {kept} bytes (its head and its tail)")
            }
        }
    }
}

/// Shrinks `value` toward `budget` bytes of compact JSON, within what `schema` (the tool's
/// `outputSchema`, when it declared one) allows. Returns what was shortened and whether it now
/// fits.
pub fn shrink(value: &mut Value, budget: usize, schema: Option<&Value>) -> (Vec<Shortened>, bool) {
    let mut done = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let mut best = None;
        let size = measure(value, schema, &mut Vec::new(), &mut best);
        if size <= budget {
            return (done, true);
        }
        let Some(Candidate { path, size: node_size }) = best else { break };
        let path: Vec<Step<'static>> = path.into_iter().map(Step::into_owned).collect();
        let target = node_size.saturating_sub(size - budget);
        let (node, node_schema) = walk(value, schema, &path);
        let Some(s) = shorten(node, node_schema, target, &pointer(&path)) else { break };
        done.push(s);
    }
    let fits = json_size(value) <= budget;
    (done, fits)
}

/// The compact JSON size of `value`.
pub fn json_size(value: &Value) -> usize {
    measure(value, None, &mut Vec::new(), &mut None)
}

/// One step down a JSON value; keys are borrowed while measuring, so that walking a large
/// value allocates only when it finds a larger candidate.
#[derive(Debug, Clone)]
enum Step<'a> {
    Key(Cow<'a, str>),
    Index(usize),
}

impl Step<'_> {
    fn into_owned(self) -> Step<'static> {
        match self {
            Step::Key(k) => Step::Key(Cow::Owned(k.into_owned())),
            Step::Index(i) => Step::Index(i),
        }
    }
}

struct Candidate<'a> {
    path: Vec<Step<'a>>,
    size: usize,
}

/// The compact JSON size of `value`, noting in `best` the largest array or string below it that
/// can still be shortened.
fn measure<'v>(
    value: &'v Value,
    schema: Option<&Value>,
    path: &mut Vec<Step<'v>>,
    best: &mut Option<Candidate<'v>>,
) -> usize {
    let size = match value {
        Value::Null => 4,
        Value::Bool(b) => 4 + usize::from(!*b),
        Value::Number(n) => display_len(n),
        Value::String(s) => escaped_len(s),
        Value::Array(items) => {
            let inner = sub(schema, "items");
            let mut total = 2 + items.len().saturating_sub(1);
            for (i, item) in items.iter().enumerate() {
                path.push(Step::Index(i));
                total += measure(item, inner, path, best);
                path.pop();
            }
            total
        }
        Value::Object(map) => {
            let mut total = 2 + map.len().saturating_sub(1);
            for (k, v) in map {
                path.push(Step::Key(Cow::Borrowed(k)));
                total += escaped_len(k) + 1 + measure(v, property(schema, k), path, best);
                path.pop();
            }
            total
        }
    };
    let shrinkable = match value {
        Value::Array(items) => items.len() > min_items(schema).max(1),
        Value::String(s) => s.len() >= MIN_CUT_STRING && free_string(schema),
        _ => false,
    };
    if shrinkable && best.as_ref().is_none_or(|b| size > b.size) {
        *best = Some(Candidate { path: path.clone(), size });
    }
    size
}

/// The node at `path` and the schema that applies to it.
fn walk<'a>(
    mut value: &'a mut Value,
    mut schema: Option<&'a Value>,
    path: &[Step],
) -> (&'a mut Value, Option<&'a Value>) {
    for step in path {
        (value, schema) = match (step, value) {
            (Step::Index(i), Value::Array(items)) => (&mut items[*i], sub(schema, "items")),
            (Step::Key(k), Value::Object(map)) => (map.get_mut(k.as_ref()).expect("measured"), property(schema, k)),
            _ => unreachable!("a path measured in this value"),
        };
    }
    (value, schema)
}

/// Shortens the array or string `node` to about `target` bytes.
fn shorten(node: &mut Value, schema: Option<&Value>, target: usize, path: &str) -> Option<Shortened> {
    match node {
        Value::Array(items) => {
            let was = items.len();
            let min = min_items(schema).max(1);
            let sizes: Vec<usize> = items.iter().map(json_size).collect();
            let (mut head, mut tail, mut used) = (0, 0, 2);
            // Entries from the head and the tail, three to one, while they fit.
            while head + tail < was {
                let from_head = (tail + 1) * 3 > head + 1 || tail >= was - head - 1;
                let i = if from_head { head } else { was - 1 - tail };
                let cost = sizes[i] + 1;
                if used + cost > target && head + tail >= min {
                    break;
                }
                used += cost;
                if from_head { head += 1 } else { tail += 1 }
            }
            if head + tail >= was {
                return None;
            }
            items.drain(head..was - tail);
            Some(Shortened::Array { path: path.into(), was, head, tail })
        }
        Value::String(s) => {
            let was = s.len();
            let marker = format!(" […{was} bytes in all; cut by toolmux…] ");
            let budget = target.saturating_sub(marker.len() + 2).max(MIN_CUT_STRING / 2);
            if budget >= was {
                return None;
            }
            let (h, t) = head_tail(s, budget);
            *s = format!("{}{marker}{}", &s[..h], &s[t..]);
            Some(Shortened::String { path: path.into(), was, kept: h + (was - t) })
        }
        _ => None,
    }
}

/// JSON Pointer-like path for the marker: `$`, `$.rows`, `$.rows[3].name`.
fn pointer(path: &[Step]) -> String {
    let mut out = String::from("$");
    for step in path {
        match step {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
        }
    }
    out
}

/// The length of what `value` displays as, without writing it anywhere.
fn display_len(value: &impl std::fmt::Display) -> usize {
    struct Count(usize);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = std::fmt::write(&mut count, format_args!("{value}"));
    count.0
}

fn escaped_len(s: &str) -> usize {
    let mut n = 2;
    for c in s.chars() {
        n += match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
    }
    n
}

fn sub<'a>(schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    schema?.get(key).filter(|s| s.is_object())
}

fn property<'a>(schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties").and_then(|p| p.get(key)).or_else(|| s.get("additionalProperties")).filter(|s| s.is_object())
}

/// The least number of entries an array must keep: its schema's `minItems` (and, for a schema
/// that cannot be followed here, all of them: nothing is taken from what is not understood).
fn min_items(schema: Option<&Value>) -> usize {
    let Some(s) = schema else { return 0 };
    if opaque(s) || s.get("prefixItems").is_some() || s.get("contains").is_some() || s.get("uniqueItems").is_some() {
        return usize::MAX;
    }
    s.get("minItems").and_then(Value::as_u64).map_or(0, |n| n as usize)
}

/// A string its schema lets be cut: no pattern, format, enumeration or minimum length.
fn free_string(schema: Option<&Value>) -> bool {
    let Some(s) = schema else { return true };
    !opaque(s)
        && ["pattern", "format", "enum", "const", "minLength", "contentEncoding"].iter().all(|k| s.get(k).is_none())
}

/// A schema this module does not follow: references and combinations.
fn opaque(s: &Value) -> bool {
    ["$ref", "anyOf", "oneOf", "allOf", "not", "if", "$dynamicRef"].iter().any(|k| s.get(k).is_some())
}
