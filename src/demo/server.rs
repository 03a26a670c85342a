//! A demo backend as a real MCP server (rmcp), over streamable HTTP or stdio.

#![allow(deprecated, reason = "logging and sampling are what 2025-11-25 clients use, and what the testkit exercises")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, Prompt, PromptArgument, PromptMessage, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate, Role, ServerCapabilities,
    ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleServer, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::DemoBackend;

struct Shared {
    name: String,
    title: Option<String>,
    description: String,
    /// Grows when `add_tool` is called; shared by every session of this server.
    tools: Mutex<Vec<Tool>>,
    /// The `summarize` prompt's and the `about` resource's descriptions, once `set_description`
    /// changed them.
    prompt_description: Mutex<Option<String>>,
    resource_description: Mutex<Option<String>>,
    /// Connected clients, told when the tools change.
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// Bumped when the tools change: 2026-07-28 clients hear of it on `subscriptions/listen`.
    tools_changed: tokio::sync::watch::Sender<u64>,
    /// Set when `set_description` changes the prompt (true) or the resource (false).
    parts_changed: tokio::sync::watch::Sender<bool>,
    /// Calls the client cancelled before they finished (reported by `testkit`'s `cancelled_calls`).
    cancelled: std::sync::atomic::AtomicU64,
    list_delay: Duration,
    /// `job`'s tasks, for clients that support tasks.
    tasks: rmcp::task_manager::TaskManager,
}

/// What one MCP session of a demo server keeps (`remember`, `logging/setLevel`).
#[derive(Default)]
struct PerSession {
    remembered: Mutex<Option<String>>,
    level: crate::session::LogLevel,
}

#[derive(Clone)]
pub struct DemoServer {
    shared: Arc<Shared>,
    session: Arc<PerSession>,
}

impl DemoServer {
    pub fn new(backend: DemoBackend) -> Self {
        Self {
            shared: Arc::new(Shared {
                name: backend.name,
                title: backend.title,
                description: backend.description,
                tools: Mutex::new(backend.tools),
                prompt_description: Mutex::default(),
                resource_description: Mutex::default(),
                peers: Mutex::new(Vec::new()),
                tools_changed: tokio::sync::watch::channel(0).0,
                parts_changed: tokio::sync::watch::channel(false).0,
                cancelled: Default::default(),
                list_delay: backend.list_delay,
                tasks: Default::default(),
            }),
            session: Arc::default(),
        }
    }

    /// The same server, for a new MCP session: shared tools, fresh per-session state.
    pub fn for_session(&self) -> Self {
        Self { shared: self.shared.clone(), session: Arc::default() }
    }

    fn tools(&self) -> Vec<Tool> {
        self.shared.tools.lock().expect("tools lock").clone()
    }

    /// Replaces `tool`'s description (as a server that changes a tool after clients trust it),
    /// or with `kind` "prompt" or "resource" the description of this server's prompt or resource.
    async fn set_description(&self, kind: &str, tool: &str, description: &str) -> CallToolResult {
        let other = match kind {
            "prompt" => Some(&self.shared.prompt_description),
            "resource" => Some(&self.shared.resource_description),
            _ => None,
        };
        if let Some(slot) = other {
            *slot.lock().expect("description lock") = Some(description.to_string());
            let prompt = kind == "prompt";
            self.shared.parts_changed.send_replace(prompt);
            let peers = self.shared.peers.lock().expect("peers lock").clone();
            for p in peers {
                let _ = match prompt {
                    true => p.notify_prompt_list_changed().await,
                    false => p.notify_resource_list_changed().await,
                };
            }
            return text(format!("changed the description of the {kind}"));
        }
        let found = {
            let mut tools = self.shared.tools.lock().expect("tools lock");
            match tools.iter_mut().find(|t| t.name == tool) {
                Some(t) => {
                    t.description = Some(description.to_string().into());
                    true
                }
                None => false,
            }
        };
        if !found {
            return CallToolResult::error(vec![ContentBlock::text(format!("no tool `{tool}` here"))]);
        }
        self.announce().await;
        text(format!("changed the description of {tool}"))
    }

