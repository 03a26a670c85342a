//! Groups (the progressive-disclosure working group's draft SEP, extension
//! `io.modelcontextprotocol/groups`): each backend whose tools a caller may use is a group.
//! For a client that declares the extension, `tools/list` keeps only the top-level tools
//! (`[groups] top_level`), `groups/list` names the caller's groups and `groups/get` hands out a
//! group's tools (and the backend's instructions). Groups follow the caller's scope: a backend
//! that is down or that the policy hides is no group of theirs, and `groups/get` answers for it
//! as for a name that does not exist. Scoping is discovery, not access: a tool is callable by
//! name whether or not its group was fetched, under the same policy as ever.

use globset::GlobSet;
use serde::Serialize;
use serde_json::{Value, json};

use super::Gateway;
use crate::catalog::CatalogTool;
use crate::config::GroupsConfig;
use crate::session::Snapshot;

pub const GROUPS_EXTENSION: &str = "io.modelcontextprotocol/groups";
pub const LIST: &str = "groups/list";

/// Whether a client's capabilities declare the groups extension.
pub fn declared(capabilities: &rmcp::model::ClientCapabilities) -> bool {
    capabilities.extensions.as_ref().is_some_and(|e| e.contains_key(GROUPS_EXTENSION))
}
pub const GET: &str = "groups/get";
pub const LIST_CHANGED: &str = "notifications/groups/list_changed";
/// Tool names given as examples in a group's made-up description.
const EXAMPLES: usize = 3;

/// `[groups]`, ready to apply.
pub struct Groups {
    top_level: Option<GlobSet>,
}

/// One group as `groups/list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub description: String,
    /// The backend it stands for.
    #[serde(skip)]
    pub backend: String,
}

/// A group name as the draft allows it: 1–64 characters, lower-case letters, digits and single
/// hyphens, none at either end.
pub fn group_name(backend: &str) -> String {
    let mut out = String::new();
    for c in backend.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut out: String = out.trim_end_matches('-').chars().take(64).collect();
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() { "backend".into() } else { out }
}

impl Groups {
    /// `None` when `[groups]` is off.
    pub fn new(cfg: &GroupsConfig) -> Option<Self> {
        if !cfg.enabled {
            return None;
        }
        let mut set = globset::GlobSetBuilder::new();
        for g in &cfg.top_level {
            if let Ok(g) = globset::Glob::new(g) {
                set.add(g);
            }
        }
        let top_level = (!cfg.top_level.is_empty()).then(|| set.build().ok()).flatten();
        Some(Self { top_level })
    }

    /// Whether the tool exposed as `name` stays in `tools/list` for a client of groups.
    pub fn is_top_level(&self, name: &str) -> bool {
        self.top_level.as_ref().is_some_and(|s| s.is_match(name))
    }

    /// The caller's scoped tools (not top level), by backend in catalog order.
    fn scoped<'a>(&self, snap: &'a Snapshot) -> Vec<(String, Vec<&'a CatalogTool>)> {
        let mut by_backend: Vec<(String, Vec<&CatalogTool>)> = Vec::new();
        for t in snap.tools().filter(|t| !self.is_top_level(t.name())) {
            match by_backend.iter_mut().find(|(b, _)| **b == *t.key.backend) {
                Some((_, tools)) => tools.push(t),
                None => by_backend.push((t.key.backend.to_string(), vec![t])),
            }
        }
        by_backend
    }

    /// The caller's groups: one per backend with scoped tools in `snap`. Names that two backends
    /// would share get a numbered suffix, in backend order.
    pub fn list(&self, snap: &Snapshot, gw: &Gateway) -> Vec<Group> {
        self.with_tools(snap, gw).into_iter().map(|(g, _)| g).collect()
    }

    /// [`Groups::list`], each group with its tools.
    fn with_tools<'a>(&self, snap: &'a Snapshot, gw: &Gateway) -> Vec<(Group, Vec<&'a CatalogTool>)> {
        let mut scoped = self.scoped(snap);
        scoped.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(Group, Vec<&CatalogTool>)> = Vec::new();
        for (backend, tools) in scoped {
            let base = group_name(&backend);
            let mut name = base.clone();
            let mut n = 2;
            while out.iter().any(|(g, _)| g.name == name) {
                let suffix = format!("-{n}");
                name = format!("{}{suffix}", &base[..base.len().min(64 - suffix.len())]);
                n += 1;
            }
            let title = gw.upstream.get(&backend).and_then(|b| b.listing().server.clone());
            let examples: Vec<&str> = tools.iter().take(EXAMPLES).map(|t| t.name()).collect();
            let made_up = format!(
                "{} tool{} of the {backend} backend, e.g. {}.",
                tools.len(),
                if tools.len() == 1 { "" } else { "s" },
                examples.join(", ")
            );
            // What the server says of itself, as the tool ledger lets it through.
            let description = match gw.integrity.server_text(&backend).1 {
                Some(about) => format!("{} ({made_up})", about.trim().trim_end_matches('.')),
                None => made_up,
            };
            out.push((Group { name, title, description, backend }, tools));
        }
        out
    }

    /// `groups/get` for `name`: the group's tools, whole, and its backend's instructions; `None`
    /// when the caller has no such group.
    pub fn get(&self, name: &str, snap: &Snapshot, gw: &Gateway) -> Option<Value> {
        let (group, tools) = self.with_tools(snap, gw).into_iter().find(|(g, _)| g.name == name)?;
        let tools: Vec<&rmcp::model::Tool> = tools.into_iter().map(|t| &t.tool).collect();
        let mut result = json!({"contents": {"tools": tools}});
        if let Some(instructions) = gw.integrity.server_text(&group.backend).0 {
            result["instructions"] = json!(instructions);
        }
        Some(result)
    }

    /// What a client of groups is shown in `groups/list`, as one number (a change is announced).
    pub fn listed(&self, snap: &Snapshot, gw: &Gateway) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for g in self.list(snap, gw) {
            (g.name, g.title, g.description).hash(&mut h);
        }
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_follow_the_draft() {
        assert_eq!(group_name("github"), "github");
        assert_eq!(group_name("My_Backend.v2"), "my-backend-v2");
        assert_eq!(group_name("--a__b--"), "a-b");
        assert_eq!(group_name("___"), "backend");
        let long = group_name(&"x".repeat(100));
        assert_eq!(long.len(), 64);
    }
}
