//! `toolmux eval --study`: every fusion variant docs/search.md reports, replayed on the exact
//! per-arm scores of each query, and chosen by cross-validation rather than by the best split.
//!
//! Each set's queries are scored once per arm over every tool (exact cosine, BM25); each
//! variant is then a pure function of those scores, so a grid of variants costs no model time.
//! Two selections are reported per family of variants: 5-fold cross-validation with one
//! parameter set for both sets (chosen on the other folds of both, scored on the held-out fold),
//! and leave-one-set-out (chosen on one set, scored on the other, the closest the dev data comes
//! to an unseen catalog).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::text::{is_action_word, split_identifier};
use crate::embed::Embedder;
use crate::index::bm25::{Bm25Index, terms};
use crate::index::fusion::{self, Fusion, Normalise};
use crate::index::{AllowList, Hit};
use crate::store::{Generation, Store};

use super::{EvalQuery, Metrics, catalog, read_jsonl};

/// Folds of the cross-validation.
const FOLDS: usize = 5;
/// How deep each arm ranks before fusion (as find_tool).
const DEPTH: usize = 50;

/// One query's arm scores over every tool.
struct ArmHits {
    dense: Vec<Hit>,
    keyword: Vec<Hit>,
}

struct StudyQuery {
    gold: Vec<u32>,
    /// The gold tools whose name begins with an action word ([`is_action_word`]), and whether
    /// the request uses that word: a request in everyday verbs ("look up …" for `get_…`) must
    /// find its tool about as well as one that says `get`.
    actions: Vec<(u32, bool)>,
    vector: Vec<f32>,
    /// The vectors of the query and its clauses with literals dropped ([`literals_dropped`]).
    clean: (Vec<f32>, Vec<Vec<f32>>),
    terms: Vec<String>,
    whole: ArmHits,
    clauses: Vec<(Vec<f32>, Vec<String>)>,
}

struct StudySet {
    name: String,
    generation: Arc<Generation>,
    /// Keyword indexes other than find_tool's, by [`KEYWORD_VARIANTS`] position (0 is find_tool's).
    keyword: Vec<Bm25Index>,
    queries: Vec<StudyQuery>,
    /// Each tool's keyword terms (find_tool's keyword document), by slot.
    doc_terms: Vec<Vec<String>>,
    /// The same tools indexed by the model under each [`SecondText`] (by its position).
    second: Vec<Arc<Generation>>,
    /// Per [`SecondText`], each tool's cosine between its second vector and its whole text's.
    agreement: Vec<Vec<f32>>,
}

/// A variant: how the arms are merged, and what is done before and after.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Variant {
    fusion: Fusion,
    /// Rocchio feedback on the dense arm: (weight of the mean of the top `m` fused tools, m).
    feedback: Option<(f32, usize)>,
    /// Multi-request queries: each clause searched too, and the lists merged.
    clauses: Option<Combine>,
    /// Which keyword index ([`KEYWORD_VARIANTS`]).
    keyword: usize,
    /// The dense arm embeds the text with literals dropped.
    clean: bool,
    /// How each arm's list is cut and scored before the convex fusion.
    arms: ArmOptions,
    /// Pseudo-relevance feedback on the keyword arm: (top `m` fused tools, `e` expansion terms
    /// from them, each weighted `w` against the request's own).
    expansion: Option<(usize, usize, f32)>,
    /// A second vector per tool: its text, and the weight of its cosine in the dense score
    /// (`(1 − w) · cos(full text) + w · cos(second)`; `None` = the larger of the two).
    second: Option<(SecondText, Option<f32>)>,
    /// With a weighted second vector: its weight scaled per tool by how far the cosine between
    /// the tool's two vectors passes this floor (`clamp((a − floor) / (1 − floor), 0, 1)`).
    gate: Option<f32>,
}

