//! The MCP server one client talks to. rmcp makes one [`GatewayHandler`] per session (protocol
//! 2025-11-25) or per request (2026-07-28, stateless); either way every request loads one
//! snapshot and uses it to the end.
//!
//! Logging (`logging/setLevel`, log notifications) is deprecated by SEP-2577 but still what
//! 2025-11-25 clients and backends use, so the gateway carries it.
//!
//! Errors reach the wire through the `*_error` functions at the bottom: each internal error kind
//! maps to exactly one JSON-RPC error or tool result.

#![expect(deprecated, reason = "logging is relayed as 2025-11-25 peers use it")]

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, InitializeRequestParams, InitializeResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams, Prompt,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ResultType, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, Reference, SetLevelRequestParams, SubscribeRequestParams,
    SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::model::{InputRequests, InputRequiredResult};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};

use super::gateway::Gateway;
use super::meta::{self, CALL_TOOL, FIND_TOOL, TokenMetrics, Unavailable};
use super::relay::{Ask, CallClient, Relayed};
use super::rounds::{self, Parked, PendingCall, Retry};
use crate::catalog::ConflictResolution;
use crate::config::Mode;
use crate::index::{AllowList, Slot};
use crate::session::shared::{Change, Record, Restored, SessionKey};
use crate::session::{Access, Caller, SessionHandle, Snapshot};
use crate::store::{Query, Ranker};
use crate::telemetry::Trace;
use crate::upstream::{Answer, Backend, CallError, Link};

