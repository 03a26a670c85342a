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

use crate::catalog::ToolKey;
use crate::index::AllowList;
use crate::store::adapter;
use crate::store::learned::Learned;
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
    let loaded = load(&store, sets).await?;
    measure_loaded(&store, &loaded, multilingual).await
}

/// Each set's catalog indexed, with its queries.
async fn load(store: &Store, sets: &[PathBuf]) -> anyhow::Result<Vec<Set>> {
    let mut loaded = Vec::new();
    for dir in sets {
        let generation = store.rebuild(catalog(&dir.join("tools.jsonl"))?).await;
        let queries: Vec<EvalQuery> = read_jsonl(&dir.join("queries.dev.jsonl"))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        loaded.push(Set { name, generation, queries });
    }
    Ok(loaded)
}

async fn measure_loaded(store: &Store, loaded: &[Set], multilingual: Option<&Path>) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for set in loaded {
        let mut tally = Tally::default();
        for q in &set.queries {
            tally.add(verdict(store, &set.generation, &q.query).await);
        }
        rows.push(Row {
            label: format!("{} on its own catalog (answerable)", set.name),
            kind: Kind::Answerable,
            tally,
        });
    }
    for set in loaded {
        for other in loaded.iter().filter(|o| o.name != set.name) {
            let mut tally = Tally::default();
            for q in set.queries.iter().filter(|q| !overlaps(&set.generation, &other.generation, q)) {
                tally.add(verdict(store, &other.generation, &q.query).await);
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
                tally.add(verdict(store, &set.generation, &q.query).await);
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

/// Folds of the replay in [`measure_learning`].
const FOLDS: usize = 2;
/// The familiarity thresholds the replay tries.
const FAMILIAR: [f32; 8] = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7];
/// The cosines below which the replay tries calling a request `none`.
const NONE_BELOW: [f32; 6] = [0.28, 0.3, 0.32, 0.34, 0.36, 0.38];

/// One request of the replay: what its verdict is made of.
struct Replayed {
    /// The catalog asked, by its place among the sets, and the fold.
    set: usize,
    fold: usize,
    kind: Kind,
    /// The best cosine of the tools returned, and whether the model reads the request's script.
    best: f32,
    readable: bool,
    /// How familiar the tool find_tool put first is ([`Learned::familiarity`]), if its labels
    /// count.
    familiar: Option<f32>,
}

/// The thresholds of a verdict: a first tool at least `familiar` is a good match (never if
/// `None`), and a best cosine under `none_below` is `none`.
#[derive(Clone, Copy)]
struct Thresholds {
    familiar: Option<f32>,
    none_below: f32,
}

const SHIPPED: Thresholds =
    Thresholds { familiar: Some(crate::store::learned::FAMILIAR), none_below: crate::store::NONE_BELOW };

async fn ask(store: &Store, set: &Set, text: &str, learned: Option<&Learned>) -> crate::store::SearchResult {
    let allow = AllowList::all(set.generation.catalog.len());
    let query = Query { description: text.to_string(), keywords: Vec::new() };
    store.search_learning(&set.generation, &allow, &query, 8, Ranker::Fused, learned).await
}

/// The verdicts when learning knows something: each set's queries replayed as in
/// `eval-learning` (two folds, one half teaching what the other half is then asked, each query a
/// principal of its own), answerable queries asked of their own catalog and no-fit ones (the
/// other sets' queries, as in [`measure`], split between the folds) asked of it with what its
/// teaching half taught.
async fn measure_learning(store: &Store, dim: usize, loaded: &[Set], salt: u64) -> anyhow::Result<Vec<Replayed>> {
    let mut out = Vec::new();
    for (n, set) in loaded.iter().enumerate() {
        let mut vectors = Vec::new();
        for q in &set.queries {
            let r = ask(store, set, &q.query, None).await;
            vectors.push(r.vector.ok_or_else(|| anyhow::anyhow!("the model did not embed a query"))?);
        }
        let no_fit: Vec<&EvalQuery> = loaded
            .iter()
            .filter(|o| o.name != set.name)
            .flat_map(|o| o.queries.iter().filter(|q| !overlaps(&o.generation, &set.generation, q)))
            .collect();
        for fold in 0..FOLDS {
            let learned = Learned::new(true, dim, None).salted(salt);
            for (i, q) in set.queries.iter().enumerate().filter(|(i, _)| i % FOLDS != fold) {
                for g in &q.gold {
                    learned.record(
                        &vectors[i],
                        &ToolKey { backend: "eval".into(), tool: g.as_str().into() },
                        &i.to_string(),
                    );
                }
            }
            // The query adapter, fitted and judged as the gateway's fitter does: it moves the
            // first tool, whose familiarity and cosine the verdict then reads.
            let (keys, tools) = set.generation.tool_vectors().ok_or_else(|| anyhow::anyhow!("no tool vectors"))?;
            if let Some(fitted) = learned.fit(&keys, &tools, adapter::Settings::default(), &|| false) {
                eprintln!(
                    "  {} fold {fold}: adapter {}",
                    set.name,
                    if fitted.judged.served() { "served" } else { "not served" }
                );
                let version = learned.next_version();
                learned.install(fitted, version);
            }
            let asked =
                set.queries.iter().enumerate().filter(|(i, _)| i % FOLDS == fold).map(|(_, q)| (Kind::Answerable, q));
            let strangers =
                no_fit.iter().enumerate().filter(|(i, _)| i % FOLDS == fold).map(|(_, q)| (Kind::NoFit, *q));
            for (kind, q) in asked.chain(strangers) {
                let r = ask(store, set, &q.query, Some(&learned)).await;
                let familiar = match (r.hits.first(), &r.vector) {
                    (Some(h), Some(v)) if learned.active() => {
                        learned.familiarity(v, &set.generation.catalog.tools()[h.slot as usize].key).map(|f| f.0)
                    }
                    _ => None,
                };
                let best = r.similarity.iter().copied().fold(f32::MIN, f32::max);
                let readable = !crate::catalog::text::mostly_non_latin(&q.query);
                out.push(Replayed { set: n, fold, kind, best, readable, familiar });
            }
        }
    }
    Ok(out)
}

impl Replayed {
    /// The verdict under `at`, as [`Store::search_learning`] gives it.
    fn verdict(&self, at: Thresholds) -> Verdict {
        match (at.familiar, self.familiar) {
            _ if !self.readable => Verdict::None,
            (Some(t), Some(f)) if f >= t => Verdict::Good,
            _ => Verdict::of_cosine(self.best, at.none_below),
        }
    }
}

/// Per set the answerable verdicts, then all answerable, then all no-fit, each request with the
/// thresholds `at` gives it.
fn tallies(replayed: &[Replayed], sets: usize, at: impl Fn(&Replayed) -> Thresholds) -> Vec<Tally> {
    let mut t = vec![Tally::default(); sets + 2];
    for r in replayed {
        let v = r.verdict(at(r));
        if r.kind == Kind::Answerable {
            t[r.set].add(v);
            t[sets].add(v);
        } else {
            t[sets + 1].add(v);
        }
    }
    t
}

/// One row: each answerable tally's share of `verdict`, then the no-fit figures.
fn print_replay(label: &str, t: &[Tally], verdict: Verdict) {
    let (answerable, no_fit) = (&t[..t.len() - 1], &t[t.len() - 1]);
    let share = |a: &Tally| match verdict {
        Verdict::Good => a.pct(a.good),
        Verdict::Weak => a.pct(a.weak),
        Verdict::None => a.pct(a.none),
    };
    let cells: Vec<String> = answerable.iter().map(|a| format!("{:.1} (n {})", share(a), a.total())).collect();
    println!(
        "| {label} | {} | {:.1} (n {}) | {:.1} |",
        cells.join(" | "),
        no_fit.flagged(),
        no_fit.total(),
        no_fit.pct(no_fit.none)
    );
}

/// The replay of [`measure_learning`] at find_tool's thresholds: per set its answerable
/// requests, then all answerable, then all no-fit.
pub async fn replay(sets: &[PathBuf], model_dir: Option<&Path>, salt: u64) -> anyhow::Result<Vec<Tally>> {
    let (embedder, store) = super::model_store(model_dir)?;
    let loaded = load(&store, sets).await?;
    let replayed = measure_learning(&store, embedder.dim(), &loaded, salt).await?;
    Ok(tallies(&replayed, loaded.len(), |_| SHIPPED))
}

/// `toolmux eval-verdict`: [`measure`], printed as a table with the pooled rows.
pub async fn run(
    sets: &[PathBuf],
    multilingual: Option<&Path>,
    model_dir: Option<&Path>,
    salt: u64,
) -> anyhow::Result<()> {
    let (embedder, store) = super::model_store(model_dir)?;
    let loaded = load(&store, sets).await?;
    let rows = measure_loaded(&store, &loaded, multilingual).await?;
    println!("| queries | n | good % | weak % | none % | wanted |");
    println!("|---|---:|---:|---:|---:|---|");
    let want = |k: Kind| match k {
        Kind::Answerable => "good ≥ 90 %",
        Kind::NoFit => "weak + none ≥ 90 %, none ≥ 50 %",
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
    let replayed = measure_learning(&store, embedder.dim(), &loaded, salt).await?;
    // Chosen on one fold, scored on the other: the first threshold of `grid` whose verdicts on
    // the other fold's no-fit requests pass `wanted`.
    let chosen = |grid: &[f32], at: &dyn Fn(f32) -> Thresholds, wanted: &dyn Fn(&Tally) -> bool| -> Vec<f32> {
        (0..FOLDS)
            .map(|fold| {
                let found = grid.iter().copied().find(|&x| {
                    let mut no_fit = Tally::default();
                    replayed
                        .iter()
                        .filter(|r| r.fold != fold && r.kind == Kind::NoFit)
                        .for_each(|r| no_fit.add(r.verdict(at(x))));
                    wanted(&no_fit)
                });
                found.unwrap_or(f32::INFINITY)
            })
            .collect()
    };
    let listed = |c: &[f32]| c.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ");
    println!();
    println!(
        "With learning (each set's queries replayed in two folds): the first tool is a good match when requests \
         like this one led to it"
    );
    let names = |what: &str| loaded.iter().map(|s| format!("{} answerable {what} %", s.name)).collect::<Vec<_>>();
    let header = |first: &str, what: &str| {
        println!(
            "| {first} | {} | all answerable {what} % | no-fit weak + none % | no-fit none % |",
            names(what).join(" | ")
        );
        println!("|---|{}---:|---:|---:|", "---:|".repeat(loaded.len()));
    };
    header("familiar at", "good");
    let with_familiar = |f: Option<f32>| Thresholds { familiar: f, ..SHIPPED };
    for f in std::iter::once(None).chain(FAMILIAR.iter().map(|&t| Some(t))) {
        let t = tallies(&replayed, loaded.len(), |_| with_familiar(f));
        print_replay(&f.map_or("never".to_string(), |t| t.to_string()), &t, Verdict::Good);
    }
    // The lowest that keeps 90 % of the no-fit requests flagged.
    let picks = chosen(&FAMILIAR, &|f| with_familiar(Some(f)), &|t| t.flagged() >= 90.0);
    let t = tallies(&replayed, loaded.len(), |r| with_familiar(Some(picks[r.fold])));
    print_replay(&format!("chosen by the other fold ({})", listed(&picks)), &t, Verdict::Good);
    let t = tallies(&replayed, loaded.len(), |_| SHIPPED);
    print_replay(&format!("**find_tool now ({})**", crate::store::learned::FAMILIAR), &t, Verdict::Good);

    println!();
    println!(
        "The same replay, with the first tool familiar at {}: where `none` begins",
        crate::store::learned::FAMILIAR
    );
    header("none below", "none");
    let with_none = |none_below: f32| Thresholds { none_below, ..SHIPPED };
    for nb in NONE_BELOW {
        print_replay(&nb.to_string(), &tallies(&replayed, loaded.len(), |_| with_none(nb)), Verdict::None);
    }
    // The lowest that calls half the no-fit requests `none`.
    let picks = chosen(&NONE_BELOW, &with_none, &|t| t.pct(t.none) >= 50.0);
    let t = tallies(&replayed, loaded.len(), |r| with_none(picks[r.fold]));
    print_replay(&format!("chosen by the other fold ({})", listed(&picks)), &t, Verdict::None);
    let t = tallies(&replayed, loaded.len(), |_| SHIPPED);
    print_replay(&format!("**find_tool now ({})**", crate::store::NONE_BELOW), &t, Verdict::None);
    Ok(())
}
