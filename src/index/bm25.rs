//! The keyword arm: Okapi BM25 over tool texts, with identifiers split (`createPullRequest` →
//! create, pull, request), a short stop-word list and plural folding.

use std::collections::HashMap;

use crate::catalog::text::words;

use super::{AllowList, Hit, Slot, top_k};

const K1: f32 = 1.2;
const B: f32 = 0.75;

/// Words that carry no signal in tool texts or queries: English function words plus the
/// schema vocabulary the reference gateway also drops from keyword queries.
const STOP_WORDS: &[&str] = &[
    "a",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "by",
    "can",
    "could",
    "do",
    "for",
    "from",
    "get",
    "give",
    "has",
    "have",
    "help",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "me",
    "my",
    "need",
    "of",
    "on",
    "or",
    "please",
    "so",
    "some",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "this",
    "to",
    "tool",
    "use",
    "want",
    "was",
    "we",
    "what",
    "when",
    "which",
    "with",
    "would",
    "you",
    "your",
    "name",
    "description",
    "schema",
    "input",
    "output",
    "type",
    "properties",
    "required",
    "title",
    "id",
    "server",
    "meta",
    "data",
    "content",
    "text",
    "value",
    "field",
    "parameters",
];

/// Index terms of a text: split, lower-cased, stop words dropped, plurals folded.
pub fn terms(text: &str) -> Vec<String> {
    words(text).into_iter().filter(|w| !STOP_WORDS.contains(&w.as_str())).map(fold_plural).collect()
}

/// `requests` → `request`, `queries` → `query`, `boxes` → `box`; leaves `status`, `class` alone.
fn fold_plural(mut w: String) -> String {
    if w.len() <= 3 || w.ends_with("ss") || w.ends_with("us") || w.ends_with("is") {
        return w;
    }
    if let Some(stem) = w.strip_suffix("ies") {
        return format!("{stem}y");
    }
    if w.ends_with("xes") || w.ends_with("ches") || w.ends_with("shes") {
        w.truncate(w.len() - 2);
        return w;
    }
    if w.ends_with('s') {
        w.pop();
    }
    w
}

#[derive(Debug, Default)]
pub struct Bm25Index {
    postings: HashMap<String, Vec<(Slot, u16)>>,
    doc_len: Vec<u32>,
    avg_len: f32,
    k1: f32,
    b: f32,
}

impl Bm25Index {
    /// Indexes one document per slot, in slot order.
    pub fn build<'a>(docs: impl IntoIterator<Item = &'a str>) -> Self {
        Self::build_with(docs, K1, B)
    }

    /// As [`Bm25Index::build`] with other saturation (`k1`) and length normalisation (`b`).
    pub fn build_with<'a>(docs: impl IntoIterator<Item = &'a str>, k1: f32, b: f32) -> Self {
        let mut postings: HashMap<String, Vec<(Slot, u16)>> = HashMap::new();
        let mut doc_len = Vec::new();
        for (slot, doc) in docs.into_iter().enumerate() {
            let ts = terms(doc);
            doc_len.push(ts.len() as u32);
            let mut tf: HashMap<String, u16> = HashMap::new();
            for t in ts {
                *tf.entry(t).or_default() += 1;
            }
            for (t, n) in tf {
                postings.entry(t).or_default().push((slot as Slot, n));
            }
        }
        let avg_len = if doc_len.is_empty() { 1.0 } else { doc_len.iter().sum::<u32>() as f32 / doc_len.len() as f32 };
        Self { postings, doc_len, avg_len: avg_len.max(1.0), k1, b }
    }

    pub fn len(&self) -> usize {
        self.doc_len.len()
    }

    pub fn is_empty(&self) -> bool {
        self.doc_len.is_empty()
    }

    /// The `k` best allowed slots for the query terms; slots matching no term are not returned.
    pub fn search(&self, query_terms: &[String], allow: &AllowList, k: usize) -> Vec<Hit> {
        let mut seen = std::collections::HashSet::new();
        let weighted: Vec<(&str, f32)> =
            query_terms.iter().filter(|t| seen.insert(t.as_str())).map(|t| (t.as_str(), 1.0)).collect();
        self.search_weighted(&weighted, allow, k)
    }

    /// As [`Bm25Index::search`], each term's contribution scaled by its weight.
    pub fn search_weighted(&self, query: &[(&str, f32)], allow: &AllowList, k: usize) -> Vec<Hit> {
        let mut scores: HashMap<Slot, f32> = HashMap::new();
        for &(t, weight) in query {
            let Some(list) = self.postings.get(t) else { continue };
            let idf = self.idf(t);
            for &(slot, tf) in list {
                if !allow.contains(slot) {
                    continue;
                }
                let tf = tf as f32;
                let len = self.doc_len[slot as usize] as f32;
                let (k1, b) = (self.k1, self.b);
                let s = idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * len / self.avg_len));
                *scores.entry(slot).or_default() += weight * s;
            }
        }
        top_k(scores.into_iter().map(|(slot, score)| Hit { slot, score }).collect(), k)
    }

    /// How rare a term is in the indexed documents (0 for one that is in none).
    pub fn idf(&self, term: &str) -> f32 {
        let Some(list) = self.postings.get(term) else { return 0.0 };
        let (n, df) = (self.doc_len.len() as f32, list.len() as f32);
        ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_matching_documents_and_respects_allow_list() {
        let docs = [
            "create pull request: Open a pull request on a repository",
            "send message: Post a chat message to a channel",
            "list pull requests: List open pull requests",
        ];
        let idx = Bm25Index::build(docs);
        let q = terms("create a pull request");
        let hits = idx.search(&q, &AllowList::all(3), 10);
        assert_eq!(hits[0].slot, 0);
        assert_eq!(hits.len(), 2, "the chat tool matches no term");
        let hits = idx.search(&q, &AllowList::from_slots(3, [1, 2]), 10);
        assert_eq!(hits.iter().map(|h| h.slot).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn weighted_terms_scale_their_contribution() {
        let idx = Bm25Index::build(["send message: Post a chat message", "create pull request: Open a pull request"]);
        let all = AllowList::all(2);
        let plain = idx.search(&terms("chat pull"), &all, 2);
        let weighted = idx.search_weighted(&[("chat", 1.0), ("pull", 0.25)], &all, 2);
        assert_eq!(weighted[0].slot, 0, "{weighted:?}");
        let score = |hits: &[Hit], slot| hits.iter().find(|h| h.slot == slot).map(|h| h.score).unwrap();
        assert!((score(&weighted, 1) - 0.25 * score(&plain, 1)).abs() < 1e-5);
        assert_eq!(idx.idf("absent"), 0.0);
    }

    #[test]
    fn terms_fold_plurals_and_drop_stop_words() {
        assert_eq!(terms("List the queries and boxes of repos"), vec!["list", "query", "box", "repo"]);
        assert_eq!(terms("status class"), vec!["status", "class"]);
    }
}
