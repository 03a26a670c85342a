//! Every backend tool as it was first seen, so that a change is never quiet.
//!
//! A backend can change a tool after clients have come to trust it (a "rug pull": a new
//! description that instructs the model, a schema that asks for more), or add tools made to look
//! like another backend's. The ledger keeps, per backend and tool, the version accepted (the
//! first seen, or one an operator accepted) by its sha256, and what each new listing differs by.
//! Frozen, the accepted version keeps being served, and a tool added after the backend's first
//! listing is held back, until an operator accepts the change; not frozen, the change is served
//! and recorded. A backend the ledger has never seen is, frozen, held whole until accepted,
//! unless the operator trusts first listings ([`Rules::trust_first`]); either way its first
//! listing is reported, and checked for look-alikes of other backends' tools. What else the
//! model reads of a backend goes through the same rules: its prompts, resources and resource
//! templates (each an entry named by [`Part::entry`]), and what the server says of itself (its
//! instructions and description). Pure data: the caller decides when to persist it.

use std::collections::BTreeMap;

use rmcp::model::{Prompt, Resource, ResourceTemplate, Tool};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One version of a listed item: a tool, a prompt, a resource or a resource template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Version {
    /// sha256 of the backend's JSON for the item, in hex.
    pub digest: String,
    /// The item as listed (under the name `tool` that ledger files have always used).
    #[serde(rename = "tool")]
    pub item: Value,
    /// When it was first seen, in milliseconds since the Unix epoch.
    pub seen_ms: u64,
}

impl Version {
    pub fn of(item: &impl Serialize, now_ms: u64) -> Self {
        let json = serde_json::to_vec(item).unwrap_or_default();
        Self {
            digest: base16ct::lower::encode_string(&Sha256::digest(&json)),
            item: serde_json::from_slice(&json).unwrap_or_default(),
            seen_ms: now_ms,
        }
    }
}

/// The kinds of item a backend lists that the model reads, each under its own names in the
/// ledger: a tool by its name, the others by a tag and their name or URI, e.g.
/// `(prompt) summarise` (tool names cannot hold the space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Tool,
    Prompt,
    Resource,
    Template,
}

impl Part {
    const TAGGED: [Part; 3] = [Part::Prompt, Part::Resource, Part::Template];

    fn tag(self) -> &'static str {
        match self {
            Part::Tool => "",
            Part::Prompt => "(prompt) ",
            Part::Resource => "(resource) ",
            Part::Template => "(template) ",
        }
    }

    /// The ledger's name for the item `key` (a name, a URI or a URI template) of this kind.
    pub fn entry(self, key: &str) -> String {
        format!("{}{key}", self.tag())
    }

    /// What it is called in the log.
    pub fn noun(self) -> &'static str {
        match self {
            Part::Tool => "tool",
            Part::Prompt => "prompt",
            Part::Resource => "resource",
            Part::Template => "resource template",
        }
    }

    /// The kind of the item an entry name stands for.
    pub fn of(entry: &str) -> Part {
        Part::TAGGED.into_iter().find(|p| entry.starts_with(p.tag())).unwrap_or(Part::Tool)
    }
}

/// An item a backend lists, as the ledger takes it.
pub trait Item: Serialize + DeserializeOwned + Clone {
    const PART: Part;
    /// Its name, URI or URI template.
    fn key(&self) -> &str;
    /// Why what it says looks aimed at the model ([`crate::fence`]), if it does.
    fn flags(&self) -> Vec<&'static str> {
        let json = serde_json::to_value(self).unwrap_or_default();
        crate::fence::flags_in(&json).into_iter().map(|f| f.reason).collect()
    }
}

impl Item for Tool {
    const PART: Part = Part::Tool;
    fn key(&self) -> &str {
        &self.name
    }
}

impl Item for Prompt {
    const PART: Part = Part::Prompt;
    fn key(&self) -> &str {
        &self.name
    }
}

impl Item for Resource {
    const PART: Part = Part::Resource;
    fn key(&self) -> &str {
        &self.uri
    }
}

impl Item for ResourceTemplate {
    const PART: Part = Part::Template;
    fn key(&self) -> &str {
        &self.uri_template
    }
}