/// Scheduler turns given to trailing backend notifications after a call's result arrives.
const RELAY_SETTLE_YIELDS: usize = 4;

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

    fn advertisable_backends(&self) -> impl Iterator<Item = Arc<Backend>> + '_ {
        let backends = self.gw.upstream.backends();
        (0..backends.len()).map(move |i| backends[i].clone()).filter(|b| self.gw.advertisable(b.name()))
    }

    /// Advertisable backends whose resources and prompts `caller` may use (the whole backend).
    fn usable_backends<'a>(&'a self, caller: &'a Caller) -> impl Iterator<Item = Arc<Backend>> + 'a {
        let policy = self.gw.policy();
        self.advertisable_backends().filter(move |b| policy.backend(caller, b.name()) == Access::All)
    }

    /// The connection a request to `backend` travels on: this session's own upstream session
    /// for a `per_client` backend (opened now if need be), else the gateway's shared one.
    async fn link(&self, backend: &Arc<Backend>) -> Result<Link, CallError> {
        match self.session.get().and_then(|s| s.upstreams()) {
            Some(upstreams) => upstreams.link(backend).await,
            None => backend.shared_link(),
        }
    }

    /// find_tool over `snap` (also used by `toolmux find`).
    pub async fn find_tool(&self, args: Option<&rmcp::model::JsonObject>, snap: &Snapshot) -> CallToolResult {
        let args = match meta::parse_find(args) {
            Ok(a) => a,
            Err(msg) => return meta::error_result(msg),
        };
        // Checked before anything is tokenised or cached: the model reads 256 word pieces
        // (about a thousand characters) and ignores the rest anyway.
        let max = self.gw.max_query_chars;
        let description_chars = args.description.chars().count();
        let keyword_chars: usize = args.keywords.iter().map(|k| k.chars().count() + 1).sum();
        if description_chars > max {
            return meta::error_result(format!(
                "tool_description is {description_chars} characters; the limit is {max} (optimizer.max_query_chars). Describe the capability you need in a sentence or two."
            ));
        }
        if keyword_chars > max {
            return meta::error_result(format!(
                "tool_keywords add up to {keyword_chars} characters; the limit is {max} (optimizer.max_query_chars). Give a few distinctive words."
            ));
        }
        let query = Query { description: args.description, keywords: args.keywords };
        let n = self.gw.max_tools;
        let generation = &snap.generation;
        let result = self.gw.store.search(generation, &snap.allow, &query, n, Ranker::Fused).await;
        self.gw.metrics.find_tool(&result);
        let tools: Vec<&Tool> = result.hits.iter().map(|h| &generation.catalog.tools()[h.slot as usize].tool).collect();
        let returned: u64 = result.hits.iter().map(|h| generation.catalog.tools()[h.slot as usize].tokens).sum();
        let unavailable = self.unavailable(snap, &query, &result.hits).await;
        let mode =
            serde_json::to_value(result.mode).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let matched = meta::Match {
            verdict: result.verdict,
            scores: result.similarity,
            non_english: crate::catalog::text::mostly_non_latin(&query.description),
        };
        meta::find_result(tools, &matched, TokenMetrics::new(snap.baseline_tokens, returned), &mode, unavailable)
    }

    /// Up to three names in `snap` (never outside it) closest to an unknown `name`: the nearest
    /// by edit distance, then the best keyword matches for the words of the name.
    async fn closest_names(&self, snap: &Snapshot, name: &str) -> Vec<String> {
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

    /// Matches among tools whose backend is down: those that would rank with the returned ones.
    async fn unavailable(&self, snap: &Snapshot, query: &Query, returned: &[crate::index::Hit]) -> Vec<Unavailable> {
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

    /// Subscribes this client to `request.uri` at the backend that serves it.
    async fn subscribe_to(
        &self,
        request: SubscribeRequestParams,
        caller: &Caller,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some(backend) = self.resource_owner(caller, &request.uri) else {
            return Err(ErrorData::resource_not_found(format!("resource not found: {}", request.uri), None));
        };
        let uri = request.uri.clone();
        let link = self.link(&backend).await.map_err(wire_error)?;
        backend.subscribe(&link, request, &context.ct).await.map_err(wire_error)?;
        // A client's own upstream session sends its updates to that client alone already.
        if !link.is_own() {
            self.gw.relay.subscribe(&uri, context.peer.clone());
        }
        Ok(())
    }

    #[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
    async fn apply_level(&self, session: &SessionHandle, level: rmcp::model::LoggingLevel) {
        session.level.set(level);
        if let Some(upstreams) = session.upstreams() {
            let backends: Vec<_> = self.advertisable_backends().collect();
            upstreams.set_level(level, &backends).await;
        }
    }

    /// Records a change to this session in the shared store, when sessions are shared.
    async fn record(&self, context: &RequestContext<RoleServer>, change: Change) {
        let Some(shared) = self.gw.shared_sessions() else { return };
        if let Some(SessionKey(id)) = session_key(context) {
            shared.change(id, change).await;
        }
    }

    /// Records this session's own backend session to `backend` in the shared store, sealed,
    /// when it is new or its id changed (the backend refused a taken-over one, say).
    async fn record_upstream(&self, context: &RequestContext<RoleServer>, backend: &str) {
        let Some(shared) = self.gw.shared_sessions() else { return };
        let Some(SessionKey(id)) = session_key(context) else { return };
        let Some(upstreams) = self.session.get().and_then(|s| s.upstreams()) else { return };
        // Most calls find the id recorded already: only a new one is sealed and written.
        let now = upstreams.session_id(backend).await;
        let before = self.upstreams_recorded.lock().expect("recorded lock").insert(backend.to_string(), now.clone());
        if before.is_some_and(|before| before == now) {
            return;
        }
        let stored = upstreams.stored(backend).await;
        let sealed = stored.map_or_else(|| "-".to_string(), |s| shared.seal(id, backend, &s));
        shared.change(id, Change::Upstream(backend.to_string(), sealed)).await;
    }

    /// A session rebuilt from the store on this replica: its logging level and resource
    /// subscriptions come back, and its own backend sessions are offered for taking over (with
    /// `sessions.secret`; else they open afresh on first use).
    async fn resume(&self, session: &SessionHandle, record: &Record, context: &RequestContext<RoleServer>) {
        if let (Some(shared), Some(SessionKey(id)), Some(upstreams)) =
            (self.gw.shared_sessions(), session_key(context), session.upstreams())
        {
            for (backend, sealed) in &record.upstreams {
                if let Some(stored) = shared.unseal(id, backend, sealed) {
                    self.upstreams_recorded
                        .lock()
                        .expect("recorded lock")
                        .insert(backend.clone(), Some(stored.id.clone()));
                    upstreams.adopt(backend, stored);
                }
            }
        }
        if let Some(level) = record.level.as_deref().and_then(level_from_name) {
            self.apply_level(session, level).await;
        }
        for uri in &record.subscriptions {
            let request = SubscribeRequestParams::new(uri.clone());
            if let Err(e) = self.subscribe_to(request, &session.caller(), context).await {
                tracing::info!(%uri, error = %e.message, "a stored subscription could not be renewed");
            }
        }
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
    async fn measured<T>(
        &self,
        method: &'static str,
        context: &RequestContext<RoleServer>,
        handling: impl std::future::Future<Output = Result<T, ErrorData>>,
    ) -> Result<T, ErrorData> {
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
        .instrument(span)
        .await
    }

    /// A tool error in optimizer mode; a JSON-RPC invalid-params error in passthrough mode.
    fn refuse(&self, message: String) -> Result<CallToolResponse, ErrorData> {
        match self.gw.mode {
            Mode::Optimizer => Ok(meta::error_result(message).into()),
            Mode::Passthrough => Err(ErrorData::invalid_params(message, None)),
        }
    }

    async fn forward_call(
        &self,
        snap: &Snapshot,
        name: &str,
        mut params: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _inflight = self.gw.inflight.token();
        let caller = self.caller(ctx);
        let stateless = self.session.get().is_none();
        // A session-less client's retry of a call parked here, with its answers.
        if stateless && let Some(state) = params.request_state.as_deref().filter(|s| Parked::is_ours(s)) {
            let Some(mut call) = self.gw.parked.take(state, &caller) else {
                return self.refuse(format!(
                    "requestState `{state}` names no call waiting for input (it expired, was answered, or is another client's); call {name} again without requestState"
                ));
            };
            rounds::answer_asks(&mut call, params.input_responses.take().unwrap_or_default());
            return self.drive(call, ctx).await;
        }
        let Some(tool) = snap.tool(name) else {
            let close = self.closest_names(snap, name).await;
            let fix = match close.as_slice() {
                [] => String::new(),
                [one] => format!(" Did you mean {one}?"),
                [init @ .., last] => format!(" Did you mean {} or {last}?", init.join(", ")),
            };
            return match self.gw.mode {
                Mode::Optimizer => Ok(meta::error_result(format!(
                    "tool not found: {name}.{fix} Call call_tool again with an exact name, or use find_tool to search for the tool you need."
                ))
                .into()),
                Mode::Passthrough => Err(ErrorData::invalid_params(format!("tool not found: {name}.{fix}"), None)),
            };
        };
        let Some(backend) = self.gw.upstream.get(&tool.key.backend) else {
            return Ok(meta::error_result(format!("tool not found: {name}")).into());
        };
        if let Err(retry) = self.gw.health.call_gate(backend.name()) {
            self.gw.metrics.tool_call(backend.name(), "breaker_open", std::time::Duration::ZERO);
            return Ok(meta::error_result(format!(
                "backend `{}` is unavailable: its circuit breaker opened after repeated failures; it will be retried in {} s. Use another tool or try again later.",
                backend.name(),
                retry.as_secs().max(1)
            ))
            .into());
        }
        // A place among the session's running calls, then the connection to use.
        let permit = match self.session.get() {
            Some(s) => match s.calls.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    let max = self.gw.limits.max_calls_per_session;
                    return Ok(meta::error_result(format!(
                        "this session already has {max} calls running (server.max_calls_per_session); wait for one to finish, then call {name} again"
                    ))
                    .into());
                }
            },
            None => None,
        };
        let link = match self.link(&backend).await {
            Ok(l) => l,
            Err(e) => return call_error(self.gw.mode, e).map(|r| r.completed().into()),
        };
        if link.is_own() {
            self.record_upstream(ctx, backend.name()).await;
        }
        params.name = tool.key.tool.to_string().into();
        // rmcp moves the request's `_meta` into the context, and gives the forwarded request a
        // progress token of its own; the relay maps that one back to the client's. A client
        // without a session cannot be sent the backend's requests: they come back here as asks.
        let (asks_tx, asks) = if stateless {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let client = CallClient {
            session: self.session.get().map(|s| s.id),
            peer: ctx.peer.clone(),
            request: ctx.id.clone(),
            token: ctx.meta.get_progress_token(),
            level: self.session.get().map(|s| s.level.clone()),
        };
        let (guard, relayed) = self.gw.relay.begin_call(link.conn, client, asks_tx);
        // What the client can do: from its request (2026-07-28) or its session's initialize.
        let client = ctx.meta.client_capabilities().or_else(|| ctx.peer.peer_info().map(|i| i.capabilities.clone()));
        let mut call = PendingCall {
            backend,
            link,
            permit,
            caller,
            params,
            client,
            call: Box::pin(std::future::pending()),
            guard: Arc::new(guard),
            relayed,
            asks,
            waiting: Default::default(),
            ct: self.gw.call_token(),
            rounds: 0,
            started: std::time::Instant::now(),
            trace: Trace::of(ctx),
        };
        call.start();
        let span = tracing::info_span!("backend_call", backend = call.backend.name(), upstream = call.link.conn);
        tracing::Instrument::instrument(self.drive(call, ctx), span).await
    }

    /// Runs a forwarded call to its end for this request: relays its notifications, answers a
    /// 2026-07-28 backend's input rounds by asking a session client, and parks it (answering
    /// input-required) when the backend asks a session-less client for input.
    async fn drive(
        &self,
        mut call: PendingCall,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let outcome = loop {
            tokio::select! {
                _ = ctx.ct.cancelled(), if !call.ct.is_cancelled() => call.ct.cancel(),
                r = &mut call.call => match r {
                    Ok(Answer::InputRequired(asked)) if self.session.get().is_some() => {
                        call.rounds += 1;
                        if call.rounds > rounds::MAX_ROUNDS {
                            return Ok(too_many_rounds(call.backend.name()).into());
                        }
                        let requests = asked.input_requests.unwrap_or_default();
                        let responses = match rounds::fulfil(&ctx.peer, &ctx.id, requests).await {
                            Ok(r) => r,
                            Err(e) => {
                                let backend = call.backend.name();
                                let why = format!("backend `{backend}` needed input from you that could not be had: {}", e.message);
                                return Ok(meta::error_result(why).into());
                            }
                        };
                        call.params = call.params.clone().answered(responses, asked.request_state);
                        call.start();
                    }
                    other => break other,
                },
                Some(n) = call.relayed.recv() => n.send(&ctx.peer).await,
                Some(ask) = next_ask(&mut call.asks) => {
                    if let Some(ask) = call.refuse_undeclared(ask) {
                        return Ok(self.park(call, ask, ctx).await);
                    }
                }
            }
        };
        // rmcp hands notifications to spawned tasks, so the last ones can trail the response by
        // a scheduling step: let them land, and pass them on before the result.
        settle(&mut call.relayed, &ctx.peer).await;
        let label = match &outcome {
            Ok(Answer::Complete(r)) if r.is_error == Some(true) => "is_error",
            Ok(_) => "ok",
            Err(CallError::Timeout { .. }) => "timeout",
            Err(CallError::Cancelled) => "cancelled",
            Err(CallError::NotConnected { .. } | CallError::AtCapacity { .. } | CallError::SessionFailed { .. }) => {
                "unavailable"
            }
            Err(CallError::ConnectionLost { .. } | CallError::Remote { .. }) => "error",
        };
        self.gw.metrics.tool_call(call.backend.name(), label, call.started.elapsed());
        match outcome {
            Ok(Answer::Complete(r)) => Ok(r.completed().into()),
            // A 2026-07-28 backend's own round, for a client that speaks it: unchanged.
            Ok(Answer::InputRequired(r)) => Ok(CallToolResponse::InputRequired(r)),
            Err(e) => {
                if matches!(
                    e,
                    CallError::ConnectionLost { .. } | CallError::Timeout { .. } | CallError::NotConnected { .. }
                ) {
                    self.gw.health.call_failed(call.backend.name());
                }
                call_error(self.gw.mode, e).map(|r| r.completed().into())
            }
        }
    }

    /// Hands the backend's requests (`first` and any issued with it) to a session-less client as
    /// an input-required result, and parks the call until the client retries with its answers.
    async fn park(&self, mut call: PendingCall, first: Ask, ctx: &RequestContext<RoleServer>) -> CallToolResponse {
        let mut asks = vec![first];
        // Requests a backend issues together arrive a scheduling step apart: take them all.
        for _ in 0..RELAY_SETTLE_YIELDS {
            tokio::task::yield_now().await;
            while let Some(a) = call.asks.as_mut().and_then(|r| r.try_recv().ok()) {
                asks.push(a);
            }
        }
        settle(&mut call.relayed, &ctx.peer).await;
        call.rounds += 1;
        if call.rounds > rounds::MAX_ROUNDS {
            for a in asks {
                let _ = a.reply.send(Err(ErrorData::internal_error("too many rounds of input", None)));
            }
            return too_many_rounds(call.backend.name()).into();
        }
        let mut requests = InputRequests::new();
        for (i, ask) in asks.into_iter().enumerate() {
            let key = format!("input_{}_{}", call.rounds, i + 1);
            requests.insert(key.clone(), ask.request.clone());
            call.waiting.insert(key, ask);
        }
        let ttl = call.backend.config.timeout;
        let backend = call.backend.name().to_string();
        match self.gw.parked.park(call, ttl) {
            Some(state) => InputRequiredResult::new(Some(requests), Some(state)).into(),
            None => meta::error_result(format!(
                "backend `{backend}` needs input from you, but {} calls are already waiting for their clients' answers; try again shortly",
                rounds::MAX_PARKED
            ))
            .into(),
        }
    }

    /// Sends a resource or prompt request, and repeats it with a 2026-07-28 backend's input
    /// requests answered by a session client until it completes (or [`rounds::MAX_ROUNDS`]). A
    /// session-less client gets the backend's input-required result unchanged.
    async fn with_rounds<P, T, F, Fut>(
        &self,
        ctx: &RequestContext<RoleServer>,
        backend: &str,
        params: P,
        send: F,
    ) -> Result<Answer<T>, CallError>
    where
        P: rounds::Retry + Clone,
        F: Fn(P) -> Fut,
        Fut: Future<Output = Result<Answer<T>, CallError>>,
    {
        let mut answer = send(params.clone()).await?;
        if self.session.get().is_none() {
            return Ok(answer);
        }
        for _ in 0..rounds::MAX_ROUNDS {
            let Answer::InputRequired(asked) = answer else { return Ok(answer) };
            let responses = match asked.input_requests {
                Some(requests) => rounds::fulfil(&ctx.peer, &ctx.id, requests)
                    .await
                    .map_err(|error| CallError::Remote { backend: backend.to_string(), error })?,
                None => Default::default(),
            };
            answer = send(params.clone().answered(responses, asked.request_state)).await?;
        }
        match answer {
            Answer::Complete(_) => Ok(answer),
            Answer::InputRequired(_) => Err(CallError::Remote {
                backend: backend.to_string(),
                error: ErrorData::internal_error(too_many_rounds_text(backend), None),
            }),
        }
    }
}

/// The next backend request for a session-less client's call (never, for a session's).
async fn next_ask(asks: &mut Option<tokio::sync::mpsc::UnboundedReceiver<Ask>>) -> Option<Ask> {
    match asks {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Passes on notifications that trail a call's last message by a scheduling step or two.
async fn settle(relayed: &mut tokio::sync::mpsc::UnboundedReceiver<Relayed>, peer: &rmcp::service::Peer<RoleServer>) {
    for _ in 0..RELAY_SETTLE_YIELDS {
        tokio::task::yield_now().await;
        while let Ok(n) = relayed.try_recv() {
            n.send(peer).await;
        }
    }
}

fn too_many_rounds_text(backend: &str) -> String {
    format!(
        "backend `{backend}` asked for input more than {} times in one call; the call was stopped",
        rounds::MAX_ROUNDS
    )
}

/// The session id the HTTP edge found on the request.
fn session_key(context: &RequestContext<RoleServer>) -> Option<&SessionKey> {
    context.extensions.get::<http::request::Parts>()?.extensions.get::<SessionKey>()
}

/// A logging level's wire name (`"warning"`).
#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
fn level_name(level: rmcp::model::LoggingLevel) -> Option<String> {
    serde_json::to_value(level).ok()?.as_str().map(str::to_owned)
}

#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
fn level_from_name(name: &str) -> Option<rmcp::model::LoggingLevel> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

fn too_many_rounds(backend: &str) -> CallToolResult {
    meta::error_result(too_many_rounds_text(backend))
}

impl ServerHandler for GatewayHandler {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        if self.gw.mode == Mode::Optimizer {
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
            let session = self.gw.open_session(self.caller_of(&context), Some(context.peer.clone()));
            let _ = self.session.set(session.clone());
            let restored =
                context.extensions.get::<http::request::Parts>().and_then(|p| p.extensions.get::<Restored>());
            if let Some(Restored(record)) = restored {
                self.resume(&session, record, &context).await;
            }
            self.negotiate_initialize(&request)
        })
        .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.measured("tools/list", &context, async {
            let tools = match self.gw.mode {
                Mode::Optimizer => vec![meta::find_tool(self.gw.find_tool_description.as_deref()), meta::call_tool()],
                Mode::Passthrough => self.snapshot(&context).tools().map(|t| t.tool.clone()).collect(),
            };
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
            Mode::Passthrough => {
                let name = request.name.to_string();
                tracing::Span::current().record("tool", name.as_str());
                return self.forward_call(&snap, &name, request, &context).await;
            }
            Mode::Optimizer => match request.name.as_ref() {
                FIND_TOOL => self.find_tool(request.arguments.as_ref(), &snap).await,
                CALL_TOOL => match meta::parse_call(request.arguments.as_ref()) {
                    Err(msg) => meta::error_result(msg),
                    Ok(args) => {
                        tracing::Span::current().record("tool", args.tool_name.as_str());
                        // A retry's answers and state travel on the outer call_tool request.
                        let mut inner =
                            CallToolRequestParams::new(args.tool_name.clone()).with_arguments(args.parameters);
                        inner.input_responses = request.input_responses;
                        inner.request_state = request.request_state;
                        return self.forward_call(&snap, &args.tool_name, inner, &context).await;
                    }
                },
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
            if let Some(name) = level_name(request.level) {
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
            let link = self.link(&backend).await.map_err(wire_error)?;
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
            let link = self.link(&backend).await.map_err(wire_error)?;
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

    /// A stateless caller's `subscriptions/listen`: in passthrough mode, `tools/list_changed`
    /// whenever that caller's visible tool list changes (optimizer mode's two tools never do).
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let caller = self.caller_of(context.request_context());
        let mut epochs = self.gw.subscribe_scopes();
        // What the listener was last told, as a number: a long-lived stream pins no generation.
        let mut current = self.gw.scope_for(&caller).listed();
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                r = epochs.changed() => if r.is_err() { return Ok(()) },
            }
            let next = self.gw.scope_for(&caller).listed();
            if self.gw.mode == Mode::Passthrough && current != next {
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
            let out = self.merged(&caller, |l| &l.resources, |r| r.uri.clone());
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
            let out = self.merged(&caller, |l| &l.templates, |t| t.uri_template.clone());
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
            let uri = request.uri.clone();
            let Some(backend) = self.resource_owner(&self.caller(&context), &uri) else {
                return Err(ErrorData::resource_not_found(format!("resource not found: {uri}"), None));
            };
            let link = self.link(&backend).await.map_err(wire_error)?;
            let answer = self
                .with_rounds(&context, backend.name(), request, |p| backend.read_resource(&link, p, &context.ct))
                .await;
            match answer {
                Ok(Answer::Complete(r)) => Ok(r.completed().into()),
                Ok(Answer::InputRequired(r)) => Ok(r.into()),
                Err(e) => Err(wire_error(e)),
            }
        })
        .await
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
            let prompts = self.prompts(&self.caller(&context));
            let Some((_, backend, original)) = prompts.into_iter().find(|(p, _, _)| p.name == request.name) else {
                return Err(ErrorData::invalid_params(format!("prompt not found: {}", request.name), None));
            };
            request.name = original;
            let link = self.link(&backend).await.map_err(wire_error)?;
            let answer = self
                .with_rounds(&context, backend.name(), request, |p| backend.get_prompt(&link, p, &context.ct))
                .await;
            match answer {
                Ok(Answer::Complete(r)) => Ok(r.completed().into()),
                Ok(Answer::InputRequired(r)) => Ok(r.into()),
                Err(e) => Err(wire_error(e)),
            }
        })
        .await
    }
}

impl GatewayHandler {
    /// The advertised backend serving `uri`: one that lists it, else one whose template fits it.
    fn resource_owner(&self, caller: &Caller, uri: &str) -> Option<Arc<Backend>> {
        self.usable_backends(caller).find(|b| b.listing().resources.iter().any(|r| r.uri == uri)).or_else(|| {
            self.usable_backends(caller)
                .find(|b| b.listing().templates.iter().any(|t| template_matches(&t.uri_template, uri)))
        })
    }

    /// The items of every backend `caller` may use, in backend order; on a duplicate `key` the
    /// first backend's item wins.
    fn merged<T: Clone, K: Eq + std::hash::Hash>(
        &self,
        caller: &Caller,
        items: impl Fn(&crate::upstream::Listing) -> &Vec<T>,
        key: impl Fn(&T) -> K,
    ) -> Vec<T> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for b in self.usable_backends(caller) {
            let listing = b.listing();
            out.extend(items(&listing).iter().filter(|item| seen.insert(key(item))).cloned());
        }
        out
    }

    /// Exposed prompts with their backend and original name; named like tools.
    fn prompts(&self, caller: &Caller) -> Vec<(Prompt, Arc<Backend>, String)> {
        let agg = &self.gw.aggregation;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for b in self.usable_backends(caller) {
            for p in &b.listing().prompts {
                let name = match agg.conflict_resolution {
                    ConflictResolution::Prefix => {
                        format!("{}{}", agg.prefix_format.replace("{backend}", b.name()), p.name)
                    }
                    _ => p.name.clone(),
                };
                if seen.insert(name.clone()) {
                    let mut exposed = p.clone();
                    exposed.name = name;
                    out.push((exposed, b.clone(), p.name.clone()));
                }
            }
        }
        out
    }
}

