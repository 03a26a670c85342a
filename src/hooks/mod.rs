//! `[[hooks]]` in force: the company's own guard services, called over HTTP around a tool call.
//!
//! Before a call, each hook whose rule covers it gets `{"phase": "before", "principal",
//! "groups", "backend", "tool", "arguments"}`; after it, `{"phase": "after", ..., "result"}`.
//! It answers `{"decision": "allow"}`, `{"decision": "deny", "reason": "..."}`, or
//! `{"decision": "replace", "arguments": {...}}` (before) / `{"decision": "replace", "result":
//! {...}}` (after). Hooks run in the order written, each seeing what the one before let
//! through. A hook that does not answer within its timeout (a place among its `max_in_flight`
//! requests included), answers with an HTTP error or answers something else has failed: the call
//! is denied (`on_failure = "deny"`, the default) or goes on as if it had allowed it.

use std::sync::Arc;

use globset::GlobSet;
use rmcp::model::{CallToolResult, JsonObject};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::policy::set;
use crate::config::HookConfig;
use crate::session::Caller;

/// What a guard decided about a call or its result.
#[derive(Debug, PartialEq)]
pub enum Verdict<T> {
    /// Go on with this (the original, or a hook's replacement).
    Pass(T),
    /// Stop: which hook, and why (its reason, or why it failed).
    Deny { hook: String, reason: String },
}

struct Hook {
    cfg: HookConfig,
    principals: GlobSet,
    groups: GlobSet,
    backends: GlobSet,
    tools: GlobSet,
    places: Arc<tokio::sync::Semaphore>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    decision: String,
    reason: Option<String>,
    arguments: Option<Value>,
    result: Option<Value>,
}

/// Bytes of a hook's answer read at most.
const MAX_ANSWER: usize = 4 << 20;

pub struct Hooks {
    hooks: arc_swap::ArcSwap<Vec<Hook>>,
    http: reqwest::Client,
}

impl Default for Hooks {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl Hooks {
    pub fn new(hooks: &[HookConfig]) -> Self {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap_or_default();
        let s = Self { hooks: arc_swap::ArcSwap::from_pointee(Vec::new()), http };
        s.set(hooks);
        s
    }

    /// Puts `hooks` in force (a reload).
    pub fn set(&self, hooks: &[HookConfig]) {
        let compiled = hooks
            .iter()
            .map(|h| Hook {
                principals: set(&h.principals),
                groups: set(&h.groups),
                backends: set(&h.backends),
                tools: set(&h.tools),
                places: Arc::new(tokio::sync::Semaphore::new(h.max_in_flight)),
                cfg: h.clone(),
            })
            .collect();
        self.hooks.store(Arc::new(compiled));
    }

    fn covering<'a>(
        hooks: &'a [Hook],
        caller: &'a Caller,
        backend: &'a str,
        tool: &'a str,
    ) -> impl Iterator<Item = &'a Hook> + 'a {
        hooks.iter().filter(move |h| {
            (h.principals.is_match(&caller.principal) || caller.groups.iter().any(|g| h.groups.is_match(g)))
                && h.backends.is_match(backend)
                && h.tools.is_match(tool)
        })
    }

    /// Runs the `before` hooks that cover a call: the arguments to send, or a denial.
    pub async fn before(
        &self,
        caller: &Caller,
        backend: &str,
        tool: &str,
        mut arguments: Option<JsonObject>,
    ) -> Verdict<Option<JsonObject>> {
        let hooks = self.hooks.load();
        for h in Self::covering(&hooks, caller, backend, tool).filter(|h| h.cfg.before) {
            let body = json!({"phase": "before", "principal": caller.principal, "groups": caller.groups,
                              "backend": backend, "tool": tool, "arguments": arguments});
            match self.ask(h, &body).await {
                Ok(Answer { decision, .. }) if decision == "allow" => {}
                Ok(Answer { decision, reason, .. }) if decision == "deny" => {
                    return Verdict::Deny { hook: h.cfg.name.clone(), reason: reason.unwrap_or_default() };
                }
                Ok(Answer { decision, arguments: Some(Value::Object(a)), .. }) if decision == "replace" => {
                    arguments = Some(a);
                }
                Ok(_) => {
                    let why = "answered neither allow, deny, nor replace with an arguments object";
                    if let Some(denied) = failed(h, why) {
                        return denied;
                    }
                }
                Err(why) => {
                    if let Some(denied) = failed(h, &why) {
                        return denied;
                    }
                }
            }
        }
        Verdict::Pass(arguments)
    }

    /// Runs the `after` hooks that cover a call on its result: the result to return, or a
    /// denial.
    pub async fn after(
        &self,
        caller: &Caller,
        backend: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
        mut result: CallToolResult,
    ) -> Verdict<CallToolResult> {
        let hooks = self.hooks.load();
        for h in Self::covering(&hooks, caller, backend, tool).filter(|h| h.cfg.after) {
            let body = json!({"phase": "after", "principal": caller.principal, "groups": caller.groups,
                              "backend": backend, "tool": tool, "arguments": arguments, "result": result});
            let replaced = match self.ask(h, &body).await {
                Ok(Answer { decision, .. }) if decision == "allow" => continue,
                Ok(Answer { decision, reason, .. }) if decision == "deny" => {
                    return Verdict::Deny { hook: h.cfg.name.clone(), reason: reason.unwrap_or_default() };
                }
                Ok(Answer { decision, result: Some(r), .. }) if decision == "replace" => {
                    serde_json::from_value::<CallToolResult>(r)
                        .map_err(|e| format!("replaced the result with one that is not a tool result: {e}"))
                }
                Ok(_) => Err("answered neither allow, deny, nor replace with a result".to_string()),
                Err(why) => Err(why),
            };
            match replaced {
                Ok(r) => result = r,
                Err(why) => {
                    if let Some(denied) = failed(h, &why) {
                        return denied;
                    }
                }
            }
        }
        Verdict::Pass(result)
    }

    /// Whether any hook is in force.
    pub fn is_active(&self) -> bool {
        !self.hooks.load().is_empty()
    }

    /// Asks `h`, within its timeout (waiting for a place included).
    async fn ask(&self, h: &Hook, body: &Value) -> Result<Answer, String> {
        let timeout = h.cfg.timeout;
        let asked = async {
            let _place = h.places.acquire().await.map_err(|_| "closed".to_string())?;
            let mut request = self.http.post(&h.cfg.url).json(body);
            for (k, v) in &h.cfg.headers {
                request = request.header(k, v);
            }
            let response = request
                .send()
                .await
                .map_err(|e| format!("could not be reached: {}", crate::redact::urls(&e.to_string())))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!("answered HTTP {status}"));
            }
            let bytes = read_bounded(response).await?;
            serde_json::from_slice::<Answer>(&bytes)
                .map_err(|e| format!("answered something that is not a decision ({e})"))
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("did not answer within {}", humantime::format_duration(timeout))),
        }
    }
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("broke off its answer: {e}"))? {
        if bytes.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("answered more than {} MiB", MAX_ANSWER >> 20));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A hook failed: logged; a denial if it fails closed, else nothing (the call goes on).
fn failed<T>(h: &Hook, why: &str) -> Option<Verdict<T>> {
    tracing::warn!(hook = %h.cfg.name, fail_closed = h.cfg.fail_closed, "guardrail hook failed: {why}");
    h.cfg.fail_closed.then(|| Verdict::Deny {
        hook: h.cfg.name.clone(),
        reason: format!("the guardrail {why}, and it fails closed (on_failure = \"deny\")"),
    })
}
