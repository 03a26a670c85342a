//! A forwarded tool call, from the request to its answer: the tool looked up in the caller's
//! snapshot, the breaker and the session's call limit, the connection, the backend's input
//! rounds (answered by a session client, or parked for a session-less one), and the relayed
//! notifications that trail it.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, InputRequests, InputRequiredResult};
use rmcp::service::{RequestContext, RoleServer};

use super::{Completed, GatewayHandler, call_error, tasks};
use crate::config::Mode;
use crate::hooks::Verdict;
use crate::limits::Action;
use crate::mcp::meta;
use crate::mcp::relay::{Ask, CallClient, Relayed};
use crate::mcp::rounds::{self, Parked, PendingCall, Retry};
use crate::metrics::tokens;
use crate::session::{LogLevel, Snapshot};
use crate::telemetry::Trace;
use crate::upstream::{Answer, CallError};

/// Scheduler turns given to trailing backend notifications after a call's result arrives.
const RELAY_SETTLE_YIELDS: usize = 4;

/// What the audit line of a call says beyond its answer: filled in as the call goes.
struct Note {
    backend: Option<String>,
    tool: Option<String>,
    decision: &'static str,
    detail: Option<String>,
    /// Who called, and the arguments sent, for the `after` hooks (when any is in force).
    hooked: Option<(crate::session::Caller, Option<rmcp::model::JsonObject>)>,
}

impl GatewayHandler {
    /// Forwards the call of the tool exposed as `name` in `snap`, or answers why it cannot be,
    /// and writes its line in the audit trail as `action` (`tools/call` when the client called
    /// the tool by its name, `call_tool` when through the meta-tool).
    pub(super) async fn forward_call(
        &self,
        snap: &Snapshot,
        name: &str,
        params: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
        action: &'static str,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = std::time::Instant::now();
        let (arguments_sha256, arguments) = self.gw.audit().arguments(params.arguments.as_ref());
        let mut note = Note { backend: None, tool: None, decision: "allowed", detail: None, hooked: None };
        let mut response = self.forward(snap, name, params, ctx, &mut note).await;
        // `[[hooks]]` that read results: the result they let through, or a denial in its place.
        if let (Ok(CallToolResponse::Complete(r)), Some((caller, args)), Some(backend), Some(tool)) =
            (&mut response, note.hooked.take(), &note.backend, &note.tool)
        {
            let taken = std::mem::take(r);
            match self.gw.hooks.after(&caller, backend, tool, args.as_ref(), taken).await {
                Verdict::Pass(passed) => *r = passed,
                Verdict::Deny { hook, reason } => {
                    (note.decision, note.detail) = ("denied", Some(format!("hook {hook}: {reason}")));
                    *r = meta::error_result(format!(
                        "the result of {name} was withheld by the guardrail `{hook}`: {reason}. Do not retry the same call; tell the user."
                    ));
                }
            }
        }
        // `[results]`: what is over the caller's limit is cut, and the whole kept for them.
        if let (Ok(CallToolResponse::Complete(r)), "allowed", Some(backend), Some(tool)) =
            (&mut response, note.decision, &note.backend, &note.tool)
        {
            // How large this tool's results are, for find_tool to say (before any cut).
            if let (Some(learned), Some(t)) = (self.gw.store.learned(), snap.tool(name))
                && r.is_error != Some(true)
            {
                learned.record_size(&t.key, crate::catalog::tokens_of(&*r));
            }
            // What the caller uses most is what a deferred client loads up front.
            if self.gw.mode == Mode::Optimizer && r.is_error != Some(true) {
                self.gw.surfaces.used(&snap.caller.principal, name);
            }
            let bound = self.gw.results.bound(&snap.caller, backend, tool);
            let schema = || snap.tool(name).and_then(|t| t.tool.output_schema.as_ref()).map(|s| (**s).clone().into());
            let cut = self.gw.results.apply(&snap.caller.principal, bound, schema, r).await;
            self.gw.results.fence(backend, r);
            if cut > 0 {
                note.detail.get_or_insert_with(|| format!("result cut to its limit ({cut} parts kept whole)"));
            }
        }
        // A result returned: its tokens are the principal's on that backend.
        let result_bytes = match (&response, note.decision, &note.backend) {
            (Ok(CallToolResponse::Complete(r)), "allowed", Some(backend)) => {
                let bytes = super::json_len(r);
                let principal = &snap.caller.principal;
                self.gw.metrics.tokens.add(principal, backend, tokens::Kind::Results, bytes / 4);
                Some(bytes)
            }
            _ => None,
        };
        if self.gw.audit().is_on() {
            let mut e = self.audit_entry(action, ctx, note.decision);
            (e.backend, e.tool, e.detail) = (note.backend, note.tool, note.detail);
            e.target = Some(name.to_string());
            (e.arguments_sha256, e.arguments) = (arguments_sha256, arguments);
            (e.result_bytes, e.result_tokens) = (result_bytes, result_bytes.map(|b| b / 4));
            match &response {
                Ok(CallToolResponse::Complete(r)) if note.decision == "allowed" => {
                    e.status = Some(if r.is_error == Some(true) { "is_error" } else { "ok" });
                }
                Ok(CallToolResponse::Complete(_)) => {}
                Ok(CallToolResponse::Task(t)) => {
                    e.status = Some("task");
                    e.detail = Some(format!("task {}", t.task.task_id));
                }
                Ok(_) => e.status = Some("input_required"),
                Err(err) => {
                    e.status = Some("error");
                    e.detail.get_or_insert_with(|| err.message.to_string());
                }
            }
            self.gw.audit().record(e.took(started));
        }
        response
    }