/// Whether `uri` fits an RFC 6570 template, matching literal parts and letting each `{…}` take
/// any non-empty run.
pub fn template_matches(template: &str, uri: &str) -> bool {
    let mut rest = uri;
    let mut parts = template.split('{');
    let Some(first) = parts.next() else { return false };
    let Some(r) = rest.strip_prefix(first) else { return false };
    rest = r;
    for part in parts {
        let Some((_, literal)) = part.split_once('}') else { return false };
        if literal.is_empty() {
            return !rest.is_empty();
        }
        match rest.find(literal) {
            Some(i) if i > 0 => rest = &rest[i + literal.len()..],
            _ => return false,
        }
    }
    rest.is_empty()
}

/// A relayed result marked `resultType: "complete"`, which the 2026-07-28 schema requires of
/// every result. A backend on an older revision sends none; rmcp strips the mark again for
/// clients that negotiated an older revision, so it is safe to set for everyone.
trait Completed {
    fn completed(self) -> Self;
}

macro_rules! completed {
    ($($t:ty),*) => {$(
        impl Completed for $t {
            fn completed(mut self) -> Self {
                self.result_type.get_or_insert(ResultType::COMPLETE);
                self
            }
        }
    )*};
}

completed!(CallToolResult, ReadResourceResult, GetPromptResult, CompleteResult);