    /// Tells every client that the tools changed.
    async fn announce(&self) {
        self.shared.tools_changed.send_modify(|n| *n += 1);
        let peers = self.shared.peers.lock().expect("peers lock").clone();
        for p in peers {
            let _ = p.notify_tool_list_changed().await;
        }
    }

    async fn add_tool(&self, name: &str) -> CallToolResult {
        let tool = super::tool(name, &format!("A tool added at run time to {}", self.shared.name), "input: Anything")
            .expect("a plain tool parses");
        self.shared.tools.lock().expect("tools lock").push(tool);
        self.announce().await;
        text(format!("added tool {name}"))
    }
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

impl ServerHandler for DemoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_prompts()
                .enable_logging()
                .enable_tasks()
                .build(),
        )
        .with_server_info({
            let info = Implementation::new(self.shared.name.clone(), env!("CARGO_PKG_VERSION"))
                .with_description(self.shared.description.clone());
            match &self.shared.title {
                Some(t) => info.with_title(t.clone()),
                None => info,
            }
        })
        .with_instructions(self.shared.description.clone())
    }

    fn accepted_subscription_filter(&self, _requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().prompts_list_changed().resources_list_changed().build())
    }

    /// A 2026-07-28 client's `subscriptions/listen`: `tools/list_changed` when `add_tool` runs,
    /// and the prompts' or resources' when `set_description` changes one of them.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut tools = self.shared.tools_changed.subscribe();
        let mut parts = self.shared.parts_changed.subscribe();
        loop {
            let sink = context.sink();
            let sent = tokio::select! {
                _ = context.cancelled() => return Ok(()),
                r = tools.changed() => match r {
                    Ok(()) => sink.notify_tool_list_changed().await,
                    Err(_) => return Ok(()),
                },
                r = parts.changed() => match r {
                    Ok(()) if *parts.borrow_and_update() => sink.notify_prompt_list_changed().await,
                    Ok(()) => sink.notify_resource_list_changed().await,
                    Err(_) => return Ok(()),
                },
            };
            if sent.is_err() {
                return Ok(());
            }
        }
    }
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.session.level.set(request.level);
        Ok(())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut peers = self.shared.peers.lock().expect("peers lock");
        peers.retain(|p| !p.is_transport_closed());
        peers.push(context.peer);
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        tokio::time::sleep(self.shared.list_delay).await;
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = self.tools().into_iter().find(|t| t.name == request.name) else {
            return Err(ErrorData::invalid_params(format!("unknown tool `{}`", request.name), None));
        };
        let args = request.arguments.unwrap_or_default();
        if let Err(msg) = check_arguments(&tool, &args) {
            return Ok(CallToolResult::error(vec![ContentBlock::text(msg)]).into());
        }
        let arg = |k: &str| args.get(k).cloned().unwrap_or(Value::Null);
        let result = match tool.name.as_ref() {
            "echo" => text(arg("input").as_str().unwrap_or_default()),
            "sleep" => {
                let ms = arg("ms").as_u64().unwrap_or(0);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => text(format!("slept {ms} ms")),
                    _ = context.ct.cancelled() => {
                        self.shared.cancelled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        text("cancelled")
                    }
                }
            }
            "ask" => {
                let ms = arg("delay_ms").as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let prompt = arg("prompt").as_str().unwrap_or_default().to_string();
                let rounds = arg("rounds").as_u64().unwrap_or(1).max(1) as usize;
                let stateless = context.protocol_version().is_some_and(|v| !v.has_initialize());
                if stateless {
                    // A server must not rely on a capability the client did not declare.
                    if context.meta.client_capabilities().is_none_or(|c| c.sampling.is_none()) {
                        let refusal = "this tool needs sampling, which the client did not declare";
                        return Ok(CallToolResult::error(vec![ContentBlock::text(refusal)]).into());
                    }
                    return Ok(ask_in_rounds(&prompt, rounds, request.input_responses, request.request_state));
                }
                let (unlinked, elicit) = (arg("unlinked") == Value::Bool(true), arg("elicit") == Value::Bool(true));
                let mut answers = Vec::new();
                for _ in 0..rounds {
                    let peer = context.peer.clone();
                    let question = prompt.clone();
                    let asked = async move {
                        if elicit { elicit_client(&peer, &question).await } else { ask_client(&peer, &question).await }
                    };
                    // rmcp ties a request sent from the call's own task to the call's stream; one
                    // sent from another task goes out on the session's standalone stream.
                    let asked = async {
                        if unlinked {
                            tokio::spawn(asked).await.unwrap_or_else(|e| Err(e.to_string()))
                        } else {
                            asked.await
                        }
                    };
                    // A call the gateway gives up while the client is being asked is counted too.
                    let asked = tokio::select! {
                        biased;
                        _ = context.ct.cancelled() => {
                            self.shared.cancelled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            return Ok(text("cancelled").into());
                        }
                        a = asked => a,
                    };
                    match asked {
                        Ok(a) => answers.push(a),
                        Err(e) => return Ok(CallToolResult::error(vec![ContentBlock::text(e)]).into()),
                    }
                }
                text(answers.join(" | "))
            }
            "remember" => {
                let value = arg("value").as_str().unwrap_or_default().to_string();
                *self.session.remembered.lock().expect("session lock") = Some(value.clone());
                text(format!("remembered {value}"))
            }
            "whoami" => {
                let headers = context.extensions.get::<http::request::Parts>().map(|p| p.headers.clone());
                let header = |name: &str| {
                    headers.as_ref().and_then(|h| h.get(name)).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
                };
                let who = format!("user={} authorization={}", header("x-user"), header("authorization"));
                match context.meta.get_traceparent() {
                    Some(trace) => text(format!("{who} traceparent={trace}")),
                    None => text(who),
                }
            }
            "recall" => text(self.session.remembered.lock().expect("session lock").clone().unwrap_or_default()),
            "progress" => {
                let steps = arg("steps").as_u64().unwrap_or(1).min(100);
                let label = arg("label").as_str().unwrap_or_default().to_string();
                if let Some(token) = context.meta.get_progress_token() {
                    for i in 1..=steps {
                        let mut p = rmcp::model::ProgressNotificationParam::new(token.clone(), i as f64);
                        p.total = Some(steps as f64);
                        p.message = Some(format!("{label} {i}/{steps}"));
                        let _ = context.peer.notify_progress(p).await;
                    }
                }
                text(format!("{label} done"))
            }
            "log" => {
                let level: rmcp::model::LoggingLevel = serde_json::from_value(arg("level"))
                    .map_err(|e| ErrorData::invalid_params(format!("level: {e}"), None))?;
                let message = arg("message").as_str().unwrap_or_default().to_string();
                let sent = self.session.level.allows(level);
                let params = rmcp::model::LoggingMessageNotificationParam::new(level, Value::String(message));
                match arg("after_ms").as_u64() {
                    // From a task of its own, after the answer: rmcp sends it on the standalone stream.
                    Some(ms) if sent => {
                        let peer = context.peer.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            let _ = peer.notify_logging_message(params).await;
                        });
                        return Ok(text("scheduled").into());
                    }
                    _ if sent => _ = context.peer.notify_logging_message(params).await,
                    _ => {}
                }
                text(if sent { "sent" } else { "below the session's level" })
            }
            "job" => {
                let ms = arg("ms").as_u64().unwrap_or(0);
                let label = arg("label").as_str().unwrap_or("job").to_string();
                let work = Duration::from_millis(ms);
                if context.client_capabilities().is_some_and(|c| c.supports_tasks()) {
                    use rmcp::task_manager::{TaskExit, TaskOptions};
                    let options = TaskOptions::new().with_poll_interval_ms(50);
                    let shared = self.shared.clone();
                    let task = self.shared.tasks.spawn(options, move |cx| {
                        Box::pin(async move {
                            tokio::select! {
                                _ = tokio::time::sleep(work) => Ok(text(format!("{label} done after {ms} ms"))),
                                _ = cx.cancelled() => {
                                    shared.cancelled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    Err(TaskExit::Cancelled)
                                }
                            }
                        })
                    });
                    return Ok(CallToolResponse::Task(rmcp::model::CreateTaskResult::new(task)));
                }
                tokio::time::sleep(work).await;
                text(format!("{label} done after {ms} ms"))
            }
            "big" => big(arg("kind").as_str().unwrap_or_default(), arg("bytes").as_u64().unwrap_or(0) as usize)?,
            "rows" => {
                let count = arg("count").as_u64().unwrap_or(0).min(MAX_ROWS);
                let rows: Vec<Value> =
                    (0..count).map(|i| serde_json::json!({"id": i, "name": format!("row {i}")})).collect();
                let body = serde_json::json!({"rows": rows, "total": count});
                let mut r = text(body.to_string());
                r.structured_content = Some(body);
                r
            }
            "flood" => {
                let token = context.meta.get_progress_token();
                for i in 0u64.. {
                    if let Some(token) = &token {
                        let p = rmcp::model::ProgressNotificationParam::new(token.clone(), i as f64);
                        tokio::select! {
                            _ = context.peer.notify_progress(p) => {}
                            _ = context.ct.cancelled() => break,
                        }
                    } else {
                        context.ct.cancelled().await;
                        break;
                    }
                    if context.ct.is_cancelled() {
                        break;
                    }
                }
                text("flood cancelled")
            }
            "cancelled_calls" => text(self.shared.cancelled.load(std::sync::atomic::Ordering::SeqCst).to_string()),
            "exit" => std::process::exit(3),
            "add_tool" => self.add_tool(arg("name").as_str().unwrap_or("added")).await,
            "set_description" => {
                let tool = arg("tool").as_str().unwrap_or_default().to_string();
                let kind = arg("kind").as_str().unwrap_or("tool").to_string();
                self.set_description(&kind, &tool, arg("description").as_str().unwrap_or_default()).await
            }
            "get_current_time" => text(format!("{:?}", std::time::SystemTime::now())),
            name => {
                let body = plausible(&self.shared.name, name, &args);
                let mut r = text(body.to_string());
                r.structured_content = Some(body);
                r
            }
        };
        Ok(result.into())
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.shared.tasks.get_task(&request.task_id).map(rmcp::model::GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared.tasks.update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared.tasks.cancel_task(&request.task_id)
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let name = &self.shared.name;
        let mut r = Resource::new(format!("demo://{name}/about"), format!("{name}-about"));
        let changed = self.shared.resource_description.lock().expect("description lock").clone();
        r.description = Some(changed.unwrap_or_else(|| format!("What the {name} demo backend offers")));
        r.mime_type = Some("text/plain".into());
        Ok(ListResourcesResult::with_all_items(vec![r]))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let name = &self.shared.name;
        let mut templates = vec![ResourceTemplate::new(format!("demo://{name}/items/{{id}}"), format!("{name}-item"))];
        if name == "testkit" {
            templates.push(ResourceTemplate::new(format!("demo://{name}/slow/{{ms}}"), format!("{name}-slow")));
        }
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let name = &self.shared.name;
        let uri = request.uri;
        let body = if uri == format!("demo://{name}/about") {
            format!("{}: {}", name, self.shared.description)
        } else if let Some(ms) = uri.strip_prefix(&format!("demo://{name}/slow/")).and_then(|ms| ms.parse().ok()) {
            // A read that takes `ms`, counted in `cancelled_calls` when abandoned.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => format!("read after {ms} ms"),
                _ = c.ct.cancelled() => {
                    self.shared.cancelled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return Err(ErrorData::internal_error("cancelled", None));
                }
            }
        } else if let Some(id) = uri.strip_prefix(&format!("demo://{name}/items/")) {
            json!({"id": id, "backend": name, "title": format!("Item {id}")}).to_string()
        } else {
            return Err(ErrorData::resource_not_found(format!("no resource {uri}"), None));
        };
        Ok(ReadResourceResult::new(vec![ResourceContents::text(body, uri)]).into())
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let mut arg = PromptArgument::new("topic");
        arg.required = Some(true);
        let changed = self.shared.prompt_description.lock().expect("description lock").clone();
        let description = changed.unwrap_or_else(|| format!("Summarise a topic using {}", self.shared.name));
        let p = Prompt::new("summarize", Some(description), Some(vec![arg]));
        Ok(ListPromptsResult::with_all_items(vec![p]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != "summarize" {
            return Err(ErrorData::invalid_params(format!("unknown prompt `{}`", request.name), None));
        }
        let topic =
            request.arguments.as_ref().and_then(|a| a.get("topic")).and_then(Value::as_str).unwrap_or("everything");
        let msg =
            PromptMessage::new_text(Role::User, format!("Summarise {topic} using the {} tools.", self.shared.name));
        Ok(GetPromptResult::new(vec![msg]).into())
    }
}

