//! Scrubbing what a backend answers: the gateway's settings per backend, the walk over a
//! result's texts, and the count of what was replaced.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, GetPromptResult, ReadResourceResult, ResourceContents};
use serde::Serialize;
use serde_json::Value;

use super::Scrubber;
use crate::config::ScrubConfig;

/// The labels of `toolmux_redactions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Redaction {
    pub backend: String,
    pub rule: String,
}

/// Secrets replaced, by backend and rule, for `/metrics` (the family, registered there) and the
/// console ([`Redactions::rows`]).
#[derive(Default)]
pub struct Redactions {
    family: Family<Redaction, Counter>,
    counts: Mutex<BTreeMap<(String, String), u64>>,
}

/// One backend's secrets replaced by one rule.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub backend: String,
    pub rule: String,
    pub count: u64,
}

impl Redactions {
    pub fn new(family: Family<Redaction, Counter>) -> Self {
        Self { family, counts: Mutex::default() }
    }

    /// Counts `rules` (one per secret replaced); returns how many.
    fn add(&self, backend: &str, rules: Vec<String>) -> usize {
        if rules.is_empty() {
            return 0;
        }
        let n = rules.len();
        let mut counts = self.counts.lock().expect("redactions lock");
        for rule in rules {
            self.family.get_or_create(&Redaction { backend: backend.to_string(), rule: rule.clone() }).inc();
            *counts.entry((backend.to_string(), rule)).or_default() += 1;
        }
        n
    }

    /// What was replaced so far, by backend and rule.
    pub fn rows(&self) -> Vec<Row> {
        let counts = self.counts.lock().expect("redactions lock");
        counts
            .iter()
            .map(|((backend, rule), &count)| Row { backend: backend.clone(), rule: rule.clone(), count })
            .collect()
    }
}

/// Which rules each backend's answers go through (`[results] scrub`, and `scrub` and
/// `scrub_rules` per backend), put in force at start and by reloads.
pub struct Scrubbing {
    by_backend: ArcSwap<Settings>,
    pub redactions: Redactions,
}

#[derive(Default)]
struct Settings {
    /// Backends not named in `exceptions`: the built-in rules, or none.
    default: Option<Arc<Scrubber>>,
    /// Backends with their own setting: off (`None`), or the built-in rules and theirs.
    exceptions: HashMap<String, Option<Arc<Scrubber>>>,
}

impl Default for Scrubbing {
    fn default() -> Self {
        Self::new(&ScrubConfig::default(), Family::default())
    }
}

impl Scrubbing {
    pub fn new(config: &ScrubConfig, counted: Family<Redaction, Counter>) -> Self {
        let me = Self { by_backend: ArcSwap::from_pointee(Settings::default()), redactions: Redactions::new(counted) };
        me.set(config);
        me
    }

    /// Puts `config` in force (rules of a backend's own are compiled here: they were checked when
    /// the configuration was read).
    pub fn set(&self, config: &ScrubConfig) {
        let default = config.on.then(Scrubber::built_in);
        let mut exceptions = HashMap::new();
        for (backend, b) in &config.backends {
            let scrubber = match (b.on.unwrap_or(config.on), b.rules.is_empty()) {
                (false, _) => None,
                (true, true) => Some(Scrubber::built_in()),
                (true, false) => match Scrubber::with_extra(&b.rules) {
                    Ok(s) => Some(Arc::new(s)),
                    Err(e) => {
                        tracing::error!(backend, error = %e, "scrub_rules: kept to the built-in rules");
                        Some(Scrubber::built_in())
                    }
                },
            };
            exceptions.insert(backend.clone(), scrubber);
        }
        self.by_backend.store(Arc::new(Settings { default, exceptions }));
    }

    fn scrubber(&self, backend: &str) -> Option<Arc<Scrubber>> {
        let settings = self.by_backend.load();
        match settings.exceptions.get(backend) {
            Some(s) => s.clone(),
            None => settings.default.clone(),
        }
    }

    /// Whether `backend`'s answers are scrubbed at all.
    pub fn is_on(&self, backend: &str) -> bool {
        self.scrubber(backend).is_some()
    }

    /// A tool result from `backend`: its texts, embedded text resources and structured content.
    /// Images, audio and blobs are left as they are. Each of these returns how many secrets it
    /// replaced.
    pub fn result(&self, backend: &str, r: &mut CallToolResult) -> usize {
        let Some(s) = self.scrubber(backend) else { return 0 };
        let mut hits = Vec::new();
        for block in &mut r.content {
            content(&s, block, &mut hits);
        }
        if let Some(v) = &mut r.structured_content {
            json(&s, v, &mut hits);
        }
        self.redactions.add(backend, hits)
    }

