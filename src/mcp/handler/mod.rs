//! The MCP server one client talks to. rmcp makes one [`GatewayHandler`] per session (protocol
//! 2025-11-25) or per request (2026-07-28, stateless); either way every request loads one
//! snapshot and uses it to the end.
//!
//! Logging (`logging/setLevel`, log notifications) is deprecated by SEP-2577 but still what
//! 2025-11-25 clients and backends use, so the gateway carries it.
//!
//! Errors reach the wire through the `*_error` functions of `wire`: each internal error kind
//! maps to exactly one JSON-RPC error or tool result.
//!
//! This file holds the handler's state, what every request goes through ([`GatewayHandler::measured`]:
//! the caller's credential, metrics, the span) and the dispatch of each MCP method. The work is
//! in one file per concern:
//! - `search`: find_tool, and the names offered for a tool that is not found;
//! - `calls`: forwarding a tool call, its input rounds, parking a session-less client's call;
//! - `resources`: resources, templates, prompts and subscriptions, by the backend that serves them;
//! - `lifecycle`: a session's level, its record in the shared store, and its rebuild on another replica;
//! - `surface`: what each client is shown (its `tools/list`, what `initialize` tells it);
//! - `apps`: MCP Apps' `ui://` resources under their backend's name, and an App's calls;
//! - `groups`, `kept`, `tasks`: groups, kept results (`read_result`), relayed tasks;
//! - `wire`: every failure's one form on the wire.

#![expect(deprecated, reason = "logging is relayed as 2025-11-25 peers use it")]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, GetPromptRequestParams, GetPromptResponse, Implementation,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig,
};
use rmcp::model::{
    CancelTaskParams, CompleteRequestParams, CompleteResult, CompletionInfo, GetTaskParams, GetTaskResult, Reference,
    SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};

use self::apps::{served_as, with_app};
use self::wire::{Completed, call_error, relayed, wire_error};
use super::gateway::Gateway;
use super::meta::{self, CALL_TOOL, FIND_TOOL};
use crate::config::Mode;
use crate::results::READ_RESULT;
use crate::session::shared::{Change, Restored, SessionKey};
use crate::session::{Access, Caller, SessionHandle, Snapshot};
use crate::upstream::{Answer, Backend, CallError, Link};

mod apps;
mod calls;
mod groups;
mod kept;
mod lifecycle;
mod resources;
pub mod search;
mod surface;
mod tasks;
mod wire;

pub struct GatewayHandler {
    gw: Arc<Gateway>,
    /// Set at initialize; stays empty for stateless requests.
    session: OnceLock<Arc<SessionHandle>>,
    /// The backend session id last recorded in the shared store, by backend (`None`: not sealed).
    upstreams_recorded: std::sync::Mutex<std::collections::HashMap<String, Option<String>>>,
}