/// Asks the client's user `question` with an elicitation form of one text field, `answer`.
async fn elicit_client(peer: &Peer<RoleServer>, question: &str) -> Result<String, String> {
    let params = serde_json::from_value(json!({"mode": "form", "message": question, "requestedSchema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}))
    .map_err(|e| e.to_string())?;
    match peer.create_elicitation(params).await {
        Ok(r) => {
            Ok(r.content.and_then(|c| c.get("answer").and_then(Value::as_str).map(str::to_string)).unwrap_or_default())
        }
        Err(e) => Err(format!("elicitation failed: {e}")),
    }
}
fn sampling(question: &str) -> rmcp::model::CreateMessageRequestParams {
    use rmcp::model::{CreateMessageRequestParams, SamplingMessage};
    CreateMessageRequestParams::new(vec![SamplingMessage::user_text(question)], 64)
}

/// Asks the client's model `question` with a sampling request (2025-11-25) and returns its text.
async fn ask_client(peer: &Peer<RoleServer>, question: &str) -> Result<String, String> {
    match peer.create_message(sampling(question)).await {
        Ok(r) => Ok(r.message.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone()).unwrap_or_default()),
        Err(e) => Err(format!("sampling failed: {e}")),
    }
}

/// The same on 2026-07-28: each round answers input-required with one sampling request (key
/// `answer`) and the answers so far in `requestState`; the last round returns them all.
fn ask_in_rounds(
    question: &str,
    rounds: usize,
    responses: Option<rmcp::model::InputResponses>,
    state: Option<String>,
) -> CallToolResponse {
    use rmcp::model::{CreateMessageRequest, CreateMessageResult, InputRequest, InputRequests, InputRequiredResult};
    let mut answers: Vec<String> = state.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    if let Some(v) = responses.and_then(|mut r| r.remove("answer")) {
        match serde_json::from_value::<CreateMessageResult>(v) {
            Ok(r) => answers
                .push(r.message.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone()).unwrap_or_default()),
            Err(e) => {
                return CallToolResult::error(vec![ContentBlock::text(format!("not a sampling answer: {e}"))]).into();
            }
        }
    }
    if answers.len() >= rounds {
        return text(answers.join(" | ")).into();
    }
    let mut requests = InputRequests::new();
    requests.insert("answer".into(), InputRequest::CreateMessage(CreateMessageRequest::new(sampling(question))));
    let state = serde_json::to_string(&answers).unwrap_or_default();
    InputRequiredResult::new(Some(requests), Some(state)).into()
}

/// Required arguments present, and of the declared JSON type.
fn check_arguments(tool: &Tool, args: &Map<String, Value>) -> Result<(), String> {
    let schema = Value::Object((*tool.input_schema).clone());
    for r in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        if !args.contains_key(r) {
            return Err(format!("missing required argument `{r}` for `{}`", tool.name));
        }
    }
    for (k, v) in args {
        let Some(ty) = schema["properties"][k]["type"].as_str() else { continue };
        let ok = match ty {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => true,
        };
        if !ok {
            return Err(format!("argument `{k}` of `{}` must be of type {ty}", tool.name));
        }
    }
    Ok(())
}

