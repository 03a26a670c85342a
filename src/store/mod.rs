//! The shared tool store: one per process. A [`Generation`] is a catalog with its vectors and
//! indexes, built whole and swapped in; searches run against the generation their caller's
//! snapshot was built for, never a newer one with stale slot ids.
//!
//! Each distinct tool text is embedded once per process (and once per machine, through the
//! on-disk [`VectorCache`]); building a generation for an unchanged catalog runs no model.

pub mod adapter;
pub mod integrity;
pub mod learned;

/// Writes `bytes` to `path` whole: to a temporary file beside it (its folder made if need be),
/// renamed over it, so a reader never sees half a file. The tool ledger and the learned
/// ranking are kept this way.
pub(crate) fn write_whole(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;

    use anyhow::Context;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    // What is written here is the user's own state (grants, what find_tool learned, the tool
    // ledger): a folder made for it is theirs only.
    let mut folders = std::fs::DirBuilder::new();
    folders.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut folders, 0o700);
    folders.create(dir).with_context(|| format!("creating {}", dir.display()))?;
    // A name of its own per write: two writers (two processes on one file) never share a
    // half-written temporary. Readable by the owner only, as the file it replaces.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{:016x}.tmp", std::process::id(), rand::random::<u64>()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    // The rename itself survives a crash once the folder is synced (where a folder can be).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::catalog::Catalog;
use crate::catalog::text::{clauses, keyword_text, mostly_non_latin};
use crate::embed::cache::VectorCache;
use crate::embed::{EmbedError, Embedder};
use crate::index::bm25::{Bm25Index, terms};
use crate::index::dense::{DenseIndex, GRAPH_MIN_SLOTS, Plan};
use crate::index::fusion::{self, Fusion, Normalise};
use crate::index::{AllowList, Hit, top_k};

/// How deep each arm ranks before fusion.
const ARM_DEPTH: usize = 50;
/// Recent query vectors kept, so a repeated find_tool skips the model.
const QUERY_CACHE: usize = 512;
/// Texts per embedding job while building a generation, so queries interleave with a rebuild.
const BUILD_CHUNK: usize = 64;

/// How the two arms merge: each arm's scores z-normalised over its ranked tools, then averaged.
/// Chosen by cross-validation over the dev sets (`toolmux eval-study`; docs/search.md).
pub const FUSION: Fusion = Fusion::Convex { norm: Normalise::ZScore, dense: 0.5 };
/// A request of several clauses is also searched clause by clause; a tool keeps its best fused
/// score, a clause's scaled by this (so the whole request leads when it is clear).
pub const CLAUSE_WEIGHT: f32 = 0.8;
/// At most this many clauses are searched apart (the rest only as part of the whole).
const MAX_CLAUSES: usize = 4;

/// How well the best tool fits, from its cosine similarity to the request (or a clause of it).
/// Calibrated with `toolmux eval-verdict` on the dev sets and a no-fit set built from them
/// (docs/search.md): below [`WEAK_BELOW`] is "weak", below [`NONE_BELOW`] is "none".
pub const WEAK_BELOW: f32 = 0.44;
pub const NONE_BELOW: f32 = 0.32;

/// find_tool's overall verdict on a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The best tool fits the request.
    Good,
    /// Something is related, but it may not do what was asked.
    Weak,
    /// Nothing in scope fits; the closest tools are returned anyway.
    None,
}

impl Verdict {
    /// The verdict from the text alone: `none` for a request mostly in a script the model does
    /// not read, else by the best of the returned tools' cosines.
    pub fn by_text(request: &str, similarity: &[f32]) -> Self {
        if mostly_non_latin(request) {
            Verdict::None
        } else {
            Verdict::of_cosine(similarity.iter().copied().fold(f32::MIN, f32::max), NONE_BELOW)
        }
    }

    /// The verdict of a best cosine `best`, with `none` below `none_below` (find_tool's is
    /// [`NONE_BELOW`]; `toolmux eval-verdict` tries others).
    pub fn of_cosine(best: f32, none_below: f32) -> Self {
        if best < none_below {
            Verdict::None
        } else if best < WEAK_BELOW {
            Verdict::Weak
        } else {
            Verdict::Good
        }
    }
}

