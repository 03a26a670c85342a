//! `toolmux eval-learning`: what learning from use does to find_tool's ranking, measured by
//! replaying each set's dev queries as traffic. Two folds: the queries of one half are labels
//! (the request found its gold tools, as a call after a find_tool would say), the other half is
//! ranked with what was learned, and the other way round, so every query is ranked once, by
//! what other queries taught. Each weight and label minimum is scored on every set; the
//! setting shipped is chosen by the other sets (an unseen catalog decides), see docs/search.md.

use std::path::PathBuf;
use std::sync::Arc;

use super::{EvalQuery, Metrics, catalog, model_store, read_jsonl};
use crate::catalog::ToolKey;
use crate::index::AllowList;
use crate::store::adapter::{self, Judged, OFFSET};
use crate::store::learned::{self, Learned};
use crate::store::{Query, Ranker};

const FOLDS: usize = 2;
const WEIGHTS: [f32; 4] = [0.5, 1.0, 2.0, 4.0];
const MIN_LABELS: [u32; 3] = [1, 2, 3];

/// One replayed query.
struct Replayed {
    vector: Arc<Vec<f32>>,
    gold: Vec<String>,
    /// find_tool's ranking with nothing learned.
    plain: Vec<String>,
}

struct Set {
    name: String,
    queries: Vec<Replayed>,
    /// Per setting of the grid, every query's ranking with what the other half taught.
    rerank: Vec<Vec<Vec<String>>>,
    /// Per row of [`ADAPTER_ROWS`], every query's ranking.
    adapted: Vec<Vec<Vec<String>>>,
    /// Each fold's fit, as the guard judged it.
    fits: Vec<Judged>,
    /// Per query, how many queries of the other half asked for its gold tool (the fewest over
    /// its gold tools): what learning had to go on for it.
    taught: Vec<usize>,
}

/// The columns of the breakdown by [`Set::taught`]: 0, 1, 2, and this many or more.
const TAUGHT_GROUPS: usize = 4;

/// For each query, how many queries of the other folds name each of its gold tools, the fewest.
fn taught(queries: &[Replayed]) -> Vec<usize> {
    let mut asked: Vec<std::collections::HashMap<&str, usize>> = vec![Default::default(); FOLDS];
    for (i, q) in queries.iter().enumerate() {
        for g in &q.gold {
            *asked[i % FOLDS].entry(g.as_str()).or_default() += 1;
        }
    }
    let other = |fold: usize, tool: &str| {
        (0..FOLDS).filter(|&f| f != fold).map(|f| asked[f].get(tool).copied().unwrap_or(0)).sum()
    };
    queries.iter().enumerate().map(|(i, q)| q.gold.iter().map(|g| other(i % FOLDS, g)).min().unwrap_or(0)).collect()
}

/// The rows that measure the query adapter: (label, ranker, weight of the per-tool bonus,
/// adapter served as the guard decides or always, what the dense arm takes back from learned
/// tools while it is served).
const ADAPTER_ROWS: [(&str, Ranker, f32, Serve, f32); 8] = [
    ("dense only, nothing learned", Ranker::DenseOnly, 0.0, Serve::Never, OFFSET),
    ("dense only, adapter as the guard decides", Ranker::DenseOnly, 0.0, Serve::Guarded, OFFSET),
    ("dense only, adapter always", Ranker::DenseOnly, 0.0, Serve::Always, OFFSET),
    ("fused, adapter alone (no per-tool bonus), always", Ranker::Fused, 0.0, Serve::Always, OFFSET),
    ("learned + adapter as the guard decides, nothing taken back", Ranker::Fused, learned::WEIGHT, Serve::Guarded, 0.0),
    ("**learned (shipped) + adapter as the guard decides**", Ranker::Fused, learned::WEIGHT, Serve::Guarded, OFFSET),
    ("learned (shipped) + adapter always", Ranker::Fused, learned::WEIGHT, Serve::Always, OFFSET),
    (
        "learned (shipped) + adapter, beside one principal giving every labelled tool 4 labels of unrelated requests",
        Ranker::Fused,
        learned::WEIGHT,
        Serve::Poisoned,
        OFFSET,
    ),
];

