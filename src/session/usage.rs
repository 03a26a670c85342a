//! A session's part in learning from use (`store::learned`): what its last find_tool found,
//! so that a call that follows can become a label, and which labels it has given.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::catalog::ToolKey;
use crate::store::learned::PER_SESSION;

/// How long after a find_tool a call of one of its tools still counts as following it.
pub const LABEL_WINDOW: Duration = Duration::from_secs(600);

/// How long the requests of a caller without a session count as one session (a principal's
/// session-less usage is begun afresh after it, with [`PER_SESSION`] labels to give again).
pub const SESSIONLESS_SPAN: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub struct Usage(Mutex<State>);

#[derive(Default)]
struct State {
    last: Option<LastFind>,
    /// Tools this session has labelled (at most [`PER_SESSION`], one label each).
    labelled: HashSet<ToolKey>,
}

struct LastFind {
    vector: Arc<Vec<f32>>,
    found: Vec<ToolKey>,
    at: Instant,
}

impl Usage {
    /// find_tool answered `found` for a request whose vector is `vector`.
    pub fn found(&self, vector: Arc<Vec<f32>>, found: Vec<ToolKey>) {
        self.0.lock().expect("usage lock").last = Some(LastFind { vector, found, at: Instant::now() });
    }

    /// The request vector a call of `tool` labels, if it makes a label: the last find_tool
    /// returned `tool` less than [`LABEL_WINDOW`] ago, this session has not labelled `tool`
    /// yet, and it has given fewer than [`PER_SESSION`] labels.
    pub fn label_for(&self, tool: &ToolKey) -> Option<Arc<Vec<f32>>> {
        let mut state = self.0.lock().expect("usage lock");
        let last = state.last.as_ref().filter(|l| l.at.elapsed() < LABEL_WINDOW && l.found.contains(tool))?;
        let vector = last.vector.clone();
        if state.labelled.len() >= PER_SESSION || !state.labelled.insert(tool.clone()) {
            return None;
        }
        Some(vector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str) -> ToolKey {
        ToolKey { backend: "b".into(), tool: t.into() }
    }

    #[test]
    fn a_call_labels_what_the_last_find_found_once() {
        let u = Usage::default();
        assert!(u.label_for(&key("a")).is_none(), "no find_tool yet");
        u.found(Arc::new(vec![1.0]), vec![key("a"), key("b")]);
        assert!(u.label_for(&key("c")).is_none(), "not among what was found");
        assert!(u.label_for(&key("a")).is_some());
        assert!(u.label_for(&key("a")).is_none(), "one label per tool per session");
    }

    #[test]
    fn a_session_gives_a_bounded_number_of_labels() {
        let u = Usage::default();
        let keys: Vec<ToolKey> = (0..PER_SESSION + 5).map(|i| key(&i.to_string())).collect();
        u.found(Arc::new(vec![1.0]), keys.clone());
        let given = keys.iter().filter(|k| u.label_for(k).is_some()).count();
        assert_eq!(given, PER_SESSION);
    }
}