/// The keyword index of a catalog (see [`keyword_text`]).
fn keyword_index(catalog: &Catalog) -> Bm25Index {
    let docs: Vec<String> = catalog.tools().iter().map(|t| keyword_text(&t.text, t.name())).collect();
    Bm25Index::build(docs.iter().map(String::as_str))
}

/// One immutable catalog with its indexes.
pub struct Generation {
    pub id: u64,
    pub catalog: Catalog,
    /// `None` when tool texts could not be embedded: search is keyword-only until the next build.
    pub dense: Option<DenseIndex>,
    pub keyword: Bm25Index,
    /// Each backend's slots and their total token weight, so a scope is a union of a few
    /// precomputed bitsets rather than a walk over every tool.
    pub by_backend: Vec<BackendSlots>,
}

/// One backend's tools in a generation.
#[derive(Debug, Clone)]
pub struct BackendSlots {
    pub backend: Arc<str>,
    pub slots: AllowList,
    pub tokens: u64,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("id", &self.id)
            .field("tools", &self.catalog.len())
            .field("dense", &self.dense.is_some())
            .finish()
    }
}

impl Generation {
    /// Every tool's key and unit vector, slot by slot (`keys.len() × dim` floats), for fitting
    /// the query adapter; `None` without vectors.
    pub fn tool_vectors(&self) -> Option<(Vec<crate::catalog::ToolKey>, Vec<f32>)> {
        let dense = self.dense.as_ref()?;
        let tools = self.catalog.tools();
        let keys = tools.iter().map(|t| t.key.clone()).collect();
        let vectors = (0..tools.len() as u32).flat_map(|slot| dense.vector(slot)).collect();
        Some((keys, vectors))
    }

    pub fn new(id: u64, catalog: Catalog, dense: Option<DenseIndex>, keyword: Bm25Index) -> Self {
        let n = catalog.len();
        let mut by_backend: Vec<BackendSlots> = Vec::new();
        for (slot, t) in catalog.tools().iter().enumerate() {
            let i = match by_backend.iter().position(|b| b.backend == t.key.backend) {
                Some(i) => i,
                None => {
                    by_backend.push(BackendSlots {
                        backend: t.key.backend.clone(),
                        slots: AllowList::none(n),
                        tokens: 0,
                    });
                    by_backend.len() - 1
                }
            };
            by_backend[i].slots.insert(slot as u32);
            by_backend[i].tokens += t.tokens;
        }
        Self { id, catalog, dense, keyword, by_backend }
    }

    pub fn empty() -> Self {
        Self::new(0, Catalog::default(), None, Bm25Index::default())
    }

    /// A generation of `catalog` with a keyword index only (tests, benchmarks).
    pub fn keyword_only(catalog: Catalog) -> Self {
        let keyword = keyword_index(&catalog);
        Self::new(0, catalog, None, keyword)
    }
}

impl Parts {
    pub fn total(&self) -> f32 {
        self.dense + self.keyword + self.learned
    }
}

/// What a search is asked.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub description: String,
    pub keywords: Vec<String>,
}

/// Which arms answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    Hybrid,
    Keyword,
    Dense,
}

/// Which ranking to return (the eval compares all three; find_tool uses `Fused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranker {
    Fused,
    KeywordOnly,
    DenseOnly,
}

#[derive(Debug, Clone)]
pub struct SearchResult {
    pub hits: Vec<Hit>,
    /// Each hit's cosine similarity to the request (the best over its clauses), in hit order;
    /// empty when the dense arm did not run.
    pub similarity: Vec<f32>,
    /// How well the best hit fits.
    pub verdict: Verdict,
    pub mode: SearchMode,
    pub plan: Option<Plan>,
    /// Where the time went.
    pub timings: Timings,
    /// The whole request's vector, when the dense arm ran (a later call may make it a label).
    pub vector: Option<Arc<Vec<f32>>>,
    /// The model's queue was full: this many requests were ahead, and nothing was searched.
    pub busy: Option<usize>,
    /// Why each hit scored what it did, in hit order (the console's playground shows it).
    pub parts: Vec<Parts>,
}

