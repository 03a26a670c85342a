//! What find_tool learns from use. A call that follows a find_tool in the same session, of a
//! tool that find_tool returned, is a label: that request found that tool. Each label moves the
//! tool's learned vector (the mean of the request vectors that led to it) and, once a tool has
//! [`MIN_LABELS`] of them and the whole store [`MIN_TOTAL`], fused search adds
//! `weight * confidence * cos(request, learned vector)` to the tool's score (see
//! docs/search.md for how the weight was chosen).
//!
//! Caller-free: a label is a request vector and a tool key, never the request's text or who
//! asked. It only re-ranks tools a search already found in the caller's scope, so it cannot show
//! a caller a tool outside it. Bounded: [`MAX_TOOLS`] tools, each one vector whose weight stops
//! growing at [`MAX_WEIGHT`] labels (older labels fade), and the gateway takes at most
//! [`PER_SESSION`] labels from one session, one per tool.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::catalog::ToolKey;

/// Labels a tool needs before its learned vector counts: two, so that no one session (which
/// gives at most one label per tool) can make a tool's learned vector count alone.
pub const MIN_LABELS: u32 = 2;
/// Labels the store needs before any learned vector counts ("off until it has enough data").
pub const MIN_TOTAL: u64 = 20;
/// Tools with a learned vector, at most; labels for others are not kept.
pub const MAX_TOOLS: usize = 4096;
/// A learned vector is the mean of at most this many labels' worth: later labels replace a
/// share of the older ones rather than adding weight.
pub const MAX_WEIGHT: u32 = 64;
/// Labels taken from one client session, at most (one per tool).
pub const PER_SESSION: usize = 16;
/// The bonus's weight, in units of the fused score (a z-score mean): chosen with
/// `toolmux eval-learning` as the setting whose smaller gain over the two sets is largest, among
/// those that need two labels (docs/search.md).
pub const WEIGHT: f32 = 2.0;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// Sum of the labels' unit request vectors (scaled down once past [`MAX_WEIGHT`]).
    #[serde(with = "hex_f32")]
    sum: Vec<f32>,
    count: u32,
}

/// The learned vectors, and how they are kept.
pub struct Learned {
    tools: RwLock<HashMap<ToolKey, Entry>>,
    total: AtomicU64,
    dim: usize,
    /// Where they are kept between runs (`[optimizer] learning_file`), if anywhere.
    path: Option<PathBuf>,
    dirty: AtomicBool,
    /// `[optimizer] learning = false`: nothing is recorded or applied.
    enabled: bool,
    /// [`WEIGHT`] and [`MIN_LABELS`], unless an evaluation tries others.
    weight: f32,
    min_labels: u32,
}

#[derive(Serialize, Deserialize)]
struct File {
    dim: usize,
    total: u64,
    tools: Vec<(String, String, Entry)>,
}

