//! What find_tool learns from use. A call that follows a find_tool in the same session, of a
//! tool that find_tool returned, and that completes without `isError`, is a label: that request
//! found that tool. Each label moves the tool's learned vector (the mean of the request vectors
//! that led to it) and, once a tool has labels from [`MIN_PRINCIPALS`] principals and the whole
//! store [`MIN_TOTAL`] labels, fused search adds
//! `weight * confidence * cos(request, learned vector)` to the tool's score (see
//! docs/search.md for how the weight was chosen), where the confidence grows with the number
//! of distinct principals, not of labels.
//!
//! What one principal can do to another's ranking is bounded: it gives at most
//! [`PER_PRINCIPAL`] labels to a tool, however many sessions it opens, and a tool it alone
//! labelled never counts. Principals are kept only as a keyed hash, to tell them apart; never
//! the request's text. A learned vector only re-ranks tools a search already found in the
//! caller's scope, so it cannot show a caller a tool outside it.
//!
//! Bounded: [`MAX_TOOLS`] tools (past it the least recently confirmed tool leaves), each one
//! vector whose weight stops growing at [`MAX_WEIGHT`] labels (older labels fade), and the
//! gateway takes at most [`PER_SESSION`] labels from one session (a caller without one: its
//! principal's requests of an hour), one per tool.
//!
//! The file (`[optimizer] learning_file`) is a hint, never a reason not to start: one that
//! cannot be read or holds a vector that is not finite is logged, set aside beside itself and
//! started afresh.
//!
//! Replicas (`[sessions] store = "redis"`) share their labels: a label is then not applied where
//! it was made but handed to [`Learned::share`]'s channel, which the app writes to the store;
//! every replica applies every label as the store orders them ([`Learned::apply`]), so they all
//! rank a request the same way.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};

use super::adapter::{self, Adapter, Example, Judged};
use crate::catalog::ToolKey;

mod file;

use file::Pair;
pub use file::{Fitted, digest};

/// Labels a tool needs before its learned vector counts: two, so that no one session (which
/// gives at most one label per tool) can make a tool's learned vector count alone.
pub const MIN_LABELS: u32 = 2;
/// Principals whose labels a tool needs before its learned vector counts.
pub const MIN_PRINCIPALS: usize = 2;
/// Labels one principal may give one tool, over all its sessions.
pub const PER_PRINCIPAL: u32 = 4;
/// Labels the store needs before any learned vector counts ("off until it has enough data").
pub const MIN_TOTAL: u64 = 20;
/// Tools with a learned vector, at most; labels for others are not kept.
pub const MAX_TOOLS: usize = 4096;
/// Principals remembered per tool (the most recent); one forgotten may label it again.
const MAX_CONTRIBUTORS: usize = 64;
/// A learned vector is the mean of at most this many labels' worth: later labels replace a
/// share of the older ones rather than adding weight.
pub const MAX_WEIGHT: u32 = 64;
/// Labels taken from one client session, at most (one per tool).
pub const PER_SESSION: usize = 16;
/// Result sizes kept per tool, the most recent: enough for a 95th percentile to mean something.
pub const SIZE_SAMPLES: usize = 40;
/// Labels kept whole (request vector, tool, principal) for fitting the query adapter, the most
/// recent: as many as the replicas' shared stream keeps.
pub const MAX_PAIRS: usize = 20_000;
/// The share of a fit's weight one principal may carry, at most (its labels weigh less past it).
pub const PRINCIPAL_SHARE: f32 = 0.1;

/// The bonus's weight, in units of the fused score (a z-score mean): chosen with
/// `toolmux eval-learning` as the setting whose smaller gain over the two sets is largest, among
/// those that need two labels (docs/search.md).
pub const WEIGHT: f32 = 2.0;

/// A first tool whose [`Learned::familiarity`] to the request is at least this is a good match,
/// whatever the cosine to its text says: requests like this one led to it, from two principals
/// or more. Chosen with `toolmux eval-verdict`'s replay as the lowest threshold that keeps 90 %
/// of the no-fit requests flagged, on each fold (docs/search.md).
pub const FAMILIAR: f32 = 0.45;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// Sum of the labels' unit request vectors (scaled down once past [`MAX_WEIGHT`]).
    #[serde(with = "file::hex_f32")]
    sum: Vec<f32>,
    count: u32,
    /// Who gave its labels (a keyed hash of the principal) and how many, most recent last.
    #[serde(default)]
    by: Vec<(u64, u32)>,
    /// When a label last confirmed it (seconds since the Unix epoch): the least recent leaves
    /// first when the store is full.
    #[serde(default)]
    confirmed: u64,
}

