//! `toolmux eval-verdict`: how often find_tool's `match` verdict is right.
//!
//! Three kinds of queries, all through find_tool's search path:
//! - answerable: each set's own queries against its own catalog (should stay `good`);
//! - no-fit: each set's queries against every other set's catalog, keeping only queries whose
//!   gold tools are all far from that catalog (cosine below [`NO_FIT_OVERLAP`] to every one of its
//!   tools, so a weather question is not asked of a catalog that also has a weather tool); these
//!   should be flagged `weak` or `none`;
//! - other languages (`--multilingual`): translated answerable queries, which the English-only
//!   model cannot match with confidence; these should be flagged too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::embed::Embedder;
use crate::index::AllowList;
use crate::store::{Generation, Query, Ranker, Store, Verdict};

use super::{EvalQuery, catalog, read_jsonl};

/// A cross-set query counts as no-fit when each of its gold tools has a cosine similarity below
/// this to every tool of the other catalog. Checked by reading the surviving pairs with the
/// highest similarity: above 0.4 related tools (weather, sports scores, QR codes) slip through.
pub const NO_FIT_OVERLAP: f32 = 0.4;

struct Set {
    name: String,
    generation: Arc<Generation>,
    queries: Vec<EvalQuery>,
}

/// Counts of verdicts.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    good: usize,
    weak: usize,
    none: usize,
}

impl Tally {
    fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Good => self.good += 1,
            Verdict::Weak => self.weak += 1,
            Verdict::None => self.none += 1,
        }
    }

    fn total(&self) -> usize {
        self.good + self.weak + self.none
    }

    fn pct(&self, n: usize) -> f64 {
        100.0 * n as f64 / self.total().max(1) as f64
    }

    fn row(&self, label: &str, want: &str) {
        println!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} | {want} |",
            self.total(),
            self.pct(self.good),
            self.pct(self.weak),
            self.pct(self.none)
        );
    }
}

async fn verdict(store: &Store, generation: &Generation, text: &str) -> Verdict {
    let allow = AllowList::all(generation.catalog.len());
    let query = Query { description: text.to_string(), keywords: Vec::new() };
    store.search(generation, &allow, &query, 8, Ranker::Fused).await.verdict
}

/// Whether some gold tool of `q` (in `own`) is close to a tool of `other`.
fn overlaps(own: &Generation, other: &Generation, q: &EvalQuery) -> bool {
    let (Some(a), Some(b)) = (&own.dense, &other.dense) else { return true };
    q.gold.iter().filter_map(|g| own.catalog.tools().iter().position(|t| t.name() == g)).any(|slot| {
        let v = a.vector(slot as u32);
        (0..b.len() as u32).any(|t| crate::index::dense::dot(v, b.vector(t)) >= NO_FIT_OVERLAP)
    })
}

pub async fn run(sets: &[PathBuf], multilingual: Option<&Path>, model_dir: Option<&Path>) -> anyhow::Result<()> {
    let files = crate::embed::files::locate(
        crate::config::DEFAULT_MODEL,
        model_dir,
        &crate::embed::files::default_model_roots(),
        true,
    )?;
    let embedder: Arc<dyn Embedder> = Arc::new(crate::embed::worker::ModelEmbedder::start(&files)?);
    let cache = crate::embed::cache::VectorCache::open(
        crate::embed::cache::default_dir().as_deref(),
        embedder.model_id(),
        embedder.dim(),
    )
    .ok();
    let store = Store::new(Some(embedder), cache);
    let mut loaded = Vec::new();
    for dir in sets {
        let generation = store.rebuild(catalog(&dir.join("tools.jsonl"))?).await;
        let queries: Vec<EvalQuery> = read_jsonl(&dir.join("queries.dev.jsonl"))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        loaded.push(Set { name, generation, queries });
    }
    println!("| queries | n | good % | weak % | none % | wanted |");
    println!("|---|---:|---:|---:|---:|---|");
    let (mut answerable, mut no_fit) = (Tally::default(), Tally::default());
    for set in &loaded {
        let mut t = Tally::default();
        for q in &set.queries {
            t.add(verdict(&store, &set.generation, &q.query).await);
        }
        t.row(&format!("{} on its own catalog (answerable)", set.name), "good ≥ 95 %");
        answerable.good += t.good;
        answerable.weak += t.weak;
        answerable.none += t.none;
    }
    for set in &loaded {
        for other in loaded.iter().filter(|o| o.name != set.name) {
            let mut t = Tally::default();
            for q in set.queries.iter().filter(|q| !overlaps(&set.generation, &other.generation, q)) {
                t.add(verdict(&store, &other.generation, &q.query).await);
            }
            t.row(&format!("{} on {}'s catalog (no fit)", set.name, other.name), "weak + none ≥ 90 %");
            no_fit.good += t.good;
            no_fit.weak += t.weak;
            no_fit.none += t.none;
        }
    }
    answerable.row("all answerable", "good ≥ 95 %");
    no_fit.row("all no-fit", "weak + none ≥ 90 %");
    if let Some(path) = multilingual {
        #[derive(serde::Deserialize)]
        struct Translated {
            query: String,
            lang: String,
        }
        let queries: Vec<Translated> = read_jsonl(path)?;
        let target = loaded.iter().find(|s| s.name == "metatool").or(loaded.first());
        if let Some(set) = target {
            let mut t = Tally::default();
            let mut langs: Vec<&str> = Vec::new();
            for q in &queries {
                t.add(verdict(&store, &set.generation, &q.query).await);
                if !langs.contains(&q.lang.as_str()) {
                    langs.push(&q.lang);
                }
            }
            t.row(&format!("translated ({}) on {}'s catalog", langs.join(", "), set.name), "weak + none");
        }
    }
    Ok(())
}