/// Arm options of the convex fusion beyond find_tool's (depth [`DEPTH`], floor, fixed weight).
#[derive(Debug, Clone, Copy, PartialEq)]
struct ArmOptions {
    /// How many hits of each arm are normalised and fused.
    depth: usize,
    /// A tool one arm did not rank gets its exact score in that arm instead of the arm's floor.
    fill: bool,
    /// The dense weight moves by `adaptive · (zd − zk) / (zd + zk)` with each arm's top z-score:
    /// the arm whose best hit stands out more counts more for this query.
    adaptive: f32,
}

const FIND_TOOL_ARMS: ArmOptions = ArmOptions { depth: DEPTH, fill: false, adaptive: 0.0 };

/// The text of a second vector per tool.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SecondText {
    /// Name words and description, without the parameters.
    NameDescription,
    /// Name words alone.
    Name,
}

const SECOND_TEXTS: [SecondText; 2] = [SecondText::NameDescription, SecondText::Name];

/// The request without its literals: words holding a digit (ids, numbers, addresses) dropped.
pub fn literals_dropped(text: &str) -> String {
    text.split_whitespace().filter(|w| !w.chars().any(|c| c.is_ascii_digit())).collect::<Vec<_>>().join(" ")
}

/// Keyword index variants: (label, k1, b, extra copies of the name words). The first is
/// find_tool's index before this study, the second find_tool's now.
const KEYWORD_VARIANTS: &[(&str, f32, f32, usize)] = &[
    ("BM25 k1 1.2 b 0.75", 1.2, 0.75, 0),
    ("BM25 k1 1.2 b 0.75, name ×2", 1.2, 0.75, 1),
    ("BM25 k1 0.9 b 0.4", 0.9, 0.4, 0),
    ("BM25 k1 1.5 b 0.9", 1.5, 0.9, 0),
    ("BM25 k1 0.9 b 0.4, name ×2", 0.9, 0.4, 1),
];

/// How the whole query's list and its clauses' lists merge.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Combine {
    /// A tool keeps its best fused score, clause scores discounted by this factor.
    Max(f32),
    /// Round-robin by rank: a tool scores `max 1 / (k + rank)` over the lists, the whole
    /// query's list first at equal rank.
    Interleave(f32),
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.fusion)?;
        if let Some((b, m)) = self.feedback {
            write!(f, ", feedback {b} × top {m}")?;
        }
        if self.clean {
            write!(f, ", literals dropped")?;
        }
        if let Some((m, e, w)) = self.expansion {
            write!(f, ", keyword feedback {e} terms of top {m} × {w}")?;
        }
        match self.second {
            Some((text, Some(w))) => write!(f, ", {text:?} vector × {w}")?,
            Some((text, None)) => write!(f, ", max with {text:?} vector")?,
            None => {}
        }
        if let Some(floor) = self.gate {
            write!(f, " past agreement {floor}")?;
        }
        if self.arms != FIND_TOOL_ARMS {
            let ArmOptions { depth, fill, adaptive } = self.arms;
            write!(f, ", depth {depth}")?;
            if fill {
                write!(f, ", exact fill-in")?;
            }
            if adaptive > 0.0 {
                write!(f, ", adaptive {adaptive}")?;
            }
        }
        if self.keyword != 0 {
            write!(f, ", {}", KEYWORD_VARIANTS[self.keyword].0)?;
        }
        match self.clauses {
            Some(Combine::Max(g)) => write!(f, ", clauses max × {g}")?,
            Some(Combine::Interleave(k)) => write!(f, ", clauses interleaved k {k}")?,
            None => {}
        }
        Ok(())
    }
}

fn dense_hits(generation: &Generation, q: &[f32], allow: &AllowList) -> Vec<Hit> {
    match &generation.dense {
        Some(d) => d.search(q, allow, DEPTH).0,
        None => Vec::new(),
    }
}

fn keyword_hits(index: &Bm25Index, t: &[String], allow: &AllowList) -> Vec<Hit> {
    index.search(t, allow, DEPTH)
}