/// What one backend's items are known as.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendTools {
    /// The versions served, by [`Part::entry`] name.
    pub accepted: BTreeMap<String, Version>,
    /// Versions seen and not accepted (frozen only): a change, or an item added later.
    #[serde(default)]
    pub held: BTreeMap<String, Version>,
    /// What the server says of itself, as accepted, and a changed version held back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_server: Option<ServerText>,
}

/// A server's instructions and description, as one version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerText {
    pub digest: String,
    pub instructions: Option<String>,
    pub description: Option<String>,
    pub seen_ms: u64,
}

impl ServerText {
    pub fn of(instructions: Option<&str>, description: Option<&str>, now_ms: u64) -> Self {
        let json = serde_json::to_vec(&(instructions, description)).unwrap_or_default();
        Self {
            digest: base16ct::lower::encode_string(&Sha256::digest(&json)),
            instructions: instructions.map(str::to_string),
            description: description.map(str::to_string),
            seen_ms: now_ms,
        }
    }
}

/// The name a server's own text goes by in events and `tools accept --tool`.
pub const SERVER_TEXT: &str = "(server instructions)";

/// How listings are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rules {
    /// Changes and later tools are held back until accepted (`[health] freeze_tools`).
    pub frozen: bool,
    /// Frozen, a backend never seen before is accepted whole on its first listing
    /// (`[health] trust_first_listing`); otherwise it is held whole until accepted.
    pub trust_first: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    pub backends: BTreeMap<String, BackendTools>,
}

/// How a listing differed from what was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A known tool's definition changed (description, schema, annotations…).
    Changed,
    /// A tool appeared after its backend's first listing.
    Added,
    /// A tool of a backend's first listing: reported when held (frozen, first listings not
    /// trusted) or when it looks like another backend's tool.
    First,
}

/// One difference, for the log, `/status` and the metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub backend: String,
    pub tool: String,
    pub kind: Kind,
    /// Held back (frozen) rather than served.
    pub held: bool,
    /// Another backend's tool it looks like (same name once separators and case are ignored, or
    /// the same description), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub looks_like: Option<String>,
    /// Why its text looks aimed at the model ([`crate::fence`]): frozen, such a tool of a first
    /// listing is held even when first listings are trusted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<&'static str>,
    pub at_ms: u64,
}

/// A backend's listing, as the ledger takes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Listed<'a> {
    pub tools: &'a [Tool],
    pub prompts: &'a [Prompt],
    pub resources: &'a [Resource],
    pub templates: &'a [ResourceTemplate],
}

impl<'a> Listed<'a> {
    pub fn tools(tools: &'a [Tool]) -> Self {
        Self { tools, ..Self::default() }
    }

    fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.prompts.is_empty() && self.resources.is_empty() && self.templates.is_empty()
    }
}

/// What a backend lists besides its tools, as served.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parts {
    pub prompts: Vec<Prompt>,
    pub resources: Vec<Resource>,
    pub templates: Vec<ResourceTemplate>,
}

/// What to serve of a listing, and what was new in it.
#[derive(Debug, Default)]
pub struct Observed {
    pub served: Vec<Tool>,
    pub parts: Parts,
    pub events: Vec<Event>,
    /// The ledger changed (worth persisting).
    pub dirty: bool,
}

/// How one listing is taken: whether it is the backend's first, and whether that is held whole.
#[derive(Debug, Clone, Copy)]
struct Taking {
    first: bool,
    hold_first: bool,
    rules: Rules,
    now_ms: u64,
}

/// A name as two look-alikes share it: lower case, letters and digits only.
fn fold(name: &str) -> String {
    name.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
}

impl Ledger {
    /// Takes `backend`'s listing of tools alone (see [`Ledger::observe_all`]).
    pub fn observe(&mut self, backend: &str, tools: &[Tool], rules: Rules, now_ms: u64) -> Observed {
        self.observe_all(backend, Listed::tools(tools), rules, now_ms)
    }

