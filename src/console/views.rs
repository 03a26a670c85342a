//! What each console view shows, as JSON: the page reads these and computes nothing of its own.
//! Each is built for one caller: an admin (`[auth] admins`; everyone without authentication)
//! sees the whole gateway; anyone else sees their own scope and counts only.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::catalog::ledger::Kind;
use crate::index::AllowList;
use crate::mcp::handler::search::Found;
use crate::mcp::{Gateway, GatewayHandler};
use crate::session::{Access, Caller, Snapshot};
use crate::store::Ranker;

/// Characters of a tool's search text the tools view previews.
const PREVIEW_CHARS: usize = 280;
/// Excluded tools listed beside a playground answer, at most.
const MAX_EXCLUDED: usize = 10;

/// Who is looking, as every view starts with it.
fn viewer(gw: &Gateway, caller: &Caller) -> Value {
    json!({"principal": caller.principal, "groups": caller.groups, "admin": gw.is_admin(caller)})
}

/// The overview: `/status` as the caller may see it (anyone but an admin: only the backends
/// their policy lets them use), and sessions and tasks by principal (an admin sees every
/// principal; anyone else only their own).
pub fn overview(gw: &Gateway, caller: &Caller, limits: &[crate::limits::Usage]) -> Value {
    let admin = gw.is_admin(caller);
    let mut rows: BTreeMap<String, PrincipalRow> = BTreeMap::new();
    for (principal, n) in gw.registry().by_principal() {
        rows.entry(principal).or_default().sessions = n;
    }
    for (principal, (running, finished)) in gw.tasks.by_principal() {
        let row = rows.entry(principal).or_default();
        row.tasks_running = running;
        row.tasks_finished = finished;
    }
    for principal in gw.sessionless.principals() {
        rows.entry(principal).or_default().sessionless = true;
    }
    let principals: Vec<Value> = rows
        .into_iter()
        .filter(|(p, _)| admin || *p == caller.principal)
        .map(|(p, row)| {
            json!({
                "principal": p,
                "sessions": row.sessions,
                "tasks_running": row.tasks_running,
                "tasks_finished": row.tasks_finished,
                "sessionless": row.sessionless,
            })
        })
        .collect();
    // Each live session and the surface its client was given: an admin's every one, anyone
    // else's their own.
    let sessions = gw.session_rows((!admin).then_some(caller.principal.as_str()));
    json!({
        "viewer": viewer(gw, caller),
        "status": gw.status_for(caller),
        "principals": principals,
        "sessions": sessions.iter().take(crate::mcp::status::LISTED_SESSIONS).collect::<Vec<_>>(),
        "limits": limits,
    })
}

#[derive(Default)]
struct PrincipalRow {
    sessions: usize,
    tasks_running: usize,
    tasks_finished: usize,
    /// Holds backend sessions of its own without a client session (2026-07-28 callers).
    sessionless: bool,
}

/// A playground request: find_tool's arguments, and (admins only) whose scope to search.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    pub request: String,
    #[serde(default)]
    pub keywords: Vec<String>,
    /// Search as this principal (admins only; default: the caller).
    #[serde(default)]
    pub principal: Option<String>,
    /// With these groups (with `principal`).
    #[serde(default)]
    pub groups: Vec<String>,
}

