//! find_tool over a caller's snapshot, and the names offered for a tool that is not in it.

use std::collections::HashSet;

use rmcp::model::{CallToolResult, Tool};

use super::GatewayHandler;
use crate::catalog::token_weight;
use crate::config::AnswerForm;
use crate::index::{AllowList, Slot};
use crate::mcp::meta::{self, TokenMetrics, Unavailable};
use crate::session::Snapshot;
use crate::store::learned::ResultSizes;
use crate::store::{Query, Ranker, SearchResult};

/// A find_tool search done, before it is put into an answer: what the console's playground
/// shows whole, and find_tool renders as its agent-facing answer.
pub struct Found {
    pub query: Query,
    pub result: SearchResult,
    /// Matches among tools whose backend is down (would rank with the returned ones).
    pub unavailable: Vec<Unavailable>,
    /// Backends the caller may use that wait for a login.
    pub needs_login: Vec<String>,
    /// What listing every tool in the caller's scope would cost, in tokens.
    pub baseline_tokens: u64,
    /// The caller asked for full definitions (`describe`).
    pub describe: bool,
    /// How large each hit's results have been, where that is worth saying.
    pub sizes: Vec<Option<ResultSizes>>,
}

/// A tool's results count as large, and find_tool says how large, from this 95th percentile.
pub const LARGE_RESULT_TOKENS: u32 = 5_000;

/// Input parameters that let a caller ask for less; named in a large result's note.
const NARROWING: &[&str] = &[
    "limit",
    "max_results",
    "maxResults",
    "per_page",
    "perPage",
    "page_size",
    "pageSize",
    "top_k",
    "topK",
    "count",
    "max_lines",
    "lines",
    "max",
    "first",
    "fields",
];

/// A find_tool request refused before a search: the `isError` answer, and the audit decision
/// (`limited` by `[[limits]]`, else `refused`).
pub struct Refusal {
    pub result: CallToolResult,
    pub decision: &'static str,
}

