//! `[aggregation]`: how backend tools are named and filtered. Plain settings, applied by
//! [`crate::catalog`].

use std::collections::BTreeMap;

/// How clashing tool names from different backends are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictResolution {
    /// Every tool becomes `<prefix_format with {backend}><name>`.
    Prefix,
    /// Bare names; the backend listed first wins a clash.
    Priority,
    /// Bare names; every clash must be settled by an override.
    Manual,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Aggregation {
    pub conflict_resolution: ConflictResolution,
    pub prefix_format: String,
    /// Filter and overrides, by backend name.
    pub per_backend: BTreeMap<String, BackendTools>,
}

impl Default for Aggregation {
    fn default() -> Self {
        Self {
            conflict_resolution: ConflictResolution::Prefix,
            prefix_format: "{backend}_".into(),
            per_backend: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendTools {
    /// Only these original tool names are kept, when given.
    pub filter: Option<Vec<String>>,
    /// By original tool name.
    pub overrides: BTreeMap<String, Override>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Override {
    pub name: Option<String>,
    pub description: Option<String>,
}