/// Why a playground request was not run.
#[derive(Debug)]
pub enum Refused {
    /// Not the caller's to ask (another principal's scope, accepting changes): 403.
    Forbidden(&'static str),
    /// What find_tool would answer as an `isError`: 400 with the same text.
    Invalid(String),
}

/// One ranked tool, with where its score came from.
#[derive(Debug, Serialize)]
struct Ranked {
    rank: usize,
    name: String,
    backend: String,
    tool: String,
    description: String,
    /// Cosine similarity to the request (best over its clauses); absent without the dense arm.
    similarity: Option<f32>,
    /// The fused score and learning's part of it: for admins only. Learning moves a tool by
    /// what other principals called after similar requests; its exact part (or the exact score,
    /// less the two arms) would tell a non-admin about their requests, one probe at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<f32>,
    dense: f32,
    keyword: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    learned: Option<f32>,
    /// The clause of the request that scored it (absent: the whole request).
    clause: Option<usize>,
}

/// The playground: the request run through find_tool's own search for a scope, the ranked tools
/// with each arm's part, both answer forms with their token counts, and (admins only) the tools
/// the scope excludes that would have ranked.
pub async fn search(gw: &Arc<Gateway>, caller: &Caller, req: SearchRequest) -> Result<Value, Refused> {
    let admin = gw.is_admin(caller);
    let target = match req.principal.as_deref().filter(|p| !p.is_empty()) {
        Some(p) if p != caller.principal || req.groups != caller.groups => {
            if !admin {
                return Err(Refused::Forbidden("only admins may search another principal's scope"));
            }
            Caller::named(p, req.groups.clone())
        }
        _ => caller.without_token(),
    };
    let snap = gw.scope_for(&target);
    let mut args = serde_json::Map::new();
    args.insert("tool_description".into(), json!(req.request));
    if !req.keywords.is_empty() {
        args.insert("tool_keywords".into(), json!(req.keywords.join(" ")));
    }
    // The same search find_tool runs (its limits, its ranking); no session, so nothing learned.
    let handler = GatewayHandler::new(gw.clone());
    let found = match handler.search(Some(&args), &snap, caller).await {
        Ok(found) => found,
        Err(refused) => {
            let text =
                refused.result.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone()).unwrap_or_default();
            return Err(Refused::Invalid(text));
        }
    };
    let ranked = ranked(&snap, &found, admin);
    let compact = found.answer(&snap, true);
    let full = found.answer(&snap, false);
    let tokens = |r: &rmcp::model::CallToolResult| {
        r.structured_content.as_ref().map_or(0, |v| v["token_metrics"]["returned_tokens"].as_u64().unwrap_or(0))
    };
    let t = found.result.timings;
    let mut out = json!({
        "viewer": viewer(gw, caller),
        "scope": {"principal": target.principal, "groups": target.groups, "tools": snap.allow.count()},
        "request": req.request,
        "keywords": req.keywords,
        "verdict": found.result.verdict,
        "mode": found.result.mode,
        "timings_ms": {
            "embed": ms(t.embed),
            "search": ms(t.search),
            "fuse": ms(t.fuse),
        },
        "ranked": ranked,
        "answers": {
            "compact": {"tokens": tokens(&compact), "answer": compact.structured_content},
            "full": {"tokens": tokens(&full), "answer": full.structured_content},
        },
    });
    if admin {
        out["excluded"] = json!(excluded(gw, &snap, &found).await);
    }
    Ok(out)
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn ranked(snap: &Snapshot, found: &Found, admin: bool) -> Vec<Ranked> {
    let tools = snap.generation.catalog.tools();
    let r = &found.result;
    r.hits
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let t = &tools[h.slot as usize];
            let parts = r.parts.get(i).copied().unwrap_or_default();
            Ranked {
                rank: i + 1,
                name: t.name().to_string(),
                backend: t.key.backend.to_string(),
                tool: t.key.tool.to_string(),
                description: first_line(t.tool.description.as_deref().unwrap_or_default()),
                similarity: r.similarity.get(i).copied(),
                score: admin.then_some(h.score),
                dense: parts.dense,
                keyword: parts.keyword,
                learned: admin.then_some(parts.learned),
                clause: parts.clause,
            }
        })
        .collect()
}