impl Entry {
    fn is_finite(&self) -> bool {
        self.sum.iter().all(|x| x.is_finite())
    }
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
    /// [`adapter::OFFSET`], unless an evaluation tries another.
    offset: f32,
    /// The key principals are hashed under: random per process, kept in the file so a restart
    /// still tells the same principals apart (shared by the replicas through the store).
    salt: RwLock<u64>,
    /// Where labels go instead of being applied here, when the replicas share them.
    shared: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Label>>,
    /// The sizes of each tool's recent results, in tokens (for find_tool's answer): observed on
    /// every completed call whatever `learning` says, since they steer no ranking.
    sizes: RwLock<HashMap<ToolKey, VecDeque<u32>>>,
    /// The labels themselves, the most recent [`MAX_PAIRS`], for fitting the query adapter.
    pairs: RwLock<VecDeque<Pair>>,
    /// The query adapter being served, if a fit passed its guard (its version and how it was
    /// judged are the last decision's: `decided`, `judged`).
    adapter: ArcSwapOption<Adapter>,
    /// How the last fit went, served or not, and the labels recorded when it started.
    judged: RwLock<Option<(Judged, u64)>>,
    /// Labels recorded when the fitter last looked whether to fit (fitting or not).
    considered: AtomicU64,
    /// The version of the last fit's decision (served or not); 0 before any.
    decided: AtomicU64,
}

/// How large a tool's results have been, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultSizes {
    pub p50: u32,
    pub p95: u32,
    /// Results observed.
    pub calls: usize,
}

/// One label: a request vector, the tool it found, and who asked (as a keyed hash).
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub tool: ToolKey,
    pub who: u64,
    pub vector: Vec<f32>,
}

impl Label {
    /// The vector as the store keeps it: one signed byte per dimension (a unit vector's
    /// components times 127), a quarter of the f32 bytes; a learned vector is a mean of many,
    /// and rounding to 1/127 moves none of its cosines by more than a few thousandths.
    pub fn packed_vector(&self) -> String {
        let bytes: Vec<u8> = self.vector.iter().map(|x| (x * 127.0).round().clamp(-127.0, 127.0) as i8 as u8).collect();
        base16ct::lower::encode_string(&bytes)
    }

