//! `toolmux eval`: find_tool's exact search path (the same store, fusion and defaults) over a
//! catalog and labelled queries, with the metrics of eval/data/README.md for the fused
//! ranking and for each arm alone.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rmcp::model::Tool;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::catalog::text::server_label;
use crate::catalog::{Catalog, CatalogTool, ToolKey};
use crate::embed::Embedder;
use crate::embed::cache::{VectorCache, default_dir};
use crate::embed::files;
use crate::embed::worker::ModelEmbedder;
use crate::index::AllowList;
use crate::store::{Query, Ranker, Store};

pub mod learning;
pub mod study;
pub mod verdict;

#[derive(Deserialize)]
struct EvalTool {
    name: String,
    description: String,
    input_schema: Option<Value>,
    /// The server offering the tool, where the source has one (see eval/derive_servers.py).
    server: Option<EvalServer>,
}

/// A server as its `initialize` answer describes it.
#[derive(Deserialize)]
struct EvalServer {
    name: String,
    title: Option<String>,
}

#[derive(Deserialize)]
struct EvalQuery {
    id: String,
    query: String,
    gold: Vec<String>,
}

/// Macro-averaged metrics, ×100.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    pub r1: f64,
    pub r5: f64,
    pub r8: f64,
    pub r10: f64,
    pub mrr10: f64,
    pub ndcg10: f64,
    pub c8: f64,
}

impl Metrics {
    /// Scores one ranking against its gold set (and accumulates it).
    pub fn add(&mut self, ranked: &[String], gold: &[String]) {
        let hit = |k: usize| ranked.iter().take(k).filter(|r| gold.contains(r)).count() as f64;
        let g = gold.len().max(1) as f64;
        self.r1 += hit(1) / g;
        self.r5 += hit(5) / g;
        self.r8 += hit(8) / g;
        self.r10 += hit(10) / g;
        if let Some(p) = ranked.iter().take(10).position(|r| gold.contains(r)) {
            self.mrr10 += 1.0 / (p as f64 + 1.0);
        }
        let dcg: f64 = ranked
            .iter()
            .take(10)
            .enumerate()
            .filter(|(_, r)| gold.contains(r))
            .map(|(i, _)| 1.0 / (i as f64 + 2.0).log2())
            .sum();
        let ideal: f64 = (0..gold.len().min(10)).map(|i| 1.0 / (i as f64 + 2.0).log2()).sum();
        if ideal > 0.0 {
            self.ndcg10 += dcg / ideal;
        }
        if gold.iter().all(|g| ranked.iter().take(8).any(|r| r == g)) {
            self.c8 += 1.0;
        }
    }

    pub fn averaged(&self, n: usize) -> Metrics {
        let f = 100.0 / n.max(1) as f64;
        Metrics {
            r1: self.r1 * f,
            r5: self.r5 * f,
            r8: self.r8 * f,
            r10: self.r10 * f,
            mrr10: self.mrr10 * f,
            ndcg10: self.ndcg10 * f,
            c8: self.c8 * f,
        }
    }
}

fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}: not a valid record", path.display(), i + 1))
        })
        .collect()
}

/// Which text is indexed per tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TextForm {
    /// find_tool's form: split name, description, parameter names and descriptions.
    Full,
    /// The reference gateway's `name: … description: …`, for comparison.
    NameDescription,
}

/// Builds the eval catalog: tools keep their own names (no backend prefix).
pub fn catalog(tools: &Path) -> anyhow::Result<Catalog> {
    catalog_with(tools, TextForm::Full)
}

pub fn catalog_with(tools: &Path, form: TextForm) -> anyhow::Result<Catalog> {
    let raw: Vec<EvalTool> = read_jsonl(tools)?;
    let tools = raw
        .into_iter()
        .map(|t| {
            let schema = t
                .input_schema
                .and_then(|s| s.as_object().cloned())
                .unwrap_or_else(|| json!({"type": "object"}).as_object().cloned().unwrap_or_default());
            let tool = Tool::new(t.name.clone(), t.description, Arc::new(schema));
            let server = t.server.as_ref().and_then(|s| server_label(s.title.as_deref(), &s.name));
            let key = ToolKey { backend: Arc::from("eval"), tool: Arc::from(t.name.as_str()) };
            let mut t = CatalogTool::new(key, tool, server.as_deref());
            if form == TextForm::NameDescription {
                t.text = crate::catalog::text::name_description_text(&t.tool);
            }
            t
        })
        .collect();
    Ok(Catalog::from_tools(tools))
}

/// The real model, and a store over it with the on-disk vector cache (so a rerun embeds nothing).
pub(crate) fn model_store(model_dir: Option<&Path>) -> anyhow::Result<(Arc<dyn Embedder>, Store)> {
    model_store_in(model_dir, crate::config::Precision::default())
}