    async fn forward(
        &self,
        snap: &Snapshot,
        name: &str,
        mut params: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
        note: &mut Note,
    ) -> Result<CallToolResponse, ErrorData> {
        let _inflight = self.gw.inflight.token();
        let caller = self.caller(ctx);
        if let Some(why) = self.gw.audit().refusal() {
            note.decision = "refused";
            note.detail = Some("audit trail failing".into());
            return Ok(meta::error_result(format!("the call of {name} was {why}")).into());
        }
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
        let Some(tool) = snap.tool(name).or_else(|| super::apps::app_named(snap, name)) else {
            // Outside the caller's scope but in the catalog: the policy (or a backend that is
            // down) keeps it out; the answer is the same as for a name that does not exist.
            let known = snap.generation.catalog.position(name).is_some();
            note.decision = if known { "denied" } else { "refused" };
            note.detail = Some(if known { "outside the caller's scope" } else { "unknown tool" }.into());
            let close = self.closest_names(snap, name).await;
            let mut fix = match close.as_slice() {
                [] => String::new(),
                [one] => format!(" Did you mean {one}?"),
                [init @ .., last] => format!(" Did you mean {} or {last}?", init.join(", ")),
            };
            // The tools of a backend waiting for a login are not known yet: say so, so that
            // "not found" is not mistaken for "does not exist".
            let waiting = self.needs_login(snap);
            if !waiting.is_empty() {
                fix.push_str(&format!(" Not listed until someone logs in: {}.", waiting.join("; ")));
            }
            return match self.gw.mode {
                Mode::Optimizer => Ok(meta::error_result(format!(
                    "tool not found: {name}.{fix} Call call_tool again with an exact name, or use find_tool to search for the tool you need."
                ))
                .into()),
                Mode::Passthrough => Err(ErrorData::invalid_params(format!("tool not found: {name}.{fix}"), None)),
            };
        };
        note.backend = Some(tool.key.backend.to_string());
        note.tool = Some(tool.key.tool.to_string());
        let Some(backend) = self.gw.upstream.get(&tool.key.backend) else {
            note.decision = "refused";
            return Ok(meta::error_result(format!("tool not found: {name}")).into());
        };
        // The call follows a find_tool that found this tool: if it completes without an error,
        // the request found it (a label, recorded below).
        let label = self.gw.store.learned().filter(|l| l.is_enabled()).and_then(|learned| {
            let vector = self.usage(&caller.principal).label_for(&tool.key)?;
            Some((learned, vector, tool.key.clone(), caller.principal.clone()))
        });
        if let Err(retry) = self.gw.health.call_gate(backend.name()) {
            (note.decision, note.detail) = ("refused", Some("circuit breaker open".into()));
            self.gw.metrics.tool_call(backend.name(), "breaker_open", std::time::Duration::ZERO);
            return Ok(meta::error_result(format!(
                "backend `{}` is unavailable: its circuit breaker opened after repeated failures; it will be retried in {} s. Use another tool or try again later.",
                backend.name(),
                retry.as_secs().max(1)
            ))
            .into());
        }
        // A place among the session's running calls (a caller without a session: its
        // principal's), then the connection to use.
        let (places, whose) = match self.session.get() {
            Some(s) => (s.calls.clone(), "this session already has"),
            None => (self.gw.callers.calls(&caller.principal), "you already have"),
        };
        let permit = match places.try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                (note.decision, note.detail) = ("refused", Some("server.max_calls_per_session".into()));
                let max = self.gw.limits.max_calls_per_session;
                return Ok(meta::error_result(format!(
                    "{whose} {max} calls running (server.max_calls_per_session); wait for one to finish, then call {name} again"
                ))
                .into());
            }
        };
        // `[[limits]]`: a call over a limit goes no further, and spends nothing.
        let admitted = match self
            .gw
            .limiter
            .check(&caller, Action::Call { backend: backend.name(), tool: &tool.key.tool })
            .await
        {
            Ok(a) => a,
            Err(refused) => {
                (note.decision, note.detail) = ("limited", Some(format!("{} {}", refused.rule, refused.limit.key())));
                self.gw.metrics.tool_call(backend.name(), "limited", std::time::Duration::ZERO);
                let why = refused.message(&format!("the call of {name}"));
                return Ok(meta::error_result(format!("{why}. Until then, use another tool or tell the user.")).into());
            }
        };
        // `[[hooks]]`: the company's guard services see the call first, and may stop or rewrite it.
        if self.gw.hooks.is_active() {
            let arguments = params.arguments.take();
            match self.gw.hooks.before(&caller, backend.name(), &tool.key.tool, arguments).await {
                Verdict::Pass(arguments) => params.arguments = arguments,
                Verdict::Deny { hook, reason } => {
                    (note.decision, note.detail) = ("denied", Some(format!("hook {hook}: {reason}")));
                    return Ok(meta::error_result(format!(
                        "the call of {name} was denied by the guardrail `{hook}`: {reason}. Change the call (or tell the user) rather than retry it as it is."
                    ))
                    .into());
                }
            }
            note.hooked = Some((caller.clone(), params.arguments.clone()));
        }
        let link = match self.link(&backend, ctx).await {
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
            level: Some(match self.session.get() {
                Some(s) => s.level.clone(),
                // A session-less request hears log lines only at the level its `_meta` names.
                None => Arc::new(LogLevel::of_request(ctx.meta.log_level())),
            }),
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
            admitted,
        };
        call.start();
        let span = tracing::info_span!("backend_call", backend = call.backend.name(), upstream = call.link.conn);
        let response = tracing::Instrument::instrument(self.drive(call, ctx), span).await;
        if let (Some((learned, vector, key, principal)), Ok(CallToolResponse::Complete(r))) = (label, &response)
            && r.is_error != Some(true)
        {
            learned.record(&vector, &key, &principal);
        }
        response
    }

    /// Runs a forwarded call to its end for this request: relays its notifications, answers a
    /// 2026-07-28 backend's input rounds by asking a session client, and parks it (answering
    /// input-required) when the backend asks a session-less client for input.
    pub(super) async fn drive(
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
                Some(n) = call.relayed.recv() => n.scrubbed(&self.gw.scrubbing, call.backend.name()).send(&ctx.peer).await,
                Some(ask) = next_ask(&mut call.asks) => {
                    if let Some(ask) = call.refuse_undeclared(ask) {
                        return Ok(self.park(call, ask, ctx).await);
                    }
                }
            }
        };
        // rmcp hands notifications to spawned tasks, so the last ones can trail the response by
        // a scheduling step: let them land, and pass them on before the result.
        self.settle(&mut call.relayed, call.backend.name(), &ctx.peer).await;
        // A task for a client that cannot follow one: the gateway follows it, the client gets
        // the call's result.
        let outcome = match outcome {
            Ok(Answer::Task(created)) if !call.client.as_ref().is_some_and(|c| c.supports_tasks()) => {
                tasks::run_to_end(&call.backend, &call.link, created, &call.ct).await.map(Answer::Complete)
            }
            other => other,
        };
        let label = match &outcome {
            Ok(Answer::Complete(r)) if r.is_error == Some(true) => "is_error",
            Ok(Answer::Task(_)) => "task",
            Ok(_) => "ok",
            Err(CallError::Timeout { .. }) => "timeout",
            Err(CallError::Cancelled) => "cancelled",
            Err(
                CallError::NotConnected { .. }
                | CallError::WakeFailed { .. }
                | CallError::AtCapacity { .. }
                | CallError::SessionFailed { .. }
                | CallError::PrincipalsBusy { .. }
                | CallError::Exchange { .. }
                | CallError::NeedsLogin(_),
            ) => "unavailable",
            Err(CallError::ConnectionLost { .. } | CallError::Remote { .. }) => "error",
        };
        self.gw.metrics.tool_call(call.backend.name(), label, call.started.elapsed());
        if let Ok(Answer::Complete(r)) = &outcome
            && call.admitted.counts_tokens()
        {
            self.gw.limiter.spend_tokens(std::mem::take(&mut call.admitted), crate::catalog::tokens_of(r));
        }
        // Secrets out of what the backend said (`[results] scrub`), before hooks, the audit and
        // the client see it.
        let mut outcome = outcome;
        match &mut outcome {
            Ok(Answer::Complete(r)) => _ = self.gw.scrubbing.result(call.backend.name(), r),
            Err(CallError::Remote { backend, error }) => _ = self.gw.scrubbing.error(backend, error),
            _ => {}
        }
        match outcome {
            Ok(Answer::Complete(r)) => Ok(r.completed().into()),
            // A 2026-07-28 backend's own round, for a client that speaks it: unchanged.
            Ok(Answer::InputRequired(r)) => Ok(CallToolResponse::InputRequired(r)),
            Ok(Answer::Task(created)) => {
                self.task_created(&call.backend, &call.link, &call.params.name, created, ctx).await
            }
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
    pub(super) async fn park(
        &self,
        mut call: PendingCall,
        first: Ask,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let mut asks = vec![first];
        // Requests a backend issues together arrive a scheduling step apart: take them all.
        for _ in 0..RELAY_SETTLE_YIELDS {
            tokio::task::yield_now().await;
            while let Some(a) = call.asks.as_mut().and_then(|r| r.try_recv().ok()) {
                asks.push(a);
            }
        }
        self.settle(&mut call.relayed, call.backend.name(), &ctx.peer).await;
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
    pub(super) async fn with_rounds<P, T, F, Fut>(
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
            Answer::Complete(_) | Answer::Task(_) => Ok(answer),
            Answer::InputRequired(_) => Err(CallError::Remote {
                backend: backend.to_string(),
                error: ErrorData::internal_error(too_many_rounds_text(backend), None),
            }),
        }
    }
}

/// The next backend request for a session-less client's call (never, for a session's).
impl GatewayHandler {
    /// Passes on the notifications from `backend` that trail a call's last message by a
    /// scheduling step or two (scrubbed as they go).
    async fn settle(
        &self,
        relayed: &mut tokio::sync::mpsc::Receiver<Relayed>,
        backend: &str,
        peer: &rmcp::service::Peer<RoleServer>,
    ) {
        for _ in 0..RELAY_SETTLE_YIELDS {
            tokio::task::yield_now().await;
            while let Ok(n) = relayed.try_recv() {
                n.scrubbed(&self.gw.scrubbing, backend).send(peer).await;
            }
        }
    }
}

async fn next_ask(asks: &mut Option<tokio::sync::mpsc::UnboundedReceiver<Ask>>) -> Option<Ask> {
    match asks {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn too_many_rounds_text(backend: &str) -> String {
    format!(
        "backend `{backend}` asked for input more than {} times in one call; the call was stopped",
        rounds::MAX_ROUNDS
    )
}

fn too_many_rounds(backend: &str) -> CallToolResult {
    meta::error_result(too_many_rounds_text(backend))
}
