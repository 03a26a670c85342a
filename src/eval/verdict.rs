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
pub struct Tally {
    pub good: usize,
    pub weak: usize,
    pub none: usize,
}

/// What [`measure`] found: one row per kind of query, and what is wanted of it.
#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    pub kind: Kind,
    pub tally: Tally,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Answerable,
    NoFit,
    Translated,
}

impl Tally {
    fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Good => self.good += 1,
            Verdict::Weak => self.weak += 1,
            Verdict::None => self.none += 1,
        }
    }

    pub fn total(&self) -> usize {
        self.good + self.weak + self.none
    }

    pub fn pct(&self, n: usize) -> f64 {
        100.0 * n as f64 / self.total().max(1) as f64
    }

    /// Share of queries flagged weak or none, ×100.
    pub fn flagged(&self) -> f64 {
        self.pct(self.weak + self.none)
    }

    fn merge(&mut self, other: &Tally) {
        self.good += other.good;
        self.weak += other.weak;
        self.none += other.none;
    }

    /// Every row of `kind` counted together.
    pub fn pooled(rows: &[Row], kind: Kind) -> Tally {
        let mut pooled = Tally::default();
        rows.iter().filter(|r| r.kind == kind).for_each(|r| pooled.merge(&r.tally));
        pooled
    }

    fn print(&self, label: &str, want: &str) {
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
        (0..b.len() as u32).any(|t| b.similarity(&v, t) >= NO_FIT_OVERLAP)
    })
}

/// Asks each kind of query and counts the verdicts.
pub async fn measure(
    sets: &[PathBuf],
    multilingual: Option<&Path>,
    model_dir: Option<&Path>,
) -> anyhow::Result<Vec<Row>> {
    let (_, store) = super::model_store(model_dir)?;
    let mut loaded = Vec::new();
    for dir in sets {
        let generation = store.rebuild(catalog(&dir.join("tools.jsonl"))?).await;
        let queries: Vec<EvalQuery> = read_jsonl(&dir.join("queries.dev.jsonl"))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        loaded.push(Set { name, generation, queries });
    }
    let mut rows = Vec::new();
    for set in &loaded {
        let mut tally = Tally::default();
        for q in &set.queries {
            tally.add(verdict(&store, &set.generation, &q.query).await);
        }
        rows.push(Row {
            label: format!("{} on its own catalog (answerable)", set.name),
            kind: Kind::Answerable,
            tally,
        });
    }
    for set in &loaded {
        for other in loaded.iter().filter(|o| o.name != set.name) {
            let mut tally = Tally::default();
            for q in set.queries.iter().filter(|q| !overlaps(&set.generation, &other.generation, q)) {
                tally.add(verdict(&store, &other.generation, &q.query).await);
            }
            rows.push(Row {
                label: format!("{} on {}'s catalog (no fit)", set.name, other.name),
                kind: Kind::NoFit,
                tally,
            });
        }
    }
    if let Some(path) = multilingual {
        #[derive(serde::Deserialize)]
        struct Translated {
            query: String,
            lang: String,
        }
        let queries: Vec<Translated> = read_jsonl(path)?;
        if let Some(set) = loaded.iter().find(|s| s.name == "metatool").or(loaded.first()) {
            let mut tally = Tally::default();
            let mut langs: Vec<&str> = Vec::new();
            for q in &queries {
                tally.add(verdict(&store, &set.generation, &q.query).await);
                if !langs.contains(&q.lang.as_str()) {
                    langs.push(&q.lang);
                }
            }
            rows.push(Row {
                label: format!("translated ({}) on {}'s catalog", langs.join(", "), set.name),
                kind: Kind::Translated,
                tally,
            });
        }
    }
    Ok(rows)
}

/// `toolmux eval-verdict`: [`measure`], printed as a table with the pooled rows.
pub async fn run(sets: &[PathBuf], multilingual: Option<&Path>, model_dir: Option<&Path>) -> anyhow::Result<()> {
    let rows = measure(sets, multilingual, model_dir).await?;
    println!("| queries | n | good % | weak % | none % | wanted |");
    println!("|---|---:|---:|---:|---:|---|");
    let want = |k: Kind| match k {
        Kind::Answerable => "good ≥ 95 %",
        Kind::NoFit => "weak + none ≥ 90 %",
        Kind::Translated => "weak + none",
    };
    for r in rows.iter().filter(|r| r.kind != Kind::Translated) {
        r.tally.print(&r.label, want(r.kind));
    }
    for (kind, label) in [(Kind::Answerable, "all answerable"), (Kind::NoFit, "all no-fit")] {
        Tally::pooled(&rows, kind).print(label, want(kind));
    }
    for r in rows.iter().filter(|r| r.kind == Kind::Translated) {
        r.tally.print(&r.label, want(r.kind));
    }
    Ok(())
}
