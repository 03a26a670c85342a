//! Tasks (SEP-2663) through the gateway: a tool call a backend turned into a task is handed to
//! its client under an id of the gateway's (`mcp::tasks`), and `tasks/get|update|cancel` go to
//! that backend on the client's own connection to it, for the client that created the task
//! only. A client that did not declare the extension never sees a task: the gateway follows it
//! to its end and answers with its result.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult, GetTaskParams, GetTaskResult, TaskPayload,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};

use super::{GatewayHandler, session_key, wire_error};
use crate::mcp::meta;
use crate::mcp::tasks::{MAX_LIVE_PER_PRINCIPAL, Owner, Route};
use crate::session::Access;
use crate::upstream::{Backend, CallError, Link};

/// How often a task is polled for a client that cannot follow it, within the backend's hint.
const POLL_FLOOR: Duration = Duration::from_millis(50);
const POLL_CEILING: Duration = Duration::from_secs(2);

impl GatewayHandler {
    /// Who may use a task created by this request.
    fn task_owner(&self, ctx: &RequestContext<RoleServer>) -> Owner {
        Owner::new(&self.caller(ctx).principal, session_key(ctx).map(|k| &*k.0))
    }

    /// Hands the client the task `backend` created for its call of `tool` (the backend's name
    /// for it), under an id of the gateway's; with a shared session store, other replicas learn
    /// the route before the client does.
    pub(super) async fn task_created(
        &self,
        backend: &Arc<Backend>,
        link: &Link,
        tool: &str,
        mut created: CreateTaskResult,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let upstream = created.task.task_id.clone();
        let mut route = Route::new(backend.name(), &upstream, self.task_owner(ctx), created.task.ttl_ms);
        route.tool = tool.to_string();
        route.instance = Some(backend.instance);
        let Ok((id, pushed)) = self.gw.tasks.insert(route.clone()) else {
            // The backend took it on already: it must not run for nobody.
            let _ = backend.cancel_task(link, CancelTaskParams::new(upstream), &ctx.ct).await;
            return Ok(meta::error_result(format!(
                "you already have {MAX_LIVE_PER_PRINCIPAL} tasks running; wait for one to finish (tasks/get), or cancel one (tasks/cancel), then call the tool again"
            ))
            .into());
        };
        self.cancel_pushed(pushed);
        self.share_route(&id, &route).await;
        created.task.task_id = id;
        Ok(CallToolResponse::Task(created))
    }

    /// Writes a route to the shared store, for as long as it is remembered.
    async fn share_route(&self, id: &str, route: &Route) {
        if let Some(store) = self.gw.shared_sessions() {
            let value = serde_json::to_string(route).expect("a task route serialises");
            if let Err(e) = store.put_task(id, &value, route.remaining(), &route.owner.principal).await {
                tracing::warn!(error = %e.0, "a task's route could not be shared: only this replica can answer for it");
            }
        }
    }

    /// Cancels, at their backends, tasks whose routes were pushed out of the table before they
    /// finished: nobody could follow them any more ([`crate::mcp::Gateway::cancel_orphaned`]).
    fn cancel_pushed(&self, pushed: Vec<Route>) {
        for route in pushed {
            let gw = self.gw.clone();
            tokio::spawn(async move { gw.cancel_orphaned(route, None).await });
        }
    }