/// The variant's ranking (best first, 10 deep) for one query.
fn rank(set: &StudySet, q: &StudyQuery, v: &Variant, allow: &AllowList) -> Vec<u32> {
    let g = &set.generation;
    let fuse_one = |vector: &[f32], whole: Option<&ArmHits>, t: &[String]| -> Vec<Hit> {
        let dense = match whole {
            _ if v.second.is_some() => two_vector_hits(set, v, vector, allow),
            Some(a) => a.dense.clone(),
            None => dense_hits(g, vector, allow),
        };
        let keyword = match whole {
            Some(a) if v.keyword == 0 => a.keyword.clone(),
            _ => keyword_hits(&set.keyword[v.keyword], t, allow),
        };
        let mut fused = if v.arms != FIND_TOOL_ARMS {
            fuse_with_options(set, v, vector, t, allow)
        } else {
            fusion::fuse(v.fusion, &dense, &keyword, DEPTH)
        };
        if let Some((m, e, w)) = v.expansion {
            let index = &set.keyword[v.keyword];
            let mut gain: HashMap<&str, f32> = HashMap::new();
            for h in fused.iter().take(m) {
                let doc = &set.doc_terms[h.slot as usize];
                for term in doc {
                    *gain.entry(term.as_str()).or_default() += index.idf(term) / doc.len().max(1) as f32;
                }
            }
            let mut extra: Vec<(&str, f32)> =
                gain.into_iter().filter(|(term, _)| !t.iter().any(|q| q == term)).collect();
            extra.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
            let mut seen = HashSet::new();
            let mut query: Vec<(&str, f32)> =
                t.iter().filter(|q| seen.insert(q.as_str())).map(|q| (q.as_str(), 1.0)).collect();
            query.extend(extra.into_iter().take(e).map(|(term, _)| (term, w)));
            let keyword = index.search_weighted(&query, allow, DEPTH);
            fused = fusion::fuse(v.fusion, &dense, &keyword, DEPTH);
        }
        if let (Some((beta, m)), Some(d)) = (v.feedback, &g.dense) {
            let mut moved = vector.to_vec();
            let top: Vec<_> = fused.iter().take(m).collect();
            for h in &top {
                for (x, y) in moved.iter_mut().zip(d.vector(h.slot)) {
                    *x += beta * y / top.len() as f32;
                }
            }
            crate::embed::normalize(&mut moved);
            let dense = dense_hits(g, &moved, allow);
            fused = fusion::fuse(v.fusion, &dense, &keyword, DEPTH);
        }
        fused
    };
    let whole = if v.clean { None } else { Some(&q.whole) };
    let mut fused = fuse_one(if v.clean { &q.clean.0 } else { &q.vector }, whole, &q.terms);
    if let Some(combine) = v.clauses
        && q.clauses.len() > 1
    {
        let lists: Vec<Vec<Hit>> = q
            .clauses
            .iter()
            .enumerate()
            .map(|(i, (cv, ct))| fuse_one(if v.clean { &q.clean.1[i] } else { cv }, None, ct))
            .collect();
        let mut best: std::collections::HashMap<u32, f32> = std::collections::HashMap::new();
        let mut put = |slot: u32, s: f32| {
            let e = best.entry(slot).or_insert(f32::MIN);
            *e = e.max(s);
        };
        match combine {
            Combine::Max(gamma) => {
                fused.iter().for_each(|h| put(h.slot, h.score));
                lists.iter().flatten().for_each(|h| put(h.slot, gamma * h.score));
            }
            Combine::Interleave(k) => {
                fused.iter().enumerate().for_each(|(r, h)| put(h.slot, 1.0 / (k + r as f32) + 1e-4));
                for l in &lists {
                    l.iter().enumerate().for_each(|(r, h)| put(h.slot, 1.0 / (k + r as f32)));
                }
            }
        }
        fused = crate::index::top_k(best.into_iter().map(|(slot, score)| Hit { slot, score }).collect(), 10);
    }
    fused.into_iter().take(10).map(|h| h.slot).collect()
}