/// A result shaped by the tool's verb, echoing its arguments.
fn plausible(backend: &str, tool: &str, args: &Map<String, Value>) -> Value {
    let verb = tool.split('_').next().unwrap_or(tool);
    let id = format!("{backend}-{:x}", tool.len() * 7919 + args.len() * 104729);
    match verb {
        "list" | "search" | "query" | "find" | "grep" | "get_channel" => json!({
            "items": (1..=3).map(|i| json!({"id": format!("{id}-{i}"), "name": format!("{} result {i}", tool.replace('_', " "))})).collect::<Vec<_>>(),
            "total": 3,
            "query": args,
        }),
        "create" | "send" | "post" | "add" | "open" | "schedule" | "book" | "upload" | "put" | "invoke" | "deploy"
        | "log" => {
            json!({"id": id, "status": "created", "request": args})
        }
        "update" | "set" | "edit" | "transition" | "assign" | "move" | "apply" | "scale" | "merge" | "review" => {
            json!({"id": id, "status": "updated", "changes": args})
        }
        "delete" | "remove" | "close" | "cancel" | "archive" | "stop" | "mute" => {
            json!({"id": id, "status": "done", "request": args})
        }
        _ => {
            json!({"id": id, "status": "ok", "result": format!("{} completed", tool.replace('_', " ")), "request": args})
        }
    }
}

