//! A session as one Redis hash holds it: its fields, and the changes written to them.

use std::collections::{BTreeMap, HashMap};

use rmcp::model::InitializeRequestParams;

/// A session as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub principal: String,
    /// The client's `initialize` parameters: a rebuilt session replays its handshake from them.
    pub client: InitializeRequestParams,
    /// The client's `logging/setLevel`, as its JSON name (`"info"`).
    pub level: Option<String>,
    pub subscriptions: Vec<String>,
    /// Backends the session had a backend session of its own with: the session, sealed (see
    /// [`SharedSessions::seal`]), or `-` when no `sessions.secret` is set.
    pub upstreams: BTreeMap<String, String>,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub seen_ms: u64,
    /// Bumped by every write (see the module's doc).
    pub version: u64,
}

pub(super) const PRINCIPAL: &str = "principal";
pub(super) const CLIENT: &str = "client";
pub(super) const REVISION: &str = "revision";
pub(super) const LEVEL: &str = "level";
pub(super) const CREATED: &str = "created";
pub(super) const SEEN: &str = "seen";
pub(super) const VERSION: &str = "version";
pub(super) const SUB: &str = "sub:";
pub(super) const UPSTREAM: &str = "upstream:";

pub(super) type Fields = BTreeMap<String, String>;

impl Record {
    pub(super) fn from_fields(fields: &HashMap<String, String>) -> Result<Self, String> {
        let principal = fields.get(PRINCIPAL).ok_or("no principal")?.clone();
        let client = serde_json::from_str(fields.get(CLIENT).ok_or("no client parameters")?)
            .map_err(|e| format!("client parameters: {e}"))?;
        let with = |prefix: &str| {
            let mut v: Vec<String> = fields.keys().filter_map(|k| k.strip_prefix(prefix)).map(str::to_owned).collect();
            v.sort();
            v
        };
        let number = |k: &str| fields.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(Self {
            principal,
            client,
            level: fields.get(LEVEL).cloned(),
            subscriptions: with(SUB),
            upstreams: fields
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(UPSTREAM)?.to_string(), v.clone())))
                .collect(),
            created_ms: number(CREATED),
            seen_ms: number(SEEN),
            version: number(VERSION),
        })
    }
}

/// A change to one session's fields.
#[derive(Debug, Clone)]
pub enum Change {
    Level(String),
    Subscribed(String),
    Unsubscribed(String),
    /// A backend session of its own opened to a backend: (backend, sealed session or `-`).
    Upstream(String, String),
}

impl Change {
    pub(super) fn apply(&self, fields: &mut Fields) -> (Option<(String, String)>, Option<String>) {
        let (set, del) = match self {
            Change::Level(l) => (Some((LEVEL.to_string(), l.clone())), None),
            Change::Subscribed(uri) => (Some((format!("{SUB}{uri}"), "1".into())), None),
            Change::Unsubscribed(uri) => (None, Some(format!("{SUB}{uri}"))),
            Change::Upstream(backend, sealed) => (Some((format!("{UPSTREAM}{backend}"), sealed.clone())), None),
        };
        if let Some((k, v)) = &set {
            fields.insert(k.clone(), v.clone());
        }
        if let Some(k) = &del {
            fields.remove(k);
        }
        (set, del)
    }
}