/// A failed forwarded tool call, as the client sees it.
fn call_error(mode: Mode, e: CallError) -> Result<CallToolResult, ErrorData> {
    match e {
        // The backend's own JSON-RPC error: passthrough carries it as it is; in optimizer mode
        // the model gets its text as a tool error it can act on.
        CallError::Remote { error, backend } => match mode {
            Mode::Passthrough => Err(error),
            Mode::Optimizer => {
                Ok(meta::error_result(format!("backend `{backend}` rejected the call: {}", error.message)))
            }
        },
        CallError::Cancelled => Err(ErrorData::internal_error("the request was cancelled", None)),
        e @ (CallError::NotConnected { .. }
        | CallError::Timeout { .. }
        | CallError::ConnectionLost { .. }
        | CallError::AtCapacity { .. }
        | CallError::SessionFailed { .. }) => Ok(meta::error_result(e.to_string())),
    }
}

/// A failed forwarded resource or prompt request. No wildcard arm: a new kind of failure must
/// be given its wire form here.
fn wire_error(e: CallError) -> ErrorData {
    match e {
        // The backend's own JSON-RPC error, as it sent it.
        CallError::Remote { error, .. } => error,
        CallError::Cancelled => ErrorData::internal_error("the request was cancelled", None),
        // Each of these names the backend and nothing it said (see `CallError`).
        e @ (CallError::NotConnected { .. }
        | CallError::Timeout { .. }
        | CallError::ConnectionLost { .. }
        | CallError::AtCapacity { .. }
        | CallError::SessionFailed { .. }) => ErrorData::internal_error(e.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    fn templates_match_literal_parts() {
        assert!(template_matches("test://template/{id}/data", "test://template/42/data"));
        assert!(!template_matches("test://template/{id}/data", "test://template//data"));
        assert!(!template_matches("test://template/{id}/data", "test://other/42/data"));
        assert!(template_matches("file:///{path}", "file:///a/b.txt"));
        assert!(!template_matches("file:///{path}", "file:///"));
    }
}
