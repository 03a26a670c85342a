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
use crate::mcp::tasks::{MAX_LIVE_PER_OWNER, Owner, Route};
use crate::upstream::{Backend, CallError, Link};

/// How often a task is polled for a client that cannot follow it, within the backend's hint.
const POLL_FLOOR: Duration = Duration::from_millis(50);
const POLL_CEILING: Duration = Duration::from_secs(2);

impl GatewayHandler {
    /// Who may use a task created by this request.
    fn task_owner(&self, ctx: &RequestContext<RoleServer>) -> Owner {
        Owner { principal: self.caller(ctx).principal, session: session_key(ctx).map(|k| k.0.to_string()) }
    }

    /// Hands the client the task `backend` created for its call, under an id of the gateway's;
    /// with a shared session store, other replicas learn the route before the client does.
    pub(super) async fn task_created(
        &self,
        backend: &Arc<Backend>,
        link: &Link,
        mut created: CreateTaskResult,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let upstream = created.task.task_id.clone();
        let route = Route::new(backend.name(), &upstream, self.task_owner(ctx), created.task.ttl_ms);
        let Ok(id) = self.gw.tasks.insert(route.clone()) else {
            // The backend took it on already: it must not run for nobody.
            let _ = backend.cancel_task(link, CancelTaskParams::new(upstream), &ctx.ct).await;
            return Ok(meta::error_result(format!(
                "you already have {MAX_LIVE_PER_OWNER} tasks running; wait for one to finish (tasks/get), or cancel one (tasks/cancel), then call the tool again"
            ))
            .into());
        };
        if let Some(store) = self.gw.shared_sessions() {
            let value = serde_json::to_string(&route).expect("a task route serialises");
            if let Err(e) = store.put_task(&id, &value, route.remaining()).await {
                tracing::warn!(error = %e.0, "a task's route could not be shared: only this replica can answer for it");
            }
        }
        created.task.task_id = id;
        Ok(CallToolResponse::Task(created))
    }

    /// The route of task `id` for this request's caller, from this replica or the shared store;
    /// the same error for a task that does not exist and one that is someone else's.
    async fn task_route(&self, id: &str, ctx: &RequestContext<RoleServer>) -> Result<(Route, Arc<Backend>), ErrorData> {
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
                self.gw.tasks.adopt(id, route);
                self.gw.tasks.get(id, &owner).ok_or_else(unknown)?
            }
        };
        let backend = self.gw.upstream.get(&route.backend).ok_or_else(unknown)?;
        Ok((route, backend))
    }

    pub(super) async fn relay_get_task(
        &self,
        params: GetTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let id = params.task_id.clone();
        let (route, backend) = self.task_route(&id, ctx).await?;
        let link = self.link(&backend).await.map_err(wire_error)?;
        let mut got = backend.get_task(&link, GetTaskParams::new(route.upstream), &ctx.ct).await.map_err(wire_error)?;
        if got.task.status().is_terminal() {
            self.gw.tasks.finished(&id);
        }
        got.task.task.task_id = id;
        Ok(got)
    }

    pub(super) async fn relay_update_task(
        &self,
        params: UpdateTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (route, backend) = self.task_route(&params.task_id, ctx).await?;
        let link = self.link(&backend).await.map_err(wire_error)?;
        let forwarded = UpdateTaskParams::new(route.upstream, params.input_responses);
        backend.update_task(&link, forwarded, &ctx.ct).await.map_err(wire_error)
    }

    pub(super) async fn relay_cancel_task(
        &self,
        params: CancelTaskParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (route, backend) = self.task_route(&params.task_id, ctx).await?;
        let link = self.link(&backend).await.map_err(wire_error)?;
        backend.cancel_task(&link, CancelTaskParams::new(route.upstream), &ctx.ct).await.map_err(wire_error)
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