/// The dense arm when each tool has two vectors ([`Variant::second`]).
fn two_vector_hits(set: &StudySet, v: &Variant, vector: &[f32], allow: &AllowList) -> Vec<Hit> {
    let Some((text, weight)) = v.second else { return Vec::new() };
    let all = set.generation.catalog.len();
    let second = SECOND_TEXTS.iter().position(|t| *t == text).unwrap_or(0);
    let other: HashMap<u32, f32> =
        dense_hits_n(&set.second[second], vector, allow, all).iter().map(|h| (h.slot, h.score)).collect();
    let hits = dense_hits_n(&set.generation, vector, allow, all)
        .into_iter()
        .map(|h| {
            let o = other.get(&h.slot).copied().unwrap_or(h.score);
            let score = match weight {
                Some(w) => {
                    let g = match v.gate {
                        Some(floor) => {
                            ((set.agreement[second][h.slot as usize] - floor) / (1.0 - floor)).clamp(0.0, 1.0)
                        }
                        None => 1.0,
                    };
                    (1.0 - w * g) * h.score + w * g * o
                }
                None => h.score.max(o),
            };
            Hit { slot: h.slot, score }
        })
        .collect();
    crate::index::top_k(hits, DEPTH)
}

/// Mean and standard deviation of an arm's scores.
fn zstats(h: &[Hit]) -> (f32, f32) {
    let n = h.len().max(1) as f32;
    let mean = h.iter().map(|h| h.score).sum::<f32>() / n;
    let var = h.iter().map(|h| (h.score - mean).powi(2)).sum::<f32>() / n;
    (mean, if var > 0.0 { var.sqrt() } else { 1.0 })
}

/// The z-score convex fusion with [`Variant::arms`] options.
fn fuse_with_options(set: &StudySet, v: &Variant, vector: &[f32], t: &[String], allow: &AllowList) -> Vec<Hit> {
    let ArmOptions { depth, fill, adaptive: alpha } = v.arms;
    let Fusion::Convex { dense: w, .. } = v.fusion else { return Vec::new() };
    let g = &set.generation;
    let all = g.catalog.len();
    let d_all = dense_hits_n(g, vector, allow, all);
    let k_all = set.keyword[v.keyword].search(t, allow, all);
    let d_top = &d_all[..depth.min(d_all.len())];
    let k_top = &k_all[..depth.min(k_all.len())];
    let (dm, ds) = zstats(d_top);
    let (km, ks) = zstats(k_top);
    let d_floor = d_top.last().map(|h| (h.score - dm) / ds).unwrap_or(0.0);
    let k_floor = k_top.last().map(|h| (h.score - km) / ks).unwrap_or(0.0);
    let d_map: HashMap<u32, f32> = d_all.iter().map(|h| (h.slot, h.score)).collect();
    let k_map: HashMap<u32, f32> = k_all.iter().map(|h| (h.slot, h.score)).collect();
    let mut w = w;
    if alpha > 0.0 {
        let zd = d_top.first().map(|h| (h.score - dm) / ds).unwrap_or(0.0).max(0.0);
        let zk = k_top.first().map(|h| (h.score - km) / ks).unwrap_or(0.0).max(0.0);
        if zd + zk > 0.0 {
            w = (w + alpha * (zd - zk) / (zd + zk)).clamp(0.0, 1.0);
        }
    }
    let mut cands: Vec<u32> = d_top.iter().chain(k_top).map(|h| h.slot).collect();
    cands.sort_unstable();
    cands.dedup();
    let in_d: HashSet<u32> = d_top.iter().map(|h| h.slot).collect();
    let in_k: HashSet<u32> = k_top.iter().map(|h| h.slot).collect();
    let hits = cands
        .into_iter()
        .map(|slot| {
            let zd = if fill || in_d.contains(&slot) { (d_map[&slot] - dm) / ds } else { d_floor };
            let zk = if fill || in_k.contains(&slot) {
                (k_map.get(&slot).copied().unwrap_or(0.0) - km) / ks
            } else {
                k_floor
            };
            Hit { slot, score: w * zd + (1.0 - w) * zk }
        })
        .collect();
    crate::index::top_k(hits, DEPTH)
}

fn dense_hits_n(generation: &Generation, q: &[f32], allow: &AllowList, n: usize) -> Vec<Hit> {
    match &generation.dense {
        Some(d) => d.search(q, allow, n).0,
        None => Vec::new(),
    }
}