impl Found {
    /// The answer with tools compact (first sentence, required properties whole) or whole.
    pub fn answer(&self, snap: &Snapshot, compact: bool) -> CallToolResult {
        let tools: Vec<Tool> = self
            .result
            .hits
            .iter()
            .map(|h| &snap.generation.catalog.tools()[h.slot as usize].tool)
            .zip(self.sizes.iter().chain(std::iter::repeat(&None)))
            .map(|(t, size)| {
                let mut shown = if compact { meta::compact(t) } else { t.clone() };
                if let Some(size) = size {
                    let note = size_note(t, size);
                    shown.description = Some(format!("{} {note}", shown.description.as_deref().unwrap_or("")).into());
                }
                shown
            })
            .collect();
        let returned: u64 = tools.iter().map(token_weight).sum();
        let mode = serde_json::to_value(self.result.mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let matched = meta::Match {
            verdict: self.result.verdict,
            scores: self.result.similarity.clone(),
            non_english: crate::catalog::text::mostly_non_latin(&self.query.description),
        };
        meta::find_result(
            &tools,
            &matched,
            TokenMetrics::new(self.baseline_tokens, returned),
            &mode,
            self.unavailable.clone(),
            self.needs_login.clone(),
        )
    }
}

/// What find_tool says of a tool whose results are large: how large, and how to ask for less.
fn size_note(tool: &Tool, size: &ResultSizes) -> String {
    let k = |t: u32| if t >= 1_000 { format!("{}k", (t + 500) / 1_000) } else { t.to_string() };
    let props = tool.input_schema.get("properties").and_then(|p| p.as_object());
    let narrowing: Vec<&str> =
        NARROWING.iter().copied().filter(|n| props.is_some_and(|p| p.contains_key(*n))).collect();
    let ask = match narrowing.as_slice() {
        [] => String::new(),
        [one] => format!("; it has a `{one}` parameter"),
        many => format!("; it has {} parameters", many.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")),
    };
    format!(
        "(Results are large: about {} tokens typically, {} at the 95th percentile of its last {} calls{ask}.)",
        k(size.p50),
        k(size.p95),
        size.calls
    )
}

impl GatewayHandler {
    /// find_tool for a client's request, with its line in the audit trail.
    pub(super) async fn find_tool_audited(
        &self,
        args: Option<&rmcp::model::JsonObject>,
        snap: &Snapshot,
        ctx: &rmcp::service::RequestContext<rmcp::service::RoleServer>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let (answer, decision) = self.find_tool(args, snap).await;
        if self.gw.audit().is_on() {
            let mut e = self.audit_entry("find_tool", ctx, decision);
            let text = args.and_then(|a| a.get("tool_description")).and_then(|v| v.as_str()).unwrap_or_default();
            e.request = self.gw.audit().request(text);
            e.request_chars = Some(text.chars().count());
            e.status = Some(if answer.is_error == Some(true) { "is_error" } else { "ok" });
            if let Some(m) = answer.structured_content.as_ref().map(|v| &v["token_metrics"]) {
                e.definition_tokens = m["returned_tokens"].as_u64();
                e.saved_tokens =
                    m["baseline_tokens"].as_u64().zip(e.definition_tokens).map(|(b, r)| b.saturating_sub(r));
            }
            if decision != "allowed" {
                e.detail = answer.content.first().and_then(|c| c.as_text()).map(|t| t.text.chars().take(200).collect());
            }
            self.gw.audit().record(e.took(started));
        }
        answer
    }

    /// find_tool over `snap` (also used by `toolmux find`), and the decision for the audit
    /// trail: `allowed`, `limited` or `refused`.
    pub async fn find_tool(
        &self,
        args: Option<&rmcp::model::JsonObject>,
        snap: &Snapshot,
    ) -> (CallToolResult, &'static str) {
        let found = match self.search(args, snap, &snap.caller).await {
            Ok(found) => found,
            Err(refused) => return (refused.result, refused.decision),
        };
        self.gw.metrics.find_tool(&found.result);
        // A call that follows may teach the ranking (`store::learned`).
        if let Some(vector) = &found.result.vector
            && self.gw.store.learned().is_some_and(|l| l.is_enabled())
        {
            let tools = snap.generation.catalog.tools();
            let hits = found.result.hits.iter().map(|h| tools[h.slot as usize].key.clone()).collect();
            self.usage(&snap.caller.principal).found(vector.clone(), hits);
        }
        let compact = self.gw.answer == AnswerForm::Compact && !found.describe;
        let answer = found.answer(snap, compact);
        self.count_tokens(snap, &answer);
        (answer, "allowed")
    }

    /// Counts a find_tool answer's tokens for its caller: each tool's definition against its
    /// backend, and what listing the whole scope would have cost more.
    fn count_tokens(&self, snap: &Snapshot, answer: &CallToolResult) {
        use crate::metrics::tokens::{Kind, SCOPE};
        let Some(body) = answer.structured_content.as_ref() else { return };
        let principal = &snap.caller.principal;
        for tool in body["tools"].as_array().into_iter().flatten() {
            let backend = tool["name"].as_str().and_then(|n| snap.tool(n)).map(|t| &*t.key.backend);
            let tokens = crate::catalog::tokens_of(tool);
            self.gw.metrics.tokens.add(principal, backend.unwrap_or(SCOPE), Kind::Definitions, tokens);
        }
        let m = &body["token_metrics"];
        if let (Some(baseline), Some(returned)) = (m["baseline_tokens"].as_u64(), m["returned_tokens"].as_u64()) {
            self.gw.metrics.tokens.add(principal, SCOPE, Kind::Saved, baseline.saturating_sub(returned));
        }
    }

    /// find_tool's search over `snap`, with everything its answer says, or the `isError` answer
    /// for a request it refuses (bad arguments, too long, the model busy: counted, since the
    /// model's queue is shared, or over `payer`'s `find_tool_rate`). Counts no search and
    /// learns nothing: [`GatewayHandler::find_tool`] does that for agents' requests.
    pub async fn search(
        &self,
        args: Option<&rmcp::model::JsonObject>,
        snap: &Snapshot,
        payer: &crate::session::Caller,
    ) -> Result<Found, Refusal> {
        let refused = |message: String| Refusal { result: meta::error_result(message), decision: "refused" };
        if let Some(why) = self.gw.audit().refusal() {
            return Err(refused(format!("find_tool was {why}")));
        }
        let args = meta::parse_find(args).map_err(refused)?;
        // Checked before anything is tokenised or cached: the model reads 256 word pieces
        // (about a thousand characters) and ignores the rest anyway.
        let max = self.gw.max_query_chars;
        let description_chars = args.description.chars().count();
        let keyword_chars: usize = args.keywords.iter().map(|k| k.chars().count() + 1).sum();
        if description_chars > max {
            return Err(refused(format!(
                "tool_description is {description_chars} characters; the limit is {max} (optimizer.max_query_chars). Describe the capability you need in a sentence or two."
            )));
        }
        if keyword_chars > max {
            return Err(refused(format!(
                "tool_keywords add up to {keyword_chars} characters; the limit is {max} (optimizer.max_query_chars). Give a few distinctive words."
            )));
        }
        if let Err(limit) = self.gw.limiter.check(payer, crate::limits::Action::Search).await {
            let message =
                format!("{}. Until then, call the tools you already found with call_tool.", limit.message("find_tool"));
            return Err(Refusal { result: meta::error_result(message), decision: "limited" });
        }
        let query = Query { description: args.description, keywords: args.keywords };
        let result =
            self.gw.store.search(&snap.generation, &snap.allow, &query, self.gw.max_tools, Ranker::Fused).await;
        if let Some(ahead) = result.busy {
            self.gw.metrics.find_tool_busy.inc();
            return Err(refused(format!(
                "busy: {ahead} requests are ahead of yours for the search model; retry in a moment"
            )));
        }
        let unavailable = self.unavailable(snap, &query, &result.hits).await;
        let needs_login = self.needs_login(snap);
        let tools = snap.generation.catalog.tools();
        let sizes = match self.gw.store.learned() {
            Some(learned) => result
                .hits
                .iter()
                .map(|h| learned.sizes(&tools[h.slot as usize].key).filter(|s| s.p95 >= LARGE_RESULT_TOKENS))
                .collect(),
            None => Vec::new(),
        };
        Ok(Found {
            sizes,
            query,
            result,
            unavailable,
            needs_login,
            baseline_tokens: snap.baseline_tokens,
            describe: args.describe,
        })
    }

    /// Up to three names in `snap` (never outside it) closest to an unknown `name`: the nearest
    /// by edit distance, then the best keyword matches for the words of the name.
    pub(super) async fn closest_names(&self, snap: &Snapshot, name: &str) -> Vec<String> {
        const MAX: usize = 3;
        /// Normalised similarity from which a name counts as a typo of another.
        const TYPO: f64 = 0.7;
        let wanted = name.to_lowercase();
        let mut near: Vec<(f64, &str)> = snap
            .tools()
            .map(|t| t.tool.name.as_ref())
            .map(|n| (strsim::normalized_damerau_levenshtein(&wanted, &n.to_lowercase()), n))
            .filter(|(score, _)| *score >= TYPO)
            .collect();
        near.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        let mut out: Vec<String> = near.into_iter().take(MAX).map(|(_, n)| n.to_string()).collect();
        if out.len() < MAX {
            let words = name.replace(['_', '-', '.', '/'], " ");
            let query = Query { description: words, keywords: Vec::new() };
            let generation = &snap.generation;
            let found = self.gw.store.search(generation, &snap.allow, &query, MAX, Ranker::KeywordOnly).await;
            for hit in found.hits {
                let n = generation.catalog.tools()[hit.slot as usize].tool.name.to_string();
                if out.len() < MAX && !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// The backends this caller may use that wait for a login, each with the command that
    /// gives it one (their tools are unknown until then, so the search cannot name them).
    pub(super) fn needs_login(&self, snap: &Snapshot) -> Vec<String> {
        let policy = self.gw.policy();
        self.gw
            .upstream
            .backends()
            .iter()
            .filter(|b| !matches!(policy.backend(&snap.caller, b.name()), crate::session::Access::Nothing))
            .filter_map(|b| b.needs_login().map(|n| format!("backend `{}` {n}", b.name())))
            .collect()
    }

    /// Matches among tools whose backend is down: those that would rank with the returned ones.
    pub(super) async fn unavailable(
        &self,
        snap: &Snapshot,
        query: &Query,
        returned: &[crate::index::Hit],
    ) -> Vec<Unavailable> {
        let generation = &snap.generation;
        let tools = generation.catalog.tools();
        // Only what the caller's policy allows: a tool it may not use is never named, down or not.
        let Some(held_back) = &snap.held_back else { return Vec::new() };
        let down: Vec<Slot> = held_back.iter().collect();
        if down.is_empty() {
            return Vec::new();
        }
        let union = AllowList::from_slots(tools.len(), snap.allow.iter().chain(down.iter().copied()));
        let n = self.gw.max_tools;
        let ranked = self.gw.store.search(generation, &union, query, n, Ranker::Fused).await;
        let returned: HashSet<Slot> = returned.iter().map(|h| h.slot).collect();
        ranked
            .hits
            .iter()
            .filter(|h| !returned.contains(&h.slot) && !snap.allow.contains(h.slot))
            .map(|h| {
                let t = &tools[h.slot as usize];
                let health = self.gw.health.health(&t.key.backend);
                Unavailable {
                    name: t.name().to_string(),
                    backend: t.key.backend.to_string(),
                    status: health.as_ref().map_or("unknown".into(), |h| format!("{:?}", h.status).to_lowercase()),
                    since_secs: health.map_or(0, |h| h.since_secs),
                    next_retry_secs: self.gw.health.retry_in(&t.key.backend).map(|d| d.as_secs()),
                }
            })
            .collect()
    }
}
