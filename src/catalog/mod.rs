//! What a tool is to the gateway: its stable key (backend, original name), the name it is exposed
//! under, the text that search embeds, and its token weight. Naming and conflict resolution live
//! here too. Pure functions over data: no async, no I/O.

pub mod apps;
pub mod ledger;
pub mod text;

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::Tool;
use serde_json::Value;

// The naming settings are configuration; the catalog applies them.
pub use crate::config::{Aggregation, BackendTools, ConflictResolution, Override};

/// Stable identity of a backend tool, the same across catalog generations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolKey {
    pub backend: Arc<str>,
    /// The tool's name as the backend knows it.
    pub tool: Arc<str>,
}

/// One tool as the gateway exposes it.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogTool {
    pub key: ToolKey,
    /// The backend's tool object with the exposed name and description; everything else untouched.
    pub tool: Tool,
    /// Token weight: the byte length of the tool's JSON / 4.
    pub tokens: u64,
    /// The text that search indexes (see [`text::search_text`]).
    pub text: String,
    /// sha256 of the exposed tool's JSON: two tools with one digest look the same to a client.
    pub digest: [u8; 32],
    /// Why its description looks aimed at the model ([`crate::fence`]); served with a warning.
    pub flags: Vec<crate::fence::Flag>,
}

impl CatalogTool {
    pub fn name(&self) -> &str {
        &self.tool.name
    }
}

/// A clash that `manual` resolution needs an override for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tool name `{name}` is exposed by both `{first}` and `{second}`; with conflict_resolution = \"manual\" give one of them an override in [[aggregation.tools]]"
)]
pub struct Clash {
    pub name: String,
    pub first: String,
    pub second: String,
}

/// One backend's tools, in configuration order.
pub struct Listing<'a> {
    pub backend: &'a str,
    pub tools: &'a [Tool],
    /// The backend's label for search text ([`text::server_label`] of its `serverInfo`).
    pub server: Option<&'a str>,
}

/// The resolved, name-sorted set of exposed tools.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    tools: Vec<CatalogTool>,
    by_name: HashMap<String, usize>,
}