/// A hit's score by where it came from: `score == dense + keyword + learned`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Parts {
    /// What the dense arm added (its normalised score, weighted; a clause's scaled too).
    pub dense: f32,
    /// What the keyword arm added.
    pub keyword: f32,
    /// What use taught ([`learned`]): zero until learning is active.
    pub learned: f32,
    /// Which clause of the request scored it (`None`: the whole request).
    pub clause: Option<usize>,
}

impl SearchResult {
    /// No hits and no verdict: nothing to search, or (`busy`) the model's queue was full.
    fn nothing(timings: Timings, busy: Option<usize>) -> Self {
        Self {
            hits: Vec::new(),
            similarity: Vec::new(),
            verdict: Verdict::None,
            mode: SearchMode::Hybrid,
            plan: None,
            timings,
            vector: None,
            busy,
            parts: Vec::new(),
        }
    }
}

/// A search's time by stage.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Embedding the query (zero when it was cached or there is no dense arm).
    pub embed: std::time::Duration,
    /// Both arms' index searches.
    pub search: std::time::Duration,
    /// Merging the arms.
    pub fuse: std::time::Duration,
}

/// Counts of work done, for tests and benchmarks to check "no model run" claims.
#[derive(Debug, Default)]
pub struct Counters {
    pub texts_embedded: AtomicU64,
    pub queries_embedded: AtomicU64,
    pub generations: AtomicU64,
    /// Tool vectors found in, and missing from, the vector cache during builds.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Builds whose tool texts could not be embedded (keyword-only generations).
    pub embed_failures: AtomicU64,
}

pub struct Store {
    embedder: Option<Arc<dyn Embedder>>,
    cache: Option<VectorCache>,
    /// Written only by [`Store::rebuild`], which holds `build_lock`.
    current: ArcSwap<Generation>,
    build_lock: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    /// Recent query vectors by text (least recently used out first).
    queries: Mutex<lru::LruCache<String, Arc<Vec<f32>>>>,
    graph_min: usize,
    /// Every generation made current, while anything holds it (`live_generations`).
    published: Mutex<Vec<std::sync::Weak<Generation>>>,
    pub counters: Counters,
    /// What find_tool learned from use ([`learned`]); disabled until the gateway sets it.
    learned: std::sync::OnceLock<Arc<learned::Learned>>,
}

