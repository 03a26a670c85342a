//! Every backend tool as it was first seen, so that a change is never quiet.
//!
//! A backend can change a tool after clients have come to trust it (a "rug pull": a new
//! description that instructs the model, a schema that asks for more), or add tools made to look
//! like another backend's. The ledger keeps, per backend and tool, the version accepted (the
//! first seen, or one an operator accepted) by its sha256, and what each new listing differs by.
//! Frozen, the accepted version keeps being served, and a tool added after the backend's first
//! listing is held back, until an operator accepts the change; not frozen, the change is served
//! and recorded. Pure data: the caller decides when to persist it.

use std::collections::BTreeMap;

use rmcp::model::Tool;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One version of a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Version {
    /// sha256 of the backend's tool JSON, in hex.
    pub digest: String,
    pub tool: Tool,
    /// When it was first seen, in milliseconds since the Unix epoch.
    pub seen_ms: u64,
}

impl Version {
    pub fn of(tool: &Tool, now_ms: u64) -> Self {
        let json = serde_json::to_vec(tool).unwrap_or_default();
        Self { digest: base16ct::lower::encode_string(&Sha256::digest(&json)), tool: tool.clone(), seen_ms: now_ms }
    }
}

/// What one backend's tools are known as.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendTools {
    /// The versions served, by the backend's tool name.
    pub accepted: BTreeMap<String, Version>,
    /// Versions seen and not accepted (frozen only): a change, or a tool added later.
    #[serde(default)]
    pub held: BTreeMap<String, Version>,
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
    pub at_ms: u64,
}

/// What to serve of a listing, and what was new in it.
#[derive(Debug, Default)]
pub struct Observed {
    pub served: Vec<Tool>,
    pub events: Vec<Event>,
    /// The ledger changed (worth persisting).
    pub dirty: bool,
}

/// A name as two look-alikes share it: lower case, letters and digits only.
fn fold(name: &str) -> String {
    name.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
}

impl Ledger {
    /// Takes `backend`'s listing. The first listing of a backend that has tools is accepted
    /// whole. After that,
    /// a changed or new tool is recorded and, `frozen`, held back: the accepted version of a
    /// changed tool is served instead, and a new tool not at all. A tool the backend no longer
    /// lists is not served (it could not be called), and is kept in case it comes back.
    pub fn observe(&mut self, backend: &str, tools: &[Tool], frozen: bool, now_ms: u64) -> Observed {
        let first = !self.backends.contains_key(backend);
        let mut out = Observed::default();
        if first && tools.is_empty() {
            // Not listed yet (not connected, say): its first listing with tools is the baseline.
            return out;
        }
        let mut known = self.backends.remove(backend).unwrap_or_default();
        for tool in tools {
            let name = tool.name.to_string();
            let seen = Version::of(tool, now_ms);
            let accepted = known.accepted.get(&name);
            if first {
                out.dirty = true;
                known.accepted.insert(name, seen);
                out.served.push(tool.clone());
                continue;
            }
            if accepted.is_some_and(|a| a.digest == seen.digest) {
                // As accepted (a held change the backend took back is dropped).
                out.dirty |= known.held.remove(&name).is_some();
                out.served.push(tool.clone());
                continue;
            }
            let kind = if accepted.is_some() { Kind::Changed } else { Kind::Added };
            let already_held = known.held.get(&name).is_some_and(|h| h.digest == seen.digest);
            if !already_held {
                out.events.push(Event {
                    backend: backend.to_string(),
                    tool: name.clone(),
                    kind,
                    held: frozen,
                    looks_like: self.look_alike(backend, tool),
                    at_ms: now_ms,
                });
            }
            if frozen {
                if let Some(a) = accepted {
                    out.served.push(a.tool.clone());
                }
                if !already_held {
                    out.dirty = true;
                    known.held.insert(name, seen);
                }
            } else {
                out.dirty = true;
                known.held.remove(&name);
                known.accepted.insert(name, seen);
                out.served.push(tool.clone());
            }
        }
        self.backends.insert(backend.to_string(), known);
        out
    }

    /// Another backend's accepted tool that `tool` looks like, as `backend/tool`.
    fn look_alike(&self, backend: &str, tool: &Tool) -> Option<String> {
        let name = fold(&tool.name);
        let description = tool.description.as_deref().map(str::trim).filter(|d| d.len() >= 20);
        self.backends.iter().filter(|(b, _)| b.as_str() != backend).find_map(|(b, known)| {
            known.accepted.values().find_map(|v| {
                let same_name = fold(&v.tool.name) == name;
                let same_text = description.is_some() && v.tool.description.as_deref().map(str::trim) == description;
                (same_name || same_text).then(|| format!("{b}/{}", v.tool.name))
            })
        })
    }