impl Catalog {
    /// Applies filters and overrides, then resolves names. Clashes that `manual` cannot settle
    /// are returned beside the catalog (the first backend's tool is kept, so the gateway can run).
    pub fn resolve(listings: &[Listing<'_>], agg: &Aggregation) -> (Catalog, Vec<Clash>) {
        let mut tools: Vec<CatalogTool> = Vec::new();
        let mut owner: HashMap<String, (usize, Arc<str>)> = HashMap::new();
        let mut clashes = Vec::new();
        for listing in listings {
            let backend: Arc<str> = Arc::from(listing.backend);
            let rules = agg.per_backend.get(listing.backend);
            for tool in listing.tools {
                let original = tool.name.to_string();
                if let Some(filter) = rules.and_then(|r| r.filter.as_ref())
                    && !filter.contains(&original)
                {
                    continue;
                }
                let ov = rules.and_then(|r| r.overrides.get(&original));
                let base = ov.and_then(|o| o.name.clone()).unwrap_or_else(|| original.clone());
                let exposed = match agg.conflict_resolution {
                    ConflictResolution::Prefix => {
                        format!("{}{base}", agg.prefix_format.replace("{backend}", listing.backend))
                    }
                    ConflictResolution::Priority | ConflictResolution::Manual => base,
                };
                if let Some((_, first)) = owner.get(&exposed) {
                    if agg.conflict_resolution != ConflictResolution::Priority || **first == *backend {
                        clashes.push(Clash {
                            name: exposed.clone(),
                            first: format!("{first}/{exposed}"),
                            second: format!("{backend}/{original}"),
                        });
                    }
                    continue;
                }
                let mut exposed_tool = tool.clone();
                exposed_tool.name = exposed.clone().into();
                apps::rewrite(&mut exposed_tool, listing.backend);
                let overridden = ov.and_then(|o| o.description.clone());
                // An operator's own description is trusted; the backend's is checked.
                let flags = if overridden.is_none() { fenced(&mut exposed_tool) } else { Vec::new() };
                if let Some(d) = overridden {
                    exposed_tool.description = Some(d.into());
                }
                owner.insert(exposed.clone(), (tools.len(), backend.clone()));
                let mut t = CatalogTool::new(
                    ToolKey { backend: backend.clone(), tool: Arc::from(original.as_str()) },
                    exposed_tool,
                    listing.server,
                );
                t.flags = flags;
                tools.push(t);
            }
        }
        other_backends_named(&mut tools);
        for t in &mut tools {
            let flags = std::mem::take(&mut t.flags);
            t.flag(flags);
        }
        (Catalog::from_tools(tools), clashes)
    }

    /// Builds a catalog from already-named tools (sorted here; names must be unique).
    pub fn from_tools(mut tools: Vec<CatalogTool>) -> Catalog {
        tools.sort_by(|a, b| a.tool.name.cmp(&b.tool.name));
        let by_name = tools.iter().enumerate().map(|(i, t)| (t.tool.name.to_string(), i)).collect();
        Catalog { tools, by_name }
    }

    pub fn tools(&self) -> &[CatalogTool] {
        &self.tools
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Position of an exposed name in [`Self::tools`].
    pub fn position(&self, exposed: &str) -> Option<usize> {
        self.by_name.get(exposed).copied()
    }
}

impl CatalogTool {
    /// `server` is the label of the server offering the tool ([`text::server_label`]), if any.
    pub fn new(key: ToolKey, tool: Tool, server: Option<&str>) -> Self {
        use sha2::Digest;
        let json = serde_json::to_vec(&tool).unwrap_or_default();
        let tokens = json.len() as u64 / 4;
        let digest = sha2::Sha256::digest(&json).into();
        let text = text::search_text(&tool, server);
        Self { key, tool, tokens, text, digest, flags: Vec::new() }
    }

    /// Marks the tool flagged: its served description starts with the warning (search text,
    /// built from the description as the backend wrote it, is left as it was).
    pub fn flag(&mut self, flags: Vec<crate::fence::Flag>) {
        use sha2::Digest;
        if flags.is_empty() {
            return;
        }
        let description = self.tool.description.as_deref().unwrap_or_default();
        self.tool.description = Some(format!("{} {description}", crate::fence::warning(&flags)).into());
        let json = serde_json::to_vec(&self.tool).unwrap_or_default();
        (self.tokens, self.digest) = (json.len() as u64 / 4, sha2::Sha256::digest(&json).into());
        self.flags = flags;
    }
}

/// Flags a description that names another backend's tool by its exposed name (a tool telling
/// the model how to use, or not use, another server's tools: "shadowing"). Names shorter than
/// [`MIN_NAMED`] or without an underscore are too common to tell. One automaton of every name,
/// one pass over each description: a catalog of 10,000 tools costs 10,000 scans, not 10,000².
fn other_backends_named(tools: &mut [CatalogTool]) {
    const MIN_NAMED: usize = 8;
    let named: Vec<(String, Arc<str>)> = tools
        .iter()
        .filter(|t| t.tool.name.len() >= MIN_NAMED && t.tool.name.contains('_'))
        .map(|t| (t.tool.name.to_string(), t.key.backend.clone()))
        .collect();
    let Ok(names) = aho_corasick::AhoCorasick::new(named.iter().map(|(n, _)| n)) else { return };
    if named.is_empty() {
        return;
    }
    for t in tools.iter_mut() {
        let Some(d) = t.tool.description.as_deref() else { continue };
        let other =
            names.find_overlapping_iter(d).map(|m| &named[m.pattern().as_usize()]).find(|(_, b)| *b != t.key.backend);
        if let Some((name, _)) = other {
            t.flags.push(crate::fence::Flag { reason: "other-backend", matched: format!("names {name}") });
        }
    }
}

/// Strips what no reader sees from a tool's description and its parameters' descriptions, and
/// returns the flags of what it says (see [`crate::fence`]).
fn fenced(tool: &mut Tool) -> Vec<crate::fence::Flag> {
    let mut flags = Vec::new();
    if let Some(d) = tool.description.as_deref() {
        let (clean, found) = crate::fence::check(d);
        flags.extend(found);
        tool.description = Some(clean.into());
    }
    let mut schema = (*tool.input_schema).clone();
    let mut changed = false;
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        for (name, p) in props.iter_mut() {
            if let Some(Value::String(d)) = p.get_mut("description") {
                let (clean, found) = crate::fence::check(d);
                flags.extend(found.into_iter().map(|mut f| {
                    f.matched = format!("parameter {name}: {}", f.matched);
                    f
                }));
                changed |= clean != *d;
                *d = clean;
            }
        }
    }
    if changed {
        tool.input_schema = Arc::new(schema);
    }
    flags
}

/// The reference gateway's token estimate: bytes of the tool's JSON / 4.
pub fn token_weight(tool: &Tool) -> u64 {
    tokens_of(tool)
}

/// The same estimate for anything sent to a client (a tool call's result, say).
pub fn tokens_of<T: serde::Serialize>(value: &T) -> u64 {
    serde_json::to_vec(value).map(|v| v.len() as u64 / 4).unwrap_or(0)
}

/// The input schema's properties as (name, description) pairs, in schema order.
pub fn schema_properties(tool: &Tool) -> Vec<(String, String)> {
    let Some(Value::Object(props)) = tool.input_schema.get("properties") else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, p)| {
            let desc = p.get("description").and_then(Value::as_str).unwrap_or_default().to_string();
            (name.clone(), desc)
        })
        .collect()
}

#[cfg(test)]
mod tests;