/// Serves `backend` over streamable HTTP on `listener` until `ct` is cancelled.
pub async fn serve_http(
    backend: DemoBackend,
    listener: tokio::net::TcpListener,
    ct: CancellationToken,
) -> std::io::Result<()> {
    let server = DemoServer::new(backend);
    let service = StreamableHttpService::new(
        move || Ok(server.for_session()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token()),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, router).with_graceful_shutdown(async move { ct.cancelled().await }).await
}

/// Serves `backend` over stdin/stdout until the client goes away.
pub async fn serve_stdio(backend: DemoBackend) -> anyhow::Result<()> {
    let service = DemoServer::new(backend).serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}

/// The most rows `rows` returns, and bytes `big` makes: large enough for a bad-input test.
const MAX_ROWS: u64 = 2_000_000;
const MAX_BIG: usize = 64 << 20;

/// `big`'s result of about `bytes` bytes: numbered lines, a JSON array of numbers, or an image.
fn big(kind: &str, bytes: usize) -> Result<CallToolResult, ErrorData> {
    let bytes = bytes.min(MAX_BIG);
    Ok(match kind {
        "text" => {
            let mut out = String::with_capacity(bytes + 64);
            for i in 0.. {
                if out.len() >= bytes {
                    break;
                }
                out.push_str(&format!("line {i}: the quick brown fox jumps over the lazy dog\n"));
            }
            text(out)
        }
        "json" => {
            let rows: Vec<usize> = (0..bytes / 7).collect();
            text(serde_json::json!({"rows": rows, "count": rows.len()}).to_string())
        }
        "image" => CallToolResult::success(vec![
            ContentBlock::text("the chart"),
            ContentBlock::image("QUJD".repeat(bytes / 3), "image/png"),
        ]),
        other => return Err(ErrorData::invalid_params(format!("kind `{other}`: give text, json or image"), None)),
    })
}