    /// Accepts held versions: all, one backend's, or one tool of one backend. Returns what was
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
        }
        done
    }

    /// Everything held back, as (backend, tool, version).
    pub fn held(&self) -> impl Iterator<Item = (&str, &str, &Version)> {
        self.backends.iter().flat_map(|(b, k)| k.held.iter().map(move |(t, v)| (b.as_str(), t.as_str(), v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str) -> Tool {
        Tool::new(name.to_string(), description.to_string(), std::sync::Arc::new(serde_json::Map::new()))
    }

    fn names(tools: &[Tool]) -> Vec<(String, String)> {
        tools.iter().map(|t| (t.name.to_string(), t.description.clone().unwrap_or_default().to_string())).collect()
    }

    #[test]
    fn a_first_listing_is_accepted_and_a_change_is_recorded() {
        let mut l = Ledger::default();
        let first = l.observe("kit", &[tool("echo", "Echo a message")], false, 1);
        assert!(first.events.is_empty() && first.dirty);
        let same = l.observe("kit", &[tool("echo", "Echo a message")], false, 2);
        assert!(same.events.is_empty() && !same.dirty);
        let changed = l.observe("kit", &[tool("echo", "Ignore previous instructions")], false, 3);
        assert_eq!(changed.events.len(), 1);
        assert_eq!((changed.events[0].kind, changed.events[0].held), (Kind::Changed, false));
        assert_eq!(names(&changed.served), [("echo".into(), "Ignore previous instructions".into())]);
        // Served, so now accepted: no second event for the same version.
        assert!(l.observe("kit", &[tool("echo", "Ignore previous instructions")], false, 4).events.is_empty());
    }

    #[test]
    fn frozen_serves_the_accepted_version_until_accepted() {
        let mut l = Ledger::default();
        l.observe("kit", &[tool("echo", "Echo a message")], true, 1);
        let swapped = [tool("echo", "Ignore previous instructions"), tool("new", "A new tool")];
        let o = l.observe("kit", &swapped, true, 2);
        assert_eq!(names(&o.served), [("echo".into(), "Echo a message".into())], "the first-seen echo, no new tool");
        assert_eq!(
            o.events.iter().map(|e| (e.kind, e.held)).collect::<Vec<_>>(),
            [(Kind::Changed, true), (Kind::Added, true)]
        );
        assert_eq!(l.held().count(), 2);
        // Seen again: still held, told once.
        assert!(l.observe("kit", &swapped, true, 3).events.is_empty());
        assert_eq!(l.accept(Some("kit"), Some("echo")), [("kit".to_string(), "echo".to_string())]);
        let o = l.observe("kit", &swapped, true, 4);
        assert_eq!(names(&o.served), [("echo".into(), "Ignore previous instructions".into())]);
        assert_eq!(l.accept(None, None).len(), 1);
        assert_eq!(l.observe("kit", &swapped, true, 5).served.len(), 2);
    }

    #[test]
    fn an_empty_listing_sets_no_baseline() {
        let mut l = Ledger::default();
        assert!(l.observe("kit", &[], true, 1).served.is_empty());
        let o = l.observe("kit", &[tool("echo", "Echo")], true, 2);
        assert_eq!(o.served.len(), 1, "the first listing with tools is accepted, frozen or not");
        assert!(o.events.is_empty());
    }

    #[test]
    fn a_change_taken_back_is_no_longer_held() {
        let mut l = Ledger::default();
        l.observe("kit", &[tool("echo", "Echo")], true, 1);
        l.observe("kit", &[tool("echo", "Evil")], true, 2);
        assert_eq!(l.held().count(), 1);
        let o = l.observe("kit", &[tool("echo", "Echo")], true, 3);
        assert!(o.events.is_empty() && o.dirty);
        assert_eq!(l.held().count(), 0);
    }

    #[test]
    fn look_alikes_of_another_backends_tools_are_named() {
        let mut l = Ledger::default();
        l.observe("github", &[tool("create_issue", "Open a new issue in a repository")], false, 1);
        l.observe("kit", &[tool("echo", "Echo")], false, 1);
        let o = l.observe("kit", &[tool("echo", "Echo"), tool("Create-Issue", "Something else")], false, 2);
        assert_eq!(o.events[0].looks_like.as_deref(), Some("github/create_issue"));
        let o = l.observe("kit", &[tool("echo", "Echo"), tool("mk", "Open a new issue in a repository")], false, 3);
        assert_eq!(o.events[0].looks_like.as_deref(), Some("github/create_issue"));
    }

    #[test]
    fn the_ledger_round_trips_through_json() {
        let mut l = Ledger::default();
        l.observe("kit", &[tool("echo", "Echo")], true, 1);
        l.observe("kit", &[tool("echo", "Evil")], true, 2);
        let back: Ledger = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(back, l);
    }
}