    /// A label read back from the store; `None` if it is not one.
    pub fn unpack(backend: &str, tool: &str, who: u64, vector: &str) -> Option<Self> {
        let bytes = base16ct::lower::decode_vec(vector).ok()?;
        let vector = bytes.iter().map(|b| f32::from(*b as i8) / 127.0).collect();
        Some(Self { tool: ToolKey { backend: backend.into(), tool: tool.into() }, who, vector })
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
            offset: adapter::OFFSET,
            salt: RwLock::new(rand::random()),
            shared: std::sync::OnceLock::new(),
            sizes: RwLock::default(),
            pairs: RwLock::default(),
            adapter: ArcSwapOption::empty(),
            judged: RwLock::default(),
            considered: AtomicU64::new(0),
            decided: AtomicU64::new(0),
        }
    }

    /// Notes that a call of `tool` returned `tokens` tokens.
    pub fn record_size(&self, tool: &ToolKey, tokens: u64) {
        let mut sizes = self.sizes.write().expect("learned lock");
        if sizes.len() >= MAX_TOOLS && !sizes.contains_key(tool) {
            return;
        }
        let recent = sizes.entry(tool.clone()).or_default();
        if recent.len() == SIZE_SAMPLES {
            recent.pop_front();
        }
        recent.push_back(u32::try_from(tokens).unwrap_or(u32::MAX));
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// How large `tool`'s recent results were, if any were seen.
    pub fn sizes(&self, tool: &ToolKey) -> Option<ResultSizes> {
        let sizes = self.sizes.read().expect("learned lock");
        let mut seen: Vec<u32> = sizes.get(tool)?.iter().copied().collect();
        seen.sort_unstable();
        let at = |q: f64| seen[((seen.len() - 1) as f64 * q).round() as usize];
        Some(ResultSizes { p50: at(0.5), p95: at(0.95), calls: seen.len() })
    }

    /// Hands labels to `to` from now on instead of applying them, principals hashed under
    /// `salt` (the replicas' common one): the replicas' store orders them, and every replica
    /// applies them in that order.
    pub fn share(&self, salt: u64, to: tokio::sync::mpsc::UnboundedSender<Label>) {
        *self.salt.write().expect("learned lock") = salt;
        let _ = self.shared.set(to);
    }

    /// The same with another weight and label minimum (`toolmux eval-learning` compares them).
    pub fn tuned(mut self, weight: f32, min_labels: u32) -> Self {
        self.weight = weight;
        self.min_labels = min_labels.max(1);
        self
    }

    /// The same, with `offset` taken back from learned tools in place of [`adapter::OFFSET`]:
    /// how `toolmux eval-learning` shows the adapter with and without it.
    pub fn offset(mut self, offset: f32) -> Self {
        self.offset = offset;
        self
    }

    /// The same, keyed by `salt` instead of a random key: how the evaluations repeat a run (the
    /// key orders the adapter's held-back requests and shuffles its fit).
    pub fn salted(self, salt: u64) -> Self {
        *self.salt.write().expect("learned lock") = salt;
        self
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The request vectors' dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Labels recorded, over all tools.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn tools(&self) -> usize {
        self.tools.read().expect("learned lock").len()
    }

    /// How many principals labelled each labelled tool (`backend_tool`), whether or not it counts.
    pub fn principals_per_tool(&self) -> std::collections::BTreeMap<String, usize> {
        let tools = self.tools.read().expect("learned lock");
        tools.iter().map(|(k, e)| (format!("{}_{}", k.backend, k.tool), e.by.len())).collect()
    }

    /// Tools whose labels count in rankings: enough of them, from [`MIN_PRINCIPALS`] principals.
    pub fn counting(&self) -> usize {
        let tools = self.tools.read().expect("learned lock");
        tools.values().filter(|e| self.counts(e)).count()
    }

    /// Whether a tool's labels count: enough of them, from [`MIN_PRINCIPALS`] principals.
    fn counts(&self, e: &Entry) -> bool {
        e.count >= self.min_labels && e.by.len() >= MIN_PRINCIPALS
    }

    /// Whether learned vectors count in rankings yet.
    pub fn active(&self) -> bool {
        self.enabled && self.total() >= MIN_TOTAL
    }

    /// The key principals are hashed under (also the seed of the adapter's split).
    pub fn salt(&self) -> u64 {
        *self.salt.read().expect("learned lock")
    }

    /// The keyed hash a principal is known by here.
    fn who(&self, principal: &str) -> u64 {
        use sha2::Digest;
        let salt = *self.salt.read().expect("learned lock");
        let digest = sha2::Sha256::new().chain_update(salt.to_le_bytes()).chain_update(principal.as_bytes()).finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }

    /// One label from `principal`: `vector` (a unit request vector) found `tool`. Not kept past
    /// the principal's [`PER_PRINCIPAL`] labels for the tool, nor when not finite. Shared
    /// (replicas), it is handed over rather than applied here.
    pub fn record(&self, vector: &[f32], tool: &ToolKey, principal: &str) {
        if !self.enabled || vector.len() != self.dim || !vector.iter().all(|x| x.is_finite()) {
            return;
        }
        let label = Label { tool: tool.clone(), who: self.who(principal), vector: vector.to_vec() };
        match self.shared.get() {
            Some(to) if to.send(label.clone()).is_ok() => {}
            _ => self.apply(&label),
        }
    }

    /// Applies one label (made here, or by a replica and read from the store).
    pub fn apply(&self, label: &Label) {
        let (vector, who, tool) = (&label.vector, label.who, &label.tool);
        if !self.enabled || vector.len() != self.dim || !vector.iter().all(|x| x.is_finite()) {
            return;
        }
        let mut tools = self.tools.write().expect("learned lock");
        if !tools.contains_key(tool) && tools.len() >= MAX_TOOLS {
            // The least recently confirmed tool makes room.
            let stale = tools.iter().min_by_key(|(_, e)| e.confirmed).map(|(k, _)| k.clone());
            if let Some(stale) = stale {
                tools.remove(&stale);
            }
        }
        let entry = tools.entry(tool.clone()).or_insert_with(|| Entry {
            sum: vec![0.0; self.dim],
            count: 0,
            by: Vec::new(),
            confirmed: 0,
        });
        let given = match entry.by.iter().position(|(w, _)| *w == who) {
            Some(i) => {
                let mine = entry.by.remove(i);
                entry.by.push(mine);
                &mut entry.by.last_mut().expect("just pushed").1
            }
            None => {
                if entry.by.len() >= MAX_CONTRIBUTORS {
                    entry.by.remove(0);
                }
                entry.by.push((who, 0));
                &mut entry.by.last_mut().expect("just pushed").1
            }
        };
        if *given >= PER_PRINCIPAL {
            return;
        }
        *given += 1;
        if entry.count >= MAX_WEIGHT {
            let keep = (MAX_WEIGHT - 1) as f32 / MAX_WEIGHT as f32;
            entry.sum.iter_mut().for_each(|x| *x *= keep);
        } else {
            entry.count += 1;
        }
        entry.sum.iter_mut().zip(vector).for_each(|(s, v)| *s += v);
        entry.confirmed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        drop(tools);
        let mut pairs = self.pairs.write().expect("learned lock");
        if pairs.len() == MAX_PAIRS {
            pairs.pop_front();
        }
        pairs.push_back(Pair {
            backend: tool.backend.to_string(),
            tool: tool.tool.to_string(),
            who,
            vector: vector.iter().map(|x| (x * 127.0).round().clamp(-127.0, 127.0) as i8).collect(),
        });
        drop(pairs);
        self.total.fetch_add(1, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// How like the requests that led to `tool` this request is: the cosine between its unit
    /// vector and the mean of theirs, with how many principals they came from; `None` until
    /// the tool's labels count (enough labels, from [`MIN_PRINCIPALS`] principals or more).
    pub fn familiarity(&self, vector: &[f32], tool: &ToolKey) -> Option<(f32, usize)> {
        let tools = self.tools.read().expect("learned lock");
        let e = tools.get(tool).filter(|e| self.counts(e))?;
        let norm = e.sum.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm == 0.0 {
            return None;
        }
        let cos = e.sum.iter().zip(vector).map(|(a, b)| a * b).sum::<f32>() / norm;
        Some((cos, e.by.len().min(e.count as usize)))
    }

    /// The bonus for `tool` given the request's unit vector: 0 until it counts.
    pub fn bonus(&self, vector: &[f32], tool: &ToolKey) -> f32 {
        let Some((cos, principals)) = self.familiarity(vector, tool) else { return 0.0 };
        // Confidence in principals, not labels: many sessions of one caller add nothing.
        let principals = principals as f32;
        let confidence = principals / (principals + self.min_labels as f32);
        self.weight * confidence * cos
    }

    /// The request vector the dense search should use: through the served adapter, if any.
    pub fn adapt(&self, vector: &[f32]) -> Option<Vec<f32>> {
        if !self.enabled {
            return None;
        }
        self.adapter.load().as_ref().map(|a| a.apply(vector))
    }

    /// While the adapter is served, lowers the dense score of each hit whose tool's labels count
    /// by the offset ([`adapter::OFFSET`]) and puts `hits` back in order: `W` pulls requests
    /// towards the tools it learned from, and this takes back that pull's constant part. `key`
    /// names a hit's tool. Without a served adapter, nothing changes.
    pub fn take_back<'k>(&self, hits: &mut [crate::index::Hit], key: impl Fn(u32) -> &'k ToolKey) {
        if !self.enabled || self.offset == 0.0 || self.adapter.load().is_none() {
            return;
        }
        let tools = self.tools.read().expect("learned lock");
        for h in hits.iter_mut() {
            if tools.get(key(h.slot)).is_some_and(|e| self.counts(e)) {
                h.score -= self.offset;
            }
        }
        drop(tools);
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    }

    /// The adapter being served, if any.
    pub fn served(&self) -> Option<std::sync::Arc<Adapter>> {
        self.adapter.load_full()
    }

    /// How the last fit went (served or not), and the labels recorded when it started.
    pub fn last_fit(&self) -> Option<(Judged, u64)> {
        self.judged.read().expect("learned lock").clone()
    }

    /// Labels kept whole for the adapter.
    pub fn pairs(&self) -> usize {
        self.pairs.read().expect("learned lock").len()
    }

    /// The labels as examples over a catalog whose tools `row` finds: only labels of tools that
    /// [`MIN_PRINCIPALS`] principals labelled teach (and judge) the adapter, and
    /// each principal's weight is capped at [`PRINCIPAL_SHARE`] of the whole (but never below
    /// its [`PER_PRINCIPAL`] labels' worth).
    pub fn examples(&self, row: impl Fn(&str, &str) -> Option<usize>) -> Vec<Example> {
        let counted: std::collections::HashSet<(String, String)> = {
            let tools = self.tools.read().expect("learned lock");
            tools
                .iter()
                .filter(|(_, e)| e.by.len() >= MIN_PRINCIPALS)
                .map(|(k, _)| (k.backend.to_string(), k.tool.to_string()))
                .collect()
        };
        let pairs = self.pairs.read().expect("learned lock");
        let mut examples = Vec::new();
        let mut whose = Vec::new();
        for p in pairs.iter() {
            let Some(target) = row(&p.backend, &p.tool) else { continue };
            let query: Vec<f32> = p.vector.iter().map(|&b| f32::from(b)).collect();
            let norm = query.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm == 0.0 {
                continue;
            }
            // Labels of one request share its vector: they stay on one side of the guard's split.
            let request = {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                p.vector.hash(&mut h);
                h.finish()
            };
            let teaches = counted.contains(&(p.backend.clone(), p.tool.clone()));
            let query = query.iter().map(|x| x / norm).collect();
            examples.push(Example { query, target, weight: 1.0, request, teaches });
            whose.push(p.who);
        }
        // Shares of what teaches only: labels that do not teach change no one's weight.
        let mut per: HashMap<u64, usize> = HashMap::new();
        let teaching = examples.iter().zip(&whose).filter(|(e, _)| e.teaches);
        teaching.clone().for_each(|(_, w)| *per.entry(*w).or_default() += 1);
        let cap = (PRINCIPAL_SHARE * teaching.count() as f32).max(PER_PRINCIPAL as f32);
        for (e, w) in examples.iter_mut().zip(&whose) {
            e.weight = per.get(w).map_or(0.0, |n| (cap / *n as f32).min(1.0));
        }
        examples
    }

    /// Fits the query adapter on what was learned over a catalog (`keys` and their unit vectors
    /// `tools`, row by row) and judges it; [`Learned::install`] serves the outcome. `None` if
    /// too few labels teach or `between` (asked between batches) ended it.
    pub fn fit(
        &self,
        keys: &[ToolKey],
        tools: &[f32],
        settings: adapter::Settings,
        between: &dyn Fn() -> bool,
    ) -> Option<Fitted> {
        let rows: HashMap<(&str, &str), usize> =
            keys.iter().enumerate().map(|(i, k)| ((&*k.backend, &*k.tool), i)).collect();
        let labels = self.total();
        let examples = self.examples(|b, t| rows.get(&(b, t)).copied());
        if examples.iter().filter(|e| e.teaches).count() < adapter::MIN_LABELS {
            return None;
        }
        let (adapter, judged) = adapter::fit_and_judge(&examples, tools, self.dim, settings, self.salt(), between)?;
        Some(Fitted { adapter, judged, labels })
    }

    /// Serves what a fit decided (its adapter if it passed the guard, else none), as `version`.
    pub fn install(&self, fitted: Fitted, version: u64) {
        self.decided.store(version, Ordering::Relaxed);
        let served = fitted.adapter;
        *self.judged.write().expect("learned lock") = Some((fitted.judged, fitted.labels));
        self.serve(served);
    }

    /// Notes that the fitter looked at `labels` labels (and fitted if enough of them teach).
    pub fn considered(&self, labels: u64) {
        self.considered.store(labels, Ordering::Relaxed);
    }

    /// Labels recorded when the fitter last looked.
    pub fn considered_at(&self) -> u64 {
        self.considered.load(Ordering::Relaxed)
    }

    /// The version of the last fit's decision, served or not (the replicas' store numbers them
    /// for all); `None` before any.
    pub fn version(&self) -> Option<u64> {
        Some(self.decided.load(Ordering::Relaxed)).filter(|v| *v > 0)
    }

    /// The version the next decision made here takes.
    pub fn next_version(&self) -> u64 {
        self.decided.load(Ordering::Relaxed) + 1
    }

    /// Serves `served` (or none).
    pub fn serve(&self, served: Option<Adapter>) {
        self.adapter.store(served.map(std::sync::Arc::new));
        self.dirty.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
