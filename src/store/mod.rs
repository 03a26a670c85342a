//! The shared tool store: one per process. A [`Generation`] is a catalog with its vectors and
//! indexes, built whole and swapped in; searches run against the generation their caller's
//! snapshot was built for, never a newer one with stale slot ids.
//!
//! Each distinct tool text is embedded once per process (and once per machine, through the
//! on-disk [`VectorCache`]); building a generation for an unchanged catalog runs no model.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::catalog::Catalog;
use crate::embed::cache::VectorCache;
use crate::embed::{EmbedError, Embedder};
use crate::index::bm25::{Bm25Index, terms};
use crate::index::dense::{DenseIndex, GRAPH_MIN_SLOTS, Plan};
use crate::index::fusion::rrf;
use crate::index::{AllowList, Hit};

/// How deep each arm ranks before fusion.
const ARM_DEPTH: usize = 50;
/// Recent query vectors kept, so a repeated find_tool skips the model.
const QUERY_CACHE: usize = 512;
/// Texts per embedding job while building a generation, so queries interleave with a rebuild.
const BUILD_CHUNK: usize = 64;

/// Weights of the two arms in the fusion (dense, keyword); see docs/search.md.
pub const DENSE_WEIGHT: f32 = 1.0;
pub const KEYWORD_WEIGHT: f32 = 1.0;

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
        let keyword = Bm25Index::build(catalog.tools().iter().map(|t| t.text.as_str()));
        Self::new(0, catalog, None, keyword)
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
    pub mode: SearchMode,
    pub plan: Option<Plan>,
    /// Where the time went.
    pub timings: Timings,
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
    queries: Mutex<QueryCache>,
    graph_min: usize,
    pub counters: Counters,
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
            queries: Mutex::new(QueryCache::default()),
            graph_min: GRAPH_MIN_SLOTS,
            counters: Counters::default(),
        }
    }

    /// Overrides the catalog size from which an HNSW graph is built (benchmarks, tests).
    pub fn with_graph_min(mut self, n: usize) -> Self {
        self.graph_min = n;
        self
    }

    pub fn current(&self) -> Arc<Generation> {
        self.current.load_full()
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
            let keyword = Bm25Index::build(catalog.tools().iter().map(|t| t.text.as_str()));
            let dense = dense.map(|(dim, data)| DenseIndex::build(dim, data, graph_min));
            Generation::new(id, catalog, dense, keyword)
        })
        .await
        .expect("index build does not panic");
        let generation = Arc::new(generation);
        self.current.store(generation.clone());
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

    async fn query_vector(&self, e: &dyn Embedder, text: &str) -> Result<Arc<Vec<f32>>, EmbedError> {
        if let Some(v) = self.queries.lock().expect("query cache").get(text) {
            return Ok(v);
        }
        let v = e.embed(vec![text.to_string()]).await?.pop().ok_or(EmbedError::Stopped)?;
        self.counters.queries_embedded.fetch_add(1, Ordering::Relaxed);
        let v = Arc::new(v);
        self.queries.lock().expect("query cache").put(text, v.clone());
        Ok(v)
    }

    /// Ranks the allowed tools of `generation` for `query`; at most `n` hits.
    pub async fn search(
        &self,
        generation: &Generation,
        allow: &AllowList,
        query: &Query,
        n: usize,
        ranker: Ranker,
    ) -> SearchResult {
        if allow.is_empty() || n == 0 {
            return SearchResult {
                hits: Vec::new(),
                mode: SearchMode::Hybrid,
                plan: None,
                timings: Timings::default(),
            };
        }
        debug_assert_eq!(allow.universe(), generation.catalog.len(), "allow-list of another generation");
        let started = std::time::Instant::now();
        let mut kw_terms = terms(&query.description);
        for k in &query.keywords {
            // Explicit keywords count twice: the caller chose them for this arm.
            let t = terms(k);
            kw_terms.extend(t.iter().cloned());
            kw_terms.extend(t);
        }
        let mut timings = Timings::default();
        let keyword = |timings: &mut Timings| {
            let at = std::time::Instant::now();
            let hits = tracing::debug_span!("keyword_search")
                .in_scope(|| generation.keyword.search(&kw_terms, allow, ARM_DEPTH.max(n)));
            timings.search += at.elapsed();
            hits
        };
        let dense = match (&generation.dense, &self.embedder, ranker) {
            (_, _, Ranker::KeywordOnly) => None,
            (Some(d), Some(e), _) => match tracing::Instrument::instrument(
                self.query_vector(e.as_ref(), &query.description),
                tracing::debug_span!("embed_query"),
            )
            .await
            {
                Ok(q) => {
                    let at = std::time::Instant::now();
                    let found = tracing::debug_span!("dense_search").in_scope(|| d.search(&q, allow, ARM_DEPTH.max(n)));
                    timings.search += at.elapsed();
                    Some(found)
                }
                Err(err) => {
                    tracing::warn!(%err, "query not embedded; answering from the keyword arm");
                    None
                }
            },
            _ => None,
        };
        // Everything before the index searches was the query's embedding.
        timings.embed = started.elapsed().saturating_sub(timings.search);
        match (dense, ranker) {
            (Some((d, plan)), Ranker::DenseOnly) => SearchResult {
                hits: d.into_iter().take(n).collect(),
                mode: SearchMode::Dense,
                plan: Some(plan),
                timings,
            },
            (Some((d, plan)), _) => {
                let k = keyword(&mut timings);
                let at = std::time::Instant::now();
                let hits =
                    tracing::debug_span!("fuse").in_scope(|| rrf(&[(&d, DENSE_WEIGHT), (&k, KEYWORD_WEIGHT)], n));
                timings.fuse = at.elapsed();
                SearchResult { hits, mode: SearchMode::Hybrid, plan: Some(plan), timings }
            }
            (None, _) => {
                let hits = keyword(&mut timings).into_iter().take(n).collect();
                SearchResult { hits, mode: SearchMode::Keyword, plan: None, timings }
            }
        }
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

/// A small LRU of query vectors.
#[derive(Default)]
struct QueryCache {
    map: HashMap<String, (Arc<Vec<f32>>, u64)>,
    tick: u64,
}

impl QueryCache {
    fn get(&mut self, text: &str) -> Option<Arc<Vec<f32>>> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(text).map(|(v, t)| {
            *t = tick;
            v.clone()
        })
    }

    fn put(&mut self, text: &str, v: Arc<Vec<f32>>) {
        self.tick += 1;
        if self.map.len() >= QUERY_CACHE
            && let Some(oldest) = self.map.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone())
        {
            self.map.remove(&oldest);
        }
        self.map.insert(text.to_string(), (v, self.tick));
    }
}

#[cfg(test)]
mod tests;