/// One query's figures under one variant.
#[derive(Debug, Clone)]
struct QueryScore {
    r8: f64,
    mrr10: f64,
    /// Each of [`StudyQuery::actions`]: whether the request uses the action word, and the
    /// tool's reciprocal rank (0 past 10).
    actions: Vec<(bool, f64)>,
}

/// Per-query figures of one variant on one set.
fn score(set: &StudySet, v: &Variant) -> Vec<QueryScore> {
    let allow = AllowList::all(set.generation.catalog.len());
    set.queries
        .iter()
        .map(|q| {
            let ranked = rank(set, q, v, &allow);
            let as_text = |slots: &[u32]| slots.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            let mut m = Metrics::default();
            m.add(&as_text(&ranked), &as_text(&q.gold));
            let actions = q
                .actions
                .iter()
                .map(|&(slot, said)| {
                    let rank = ranked.iter().take(10).position(|&s| s == slot);
                    (said, rank.map_or(0.0, |r| 1.0 / (r + 1) as f64))
                })
                .collect();
            QueryScore { r8: m.r8 * 100.0, mrr10: m.mrr10 * 100.0, actions }
        })
        .collect()
}

fn mean(xs: impl Iterator<Item = (f64, f64)>) -> (f64, f64) {
    let (mut a, mut b, mut n) = (0.0, 0.0, 0usize);
    for (x, y) in xs {
        a += x;
        b += y;
        n += 1;
    }
    (a / n.max(1) as f64, b / n.max(1) as f64)
}

/// What a selection maximises: R@8 plus MRR@10, each macro-averaged over the sets given.
fn objective(per_set: &[(f64, f64)]) -> f64 {
    per_set.iter().map(|(r, m)| r + m).sum::<f64>() / per_set.len().max(1) as f64
}

async fn load(store: &Store, embedder: &Arc<dyn Embedder>, dir: &std::path::Path) -> anyhow::Result<StudySet> {
    let catalog = catalog(&dir.join("tools.jsonl"))?;
    let raw: Vec<EvalQuery> = read_jsonl(&dir.join("queries.dev.jsonl"))?;
    let generation = store.rebuild(catalog).await;
    let slot_of = |name: &str| generation.catalog.tools().iter().position(|t| t.name() == name).map(|s| s as u32);
    let allow = AllowList::all(generation.catalog.len());
    let mut texts: Vec<String> = Vec::new();
    let mut split: Vec<Vec<String>> = Vec::new();
    for q in &raw {
        texts.push(q.query.clone());
        let c = crate::catalog::text::clauses(&q.query);
        let c = if c.len() > 1 { c } else { Vec::new() };
        texts.extend(c.iter().cloned());
        texts.push(literals_dropped(&q.query));
        texts.extend(c.iter().map(|c| literals_dropped(c)));
        split.push(c);
    }
    let mut vectors = Vec::new();
    for chunk in texts.chunks(32) {
        vectors.extend(embedder.embed(chunk.to_vec()).await?);
    }
    let keyword: Vec<Bm25Index> = KEYWORD_VARIANTS
        .iter()
        .map(|&(_, k1, b, name_copies)| {
            let docs: Vec<String> = generation
                .catalog
                .tools()
                .iter()
                .map(|t| {
                    let name = crate::catalog::text::split_identifier(t.name()).join(" ");
                    format!("{}{}", t.text, format!(" {name}").repeat(name_copies))
                })
                .collect();
            Bm25Index::build_with(docs.iter().map(String::as_str), k1, b)
        })
        .collect();
    let mut vectors = vectors.into_iter();
    let mut queries = Vec::new();
    for (q, c) in raw.iter().zip(split) {
        let vector = vectors.next().unwrap_or_default();
        let t = terms(&q.query);
        let whole =
            ArmHits { dense: dense_hits(&generation, &vector, &allow), keyword: keyword_hits(&keyword[0], &t, &allow) };
        let clauses = c.iter().map(|text| (vectors.next().unwrap_or_default(), terms(text))).collect();
        let clean =
            (vectors.next().unwrap_or_default(), c.iter().map(|_| vectors.next().unwrap_or_default()).collect());
        let gold: Vec<u32> = q.gold.iter().filter_map(|g| slot_of(g)).collect();
        let actions = gold
            .iter()
            .filter_map(|&s| {
                let words = split_identifier(generation.catalog.tools()[s as usize].name());
                let action = words.into_iter().next().filter(|w| is_action_word(w))?;
                Some((s, t.contains(&action)))
            })
            .collect();
        queries.push(StudyQuery { gold, actions, vector, clean, terms: t, whole, clauses });
    }
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut second = Vec::new();
    for form in SECOND_TEXTS {
        let mut c = super::catalog(&dir.join("tools.jsonl"))?;
        let tools: Vec<_> = c
            .tools()
            .iter()
            .map(|t| {
                let mut t = t.clone();
                let name = crate::catalog::text::split_identifier(t.name()).join(" ");
                t.text = if form == SecondText::NameDescription {
                    format!("{name}: {}", t.tool.description.as_deref().unwrap_or_default().trim())
                } else {
                    name
                };
                t
            })
            .collect();
        c = crate::catalog::Catalog::from_tools(tools);
        second.push(store.rebuild(c).await);
    }
    let agreement: Vec<Vec<f32>> = second
        .iter()
        .map(|g| {
            let (Some(a), Some(b)) = (&generation.dense, &g.dense) else { return Vec::new() };
            (0..generation.catalog.len() as u32).map(|s| crate::simd::dot(&a.vector(s), &b.vector(s))).collect()
        })
        .collect();
    let doc_terms = generation
        .catalog
        .tools()
        .iter()
        .map(|t| terms(&crate::catalog::text::keyword_text(&t.text, t.name())))
        .collect();
    Ok(StudySet { name, generation, keyword, queries, second, agreement, doc_terms })
}