    /// Takes `backend`'s listing. The first listing of a backend that lists anything is
    /// accepted whole, unless frozen without trust in first listings: then it is held whole.
    /// After that, a changed or new item is recorded and, `frozen`, held back: the accepted
    /// version of a changed item is served instead, and a new item not at all. An item the
    /// backend no longer lists is not served (it could not be used), and is kept in case it
    /// comes back.
    pub fn observe_all(&mut self, backend: &str, listed: Listed<'_>, rules: Rules, now_ms: u64) -> Observed {
        let first = !self.backends.contains_key(backend);
        let mut out = Observed::default();
        if first && listed.is_empty() {
            // Not listed yet (not connected, say): its first listing is the baseline.
            return out;
        }
        let how = Taking { first, hold_first: first && rules.frozen && !rules.trust_first, rules, now_ms };
        let mut known = self.backends.remove(backend).unwrap_or_default();
        out.served = self.take(&mut known, backend, listed.tools, how, &mut out);
        out.parts.prompts = self.take(&mut known, backend, listed.prompts, how, &mut out);
        out.parts.resources = self.take(&mut known, backend, listed.resources, how, &mut out);
        out.parts.templates = self.take(&mut known, backend, listed.templates, how, &mut out);
        self.backends.insert(backend.to_string(), known);
        out
    }

    /// Takes one kind of item of a listing into `known` (removed from `self` meanwhile), and
    /// returns what of it to serve; events and `dirty` go to `out`.
    fn take<T: Item>(
        &self,
        known: &mut BackendTools,
        backend: &str,
        items: &[T],
        how: Taking,
        out: &mut Observed,
    ) -> Vec<T> {
        let mut served = Vec::with_capacity(items.len());
        for item in items {
            let name = T::PART.entry(item.key());
            let seen = Version::of(item, how.now_ms);
            let event = |kind, held, looks_like, flags| Event {
                backend: backend.to_string(),
                tool: name.clone(),
                kind,
                held,
                looks_like,
                flags,
                at_ms: how.now_ms,
            };
            let looks_like = || (T::PART == Part::Tool).then(|| self.look_alike(backend, item.key(), &seen)).flatten();
            if how.first {
                out.dirty = true;
                let looks_like = looks_like();
                // Frozen, a first listing's flagged tool is not trusted with the rest.
                let flags = if how.rules.frozen { item.flags() } else { Vec::new() };
                let hold = how.hold_first || !flags.is_empty();
                if hold || looks_like.is_some() {
                    out.events.push(event(Kind::First, hold, looks_like, flags));
                }
                if hold {
                    known.held.insert(name, seen);
                } else {
                    known.accepted.insert(name, seen);
                    served.push(item.clone());
                }
                continue;
            }
            let accepted = known.accepted.get(&name);
            if accepted.is_some_and(|a| a.digest == seen.digest) {
                // As accepted (a held change the backend took back is dropped).
                out.dirty |= known.held.remove(&name).is_some();
                served.push(item.clone());
                continue;
            }
            let kind = if accepted.is_some() { Kind::Changed } else { Kind::Added };
            let already_held = known.held.get(&name).is_some_and(|h| h.digest == seen.digest);
            if !already_held {
                out.events.push(event(kind, how.rules.frozen, looks_like(), item.flags()));
            }
            if how.rules.frozen {
                if let Some(a) = accepted.and_then(|a| serde_json::from_value::<T>(a.item.clone()).ok()) {
                    served.push(a);
                }
                if !already_held {
                    out.dirty = true;
                    known.held.insert(name, seen);
                }
            } else {
                out.dirty = true;
                known.held.remove(&name);
                known.accepted.insert(name, seen);
                served.push(item.clone());
            }
        }
        served
    }

    /// Takes what `backend` says of itself (its instructions and description), as
    /// [`Ledger::observe`] takes its tools, after them: the first text is accepted with the
    /// backend's first listing; later, a change is recorded and, frozen, held back, the
    /// accepted text served instead. Returns the text to serve and the event, if any.
    pub fn observe_server(
        &mut self,
        backend: &str,
        instructions: Option<&str>,
        description: Option<&str>,
        rules: Rules,
        now_ms: u64,
    ) -> (Option<ServerText>, Option<Event>, bool) {
        let Some(known) = self.backends.get_mut(backend) else { return (None, None, false) };
        let seen = ServerText::of(instructions, description, now_ms);
        let Some(accepted) = known.server.clone() else {
            // With the first listing: accepted unless that listing is held whole.
            let held_whole = known.accepted.is_empty() && !known.held.is_empty();
            return match held_whole {
                true => {
                    known.held_server = Some(seen);
                    (None, None, true)
                }
                false => {
                    known.server = Some(seen.clone());
                    (Some(seen), None, true)
                }
            };
        };
        if accepted.digest == seen.digest {
            let dirty = known.held_server.take().is_some();
            return (Some(accepted), None, dirty);
        }
        let already_held = known.held_server.as_ref().is_some_and(|h| h.digest == seen.digest);
        let event = (!already_held).then(|| Event {
            backend: backend.to_string(),
            tool: SERVER_TEXT.to_string(),
            kind: Kind::Changed,
            held: rules.frozen,
            looks_like: None,
            flags: [instructions, description]
                .into_iter()
                .flatten()
                .flat_map(|t| crate::fence::check(t).1)
                .map(|f| f.reason)
                .collect(),
            at_ms: now_ms,
        });
        if rules.frozen {
            known.held_server = Some(seen);
            (Some(accepted), event, !already_held)
        } else {
            known.held_server = None;
            known.server = Some(seen.clone());
            (Some(seen), event, true)
        }
    }