impl GatewayHandler {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw, session: OnceLock::new(), upstreams_recorded: Default::default() }
    }

    fn snapshot(&self, ctx: &RequestContext<RoleServer>) -> Arc<Snapshot> {
        match self.session.get() {
            Some(s) => self.gw.session_snapshot(s),
            None => self.gw.scope_for(&self.caller_of(ctx)),
        }
    }

    /// Where learning from use keeps this caller's last find_tool and the labels it gave: its
    /// session's, or for a caller without a session its principal's ([`Callers::usage`](crate::mcp::callers::Callers::usage)).
    fn usage(&self, principal: &str) -> Arc<crate::session::usage::Usage> {
        match self.session.get() {
            Some(s) => s.usage.clone(),
            None => self.gw.callers.usage(principal),
        }
    }

    fn advertisable_backends(&self) -> impl Iterator<Item = Arc<Backend>> + '_ {
        let backends = self.gw.upstream.backends();
        (0..backends.len()).map(move |i| backends[i].clone()).filter(|b| self.gw.advertisable(b.name()))
    }

    /// Advertisable backends whose resources and prompts `caller` may use (the whole backend).
    fn usable_backends<'a>(&'a self, caller: &'a Caller) -> impl Iterator<Item = Arc<Backend>> + 'a {
        let policy = self.gw.policy();
        self.advertisable_backends().filter(move |b| policy.backend(caller, b.name()) == Access::All)
    }

    /// The connection a request to `backend` travels on. A `per_client` backend: this session's
    /// own upstream session, or for a caller without a session its principal's (opened now if
    /// need be); never the gateway's shared connection, which would share the backend's state
    /// across callers. Any other backend: the gateway's shared connection.
    async fn link(&self, backend: &Arc<Backend>, ctx: &RequestContext<RoleServer>) -> Result<Link, CallError> {
        if let Some(upstreams) = self.session.get().and_then(|s| s.upstreams()) {
            return upstreams.link(backend).await;
        }
        if self.session.get().is_none() && backend.per_client() {
            let caller = self.caller_of(ctx);
            return self.gw.sessionless.link(&caller.principal, caller.token.clone(), backend).await;
        }
        backend.awake_link().await
    }

    /// The caller the HTTP edge authenticated; over stdio, `auth.stdio_principal`.
    fn caller_of(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        match ctx.extensions.get::<http::request::Parts>() {
            Some(parts) => parts.extensions.get::<Caller>().cloned().unwrap_or_else(Caller::anonymous),
            None => self.gw.local_caller.clone(),
        }
    }

    /// Who is asking: the session's caller (as this request presented it, see
    /// [`Self::measured`]), or the request's for a client without a session.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        self.session.get().map_or_else(|| self.caller_of(ctx), |s| (*s.caller()).clone())
    }

    /// Runs one MCP request's handling and counts it in the metrics by method and outcome.
    ///
    /// The handling is boxed: rmcp awaits a session's `initialize` inside the task that serves
    /// the session for its whole life, and that task is as large as the largest request future
    /// it could await there. Boxed, every handler method's future is a pointer and the context;
    /// inline, an idle session carried the size of `tools/call` (docs/performance.md).
    fn measured<'a, T: Send + 'a>(
        &'a self,
        method: &'static str,
        context: &RequestContext<RoleServer>,
        handling: impl std::future::Future<Output = Result<T, ErrorData>> + Send + 'a,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ErrorData>> + Send + 'a>> {
        use tracing::Instrument;
        // Every request's own credential decides what it may do: the session takes its groups
        // and token before anything is looked up (over HTTP; stdio has one caller throughout).
        if let Some(session) = self.session.get()
            && context.extensions.get::<http::request::Parts>().is_some()
        {
            self.gw.present(session, &self.caller_of(context));
        }
        let session = self.session.get().map(|s| s.id);
        let span = tracing::info_span!("mcp_request", method, session, tool = tracing::field::Empty);
        crate::telemetry::adopt(&span, context);
        Box::pin(
            async move {
                let at = std::time::Instant::now();
                let result = handling.await;
                self.gw.metrics.request(method, result.is_ok(), at.elapsed());
                // Logged once, here, with the request's span fields.
                if let Err(e) = &result {
                    tracing::info!(code = e.code.0, error = %e.message, "request answered with an error");
                }
                result
            }
            .instrument(span),
        )
    }

    /// A tool error in optimizer mode; a JSON-RPC invalid-params error in passthrough mode.
    /// An audit line for `action` by this request's caller, with its session (hashed), client
    /// and trace filled in.
    pub(super) fn audit_entry(
        &self,
        action: &'static str,
        ctx: &RequestContext<RoleServer>,
        decision: &'static str,
    ) -> crate::audit::Entry {
        let mut e = crate::audit::Entry::new(action, &self.caller(ctx).principal, decision);
        let headers = ctx.extensions.get::<http::request::Parts>().map(|p| &p.headers);
        e.session =
            headers.and_then(|h| h.get("mcp-session-id")).and_then(|v| v.to_str().ok()).map(crate::audit::session_hash);
        e.client = ctx.peer.peer_info().map(|i| i.client_info.name.clone());
        let parent =
            crate::telemetry::current().map(|(p, _)| p).or_else(|| crate::telemetry::Trace::of(ctx).traceparent);
        e.trace_id = parent.and_then(|p| p.split('-').nth(1).map(str::to_owned));
        e
    }

    /// Counts the tokens of tool definitions listed to this request's caller, by backend (the
    /// meta-tools' own under the gateway's name).
    fn count_listed(&self, ctx: &RequestContext<RoleServer>, tools: &[rmcp::model::Tool]) {
        use crate::metrics::tokens::{GATEWAY, Kind};
        let snap = self.snapshot(ctx);
        // A catalog tool's weight was computed when the catalog was built: a listing of
        // thousands of tools is not serialised again, and is counted once per backend.
        let mut by_backend: HashMap<&str, u64> = HashMap::new();
        for t in tools {
            let (backend, tokens) = match snap.tool(&t.name) {
                Some(c) => (&*c.key.backend, c.tokens),
                None => (GATEWAY, crate::catalog::token_weight(t)),
            };
            *by_backend.entry(backend).or_default() += tokens;
        }
        let principal = &snap.caller.principal;
        for (backend, tokens) in &by_backend {
            self.gw.metrics.tokens.add(principal, backend, Kind::Definitions, *tokens);
        }
        if self.gw.audit().is_on() {
            let mut e = self.audit_entry("tools/list", ctx, "allowed");
            (e.status, e.definition_tokens) = (Some("ok"), Some(by_backend.values().sum()));
            self.gw.audit().record(e);
        }
    }

    fn refuse(&self, message: String) -> Result<CallToolResponse, ErrorData> {
        match self.gw.mode {
            Mode::Optimizer => Ok(meta::error_result(message).into()),
            Mode::Passthrough => Err(ErrorData::invalid_params(message, None)),
        }
    }
}