/// No option on: one fusion of the whole request's two arms, find_tool's keyword index before
/// the study. The families below change the fields they study.
const PLAIN: Variant = Variant {
    fusion: Fusion::Rrf { k: 60.0, dense: 0.5 },
    feedback: None,
    clauses: None,
    keyword: 0,
    clean: false,
    arms: FIND_TOOL_ARMS,
    second: None,
    gate: None,
    expansion: None,
};

/// find_tool now: z-scores averaged, clauses, the name counted twice in the keyword index.
const FIND_TOOL: Variant = Variant {
    fusion: Fusion::Convex { norm: Normalise::ZScore, dense: 0.5 },
    clauses: Some(Combine::Max(crate::store::CLAUSE_WEIGHT)),
    keyword: 1,
    ..PLAIN
};

/// The families compared, each a grid of variants.
fn families() -> Vec<(&'static str, Vec<Variant>)> {
    let plain = |fusion| Variant { fusion, ..PLAIN };
    let weights: Vec<f32> = (2..=8).map(|i| i as f32 / 10.0).collect();
    let mut rrf = Vec::new();
    for k in [10.0, 20.0, 60.0] {
        for &w in &weights {
            rrf.push(plain(Fusion::Rrf { k, dense: w }));
        }
    }
    let mm = |n| weights.iter().map(|&w| plain(Fusion::Convex { norm: n, dense: w })).collect::<Vec<_>>();
    let best_convex = |n| -> Vec<Fusion> { weights.iter().map(|&w| Fusion::Convex { norm: n, dense: w }).collect() };
    let (mut feedback, mut zfeedback) = (Vec::new(), Vec::new());
    for (out, norm) in [(&mut feedback, Normalise::MinMax), (&mut zfeedback, Normalise::ZScore)] {
        for fusion in best_convex(norm) {
            for beta in [0.5, 1.0] {
                for m in [3, 5] {
                    out.push(Variant { fusion, feedback: Some((beta, m)), ..PLAIN });
                }
            }
        }
    }
    let (mut clauses, mut zclauses) = (Vec::new(), Vec::new());
    for (out, norm) in [(&mut clauses, Normalise::MinMax), (&mut zclauses, Normalise::ZScore)] {
        for fusion in best_convex(norm) {
            for c in
                [Combine::Max(0.6), Combine::Max(0.7), Combine::Max(0.8), Combine::Max(0.9), Combine::Interleave(2.0)]
            {
                out.push(Variant { fusion, clauses: Some(c), ..PLAIN });
            }
        }
    }
    // The rest vary find_tool's settings over the two weights most folds pick.
    let zscore = [0.5f32, 0.6].map(|dense| Fusion::Convex { norm: Normalise::ZScore, dense });
    let mut zkeyword = Vec::new();
    for fusion in best_convex(Normalise::ZScore) {
        for keyword in 0..KEYWORD_VARIANTS.len() {
            zkeyword.push(Variant { fusion, keyword, clauses: Some(Combine::Max(0.8)), ..PLAIN });
        }
    }
    let mut zclean = Vec::new();
    for fusion in best_convex(Normalise::ZScore) {
        for c in [Combine::Max(0.7), Combine::Max(0.8)] {
            for keyword in [0, 1] {
                zclean.push(Variant { fusion, clauses: Some(c), keyword, clean: true, ..PLAIN });
            }
        }
    }
    let mut arm_options = Vec::new();
    for fusion in zscore {
        for depth in [20usize, 50, 100] {
            for fill in [false, true] {
                for adaptive in [0.0f32, 0.25, 0.5] {
                    arm_options.push(Variant { fusion, arms: ArmOptions { depth, fill, adaptive }, ..FIND_TOOL });
                }
            }
        }
    }
    let mut two_vectors = Vec::new();
    for fusion in zscore {
        for text in SECOND_TEXTS {
            for weight in [Some(0.3f32), Some(0.5), None] {
                two_vectors.push(Variant { fusion, second: Some((text, weight)), ..FIND_TOOL });
            }
        }
    }
    let mut gated = Vec::new();
    for fusion in zscore {
        for weight in [0.3f32, 0.5] {
            for floor in [0.4f32, 0.5, 0.6, 0.7] {
                gated.push(Variant {
                    fusion,
                    second: Some((SecondText::Name, Some(weight))),
                    gate: Some(floor),
                    ..FIND_TOOL
                });
            }
        }
    }
    let mut keyword_feedback = Vec::new();
    for fusion in zscore {
        for (m, e) in [(1, 5), (3, 5), (3, 10), (5, 10)] {
            for w in [0.2f32, 0.4] {
                keyword_feedback.push(Variant { fusion, expansion: Some((m, e, w)), ..FIND_TOOL });
            }
        }
    }
    vec![
        ("RRF 1 : 1, k 60 (find_tool before)", vec![PLAIN]),
        ("RRF, k and weight chosen", rrf),
        ("convex, min-max", mm(Normalise::MinMax)),
        ("convex, max (BM25 from 0)", mm(Normalise::Max)),
        ("convex, z-score", mm(Normalise::ZScore)),
        ("convex min-max + dense feedback", feedback),
        ("convex min-max + clauses", clauses),
        ("convex z-score + dense feedback", zfeedback),
        ("convex z-score + clauses", zclauses),
        ("convex z-score + clauses, keyword index chosen", zkeyword),
        ("convex z-score + clauses, literals dropped", zclean),
        ("convex z-score + clauses, arm depth, exact fill-in, adaptive weight", arm_options),
        ("convex z-score + clauses, two vectors per tool", two_vectors),
        ("convex z-score + clauses, keyword feedback", keyword_feedback),
        ("convex z-score + clauses, name vector gated by its agreement", gated),
        ("find_tool now: z-score 0.5, name ×2, clauses max × 0.8", vec![FIND_TOOL]),
    ]
}