mod hex_f32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        s.serialize_str(&base16ct::lower::encode_string(&bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = base16ct::lower::decode_vec(text).map_err(serde::de::Error::custom)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl Learned {
    pub fn disabled() -> Self {
        Self::new(false, 0, None)
    }

    pub fn new(enabled: bool, dim: usize, path: Option<PathBuf>) -> Self {
        Self {
            tools: RwLock::default(),
            total: AtomicU64::new(0),
            dim,
            path,
            dirty: AtomicBool::new(false),
            enabled,
            weight: WEIGHT,
            min_labels: MIN_LABELS,
        }
    }

    /// The same with another weight and label minimum (`toolmux eval-learning` compares them).
    pub fn tuned(mut self, weight: f32, min_labels: u32) -> Self {
        self.weight = weight;
        self.min_labels = min_labels.max(1);
        self
    }

    /// Reads what an earlier run learned from `path` (a missing file is a fresh start; vectors
    /// of another dimension, from another model, are dropped).
    pub fn open(enabled: bool, dim: usize, path: Option<PathBuf>) -> anyhow::Result<Self> {
        let me = Self::new(enabled, dim, path);
        let Some(p) = &me.path else { return Ok(me) };
        let file: File = match std::fs::read(p) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("optimizer.learning_file: {} is not a learned-ranking file", p.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(me),
            Err(e) => return Err(e).with_context(|| format!("optimizer.learning_file: reading {}", p.display())),
        };
        if file.dim != dim {
            tracing::warn!(file = file.dim, model = dim, "learned ranking from another model: starting afresh");
            return Ok(me);
        }
        let mut tools = me.tools.write().expect("learned lock");
        for (backend, tool, entry) in file.tools.into_iter().take(MAX_TOOLS) {
            if entry.sum.len() == dim {
                tools.insert(ToolKey { backend: backend.into(), tool: tool.into() }, entry);
            }
        }
        drop(tools);
        me.total.store(file.total, Ordering::Relaxed);
        Ok(me)
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Labels recorded, over all tools.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn tools(&self) -> usize {
        self.tools.read().expect("learned lock").len()
    }

    /// Whether learned vectors count in rankings yet.
    pub fn active(&self) -> bool {
        self.enabled && self.total() >= MIN_TOTAL
    }

    /// One label: `vector` (a unit request vector) found `tool`.
    pub fn record(&self, vector: &[f32], tool: &ToolKey) {
        if !self.enabled || vector.len() != self.dim {
            return;
        }
        let mut tools = self.tools.write().expect("learned lock");
        if !tools.contains_key(tool) && tools.len() >= MAX_TOOLS {
            return;
        }
        let entry = tools.entry(tool.clone()).or_insert_with(|| Entry { sum: vec![0.0; self.dim], count: 0 });
        if entry.count >= MAX_WEIGHT {
            let keep = (MAX_WEIGHT - 1) as f32 / MAX_WEIGHT as f32;
            entry.sum.iter_mut().for_each(|x| *x *= keep);
        } else {
            entry.count += 1;
        }
        entry.sum.iter_mut().zip(vector).for_each(|(s, v)| *s += v);
        self.total.fetch_add(1, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// The bonus for `tool` given the request's unit vector: 0 until it counts.
    pub fn bonus(&self, vector: &[f32], tool: &ToolKey) -> f32 {
        let tools = self.tools.read().expect("learned lock");
        let Some(e) = tools.get(tool).filter(|e| e.count >= self.min_labels) else { return 0.0 };
        let norm = e.sum.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm == 0.0 {
            return 0.0;
        }
        let cos = e.sum.iter().zip(vector).map(|(a, b)| a * b).sum::<f32>() / norm;
        let confidence = e.count as f32 / (e.count + self.min_labels) as f32;
        self.weight * confidence * cos
    }

    /// Writes the learned vectors to their file if they changed since the last save.
    pub fn save(&self) -> anyhow::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let file = {
            let tools = self.tools.read().expect("learned lock");
            File {
                dim: self.dim,
                total: self.total(),
                tools: tools.iter().map(|(k, e)| (k.backend.to_string(), k.tool.to_string(), e.clone())).collect(),
            }
        };
        super::write_whole(path, &serde_json::to_vec(&file)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str) -> ToolKey {
        ToolKey { backend: "b".into(), tool: t.into() }
    }

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn a_tool_counts_once_it_has_labels_and_the_store_enough() {
        let l = Learned::new(true, 2, None);
        let q = unit(&[1.0, 0.0]);
        for _ in 0..MIN_LABELS - 1 {
            l.record(&q, &key("a"));
        }
        assert_eq!(l.bonus(&q, &key("a")), 0.0, "too few labels");
        l.record(&q, &key("a"));
        assert!(l.bonus(&q, &key("a")) > 0.0);
        assert!(!l.active(), "the store has too few labels");
        for _ in 0..MIN_TOTAL {
            l.record(&unit(&[0.0, 1.0]), &key("b"));
        }
        assert!(l.active());
        // Closer requests get more.
        assert!(l.bonus(&unit(&[1.0, 0.1]), &key("a")) > l.bonus(&unit(&[0.1, 1.0]), &key("a")));
        assert_eq!(l.bonus(&q, &key("unknown")), 0.0);
    }

    #[test]
    fn one_tools_weight_stops_growing() {
        let l = Learned::new(true, 2, None);
        for _ in 0..10 * MAX_WEIGHT {
            l.record(&unit(&[1.0, 0.0]), &key("a"));
        }
        // As many labels again, elsewhere, turn it most of the way.
        for _ in 0..MAX_WEIGHT {
            l.record(&unit(&[0.0, 1.0]), &key("a"));
        }
        assert!(l.bonus(&unit(&[0.0, 1.0]), &key("a")) > l.bonus(&unit(&[1.0, 0.0]), &key("a")));
    }

    #[test]
    fn disabled_learns_nothing_and_the_file_round_trips() {
        let off = Learned::new(false, 2, None);
        off.record(&[1.0, 0.0], &key("a"));
        assert_eq!(off.total(), 0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("learned.json");
        let l = Learned::new(true, 2, Some(path.clone()));
        for _ in 0..5 {
            l.record(&unit(&[1.0, 2.0]), &key("a"));
        }
        l.save().unwrap();
        let back = Learned::open(true, 2, Some(path.clone())).unwrap();
        assert_eq!(back.total(), 5);
        assert!((back.bonus(&unit(&[1.0, 2.0]), &key("a")) - l.bonus(&unit(&[1.0, 2.0]), &key("a"))).abs() < 1e-6);
        // Another model's vectors are not used.
        assert_eq!(Learned::open(true, 3, Some(path)).unwrap().total(), 0);
    }
}