/// The session id the HTTP edge found on the request.
fn session_key(context: &RequestContext<RoleServer>) -> Option<&SessionKey> {
    context.extensions.get::<http::request::Parts>()?.extensions.get::<SessionKey>()
}

impl ServerHandler for GatewayHandler {
    // No `get_tool`: SEP-2243's `Mcp-Param-*` headers are checked at the HTTP edge, where the
    // caller is known, against the tool in that caller's scope (`http::params`). rmcp would ask
    // a fresh handler, which knows no caller.

    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_tasks()
            .build();
        if self.gw.groups.is_some()
            && let Some(extensions) = caps.extensions.as_mut()
        {
            let mut settings = rmcp::model::JsonObject::new();
            settings.insert("listChanged".into(), true.into());
            extensions.insert(crate::mcp::groups::GROUPS_EXTENSION.into(), settings);
        }
        // Optimizer mode's list changes only when it has pinned tools.
        if self.gw.mode == Mode::Optimizer && !self.gw.has_pinned() {
            caps.tools = Some(Default::default());
        }
        ServerConfig::new(caps)
            .with_server_info(Implementation::new("toolmux", env!("CARGO_PKG_VERSION")))
            .with_instructions(match self.gw.mode {
                Mode::Optimizer => "Tools are found on demand: call find_tool with the capability you need, then call_tool with the name it returns.",
                Mode::Passthrough => "Every backend tool is listed; names carry the backend they come from.",
            })
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.measured("initialize", &context, async {
            context.peer.set_peer_info(request.clone());
            let id = session_key(&context).map(|SessionKey(id)| id.clone());
            let session = self.gw.open_session(self.caller_of(&context), Some(context.peer.clone()), id.as_deref());
            let _ = self.session.set(session.clone());
            let restored =
                context.extensions.get::<http::request::Parts>().and_then(|p| p.extensions.get::<Restored>());
            if let Some(Restored(record)) = restored {
                self.resume(&session, record, &context).await;
            }
            self.audit_start(&context, &session);
            let mut result = self.negotiate_initialize(&request)?;
            self.introduce(&mut result, &session);
            Ok(result)
        })
        .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.measured("tools/list", &context, async {
            let snap = self.snapshot(&context);
            let tools = self.listing(&snap, self.surface(&context));
            self.count_listed(&context, &tools);
            Ok(ListToolsResult::with_all_items(tools))
        })
        .await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.measured("tools/call", &context, async {
        let snap = self.snapshot(&context);
        let result = match self.gw.mode {
            Mode::Passthrough if request.name == READ_RESULT && self.offers_read_result(&snap) => {
                self.read_result(request.arguments.as_ref(), &context).await
            }
            Mode::Passthrough => {
                let name = request.name.to_string();
                tracing::Span::current().record("tool", name.as_str());
                return self.forward_call(&snap, &name, request, &context, "tools/call").await;
            }
            Mode::Optimizer => match request.name.as_ref() {
                READ_RESULT if self.offers_read_result(&snap) => {
                    self.read_result(request.arguments.as_ref(), &context).await
                }
                FIND_TOOL => self.find_tool_audited(request.arguments.as_ref(), &snap, &context).await,
                CALL_TOOL => match meta::parse_call(request.arguments.as_ref()) {
                    Err(msg) => meta::error_result(msg),
                    // An agent that runs read_result through call_tool reads as directly.
                    Ok(args) if args.tool_name == READ_RESULT && self.offers_read_result(&snap) => {
                        self.read_result(Some(&args.parameters), &context).await
                    }
                    Ok(args) => {
                        tracing::Span::current().record("tool", args.tool_name.as_str());
                        // A retry's answers and state travel on the outer call_tool request.
                        let mut inner =
                            CallToolRequestParams::new(args.tool_name.clone()).with_arguments(args.parameters);
                        inner.input_responses = request.input_responses;
                        inner.request_state = request.request_state;
                        let answer = self.forward_call(&snap, &args.tool_name, inner, &context, "call_tool").await;
                        return Ok(with_app(&snap, &args.tool_name, answer?));
                    }
                },
                // A pinned tool, one listed (deferred) or that a group disclosed, called by its
                // own name, or an App's call.
                other
                    if self.gw.is_pinned(other)
                        || (self.surface(&context).calls_by_name() && snap.tool(other).is_some())
                        // An App calls its server's tools by their own names, on any surface.
                        || apps::app_named(&snap, other).is_some() =>
                {
                    let name = other.to_string();
                    tracing::Span::current().record("tool", name.as_str());
                    return self.forward_call(&snap, &name, request, &context, "tools/call").await;
                }
                other => meta::error_result(format!(
                    "unknown tool `{other}`: this gateway offers find_tool (to search) and call_tool (to run what find_tool returns)"
                )),
            },
        };
        Ok(result.completed().into())
        })
        .await
    }

    /// This session's level: log messages below it are not passed on, and its own upstream
    /// sessions are told. Shared connections are not: that would change what others hear.
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.measured("logging/setLevel", &context, async {
            let Some(session) = self.session.get() else { return Ok(()) };
            self.apply_level(session, request.level).await;
            if let Some(name) = lifecycle::level_name(request.level) {
                self.record(&context, Change::Level(name)).await;
            }
            Ok(())
        })
        .await
    }

    async fn complete(
        &self,
        mut request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.measured("completion/complete", &context, async {
            let caller = self.caller(&context);
            let owner = match &mut request.r#ref {
                Reference::Prompt(p) => {
                    self.prompts(&caller).into_iter().find(|(e, _, _)| e.name == p.name).map(|(_, b, original)| {
                        p.name = original;
                        b
                    })
                }
                Reference::Resource(r) => self.resource_owner(&caller, &r.uri.clone()),
                _ => None,
            };
            let Some(backend) = owner else {
                return Ok(CompleteResult::new(CompletionInfo::default()));
            };
            let link = self.link(&backend, &context).await.map_err(wire_error)?;
            backend.complete(&link, request, &context.ct).await.map(Completed::completed).map_err(wire_error)
        })
        .await
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.measured("resources/subscribe", &context, async {
            let uri = request.uri.clone();
            self.subscribe_to(request, &self.caller(&context), &context).await?;
            self.record(&context, Change::Subscribed(uri)).await;
            Ok(())
        })
        .await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.measured("resources/unsubscribe", &context, async {
            self.record(&context, Change::Unsubscribed(request.uri.clone())).await;
            let Some(backend) = self.resource_owner(&self.caller(&context), &request.uri) else {
                self.gw.relay.unsubscribe(&request.uri, &context.peer);
                return Ok(());
            };
            let link = self.link(&backend, &context).await.map_err(wire_error)?;
            // On a shared connection the subscription is dropped only when no session wants it.
            if link.is_own() || self.gw.relay.unsubscribe(&request.uri, &context.peer) {
                backend.unsubscribe(&link, request, &context.ct).await.map_err(wire_error)?;
            }
            Ok(())
        })
        .await
    }

    fn accepted_subscription_filter(&self, _requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// A stateless caller's `subscriptions/listen`: `tools/list_changed` whenever what that
    /// caller lists changes (in optimizer mode, only its pinned tools can).
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let caller = self.caller_of(context.request_context());
        let mut epochs = self.gw.subscribe_scopes();
        // What the listener was last told, as a number: a long-lived stream pins no generation.
        let surface = self.surface(context.request_context());
        let mut current = self.gw.listed(&self.gw.scope_for(&caller), surface);
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                r = epochs.changed() => if r.is_err() { return Ok(()) },
            }
            let next = self.gw.listed(&self.gw.scope_for(&caller), surface);
            if current != next {
                if context.sink().notify_tool_list_changed().await.is_err() {
                    return Ok(());
                }
                self.gw.counters.list_changed_sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            current = next;
        }
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.measured("resources/list", &context, async {
            let caller = self.caller(&context);
            let out = self.merged(&caller, |l| &l.resources, apps::serve_resource, |r| r.uri.clone());
            Ok(ListResourcesResult::with_all_items(out))
        })
        .await
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.measured("resources/templates/list", &context, async {
            let caller = self.caller(&context);
            let out = self.merged(&caller, |l| &l.templates, |_, _| {}, |t| t.uri_template.clone());
            Ok(ListResourceTemplatesResult::with_all_items(out))
        })
        .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.measured("resources/read", &context, async {
            let started = std::time::Instant::now();
            let uri = request.uri.clone();
            let caller = self.caller(&context);
            let mut note = ReadNote::default();
            let answer = async {
                self.audit_gate()?;
                if uri.starts_with(crate::results::URI_PREFIX) {
                    note.decision = "allowed";
                    return self.read_kept(&uri, &context).await.map(ReadResourceResponse::Complete);
                }
                // An App's HTML (MCP Apps): the backend its URI names, as the backend knows it.
                let (owner, request) = match self.app_resource(&caller, &self.snapshot(&context), request) {
                    Ok((backend, request)) => (Some(backend), request),
                    Err(request) => (self.resource_owner(&caller, &uri), request),
                };
                let Some(backend) = owner else {
                    note.decision = "refused";
                    return Err(ErrorData::resource_not_found(format!("resource not found: {uri}"), None));
                };
                note.backend = Some(backend.name().to_string());
                self.admit_read(&caller, &backend, &format!("reading {uri}"))
                    .await
                    .inspect_err(|_| note.decision = "limited")?;
                let link = self.link(&backend, &context).await.map_err(wire_error)?;
                let mut answer = self
                    .with_rounds(&context, backend.name(), request, |p| backend.read_resource(&link, p, &context.ct))
                    .await;
                self.scrubbed(backend.name(), &mut answer, |s, b, r| s.read(b, r));
                if let Ok(Answer::Complete(r)) = &mut answer {
                    served_as(backend.name(), r);
                }
                relayed(answer)
            }
            .await;
            let size = answer.as_ref().map(|a| match a {
                ReadResourceResponse::Complete(r) => Some(json_len(r)),
                _ => None,
            });
            self.audit_read("resources/read", &uri, &context, note, size, started);
            answer
        })
        .await
    }

    /// `groups/list` and `groups/get` (`[groups]`); any other method rmcp does not know: -32601.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let method: &'static str = match request.method.as_str() {
            crate::mcp::groups::LIST => crate::mcp::groups::LIST,
            crate::mcp::groups::GET => crate::mcp::groups::GET,
            other => return Err(ErrorData::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, other.to_string(), None)),
        };
        self.measured(method, &context, async { self.groups_request(method, request.params.as_ref(), &context) }).await
    }

    /// `tasks/*` (SEP-2663): rmcp answers -32021 before these for a client that did not declare
    /// the extension; the rest is in `tasks`.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let id = request.task_id.clone();
        let get = self.audited_task("tasks/get", &id, &context, self.relay_get_task(request, &context));
        self.measured("tasks/get", &context, get).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let id = request.task_id.clone();
        let update = self.audited_task("tasks/update", &id, &context, self.relay_update_task(request, &context));
        self.measured("tasks/update", &context, update).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let id = request.task_id.clone();
        let cancel = self.audited_task("tasks/cancel", &id, &context, self.relay_cancel_task(request, &context));
        self.measured("tasks/cancel", &context, cancel).await
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.measured("prompts/list", &context, async {
            let prompts = self.prompts(&self.caller(&context));
            Ok(ListPromptsResult::with_all_items(prompts.into_iter().map(|(p, _, _)| p).collect()))
        })
        .await
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.measured("prompts/get", &context, async {
            let started = std::time::Instant::now();
            let asked = request.name.clone();
            let caller = self.caller(&context);
            let mut note = ReadNote::default();
            let answer = async {
                self.audit_gate()?;
                let prompts = self.prompts(&caller);
                let Some((_, backend, original)) = prompts.into_iter().find(|(p, _, _)| p.name == request.name) else {
                    note.decision = "refused";
                    return Err(ErrorData::invalid_params(format!("prompt not found: {}", request.name), None));
                };
                note.backend = Some(backend.name().to_string());
                self.admit_read(&caller, &backend, &format!("getting prompt {}", request.name))
                    .await
                    .inspect_err(|_| note.decision = "limited")?;
                request.name = original;
                let link = self.link(&backend, &context).await.map_err(wire_error)?;
                let mut answer = self
                    .with_rounds(&context, backend.name(), request, |p| backend.get_prompt(&link, p, &context.ct))
                    .await;
                self.scrubbed(backend.name(), &mut answer, |s, b, r| s.prompt(b, r));
                relayed(answer)
            }
            .await;
            let size = answer.as_ref().map(|a| match a {
                GetPromptResponse::Complete(r) => Some(json_len(r)),
                _ => None,
            });
            self.audit_read("prompts/get", &asked, &context, note, size, started);
            answer
        })
        .await
    }
}