/// Runs the study over the sets (each a folder of `tools.jsonl` + `queries.dev.jsonl`), every
/// family or only those whose label contains `only`, with the encoder in `precision`.
pub async fn run(
    sets: &[PathBuf],
    model_dir: Option<&std::path::Path>,
    only: Option<&str>,
    precision: crate::config::Precision,
) -> anyhow::Result<()> {
    let (embedder, store) = super::model_store_in(model_dir, precision)?;
    let mut loaded = Vec::new();
    for dir in sets {
        eprintln!("loading {} ...", dir.display());
        loaded.push(load(&store, &embedder, dir).await?);
    }
    let names: Vec<&str> = loaded.iter().map(|s| s.name.as_str()).collect();
    println!("| family | selection | {} |", names.join(" | "));
    println!("|---|---|{}", "---:|".repeat(names.len()));
    let mut actions = Vec::new();
    for (family, grid) in families().into_iter().filter(|(f, _)| only.is_none_or(|o| f.contains(o))) {
        // scores[variant][set] = per-query figures
        let scores: Vec<Vec<Vec<QueryScore>>> =
            grid.iter().map(|v| loaded.iter().map(|s| score(s, v)).collect()).collect();
        let fold_mean = |vi: usize, si: usize, keep: &dyn Fn(usize) -> bool| {
            mean(scores[vi][si].iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, s)| (s.r8, s.mrr10)))
        };
        // k-fold with one choice for all sets.
        let mut held = vec![Vec::new(); loaded.len()];
        let mut chosen = Vec::new();
        for f in 0..FOLDS {
            let train = |i: usize| i % FOLDS != f;
            let best = (0..grid.len())
                .max_by(|&a, &b| {
                    let oa = objective(&(0..loaded.len()).map(|s| fold_mean(a, s, &train)).collect::<Vec<_>>());
                    let ob = objective(&(0..loaded.len()).map(|s| fold_mean(b, s, &train)).collect::<Vec<_>>());
                    oa.total_cmp(&ob)
                })
                .unwrap_or(0);
            chosen.push(best);
            for (s, h) in held.iter_mut().enumerate() {
                h.extend(scores[best][s].iter().enumerate().filter(|(i, _)| i % FOLDS == f).map(|(_, x)| x.clone()));
            }
        }
        let cells: Vec<String> = held
            .iter()
            .map(|h| {
                let (r, m) = mean(h.iter().map(|s| (s.r8, s.mrr10)));
                format!("{r:.2} / {m:.2}")
            })
            .collect();
        actions.push((
            family,
            held.iter()
                .map(|h| {
                    let mrr = |said: bool| {
                        let r: Vec<f64> =
                            h.iter().flat_map(|s| &s.actions).filter(|a| a.0 == said).map(|a| a.1).collect();
                        format!("{:.2} (n {})", 100.0 * r.iter().sum::<f64>() / r.len().max(1) as f64, r.len())
                    };
                    format!("{} / {}", mrr(true), mrr(false))
                })
                .collect::<Vec<_>>(),
        ));
        chosen.sort_unstable();
        chosen.dedup();
        let picks: Vec<String> = chosen.iter().map(|&i| grid[i].to_string()).collect();
        println!("| {family} | {FOLDS}-fold CV (picked: {}) | {} |", picks.join("; "), cells.join(" | "));
        // Leave one set out: choose on the others, score on it.
        if loaded.len() > 1 && grid.len() > 1 {
            let cells: Vec<String> = (0..loaded.len())
                .map(|test| {
                    let best = (0..grid.len())
                        .max_by(|&a, &b| {
                            let o = |v: usize| {
                                objective(
                                    &(0..loaded.len())
                                        .filter(|&s| s != test)
                                        .map(|s| fold_mean(v, s, &|_| true))
                                        .collect::<Vec<_>>(),
                                )
                            };
                            o(a).total_cmp(&o(b))
                        })
                        .unwrap_or(0);
                    let (r, m) = fold_mean(best, test, &|_| true);
                    format!("{r:.2} / {m:.2} ({})", grid[best])
                })
                .collect();
            println!("| | other set chooses | {} |", cells.join(" | "));
        }
    }
    // The same held-out choices, for the tools named with an action word: is one harder to find
    // when the request says that action another way?
    println!();
    println!(
        "| family | MRR@10 of tools named with an action word, the request using it / another: {} |",
        names.join(" | ")
    );
    println!("|---|{}", "---:|".repeat(names.len()));
    for (family, cells) in actions {
        println!("| {family} | {} |", cells.join(" | "));
    }
    Ok(())
}