/// [`model_store`] with the encoder in `precision`.
pub(crate) fn model_store_in(
    model_dir: Option<&Path>,
    precision: crate::config::Precision,
) -> anyhow::Result<(Arc<dyn Embedder>, Store)> {
    let files = files::locate(crate::config::DEFAULT_MODEL, model_dir, &files::default_model_roots(), true)?;
    let batching = crate::embed::worker::Batching::default();
    let embedder: Arc<dyn Embedder> = Arc::new(ModelEmbedder::start_with(&files, batching, precision)?);
    let cache = VectorCache::open(default_dir().as_deref(), embedder.model_id(), embedder.dim()).ok();
    Ok((embedder.clone(), Store::new(Some(embedder), cache)))
}

/// The key the replays of `eval-learning` and `eval-verdict` give their learning stores unless
/// told another (`--salt`): it decides which requests the adapter's guard holds back and the
/// order a fit goes through its labels, so the same key gives the same figures.
pub const SALT: u64 = 1;

/// The rankings `toolmux eval` compares: find_tool's, and each arm alone.
pub const RANKERS: [(&str, Ranker); 3] =
    [("toolmux (fused)", Ranker::Fused), ("keyword arm", Ranker::KeywordOnly), ("dense arm", Ranker::DenseOnly)];

/// What [`evaluate`] measured.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub tools: usize,
    pub queries: usize,
    /// Averaged metrics in [`RANKERS`] order.
    pub metrics: Vec<Metrics>,
}

/// Runs every query through find_tool's search path and each arm alone. With `out`, every
/// ranking is written there.
pub async fn evaluate(
    tools: &Path,
    queries: &Path,
    k: usize,
    out: Option<&Path>,
    model_dir: Option<&Path>,
    form: TextForm,
    precision: crate::config::Precision,
) -> anyhow::Result<Evaluation> {
    let catalog = catalog_with(tools, form)?;
    let queries: Vec<EvalQuery> = read_jsonl(queries)?;
    let (_, store) = model_store_in(model_dir, precision)?;
    eprintln!("indexing {} tools (texts not in the vector cache are embedded) ...", catalog.len());
    let bar = indicatif::ProgressBar::hidden();
    let generation = store
        .rebuild_with_progress(catalog, &|done, total| {
            if bar.is_hidden() {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.set_length(total as u64);
            }
            bar.set_position(done as u64);
        })
        .await;
    bar.finish_and_clear();
    let allow = AllowList::all(generation.catalog.len());
    let mut out_file = out.map(std::fs::File::create).transpose()?;
    let mut sums = vec![Metrics::default(); RANKERS.len()];
    let progress = indicatif::ProgressBar::new(queries.len() as u64);
    for q in &queries {
        let query = Query { description: q.query.clone(), keywords: Vec::new() };
        let mut record = json!({"id": q.id, "gold": q.gold});
        for (i, (label, ranker)) in RANKERS.iter().enumerate() {
            let r = store.search(&generation, &allow, &query, k.max(10), *ranker).await;
            let names: Vec<String> =
                r.hits.iter().map(|h| generation.catalog.tools()[h.slot as usize].name().to_string()).collect();
            sums[i].add(&names, &q.gold);
            record[*label] = json!(names.iter().take(k).collect::<Vec<_>>());
        }
        if let Some(f) = out_file.as_mut() {
            writeln!(f, "{record}")?;
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(Evaluation {
        tools: generation.catalog.len(),
        queries: queries.len(),
        metrics: sums.iter().map(|m| m.averaged(queries.len())).collect(),
    })
}

/// `toolmux eval`'s output: an [`Evaluation`] as a table.
pub fn print(e: &Evaluation) {
    println!("{} tools, {} queries", e.tools, e.queries);
    println!("| ranking | R@1 | R@5 | R@8 | R@10 | MRR@10 | nDCG@10 | C@8 |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for ((label, _), m) in RANKERS.iter().zip(&e.metrics) {
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            m.r1, m.r5, m.r8, m.r10, m.mrr10, m.ndcg10, m.c8
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_match_hand_computation() {
        let mut m = Metrics::default();
        let ranked: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        m.add(&ranked, &["b".to_string()]);
        let a = m.averaged(1);
        assert_eq!(a.r1, 0.0);
        assert_eq!(a.r5, 100.0);
        assert_eq!(a.mrr10, 50.0);
        assert!((a.ndcg10 - 100.0 / 3f64.log2()).abs() < 1e-9);
        assert_eq!(a.c8, 100.0);
    }
}