impl Store {
    /// A store with no embedder searches by keyword only (passthrough mode needs no model).
    pub fn new(embedder: Option<Arc<dyn Embedder>>, cache: Option<VectorCache>) -> Self {
        Self {
            embedder,
            cache,
            current: ArcSwap::from_pointee(Generation::empty()),
            build_lock: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            queries: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(QUERY_CACHE).expect("a positive capacity"),
            )),
            graph_min: GRAPH_MIN_SLOTS,
            published: Mutex::default(),
            counters: Counters::default(),
            learned: std::sync::OnceLock::new(),
        }
    }

    /// Sets what fused search learns from and applies (once; later calls are ignored).
    pub fn set_learned(&self, learned: Arc<learned::Learned>) {
        let _ = self.learned.set(learned);
    }

    /// What fused search learns from, if learning was set up.
    pub fn learned(&self) -> Option<&Arc<learned::Learned>> {
        self.learned.get()
    }

    /// Overrides the catalog size from which an HNSW graph is built (benchmarks, tests).
    pub fn with_graph_min(mut self, n: usize) -> Self {
        self.graph_min = n;
        self
    }

    pub fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Generations still in memory: the current one, and older ones that something still
    /// holds (a request under way, a session not yet swapped). Each holds its catalog, vectors
    /// and indexes, so this should fall back to 1 soon after every change.
    pub fn live_generations(&self) -> usize {
        self.published.lock().expect("published lock").iter().filter(|g| g.strong_count() > 0).count()
    }

    pub fn embedder(&self) -> Option<&Arc<dyn Embedder>> {
        self.embedder.as_ref()
    }

    /// Embeds what is new in `catalog`, builds its indexes and makes it current. Long embedding
    /// work is logged as it goes.
    pub async fn rebuild(&self, catalog: Catalog) -> Arc<Generation> {
        let log = ProgressLog::default();
        self.rebuild_with_progress(catalog, &|done, total| log.report(done, total)).await
    }

    /// [`Store::rebuild`], telling `progress` (texts embedded, texts to embed) after each chunk.
    pub async fn rebuild_with_progress(&self, catalog: Catalog, progress: &Progress<'_>) -> Arc<Generation> {
        let _writer = self.build_lock.lock().await;
        let dense = match &self.embedder {
            Some(e) => match self.vectors(e.as_ref(), &catalog, progress).await {
                Ok(data) => Some((e.dim(), data)),
                Err(err) => {
                    self.counters.embed_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%err, "tool texts could not be embedded; search is keyword-only until the next rebuild");
                    None
                }
            },
            None => None,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let graph_min = self.graph_min;
        let generation = tokio::task::spawn_blocking(move || {
            let keyword = keyword_index(&catalog);
            let dense = dense.map(|(dim, data)| DenseIndex::build(dim, data, graph_min));
            // The f32 vectors (15 MB at 10k tools) were just freed: give them back.
            crate::memory::trim();
            Generation::new(id, catalog, dense, keyword)
        })
        .await
        .expect("index build does not panic");
        let generation = Arc::new(generation);
        self.current.store(generation.clone());
        {
            let mut published = self.published.lock().expect("published lock");
            published.retain(|g| g.strong_count() > 0);
            published.push(Arc::downgrade(&generation));
        }
        self.counters.generations.fetch_add(1, Ordering::Relaxed);
        tracing::info!(generation = id, tools = generation.catalog.len(), "tool index built");
        generation
    }

    /// Slot-major vectors for every tool of `catalog`, from the cache or the model.
    async fn vectors(
        &self,
        e: &dyn Embedder,
        catalog: &Catalog,
        progress: &Progress<'_>,
    ) -> Result<Vec<f32>, EmbedError> {
        let dim = e.dim();
        let tools = catalog.tools();
        let mut data = vec![0f32; tools.len() * dim];
        let mut missing: HashMap<&str, Vec<usize>> = HashMap::new();
        for (slot, t) in tools.iter().enumerate() {
            let hit = self.cache.as_ref().and_then(|c| c.get(&c.key(&t.text)));
            let counter = if hit.is_some() { &self.counters.cache_hits } else { &self.counters.cache_misses };
            counter.fetch_add(1, Ordering::Relaxed);
            match hit {
                Some(v) => data[slot * dim..(slot + 1) * dim].copy_from_slice(&v),
                None => missing.entry(t.text.as_str()).or_default().push(slot),
            }
        }
        let texts: Vec<&str> = missing.keys().copied().collect();
        let mut done = 0;
        for chunk in texts.chunks(BUILD_CHUNK) {
            let vs = e.embed(chunk.iter().map(|s| s.to_string()).collect()).await?;
            self.counters.texts_embedded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            let mut fresh = Vec::with_capacity(chunk.len());
            for (text, v) in chunk.iter().zip(vs) {
                for &slot in &missing[text] {
                    data[slot * dim..(slot + 1) * dim].copy_from_slice(&v);
                }
                if let Some(c) = &self.cache {
                    fresh.push((c.key(text), v));
                }
            }
            if let Some(c) = &self.cache
                && let Err(err) = c.insert_all(&fresh)
            {
                tracing::warn!(%err, "vector cache not written; vectors stay in memory");
            }
            done += chunk.len();
            progress(done, texts.len());
        }
        Ok(data)
    }

    /// Vectors of `texts`, from the query cache or one model call for those not in it.
    async fn query_vectors(&self, e: &dyn Embedder, texts: &[String]) -> Result<Vec<Arc<Vec<f32>>>, EmbedError> {
        let mut found: Vec<Option<Arc<Vec<f32>>>> = {
            let mut cache = self.queries.lock().expect("query cache");
            texts.iter().map(|t| cache.get(t.as_str()).cloned()).collect()
        };
        let missing: Vec<String> =
            texts.iter().zip(&found).filter(|(_, v)| v.is_none()).map(|(t, _)| t.clone()).collect();
        if !missing.is_empty() {
            let fresh = e.embed(missing.clone()).await?;
            if fresh.len() != missing.len() {
                return Err(EmbedError::Stopped);
            }
            self.counters.queries_embedded.fetch_add(missing.len() as u64, Ordering::Relaxed);
            let mut cache = self.queries.lock().expect("query cache");
            let mut fresh = missing.iter().zip(fresh);
            for slot in found.iter_mut().filter(|v| v.is_none()) {
                if let Some((text, v)) = fresh.next() {
                    let v = Arc::new(v);
                    cache.put(text.clone(), v.clone());
                    *slot = Some(v);
                }
            }
        }
        Ok(found.into_iter().map(|v| v.unwrap_or_default()).collect())
    }

    /// Ranks the allowed tools of `generation` for `query`; at most `n` hits.
    ///
    /// The request and, when it holds several, each of its [`clauses`] are searched by both
    /// arms and fused ([`FUSION`]); a tool keeps its best score (a clause's scaled by
    /// [`CLAUSE_WEIGHT`]), so each part of a multi-part request gets its tools into the list.
    pub async fn search(
        &self,
        generation: &Generation,
        allow: &AllowList,
        query: &Query,
        n: usize,
        ranker: Ranker,
    ) -> SearchResult {
        self.search_learning(generation, allow, query, n, ranker, self.learned.get().map(Arc::as_ref)).await
    }

    /// [`Store::search`], with `learned` (not the store's own) re-ranking fused results: for
    /// measuring what learning does.
    pub async fn search_learning(
        &self,
        generation: &Generation,
        allow: &AllowList,
        query: &Query,
        n: usize,
        ranker: Ranker,
        learned: Option<&learned::Learned>,
    ) -> SearchResult {
        if allow.is_empty() || n == 0 {
            return SearchResult::nothing(Timings::default(), None);
        }
        debug_assert_eq!(allow.universe(), generation.catalog.len(), "allow-list of another generation");
        let started = std::time::Instant::now();
        let mut extra_terms = Vec::new();
        for k in &query.keywords {
            // Explicit keywords count twice: the caller chose them for this arm.
            let t = terms(k);
            extra_terms.extend(t.iter().cloned());
            extra_terms.extend(t);
        }
        // The whole request first, then its clauses when it has more than one.
        let mut texts = vec![query.description.clone()];
        if ranker == Ranker::Fused {
            let parts = clauses(&query.description);
            if parts.len() > 1 {
                texts.extend(parts.into_iter().take(MAX_CLAUSES));
            }
        }
        let depth = ARM_DEPTH.max(n);
        let mut timings = Timings::default();
        let keyword = |text: &str, timings: &mut Timings, whole: bool| {
            let mut t = terms(text);
            if whole {
                t.extend(extra_terms.iter().cloned());
            }
            let at = std::time::Instant::now();
            let hits = tracing::debug_span!("keyword_search").in_scope(|| generation.keyword.search(&t, allow, depth));
            timings.search += at.elapsed();
            hits
        };
        let vectors = match (&generation.dense, &self.embedder, ranker) {
            (_, _, Ranker::KeywordOnly) => None,
            (Some(_), Some(e), _) => {
                let embedded = tracing::Instrument::instrument(
                    self.query_vectors(e.as_ref(), &texts),
                    tracing::debug_span!("embed_query"),
                )
                .await;
                match embedded {
                    Ok(v) => Some(v),
                    // Too many ahead: the caller is told at once (a keyword answer now would
                    // be a worse one, given silently).
                    Err(EmbedError::Overloaded(ahead)) => return SearchResult::nothing(timings, Some(ahead)),
                    Err(err) => {
                        tracing::warn!(%err, "query not embedded; answering from the keyword arm");
                        None
                    }
                }
            }
            _ => None,
        };
        timings.embed = started.elapsed();
        let (Some(dense), Some(vectors)) = (&generation.dense, vectors) else {
            let hits: Vec<Hit> = keyword(&query.description, &mut timings, true).into_iter().take(n).collect();
            let parts = hits.iter().map(|h| Parts { keyword: h.score, ..Parts::default() }).collect();
            // No similarity to judge by: a keyword match is at best weak.
            let unreadable = hits.is_empty() || mostly_non_latin(&query.description);
            let verdict = if unreadable { Verdict::None } else { Verdict::Weak };
            return SearchResult {
                hits,
                similarity: Vec::new(),
                verdict,
                mode: SearchMode::Keyword,
                plan: None,
                timings,
                vector: None,
                busy: None,
                parts,
            };
        };
        let mut plan = None;
        // The way this deployment's users speak, if learning fitted it: the dense arm searches
        // with the adapted request (the verdict and the labels keep the request as said).
        let adapted: Option<Vec<Vec<f32>>> = learned.and_then(|l| vectors.iter().map(|v| l.adapt(v)).collect());
        // Each slot's best score, and what made it.
        let mut best: HashMap<u32, Parts> = HashMap::new();
        for (i, (text, vector)) in texts.iter().zip(&vectors).enumerate() {
            let at = std::time::Instant::now();
            let vector = adapted.as_ref().map_or(vector.as_slice(), |a| a[i].as_slice());
            let (mut d, p) = tracing::debug_span!("dense_search").in_scope(|| dense.search(vector, allow, depth));
            if let (Some(_), Some(l)) = (&adapted, learned) {
                let tools = generation.catalog.tools();
                l.take_back(&mut d, |slot| &tools[slot as usize].key);
            }
            timings.search += at.elapsed();
            plan.get_or_insert(p);
            if ranker == Ranker::DenseOnly {
                best.extend(d.iter().map(|h| (h.slot, Parts { dense: h.score, ..Parts::default() })));
                break;
            }
            let k = keyword(text, &mut timings, i == 0);
            let at = std::time::Instant::now();
            let weight = if i == 0 { 1.0 } else { CLAUSE_WEIGHT };
            for (h, c) in tracing::debug_span!("fuse").in_scope(|| fusion::fuse_explained(FUSION, &d, &k, depth)) {
                let clause = (i > 0).then(|| i - 1);
                let candidate = Parts { dense: weight * c.dense, keyword: weight * c.keyword, learned: 0.0, clause };
                match best.entry(h.slot) {
                    std::collections::hash_map::Entry::Occupied(mut e) if e.get().total() < candidate.total() => {
                        e.insert(candidate);
                    }
                    std::collections::hash_map::Entry::Occupied(_) => {}
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(candidate);
                    }
                }
            }
            timings.fuse += at.elapsed();
        }
        // What use taught: tools that past requests like this one led to rise (only among the
        // tools this search found in the caller's scope).
        if ranker == Ranker::Fused
            && let Some(learned) = learned.filter(|l| l.active())
        {
            let tools = generation.catalog.tools();
            for (slot, parts) in best.iter_mut() {
                parts.learned = learned.bonus(&vectors[0], &tools[*slot as usize].key);
            }
        }
        let hits = top_k(best.iter().map(|(&slot, p)| Hit { slot, score: p.total() }).collect(), n);
        let parts = hits.iter().map(|h| best[&h.slot]).collect();
        let similarity: Vec<f32> =
            hits.iter().map(|h| vectors.iter().map(|q| dense.similarity(q, h.slot)).fold(f32::MIN, f32::max)).collect();
        // Requests like this one led to the first tool: it fits, however its text reads (a
        // request the model cannot read stays `none`).
        let familiar = |first: &Hit| {
            learned
                .filter(|l| l.active())
                .and_then(|l| l.familiarity(&vectors[0], &generation.catalog.tools()[first.slot as usize].key))
        };
        let verdict = match hits.first().and_then(familiar) {
            Some((cos, _)) if cos >= learned::FAMILIAR && !mostly_non_latin(&query.description) => Verdict::Good,
            _ => Verdict::by_text(&query.description, &similarity),
        };
        let mode = if ranker == Ranker::DenseOnly { SearchMode::Dense } else { SearchMode::Hybrid };
        let vector = vectors.into_iter().next();
        SearchResult { hits, similarity, verdict, mode, plan, timings, vector, busy: None, parts }
    }
}

/// Told (texts embedded so far, texts to embed) as a rebuild embeds.
pub type Progress<'a> = dyn Fn(usize, usize) + Send + Sync + 'a;

/// The default progress report: a log line every few seconds while embedding runs long.
#[derive(Default)]
struct ProgressLog {
    last: Mutex<Option<std::time::Instant>>,
}

impl ProgressLog {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    fn report(&self, done: usize, total: usize) {
        let mut last = self.last.lock().expect("progress lock");
        let now = std::time::Instant::now();
        match *last {
            None => *last = Some(now),
            Some(t) if now - t >= Self::EVERY || done == total => {
                tracing::info!("embedding tool texts: {done} of {total}");
                *last = Some(now);
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