/// The bytes of `value`'s JSON.
fn json_len<T: serde::Serialize>(value: &T) -> u64 {
    serde_json::to_vec(value).map_or(0, |v| v.len() as u64)
}

/// What a read's audit line says beyond its answer.
struct ReadNote {
    backend: Option<String>,
    decision: &'static str,
}

impl Default for ReadNote {
    fn default() -> Self {
        Self { backend: None, decision: "allowed" }
    }
}

impl GatewayHandler {
    /// Refuses a read while the audit trail fails and `audit.on_failure = "refuse"`.
    fn audit_gate(&self) -> Result<(), ErrorData> {
        match self.gw.audit().refusal() {
            Some(why) => Err(ErrorData::internal_error(format!("this request was {why}"), None)),
            None => Ok(()),
        }
    }

    /// Writes a resource read's or prompt get's line in the audit trail.
    /// `answer` is the result's size in bytes (`None`: an input-required answer), or the error.
    fn audit_read(
        &self,
        action: &'static str,
        target: &str,
        ctx: &RequestContext<RoleServer>,
        note: ReadNote,
        answer: Result<Option<u64>, &ErrorData>,
        started: std::time::Instant,
    ) {
        if !self.gw.audit().is_on() {
            return;
        }
        let mut e = self.audit_entry(action, ctx, note.decision);
        e.backend = note.backend;
        e.target = Some(target.to_string());
        match answer {
            Ok(Some(bytes)) => {
                (e.status, e.result_bytes, e.result_tokens) = (Some("ok"), Some(bytes), Some(bytes / 4));
            }
            Ok(None) => e.status = Some("input_required"),
            Err(err) => {
                e.detail = Some(err.message.to_string());
                if note.decision == "allowed" {
                    e.status = Some("error");
                }
            }
        }
        self.gw.audit().record(e.took(started));
    }
}