    /// Another backend's accepted tool that the tool `name` (as `seen`) looks like, as
    /// `backend/tool`.
    fn look_alike(&self, backend: &str, name: &str, seen: &Version) -> Option<String> {
        let folded = fold(name);
        fn text(v: &Version) -> Option<&str> {
            v.item.get("description").and_then(Value::as_str).map(str::trim)
        }
        let description = text(seen).filter(|d| d.len() >= 20);
        self.backends.iter().filter(|(b, _)| b.as_str() != backend).find_map(|(b, known)| {
            known.accepted.iter().filter(|(entry, _)| Part::of(entry) == Part::Tool).find_map(|(tool, v)| {
                let same_name = fold(tool) == folded;
                let same_text = description.is_some() && text(v) == description;
                (same_name || same_text).then(|| format!("{b}/{tool}"))
            })
        })
    }

    /// Accepts held versions: all, one backend's, or one item (a [`Part::entry`] name) of one
    /// backend. Returns what was
    /// accepted, as (backend, tool).
    pub fn accept(&mut self, backend: Option<&str>, tool: Option<&str>) -> Vec<(String, String)> {
        let mut done = Vec::new();
        for (b, known) in self.backends.iter_mut().filter(|(b, _)| backend.is_none_or(|w| w == b.as_str())) {
            let names: Vec<String> =
                known.held.keys().filter(|t| tool.is_none_or(|w| w == t.as_str())).cloned().collect();
            for name in names {
                if let Some(v) = known.held.remove(&name) {
                    known.accepted.insert(name.clone(), v);
                    done.push((b.clone(), name));
                }
            }
            if tool.is_none_or(|w| w == SERVER_TEXT)
                && let Some(text) = known.held_server.take()
            {
                known.server = Some(text);
                done.push((b.clone(), SERVER_TEXT.to_string()));
            }
        }
        done
    }

    /// Everything held back, as (backend, tool, digest, first seen).
    pub fn held(&self) -> impl Iterator<Item = (&str, &str, &str, u64)> {
        self.backends.iter().flat_map(|(b, k)| {
            let tools = k.held.iter().map(move |(t, v)| (b.as_str(), t.as_str(), v.digest.as_str(), v.seen_ms));
            let server = k.held_server.iter().map(move |v| (b.as_str(), SERVER_TEXT, v.digest.as_str(), v.seen_ms));
            tools.chain(server)
        })
    }

    /// What a held version says to the model ([`crate::fence::flags_in`]); none when nothing
    /// of that name is held.
    pub fn held_flags(&self, backend: &str, tool: &str) -> Vec<crate::fence::Flag> {
        let Some(known) = self.backends.get(backend) else { return Vec::new() };
        if tool == SERVER_TEXT {
            let text = known
                .held_server
                .as_ref()
                .map(|t| serde_json::json!({"instructions": t.instructions, "description": t.description}));
            return text.map(|t| crate::fence::flags_in(&t)).unwrap_or_default();
        }
        known.held.get(tool).map(|v| crate::fence::flags_in(&v.item)).unwrap_or_default()
    }
}

/// A change to the replicas' shared copy of the ledger (`[sessions] store = "redis"`): one
/// entry per (backend, tool) in an accepted and a held map, as JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A first-seen version: kept only if no replica set one first (a baseline is never
    /// overwritten by another replica's).
    Baseline {
        field: String,
        json: String,
    },
    /// An accepted version that replaces the one before (a change served unfrozen, or one an
    /// operator accepted).
    Accept {
        field: String,
        json: String,
    },
    Hold {
        field: String,
        json: String,
    },
    Unhold {
        field: String,
    },
}