    /// A resource read from `backend`: its text contents.
    pub fn read(&self, backend: &str, r: &mut ReadResourceResult) -> usize {
        let Some(s) = self.scrubber(backend) else { return 0 };
        let mut hits = Vec::new();
        for c in &mut r.contents {
            resource(&s, c, &mut hits);
        }
        self.redactions.add(backend, hits)
    }

    /// A prompt from `backend`: its description and its messages' texts.
    pub fn prompt(&self, backend: &str, r: &mut GetPromptResult) -> usize {
        let Some(s) = self.scrubber(backend) else { return 0 };
        let mut hits = Vec::new();
        if let Some(d) = &mut r.description {
            text(&s, d, &mut hits);
        }
        for m in &mut r.messages {
            content(&s, &mut m.content, &mut hits);
        }
        self.redactions.add(backend, hits)
    }

    /// A JSON-RPC error from `backend`: its message and the strings in its data.
    pub fn error(&self, backend: &str, e: &mut ErrorData) -> usize {
        let Some(s) = self.scrubber(backend) else { return 0 };
        let mut hits = Vec::new();
        let (scrubbed, found) = s.scrub(&e.message);
        if !found.is_empty() {
            e.message = scrubbed.into_owned().into();
            hits.extend(found);
        }
        if let Some(v) = &mut e.data {
            json(&s, v, &mut hits);
        }
        self.redactions.add(backend, hits)
    }

    /// One text from `backend` (a progress message).
    pub fn text(&self, backend: &str, t: &mut String) -> usize {
        let Some(s) = self.scrubber(backend) else { return 0 };
        let mut hits = Vec::new();
        text(&s, t, &mut hits);
        self.redactions.add(backend, hits)
    }

    /// Any JSON from `backend` (a task's result or error, as `tasks/get` relays it): every string.
    pub fn value(&self, backend: &str, v: &mut Value) -> usize {
        let Some(s) = self.scrubber(backend) else { return 0 };
        let mut hits = Vec::new();
        json(&s, v, &mut hits);
        self.redactions.add(backend, hits)
    }
}

fn text(s: &Scrubber, t: &mut String, hits: &mut Vec<String>) {
    let (scrubbed, found) = s.scrub(t);
    if !found.is_empty() {
        *t = scrubbed.into_owned();
        hits.extend(found);
    }
}

fn content(s: &Scrubber, block: &mut ContentBlock, hits: &mut Vec<String>) {
    match block {
        ContentBlock::Text(t) => text(s, &mut t.text, hits),
        ContentBlock::Resource(r) => resource(s, &mut r.resource, hits),
        ContentBlock::ResourceLink(l) => text(s, &mut l.uri, hits),
        // Images and audio are data, not text; a kind added later is left as it is.
        _ => {}
    }
}

fn resource(s: &Scrubber, c: &mut ResourceContents, hits: &mut Vec<String>) {
    match c {
        ResourceContents::TextResourceContents { text: t, uri, .. } => {
            text(s, t, hits);
            text(s, uri, hits);
        }
        ResourceContents::BlobResourceContents { uri, .. } => text(s, uri, hits),
        _ => {}
    }
}

/// Every string value in `v` (keys are names, not secrets).
fn json(s: &Scrubber, v: &mut Value, hits: &mut Vec<String>) {
    match v {
        Value::String(t) => text(s, t, hits),
        Value::Array(items) => items.iter_mut().for_each(|i| json(s, i, hits)),
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                // A value named as a secret is one, whatever it looks like.
                if let Value::String(t) = value
                    && secret_name(key)
                    && t.chars().count() >= 4
                    && !t.starts_with("[redacted: ")
                {
                    *t = super::marker("secret-field");
                    hits.push("secret-field".to_string());
                    continue;
                }
                json(s, value, hits);
            }
        }
        _ => {}
    }
}

/// Whether a JSON key names a secret: `password`, `client_secret`, `apiKey`, `access_token`…
/// (not `max_tokens`, `token_count` or `secret_name`: the word must end the key).
fn secret_name(key: &str) -> bool {
    let k: String = key.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    const ENDINGS: [&str; 11] = [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "apikey",
        "accesstoken",
        "refreshtoken",
        "authtoken",
        "privatekey",
        "secretkey",
        "accesskey",
    ];
    ENDINGS.iter().any(|e| k.ends_with(e)) || k == "token" || k == "pwd"
}