    /// The route of task `id` for this request's caller, from this replica or the shared store;
    /// the same error for a task that does not exist, one that is someone else's, and one whose
    /// tool the caller may no longer use (that task is cancelled at the backend and forgotten).
    async fn task_route(
        &self,
        id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(Route, Arc<Backend>, Link), ErrorData> {
        let owner = self.task_owner(ctx);
        let unknown = || ErrorData::invalid_params(format!("unknown task: {id}"), None);
        let route = match self.gw.tasks.get(id, &owner) {
            Some(r) => r,
            None if self.gw.tasks.knows(id) => return Err(unknown()),
            None => {
                let stored = match self.gw.shared_sessions() {
                    Some(store) => store.fetch_task(id).await.ok().flatten(),
                    None => None,
                };
                let Some(route) = stored.and_then(|v| serde_json::from_str::<Route>(&v).ok()) else {
                    return Err(unknown());
                };
                let pushed = self.gw.tasks.adopt(id, route);
                self.cancel_pushed(pushed);
                self.gw.tasks.get(id, &owner).ok_or_else(unknown)?
            }
        };
        let backend = self.gw.upstream.get(&route.backend).ok_or_else(unknown)?;
        // A backend a reload replaced runs none of the old one's tasks.
        if route.instance.is_some_and(|i| i != backend.instance) {
            self.gw.tasks.forget(id);
            return Err(unknown());
        }
        let link = self.link(&backend, ctx).await.map_err(wire_error)?;
        if !self.may_use(&self.caller(ctx), &route) {
            tracing::info!(
                backend = backend.name(),
                tool = route.tool,
                "a task's owner may no longer use its tool: the task is cancelled"
            );
            self.gw.tasks.forget(id);
            if let Some(store) = self.gw.shared_sessions() {
                let _ = store.forget_task(id).await;
            }
            let _ = backend.cancel_task(&link, CancelTaskParams::new(route.upstream), &ctx.ct).await;
            return Err(unknown());
        }
        Ok((route, backend, link))
    }

    /// Whether `caller` may use the tool `route`'s task came from, under the policy in force
    /// now. (Health is not asked: a task outlives a backend's brief outage.)
    fn may_use(&self, caller: &crate::session::Caller, route: &Route) -> bool {
        let policy = self.gw.policy();
        match policy.backend(caller, &route.backend) {
            Access::All => true,
            Access::Some => policy.allows(caller, &route.backend, &route.tool),
            Access::Nothing => false,
        }
    }

    /// Runs a `tasks/*` request for task `id` and writes its line in the audit trail: `denied`
    /// when the task is not the caller's to see (or does not exist: the answer is the same).
    pub(super) async fn audited_task<T>(
        &self,
        action: &'static str,
        id: &str,
        ctx: &RequestContext<RoleServer>,
        request: impl std::future::Future<Output = Result<T, ErrorData>>,
    ) -> Result<T, ErrorData> {
        let started = std::time::Instant::now();
        let answer = request.await;
        if self.gw.audit().is_on() {
            let unknown = answer.as_ref().is_err_and(|e| e.message.starts_with("unknown task"));
            let mut e = self.audit_entry(action, ctx, if unknown { "denied" } else { "allowed" });
            e.target = Some(id.to_string());
            match &answer {
                Ok(_) => e.status = Some("ok"),
                Err(err) => {
                    e.detail = Some(err.message.to_string());
                    e.status = (!unknown).then_some("error");
                }
            }
            self.gw.audit().record(e.took(started));
        }
        answer
    }

    pub(super) async fn relay_get_task(
        &self,
        params: GetTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let id = params.task_id.clone();
        let (route, backend, link) = self.task_route(&id, ctx).await?;
        let mut got = backend.get_task(&link, GetTaskParams::new(route.upstream), &ctx.ct).await.map_err(wire_error)?;
        // A finished task's result or error is the backend's answer: secrets out of it, and
        // held to the caller's result limit as a call's is.
        match &mut got.task.payload {
            TaskPayload::Completed { result } => {
                let caller = self.caller(ctx);
                let bound = self.gw.results.bound(&caller, backend.name(), &route.tool);
                finish_result(&self.gw, backend.name(), (&caller.principal, bound), result).await
            }
            TaskPayload::Failed { error } => scrub_object(&self.gw.scrubbing, backend.name(), error),
            _ => {}
        }
        if got.task.status().is_terminal()
            && !route.finished
            && let Some(finished) = self.gw.tasks.finished(&id)
        {
            // Other replicas forget it as soon as this one does.
            self.share_route(&id, &finished).await;
        }
        got.task.task.task_id = id;
        Ok(got)
    }

    pub(super) async fn relay_update_task(
        &self,
        params: UpdateTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (route, backend, link) = self.task_route(&params.task_id, ctx).await?;
        let forwarded = UpdateTaskParams::new(route.upstream, params.input_responses);
        backend.update_task(&link, forwarded, &ctx.ct).await.map_err(wire_error)
    }

    pub(super) async fn relay_cancel_task(
        &self,
        params: CancelTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (route, backend, link) = self.task_route(&params.task_id, ctx).await?;
        backend.cancel_task(&link, CancelTaskParams::new(route.upstream), &ctx.ct).await.map_err(wire_error)
    }
}

/// A task's tool result, scrubbed (`[results] scrub`) and bounded (`[results] max_tokens`)
/// as a call's is; anything else it holds, scrubbed string by string.
async fn finish_result(
    gw: &crate::mcp::gateway::Gateway,
    backend: &str,
    (principal, bound): (&str, crate::results::Bound),
    result: &mut serde_json::Map<String, serde_json::Value>,
) {
    if !gw.scrubbing.is_on(backend) && bound.is_none() {
        return;
    }
    let value = serde_json::Value::Object(std::mem::take(result));
    let parsed = <CallToolResult as serde::Deserialize>::deserialize(&value);
    if let serde_json::Value::Object(o) = value {
        *result = o;
    }
    match parsed {
        Ok(mut r) => {
            let scrubbed = gw.scrubbing.result(backend, &mut r);
            let cut = gw.results.apply(principal, bound, || None, &mut r).await;
            let changed = scrubbed + cut + usize::from(gw.results.fence(backend, &mut r));
            if changed > 0
                && let Ok(serde_json::Value::Object(done)) = serde_json::to_value(&r)
            {
                *result = done;
            }
        }
        // Not a tool result after all: its strings scrubbed.
        Err(_) => scrub_object(&gw.scrubbing, backend, result),
    }
}

/// Every string of a task's result or error object, scrubbed (`[results] scrub`).
fn scrub_object(
    scrubbing: &crate::scrub::Scrubbing,
    backend: &str,
    object: &mut serde_json::Map<String, serde_json::Value>,
) {
    if !scrubbing.is_on(backend) {
        return;
    }
    let mut value = serde_json::Value::Object(std::mem::take(object));
    _ = scrubbing.value(backend, &mut value);
    if let serde_json::Value::Object(scrubbed) = value {
        *object = scrubbed;
    }
}

/// Follows a task the backend created for a client that did not declare the extension (a
/// backend that learnt the gateway's capabilities at initialize may do that) to its end, within
/// the backend's timeout, and answers as the call would have: its result, its error, or a tool
/// error when it was cancelled or needs input such a client cannot give.
pub(super) async fn run_to_end(
    backend: &Backend,
    link: &Link,
    created: CreateTaskResult,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<CallToolResult, CallError> {
    let id = created.task.task_id.clone();
    let every =
        created.task.poll_interval_ms.map_or(POLL_CEILING / 4, Duration::from_millis).clamp(POLL_FLOOR, POLL_CEILING);
    let name = backend.name().to_string();
    let follow = async {
        loop {
            tokio::time::sleep(every).await;
            let got = backend.get_task(link, GetTaskParams::new(id.clone()), ct).await?;
            match got.task.payload {
                TaskPayload::Completed { result } => {
                    return serde_json::from_value::<CallToolResult>(serde_json::Value::Object(result)).map_err(|e| {
                        CallError::Remote {
                            backend: name.clone(),
                            error: ErrorData::internal_error(
                                format!("the task's result is not a tool result: {e}"),
                                None,
                            ),
                        }
                    });
                }
                TaskPayload::Failed { error } => {
                    let error = serde_json::from_value::<ErrorData>(serde_json::Value::Object(error))
                        .unwrap_or_else(|_| ErrorData::internal_error("the task failed", None));
                    return Err(CallError::Remote { backend: name.clone(), error });
                }
                TaskPayload::Cancelled => {
                    return Ok(meta::error_result(format!("backend `{name}` cancelled the task running this call")));
                }
                TaskPayload::InputRequired { .. } => {
                    let _ = backend.cancel_task(link, CancelTaskParams::new(id.clone()), ct).await;
                    return Ok(meta::error_result(format!(
                        "backend `{name}` ran this call as a task that needs your input, which a client can give only to a task it follows; declare the io.modelcontextprotocol/tasks extension and call again"
                    )));
                }
                _ => continue,
            }
        }
    };
    let timeout = backend.config.timeout;
    match tokio::time::timeout(timeout, follow).await {
        Ok(r) => r,
        Err(_) => {
            let _ = backend.cancel_task(link, CancelTaskParams::new(id), ct).await;
            Err(CallError::Timeout { backend: name, after: timeout })
        }
    }
}
