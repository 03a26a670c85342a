//! The walk's learning step: one principal's labels alone never change another principal's
//! find_tool ranking.

use super::*;

/// The requests the teach step asks, each with the tool it is aimed at.
const TEACH: [(&str, &str); 4] = [
    ("create an issue in a repository", "github_create_issue"),
    ("remember a value", "kit_remember"),
    ("create a ticket in a tracker project", "jira_create_ticket"),
    ("list pull requests of a repository", "github_list_pull_requests"),
];

impl Walk {
    /// One principal's labels alone never change another principal's ranking: `who` asks
    /// find_tool and calls the lowest-ranked tool it was offered but jira's (with arguments made
    /// from its schema: a label where the call succeeds), four times in four sessions of its own
    /// (a label each); another principal's ranking of the same request is the same before and
    /// after, unless a tool someone else had labelled got labels of `who` too (as the store
    /// counts principals, not as the rule that applies them: a rule that let one principal's
    /// labels count fails here). Learning is active from the start ([`Walk::seed_learning`]). One
    /// replica only: on two, labels reach each through Redis in their own time.
    pub(super) async fn teach(&mut self, who: Who) {
        if self.mode != "optimizer" || self.variant == Variant::Replicas {
            return self.find(who).await;
        }
        let request = TEACH[self.rng.random_range(0..TEACH.len())].0;
        let p = who.principal();
        let other = Who::Sessionless((p + self.rng.random_range(1..PRINCIPALS.len())) % PRINCIPALS.len());
        let learned = self.app.gateway.store.learned().expect("learning on").clone();
        let (was, labels) = (learned.principals_per_tool(), learned.total());
        let before = self.ranking(other, request).await;
        for i in 0..4 {
            // A session of its own (labels are made per session), apart from the walk's: its
            // calls change no state the walk keeps count of.
            let c = open_session(&self.app, PRINCIPALS[p], &format!("{}#teach{i}", PRINCIPALS[p])).await;
            let r = call(&c, "find_tool", json!({"tool_description": request})).await;
            let sc = r.structured_content.expect("structured content");
            // Not jira's: its calls spend the quota the walk keeps count of in `spend`.
            let offered = sc["tools"].as_array().cloned().unwrap_or_default();
            let Some(last) = offered.iter().rev().find(|t| !t["name"].as_str().unwrap().starts_with("jira_")).cloned()
            else {
                continue;
            };
            let name = last["name"].as_str().expect("a name");
            assert!(self.in_scope(who, name), "{}: {who:?} was offered {name} outside its scope", self.at());
            call(&c, "call_tool", json!({"tool_name": name, "parameters": arguments(&last["inputSchema"])})).await;
            c.cancel().await.expect("the session closes");
        }
        self.taught += learned.total() - labels;
        let now = learned.principals_per_tool();
        // A tool someone else had labelled and `who` now has too: its labels may count, or
        // count more; the check is for labels of `who` alone.
        let shared = now.iter().any(|(tool, &n)| was.get(tool).is_some_and(|&m| m >= 1 && n > m));
        let after = self.ranking(other, request).await;
        if !shared {
            assert_eq!(
                after,
                before,
                "{}: {who:?}'s labels alone changed {other:?}'s ranking of {request:?}",
                self.at()
            );
            self.teach_checks += 1;
        }
    }

    /// Learning made active from the first step, by principals outside the walk: for each
    /// request the teach step asks, labels of the tool it is aimed at from ten principals.
    pub(super) async fn seed_learning(&self) {
        let learned = self.app.gateway.store.learned().expect("learning on");
        let requests: Vec<String> = TEACH.iter().map(|(r, _)| r.to_string()).collect();
        let vectors = model().embed(requests).await.expect("the model embeds");
        let tools = self.app.gateway.store.current().catalog.tools().iter().map(|t| t.key.clone()).collect::<Vec<_>>();
        for ((_, aimed), v) in TEACH.iter().zip(&vectors) {
            let tool = tools.iter().find(|t| format!("{}_{}", t.backend, t.tool) == *aimed).expect("the aimed tool");
            for seeder in 0..10 {
                learned.record(v, tool, &format!("seed-{seeder}"));
            }
        }
        assert!(learned.active(), "seeded learning is active");
    }

    /// The tools find_tool offers `who` for `request`, in order.
    pub(super) async fn ranking(&mut self, who: Who, request: &str) -> Vec<String> {
        let c = self.client(who).await;
        let r = call(&*c, "find_tool", json!({"tool_description": request})).await;
        assert_ne!(r.is_error, Some(true), "{}: find_tool: {r:?}", self.at());
        found(&r)
    }
}

/// Arguments for a call of a tool with `schema`: each required property, a value of its type.
fn arguments(schema: &Value) -> Value {
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    let values = required.iter().filter_map(Value::as_str).map(|k| {
        let v = match schema["properties"][k]["type"].as_str() {
            Some("integer" | "number") => json!(1),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("walk"),
        };
        (k.to_string(), v)
    });
    Value::Object(values.collect())
}
