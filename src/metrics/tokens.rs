//! Tokens per principal and backend: tool definitions served (`tools/list`, find_tool answers,
//! groups), results returned, and tokens saved against listing every tool in the caller's scope
//! (find_tool's baseline less what it returned). Counted as the token metrics count them: a
//! JSON's bytes / 4. `/metrics` has them as `toolmux_tokens_total{principal,backend,kind}`; the
//! console's Traffic view reads [`Tokens::rows`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Serialize;

/// Principal and backend pairs counted apart; past this, new principals count as `(other)`,
/// so that a gateway with very many principals keeps a bounded number of series.
const MAX_PAIRS: usize = 10_000;

/// Where the meta-tools' own definitions (find_tool, call_tool) are counted.
pub const GATEWAY: &str = "(toolmux)";
/// The backend label of tokens saved: they are saved across the caller's whole scope.
pub const SCOPE: &str = "(scope)";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Kind {
    Definitions,
    Results,
    Saved,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Definitions => "definitions",
            Kind::Results => "results",
            Kind::Saved => "saved",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Spent {
    pub principal: String,
    pub backend: String,
    /// `definitions`, `results` or `saved`.
    pub kind: &'static str,
}

/// One principal's tokens on one backend.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Row {
    pub principal: String,
    pub backend: String,
    pub definitions: u64,
    pub results: u64,
    pub saved: u64,
}

#[derive(Default)]
pub struct Tokens {
    pub family: Family<Spent, Counter>,
    rows: Mutex<BTreeMap<(String, String), Row>>,
}

impl Tokens {
    pub fn add(&self, principal: &str, backend: &str, kind: Kind, n: u64) {
        if n == 0 {
            return;
        }
        let mut rows = self.rows.lock().expect("token rows lock");
        let mut key = (principal.to_string(), backend.to_string());
        if !rows.contains_key(&key) && rows.len() >= MAX_PAIRS {
            key.0 = "(other)".into();
        }
        let row = rows.entry(key.clone()).or_insert_with(|| Row {
            principal: key.0.clone(),
            backend: key.1.clone(),
            ..Row::default()
        });
        match kind {
            Kind::Definitions => row.definitions += n,
            Kind::Results => row.results += n,
            Kind::Saved => row.saved += n,
        }
        drop(rows);
        self.family.get_or_create(&Spent { principal: key.0, backend: key.1, kind: kind.label() }).inc_by(n);
    }

    /// Every row, or `only` one principal's.
    pub fn rows(&self, only: Option<&str>) -> Vec<Row> {
        let rows = self.rows.lock().expect("token rows lock");
        rows.values().filter(|r| only.is_none_or(|p| p == r.principal)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_add_up_by_principal_and_backend_and_stay_bounded() {
        let t = Tokens::default();
        t.add("alice", "github", Kind::Results, 10);
        t.add("alice", "github", Kind::Results, 5);
        t.add("alice", SCOPE, Kind::Saved, 100);
        t.add("bob", "github", Kind::Definitions, 7);
        t.add("bob", "github", Kind::Definitions, 0);
        let alice = t.rows(Some("alice"));
        assert_eq!(alice.len(), 2);
        assert_eq!((alice[0].backend.as_str(), alice[0].saved), (SCOPE, 100));
        assert_eq!((alice[1].backend.as_str(), alice[1].results), ("github", 15));
        assert_eq!(t.rows(None).len(), 3);
        let series = t
            .family
            .get_or_create(&Spent { principal: "alice".into(), backend: "github".into(), kind: "results" })
            .get();
        assert_eq!(series, 15);
        for i in 0..MAX_PAIRS {
            t.add(&format!("p{i}"), "x", Kind::Results, 1);
        }
        assert!(t.rows(None).len() <= MAX_PAIRS + 1);
        assert!(t.rows(Some("(other)")).first().is_some_and(|r| r.results >= 3));
    }
}