#[derive(Clone, Copy, PartialEq)]
enum Serve {
    Never,
    Guarded,
    Always,
    /// As the guard decides after one more principal labelled every labelled tool with other
    /// requests (as many as it may: 4 per tool), fitted anew.
    Poisoned,
}

fn score(rankings: impl Iterator<Item = (Vec<String>, Vec<String>)>) -> (f64, f64) {
    let mut m = Metrics::default();
    let mut n = 0;
    for (ranked, gold) in rankings {
        m.add(&ranked, &gold);
        n += 1;
    }
    let a = m.averaged(n);
    (a.r8, a.mrr10)
}

impl Set {
    /// R@8 and MRR@10 of one ranking of every query of the set.
    fn scored(&self, rankings: &[Vec<String>]) -> (f64, f64) {
        score(rankings.iter().zip(&self.queries).map(|(r, q)| (r.clone(), q.gold.clone())))
    }
}

/// The grid of per-tool bonus settings every set is replayed under: (weight, label minimum).
fn grid() -> Vec<(f32, u32)> {
    WEIGHTS.iter().flat_map(|&w| MIN_LABELS.iter().map(move |&m| (w, m))).collect()
}

/// Where the shipped bonus setting sits in [`grid`].
fn shipped() -> Option<usize> {
    grid().iter().position(|&(w, m)| w == learned::WEIGHT && m == learned::MIN_LABELS)
}

/// Replays `sets` under each key of `salts`. One key prints every table; several print the
/// adapter's rows key by key with their mean (the fits' spread over keys is about a point, so
/// a setting is judged on the mean).
pub async fn run(sets: &[PathBuf], model_dir: Option<&std::path::Path>, salts: &[u64]) -> anyhow::Result<()> {
    match salts {
        [] => anyhow::bail!("give at least one key (--salt)"),
        [salt] => {
            let loaded = replay(sets, model_dir, *salt, &grid()).await?;
            report(&loaded);
        }
        _ => {
            let mut by_key = Vec::new();
            for &salt in salts {
                eprintln!("key {salt}:");
                by_key.push(replay(sets, model_dir, salt, &grid()).await?);
            }
            report_keys(salts, &by_key);
        }
    }
    Ok(())
}

/// R@8 of the adapter's rows per set, one column per key and their mean.
fn report_keys(salts: &[u64], by_key: &[Vec<Set>]) {
    let keys: Vec<String> = salts.iter().map(|k| format!("key {k}")).collect();
    for (s, set) in by_key[0].iter().enumerate() {
        println!("{}: R@8 under each key", set.name);
        println!("| ranking | {} | mean |", keys.join(" | "));
        println!("|---|{}---:|", "---:|".repeat(keys.len()));
        let row = |label: &str, r8: &dyn Fn(&Set) -> f64| {
            let cells: Vec<f64> = by_key.iter().map(|sets| r8(&sets[s])).collect();
            let mean = cells.iter().sum::<f64>() / cells.len() as f64;
            let cells: Vec<String> = cells.iter().map(|c| format!("{c:.2}")).collect();
            println!("| {label} | {} | {mean:.2} |", cells.join(" | "));
        };
        if let Some(c) = shipped() {
            row("learned, per-tool bonus (shipped)", &|set| set.scored(&set.rerank[c]).0);
        }
        for (r, (label, ..)) in ADAPTER_ROWS.iter().enumerate() {
            row(label, &|set| set.scored(&set.adapted[r]).0);
        }
        println!();
    }
}