/// Tools outside `snap`'s scope that would rank among its answers if the scope allowed every
/// tool of the catalog, each with the reason it is out.
async fn excluded(gw: &Gateway, snap: &Snapshot, found: &Found) -> Vec<Value> {
    let generation = &snap.generation;
    let tools = generation.catalog.tools();
    let everything = AllowList::all(tools.len());
    if everything.count() == snap.allow.count() {
        return Vec::new();
    }
    let n = gw.max_tools + MAX_EXCLUDED;
    let wide = gw.store.search(generation, &everything, &found.query, n, Ranker::Fused).await;
    let policy = gw.policy();
    let cutoff = found.result.hits.last().map_or(f32::MIN, |h| h.score);
    wide.hits
        .iter()
        .enumerate()
        .filter(|(_, h)| !snap.allow.contains(h.slot))
        .take(MAX_EXCLUDED)
        .map(|(i, h)| {
            let t = &tools[h.slot as usize];
            let backend = t.key.backend.as_ref();
            let reason = if snap.held_back.as_ref().is_some_and(|d| d.contains(h.slot)) {
                let health = gw.health.health(backend).map_or("unknown".into(), |h| format!("{:?}", h.status));
                format!("backend `{backend}` is not served now ({})", health.to_lowercase())
            } else if matches!(policy.backend(&snap.caller, backend), Access::Nothing) {
                format!("policy: backend `{backend}` is not allowed to this principal")
            } else {
                "policy: the tool is not allowed to this principal".to_string()
            };
            json!({
                "rank_if_allowed": i + 1,
                "name": t.name(),
                "backend": backend,
                "score": h.score,
                "would_be_returned": h.score >= cutoff || found.result.hits.len() < gw.max_tools,
                "reason": reason,
            })
        })
        .collect()
}

/// The first line of `text`, clipped to [`PREVIEW_CHARS`].
fn first_line(text: &str) -> String {
    clip(text.trim().lines().next().unwrap_or_default())
}