/// The shared maps' key for `tool` of `backend`.
pub fn field(backend: &str, tool: &str) -> String {
    format!("{backend}\u{1f}{tool}")
}

impl Ledger {
    /// The shared copy, from its two maps (entries that do not parse are skipped).
    pub fn from_fields(accepted: &[(String, String)], held: &[(String, String)]) -> Self {
        let mut out = Ledger::default();
        for (map, held) in [(accepted, false), (held, true)] {
            for (f, json) in map {
                let Some((backend, tool)) = f.split_once('\u{1f}') else { continue };
                let known = out.backends.entry(backend.to_string()).or_default();
                if tool == SERVER_TEXT {
                    let Ok(text) = serde_json::from_str::<ServerText>(json) else { continue };
                    *if held { &mut known.held_server } else { &mut known.server } = Some(text);
                } else if let Ok(v) = serde_json::from_str::<Version>(json) {
                    (if held { &mut known.held } else { &mut known.accepted }).insert(tool.to_string(), v);
                }
            }
        }
        out
    }

    /// Takes what the replicas share: their accepted versions win over this one's (a baseline
    /// another replica set first, a change an operator accepted), and what they hold is held
    /// here too unless it is accepted. Returns whether anything changed here.
    pub fn adopt(&mut self, shared: &Ledger) -> bool {
        let before = self.clone();
        for (backend, theirs) in &shared.backends {
            let mine = self.backends.entry(backend.clone()).or_default();
            for (tool, v) in &theirs.accepted {
                if mine.held.get(tool).is_some_and(|h| h.digest == v.digest) {
                    mine.held.remove(tool);
                }
                mine.accepted.insert(tool.clone(), v.clone());
            }
            for (tool, v) in &theirs.held {
                if mine.accepted.get(tool).is_none_or(|a| a.digest != v.digest) {
                    mine.held.entry(tool.clone()).or_insert_with(|| v.clone());
                }
            }
            if let Some(text) = &theirs.server {
                if mine.held_server.as_ref().is_some_and(|h| h.digest == text.digest) {
                    mine.held_server = None;
                }
                mine.server = Some(text.clone());
            }
            if mine.held_server.is_none()
                && let Some(text) =
                    theirs.held_server.as_ref().filter(|h| mine.server.as_ref().is_none_or(|s| s.digest != h.digest))
            {
                mine.held_server = Some(text.clone());
            }
        }
        *self != before
    }

    /// What the shared copy lacks of this one.
    pub fn writes_since(&self, shared: &Ledger) -> Vec<Write> {
        let mut out = Vec::new();
        let empty = BackendTools::default();
        for (backend, mine) in &self.backends {
            let theirs = shared.backends.get(backend).unwrap_or(&empty);
            for (tool, v) in &mine.accepted {
                let field = field(backend, tool);
                match theirs.accepted.get(tool) {
                    None => out.push(Write::Baseline { field, json: json(v) }),
                    Some(t) if t.digest != v.digest => out.push(Write::Accept { field, json: json(v) }),
                    Some(_) => {}
                }
            }
            for (tool, v) in &mine.held {
                if theirs.held.get(tool).is_none_or(|t| t.digest != v.digest) {
                    out.push(Write::Hold { field: field(backend, tool), json: json(v) });
                }
            }
            for tool in theirs.held.keys().filter(|t| !mine.held.contains_key(*t)) {
                out.push(Write::Unhold { field: field(backend, tool) });
            }
            let field = field(backend, SERVER_TEXT);
            match (&mine.server, &theirs.server) {
                (Some(v), None) => out.push(Write::Baseline { field: field.clone(), json: json(v) }),
                (Some(v), Some(t)) if t.digest != v.digest => {
                    out.push(Write::Accept { field: field.clone(), json: json(v) })
                }
                _ => {}
            }
            match (&mine.held_server, &theirs.held_server) {
                (Some(v), t) if t.as_ref().is_none_or(|t| t.digest != v.digest) => {
                    out.push(Write::Hold { field, json: json(v) })
                }
                (None, Some(_)) => out.push(Write::Unhold { field }),
                _ => {}
            }
        }
        out
    }
}

/// A version or a server text as the shared maps hold it.
fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("a ledger entry serialises")
}

#[cfg(test)]
mod tests;