/// Every set replayed under one key, the per-tool bonus under each setting of `grid`: what each
/// half taught, ranked on the other.
async fn replay(
    sets: &[PathBuf],
    model_dir: Option<&std::path::Path>,
    salt: u64,
    grid: &[(f32, u32)],
) -> anyhow::Result<Vec<Set>> {
    let (embedder, store) = model_store(model_dir)?;
    let mut loaded = Vec::new();
    for dir in sets {
        eprintln!("replaying {} ...", dir.display());
        let generation = store.rebuild(catalog(&dir.join("tools.jsonl"))?).await;
        let raw: Vec<EvalQuery> = read_jsonl(&dir.join("queries.dev.jsonl"))?;
        let allow = AllowList::all(generation.catalog.len());
        let names = |hits: &[crate::index::Hit]| -> Vec<String> {
            hits.iter().map(|h| generation.catalog.tools()[h.slot as usize].name().to_string()).collect()
        };
        let mut queries = Vec::new();
        for q in &raw {
            let query = Query { description: q.query.clone(), keywords: Vec::new() };
            let r = store.search_learning(&generation, &allow, &query, 10, Ranker::Fused, None).await;
            let vector = r.vector.clone().ok_or_else(|| anyhow::anyhow!("the model did not embed a query"))?;
            queries.push(Replayed { vector, gold: q.gold.clone(), plain: names(&r.hits) });
        }
        let mut rerank = Vec::new();
        for &(weight, min_labels) in grid {
            let mut ranked = vec![Vec::new(); raw.len()];
            for fold in 0..FOLDS {
                let learned = Learned::new(true, embedder.dim(), None).salted(salt).tuned(weight, min_labels);
                // Each query stands for a caller of its own.
                for (i, q) in queries.iter().enumerate().filter(|(i, _)| i % FOLDS != fold) {
                    for g in &q.gold {
                        let tool = ToolKey { backend: "eval".into(), tool: g.as_str().into() };
                        learned.record(&q.vector, &tool, &i.to_string());
                    }
                }
                for (i, q) in raw.iter().enumerate().filter(|(i, _)| i % FOLDS == fold) {
                    let query = Query { description: q.query.clone(), keywords: Vec::new() };
                    let r = store.search_learning(&generation, &allow, &query, 10, Ranker::Fused, Some(&learned)).await;
                    ranked[i] = names(&r.hits);
                }
            }
            rerank.push(ranked);
        }
        // The adapter: fitted per fold on the labels of the other half, as a gateway would.
        let (keys, tools) = generation.tool_vectors().ok_or_else(|| anyhow::anyhow!("no tool vectors"))?;
        let mut adapted = vec![vec![Vec::new(); raw.len()]; ADAPTER_ROWS.len()];
        let mut fits = Vec::new();
        let settings = adapter::Settings::default();
        for fold in 0..FOLDS {
            let teach = |weight: f32, offset: f32| {
                let learned = Learned::new(true, embedder.dim(), None)
                    .salted(salt)
                    .tuned(weight, learned::MIN_LABELS)
                    .offset(offset);
                for (i, q) in queries.iter().enumerate().filter(|(i, _)| i % FOLDS != fold) {
                    for g in &q.gold {
                        let tool = ToolKey { backend: "eval".into(), tool: g.as_str().into() };
                        learned.record(&q.vector, &tool, &i.to_string());
                    }
                }
                learned
            };
            let probe = teach(0.0, OFFSET);
            let started = std::time::Instant::now();
            let fit = probe.fit(&keys, &tools, settings, &|| false);
            let judged = fit.as_ref().map(|f| f.judged.clone());
            if let Some(f) = fit {
                let version = probe.next_version();
                probe.install(f, version);
            }
            let fitted = match judged {
                Some(j) => {
                    eprintln!(
                        "  fold {fold}: {} labels fitted, {} held back, recall@8 {:.1} -> {:.1} ({}), {:.1} s",
                        j.fitted,
                        j.held_out,
                        j.plain,
                        j.adapted,
                        if j.served() { "served" } else { "not served" },
                        started.elapsed().as_secs_f64()
                    );
                    fits.push(j.clone());
                    // The same fit, served whatever the guard said.
                    let rows: std::collections::HashMap<&str, usize> =
                        keys.iter().enumerate().map(|(i, k)| (&*k.tool, i)).collect();
                    let examples = probe.examples(|_, t| rows.get(t).copied());
                    let all: Vec<_> = examples.into_iter().filter(|e| e.teaches).collect();
                    adapter::fit(&all, &tools, embedder.dim(), settings, salt, &|| false).map(|a| (a, j))
                }
                None => {
                    eprintln!("  fold {fold}: too few labels to fit");
                    None
                }
            };
            for (r, &(_, ranker, weight, serve, offset)) in ADAPTER_ROWS.iter().enumerate() {
                let learned = teach(weight, offset);
                match (serve, &fitted) {
                    (Serve::Always, Some((a, _))) => learned.serve(Some(a.clone())),
                    (Serve::Guarded, _) => learned.serve(probe.served().map(|a| (*a).clone())),
                    (Serve::Poisoned, _) => {
                        let taught: Vec<usize> = (0..queries.len()).filter(|i| i % FOLDS != fold).collect();
                        for (n, &i) in taught.iter().enumerate() {
                            for g in &queries[i].gold {
                                let tool = ToolKey { backend: "eval".into(), tool: g.as_str().into() };
                                for k in 1..=4 {
                                    let other = taught[(n + k * 7) % taught.len()];
                                    learned.record(&queries[other].vector, &tool, "mallory");
                                }
                            }
                        }
                        if let Some(f) = learned.fit(&keys, &tools, settings, &|| false) {
                            learned.install(f, 1);
                        }
                    }
                    _ => {}
                }
                for (i, q) in raw.iter().enumerate().filter(|(i, _)| i % FOLDS == fold) {
                    let query = Query { description: q.query.clone(), keywords: Vec::new() };
                    let r2 = store.search_learning(&generation, &allow, &query, 10, ranker, Some(&learned)).await;
                    adapted[r][i] = names(&r2.hits);
                }
            }
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let taught = taught(&queries);
        loaded.push(Set { name, queries, rerank, adapted, fits, taught });
    }
    Ok(loaded)
}

/// What learning gives one set under one key, R@8 of each ranking (percent): the figures
/// docs/search.md reports and `tests/it/quality.rs` holds it to.
#[derive(Debug, Clone)]
pub struct Learning {
    pub set: String,
    /// The per-tool bonus as shipped, no adapter.
    pub bonus: f64,
    /// The bonus and the adapter as the guard decides, nothing taken back.
    pub adapter_whole: f64,
    /// The bonus and the adapter as the guard decides, the offset taken back (shipped).
    pub shipped: f64,
    /// Folds whose fit the guard served.
    pub served: usize,
}

/// Replays `sets` under `salt` with the shipped settings only (the grid's other settings are
/// `run`'s to report).
pub async fn measure(
    sets: &[PathBuf],
    model_dir: Option<&std::path::Path>,
    salt: u64,
) -> anyhow::Result<Vec<Learning>> {
    let only = [(learned::WEIGHT, learned::MIN_LABELS)];
    let guarded = |offset: f32| {
        let row = ADAPTER_ROWS.iter().position(|&(_, ranker, weight, serve, o)| {
            ranker == Ranker::Fused && weight == learned::WEIGHT && serve == Serve::Guarded && o == offset
        });
        row.expect("the adapter's rows hold the shipped ranking with and without the offset")
    };
    let (whole, shipped) = (guarded(0.0), guarded(OFFSET));
    let loaded = replay(sets, model_dir, salt, &only).await?;
    Ok(loaded
        .iter()
        .map(|s| Learning {
            set: s.name.clone(),
            bonus: s.scored(&s.rerank[0]).0,
            adapter_whole: s.scored(&s.adapted[whole]).0,
            shipped: s.scored(&s.adapted[shipped]).0,
            served: s.fits.iter().filter(|j| j.served()).count(),
        })
        .collect())
}

/// Every table of one key's replay.
fn report(loaded: &[Set]) {
    let grid = grid();
    let names: Vec<&str> = loaded.iter().map(|s| s.name.as_str()).collect();
    println!("R@8 / MRR@10, every query ranked by what the other half of its set taught:");
    println!("| ranking | {} |", names.join(" | "));
    println!("|---|{}", "---:|".repeat(names.len()));
    let base: Vec<(f64, f64)> =
        loaded.iter().map(|s| score(s.queries.iter().map(|q| (q.plain.clone(), q.gold.clone())))).collect();
    let cell = |(r, m): (f64, f64)| format!("{r:.2} / {m:.2}");
    println!("| find_tool, nothing learned | {} |", base.iter().map(|x| cell(*x)).collect::<Vec<_>>().join(" | "));
    let scored: Vec<Vec<(f64, f64)>> =
        (0..grid.len()).map(|c| loaded.iter().map(|s| s.scored(&s.rerank[c])).collect()).collect();
    for (c, &(w, m)) in grid.iter().enumerate() {
        let row: Vec<String> = scored[c].iter().map(|x| cell(*x)).collect();
        println!("| learned, weight {w}, at least {m} labels | {} |", row.join(" | "));
    }
    if loaded.len() > 1 {
        let gain = |c: usize, s: usize| (scored[c][s].0 - base[s].0) + (scored[c][s].1 - base[s].1);
        let cells: Vec<String> = (0..loaded.len())
            .map(|test| {
                let best = (0..grid.len())
                    .max_by(|&a, &b| {
                        let o = |c: usize| (0..loaded.len()).filter(|&s| s != test).map(|s| gain(c, s)).sum::<f64>();
                        o(a).total_cmp(&o(b))
                    })
                    .unwrap_or(0);
                let (w, m) = grid[best];
                format!("{} (weight {w}, {m} labels)", cell(scored[best][test]))
            })
            .collect();
        println!("| learned, setting chosen by the other sets | {} |", cells.join(" | "));
    }
    for (r, (label, ..)) in ADAPTER_ROWS.iter().enumerate() {
        let row: Vec<String> = loaded.iter().map(|s| cell(s.scored(&s.adapted[r]))).collect();
        println!("| {label} | {} |", row.join(" | "));
    }
    let shipped = shipped();
    for s in loaded {
        // The queries of each column.
        let mut members = vec![Vec::new(); TAUGHT_GROUPS];
        s.taught.iter().enumerate().for_each(|(i, t)| members[(*t).min(TAUGHT_GROUPS - 1)].push(i));
        let groups = |rankings: &[Vec<String>]| -> String {
            let r8 = |m: &Vec<usize>| score(m.iter().map(|&i| (rankings[i].clone(), s.queries[i].gold.clone()))).0;
            members.iter().map(|m| format!("{:.1}", r8(m))).collect::<Vec<_>>().join(" | ")
        };
        let sizes: Vec<String> = (members.iter().enumerate())
            .map(|(g, m)| format!("{g}{} (n = {})", if g == TAUGHT_GROUPS - 1 { "+" } else { "" }, m.len()))
            .collect();
        println!();
        println!(
            "{}: R@8 by how many queries of the other half asked for the query's gold tool (the fewest over its gold tools):",
            s.name
        );
        println!("| ranking | {} |", sizes.join(" | "));
        println!("|---|{}", "---:|".repeat(TAUGHT_GROUPS));
        let plain: Vec<Vec<String>> = s.queries.iter().map(|q| q.plain.clone()).collect();
        println!("| find_tool, nothing learned | {} |", groups(&plain));
        if let Some(c) = shipped {
            println!("| learned, per-tool bonus (shipped) | {} |", groups(&s.rerank[c]));
        }
        for (r, (label, ..)) in ADAPTER_ROWS.iter().enumerate() {
            println!("| {label} | {} |", groups(&s.adapted[r]));
        }
    }
    println!();
    println!("The adapter's guard, per set and fold (labels fitted / held back, held-back recall@8 plain -> adapted):");
    for s in loaded {
        for (fold, j) in s.fits.iter().enumerate() {
            println!(
                "- {} fold {fold}: {} / {}, {:.1} -> {:.1}: {} ({:.1} s)",
                s.name,
                j.fitted,
                j.held_out,
                j.plain,
                j.adapted,
                if j.served() { "served" } else { "identity kept" },
                j.seconds
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taught_counts_the_other_half_and_takes_the_fewest_gold_tool() {
        let q = |gold: &[&str]| Replayed {
            vector: Arc::new(Vec::new()),
            gold: gold.iter().map(|g| g.to_string()).collect(),
            plain: Vec::new(),
        };
        // Folds alternate: queries 0, 2, 4 are one half; 1, 3, 5 the other.
        let queries = [q(&["a"]), q(&["a"]), q(&["a", "b"]), q(&["a"]), q(&["b"]), q(&["c"])];
        // Query 0 (half 0): "a" asked by 1 and 3. Query 1 (half 1): "a" asked by 0 and 2.
        // Query 2: "a" twice, "b" never in half 1, so 0. Query 5: "c" nowhere else.
        assert_eq!(taught(&queries), vec![2, 2, 0, 2, 0, 0]);
    }
}