/// The JSON-RPC error code of a request refused by `[[limits]]` (in the range JSON-RPC leaves
/// to servers; HTTP's 429 in its last digits). `data` carries `limit` and `retryAfter` (seconds).
pub const LIMITED: rmcp::model::ErrorCode = rmcp::model::ErrorCode(-32029);

impl GatewayHandler {
    /// Admits a resource read or prompt get on `backend` under `[[limits]]`, or answers the
    /// JSON-RPC error that names the limit and when to retry.
    async fn admit_read(&self, caller: &Caller, backend: &Backend, what: &str) -> Result<(), ErrorData> {
        match self.gw.limiter.check(caller, crate::limits::Action::Read { backend: backend.name() }).await {
            Ok(_) => Ok(()),
            Err(refused) => Err(ErrorData::new(
                LIMITED,
                refused.message(what),
                Some(
                    serde_json::json!({"limit": refused.rule, "key": refused.limit.key(), "retryAfter": refused.retry_secs()}),
                ),
            )),
        }
    }
}

impl GatewayHandler {
    /// Secrets out of a relayed read's or prompt's answer (`[results] scrub`): its result by
    /// `scrub`, or the backend's error.
    fn scrubbed<R>(
        &self,
        backend: &str,
        answer: &mut Result<Answer<R>, CallError>,
        scrub: impl FnOnce(&crate::scrub::Scrubbing, &str, &mut R) -> usize,
    ) {
        match answer {
            Ok(Answer::Complete(r)) => _ = scrub(&self.gw.scrubbing, backend, r),
            Err(CallError::Remote { error, .. }) => _ = self.gw.scrubbing.error(backend, error),
            _ => {}
        }
    }
}