/// `text` with its whitespace runs made single spaces, clipped to [`PREVIEW_CHARS`].
fn preview(text: &str) -> String {
    clip(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// `text` whole if it fits in [`PREVIEW_CHARS`], else cut with an ellipsis.
fn clip(text: &str) -> String {
    if text.chars().count() <= PREVIEW_CHARS {
        return text.to_string();
    }
    let cut: String = text.chars().take(PREVIEW_CHARS - 1).collect();
    format!("{cut}…")
}

/// The tools view: the catalog by backend (an admin's is the whole catalog; anyone else's is
/// their scope), each tool with a preview of the text it is searched by, its ledger state and
/// what it was flagged for ([`crate::fence`]); and, for admins, what the tool ledger holds back
/// with a diff against what is served and its flags.
pub fn tools(gw: &Gateway, caller: &Caller) -> Value {
    let admin = gw.is_admin(caller);
    let snap = gw.scope_for(caller);
    let generation = &snap.generation;
    let integrity = gw.integrity.status();
    let changed: std::collections::HashSet<(&str, &str)> = integrity
        .recent
        .iter()
        .filter(|e| e.kind == Kind::Changed && !e.held)
        .map(|e| (e.backend.as_str(), e.tool.as_str()))
        .collect();
    let mut by_backend: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let shown = gw.backends_shown_to(caller);
    for backend in gw.upstream.backends().iter().filter(|b| admin || shown(b.name())) {
        by_backend.entry(backend.name().to_string()).or_default();
    }
    let slots: Vec<u32> = if admin {
        (0..generation.catalog.len() as u32).collect()
    } else {
        snap.allow.iter().chain(snap.held_back.iter().flat_map(|d| d.iter())).collect()
    };
    for slot in slots {
        let t = &generation.catalog.tools()[slot as usize];
        let state = if changed.contains(&(t.key.backend.as_ref(), t.key.tool.as_ref())) { "changed" } else { "served" };
        by_backend.entry(t.key.backend.to_string()).or_default().push(json!({
            "name": t.name(),
            "tool": t.key.tool.as_ref(),
            "description": first_line(t.tool.description.as_deref().unwrap_or_default()),
            "search_text": preview(&t.text),
            "tokens": t.tokens,
            "in_scope": snap.allow.contains(slot),
            "state": state,
            "flags": t.flags,
        }));
    }
    let backends: Vec<Value> = by_backend
        .into_iter()
        .map(|(name, mut tools)| {
            tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            let health = gw.health.health(&name).map_or("unknown".into(), |h| format!("{:?}", h.status).to_lowercase());
            json!({"name": name, "health": health, "tools": tools})
        })
        .collect();
    let mut out = json!({
        "viewer": viewer(gw, caller),
        "generation": generation.id,
        "frozen": integrity.frozen,
        "backends": backends,
    });
    if admin {
        let recent_kind = |backend: &str, tool: &str| {
            integrity.recent.iter().rev().find(|e| e.backend == backend && e.tool == tool).map(|e| e.kind)
        };
        let held: Vec<Value> = integrity
            .held
            .iter()
            .map(|h| {
                let (accepted, held) = gw.integrity.versions(&h.backend, &h.tool);
                let kind = recent_kind(&h.backend, &h.tool).unwrap_or(match accepted {
                    Some(_) => Kind::Changed,
                    None => Kind::Added,
                });
                json!({
                    "backend": h.backend,
                    "tool": h.tool,
                    "kind": kind,
                    "digest": h.digest,
                    "seen_ms": h.seen_ms,
                    "flags": h.flags,
                    "diff": diff(accepted.as_ref(), held.as_ref()),
                })
            })
            .collect();
        out["held"] = json!(held);
        out["recent"] = json!(integrity.recent);
    } else {
        out["held"] = json!(integrity.held.len());
    }
    out
}

/// A line diff of two definitions (of a tool, a prompt, a resource…) as pretty JSON:
/// `[op, line]` with op ` `, `-` (served, going) or `+` (held, coming).
fn diff(served: Option<&Value>, held: Option<&Value>) -> Vec<(char, String)> {
    let pretty = |t: Option<&Value>| t.map(|t| serde_json::to_string_pretty(t).unwrap_or_default());
    let (old, new) = (pretty(served).unwrap_or_default(), pretty(held).unwrap_or_default());
    similar::TextDiff::from_lines(&old, &new)
        .iter_all_changes()
        .map(|c| {
            let op = match c.tag() {
                similar::ChangeTag::Equal => ' ',
                similar::ChangeTag::Delete => '-',
                similar::ChangeTag::Insert => '+',
            };
            (op, c.value().trim_end_matches('\n').to_string())
        })
        .collect()
}

/// Accepts held versions (admins only): in the replicas' shared ledger first when there is one
/// (its accepted versions win on every replica), then here; the catalog then serves them.
pub async fn accept(gw: &Gateway, caller: &Caller, backend: &str, tool: Option<&str>) -> Result<Value, Refused> {
    if !gw.is_admin(caller) {
        return Err(Refused::Forbidden("only admins may accept held tool changes"));
    }
    if let Some(shared) = gw.shared_sessions() {
        shared
            .accept_held(Some(backend), tool)
            .await
            .map_err(|e| Refused::Invalid(format!("the session store did not answer: {}", e.0)))?;
    }
    let accepted = gw.integrity.accept(backend, tool);
    if accepted.is_empty() {
        return Err(Refused::Invalid(format!(
            "nothing held back matched backend `{backend}`{}",
            tool.map(|t| format!(", tool `{t}`")).unwrap_or_default()
        )));
    }
    tracing::info!(principal = %caller.principal, backend, ?tool, "held tool changes accepted in the console");
    let accepted: Vec<Value> = accepted.into_iter().map(|(b, t)| json!({"backend": b, "tool": t})).collect();
    Ok(json!({"accepted": accepted}))
}

/// The traffic view: the last minutes in slices, oldest first.
pub fn traffic(gw: &Gateway, caller: &Caller) -> Value {
    // Tokens by principal and backend: an admin's whole table, anyone else's own rows.
    let only = (!gw.is_admin(caller)).then_some(caller.principal.as_str());
    // Secrets scrubbed from answers, by backend and rule: for admins (they name every backend).
    let redactions = match only {
        None => gw.scrubbing.redactions.rows(),
        Some(_) => Vec::new(),
    };
    json!({
        "viewer": viewer(gw, caller),
        "slice_secs": crate::metrics::traffic::SLICE.as_secs(),
        "points": gw.metrics.traffic.points(),
        "tokens": gw.metrics.tokens.rows(only),
        "redactions": redactions,
    })
}
