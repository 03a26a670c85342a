//! The conformance suite's input-required scenarios (SEP-2322), as a 2026-07-28 server: tools and a
//! prompt that answer `input_required` and finish once the client retries with its answers.
//! Served beside the main conformance server (at `/mrtr`), and fronted by toolmux as a backend
//! that speaks 2026-07-28, so the suite checks that toolmux carries the rounds unchanged.
//!
//! Request states are opaque handles the server issued and remembers; any other state (a
//! tampered one) is refused with invalid params.
//!
//! It also has the tool the custom-header scenario (SEP-2243) looks for, [`CUSTOM_HEADER`]: its
//! `region` argument travels in `Mcp-Param-Region` too, and this server checks that header
//! (rmcp does, through `get_tool`), so a call toolmux forwarded without it fails here.
//!
//! And the tasks scenarios' tools (SEP-2663), in [`tasks`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

#[path = "tasks.rs"]
mod tasks;

#[derive(Clone, Default)]
pub struct Mrtr {
    /// The tasks scenarios' tools and the tasks they run.
    tasks: tasks::Tasks,
    /// Request states issued and not yet spent.
    states: Arc<Mutex<HashSet<String>>>,
    /// Tools added by `test_trigger_tool_change`, and how many times the list changed.
    added: Arc<Mutex<Vec<String>>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

const TOOLS: &[&str] = &[
    "test_input_required_result_elicitation",
    "test_input_required_result_sampling",
    "test_input_required_result_list_roots",
    "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs",
    "test_input_required_result_multi_round",
    "test_input_required_result_tampered_state",
    "test_input_required_result_capabilities",
];
const PROMPT: &str = "test_input_required_result_prompt";
/// A tool whose `region` argument is mirrored into the `Mcp-Param-Region` header.
const CUSTOM_HEADER: &str = "test_custom_header";
/// The stateless scenario's diagnostic tools (SEP-2575): one that needs sampling, one that asks
/// for elicitation, one that logs, and one that changes the tool list.
const DIAGNOSTICS: &[&str] =
    &["test_missing_capability", "test_streaming_elicitation", "test_logging_tool", "test_trigger_tool_change"];

fn custom_header_tool() -> Tool {
    let schema = json!({"type": "object", "properties": {
        "region": {"type": "string", "description": "Where to run", "x-mcp-header": "Region"}}, "required": ["region"]});
    Tool::new(
        CUSTOM_HEADER,
        "Echoes the region it was called for",
        Arc::new(schema.as_object().cloned().unwrap_or_default()),
    )
}

fn elicit(message: &str, field: &str, ty: &str) -> Value {
    json!({"method": "elicitation/create", "params": {
        "message": message,
        "requestedSchema": {"type": "object", "properties": {field: {"type": ty}}, "required": [field]}}})
}

fn sample(text: &str, max_tokens: u32) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": max_tokens}})
}

fn roots() -> Value {
    json!({"method": "roots/list", "params": {}})
}

/// An input-required result asking for `requests` (key → request JSON), with `state` if given.
fn input_required(requests: Vec<(&str, Value)>, state: Option<String>) -> Result<InputRequiredResult, ErrorData> {
    let mut map = InputRequests::new();
    for (key, request) in requests {
        let request = serde_json::from_value(request).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        map.insert(key.to_string(), request);
    }
    Ok(InputRequiredResult::new(Some(map), state))
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

impl Mrtr {
    fn issue(&self, prefix: &str) -> String {
        let state = format!("{prefix}-{:016x}", rand::random::<u64>());
        self.states.lock().expect("states lock").insert(state.clone());
        state
    }

    /// Spends `state` if this server issued it with `prefix`.
    fn redeem(&self, state: Option<&str>, prefix: &str) -> Result<(), ErrorData> {
        let ok = state.is_some_and(|s| s.starts_with(prefix) && self.states.lock().expect("states lock").remove(s));
        if ok { Ok(()) } else { Err(ErrorData::invalid_params("requestState failed its integrity check", None)) }
    }

    fn call(&self, p: &CallToolRequestParams, caps: Option<ClientCapabilities>) -> Result<CallToolResponse, ErrorData> {
        let responses = p.input_responses.clone().unwrap_or_default();
        let answer = |key: &str| responses.get(key).cloned();
        let state = p.request_state.as_deref();
        let done = |r: CallToolResult| Ok(CallToolResponse::Complete(r));
        let ask = |requests, state| input_required(requests, state).map(CallToolResponse::InputRequired);
        match p.name.as_ref() {
            "test_input_required_result_elicitation" => match answer("user_name") {
                // A retry without the answer asks again (not an error).
                None => ask(vec![("user_name", elicit("What is your name?", "name", "string"))], None),
                Some(a) => done(text(format!("Hello, {}!", a["content"]["name"].as_str().unwrap_or("stranger")))),
            },
            "test_input_required_result_sampling" => match answer("capital_question") {
                None => ask(vec![("capital_question", sample("What is the capital of France?", 100))], None),
                Some(a) => done(text(a["content"]["text"].as_str().unwrap_or_default())),
            },
            "test_input_required_result_list_roots" => match answer("client_roots") {
                None => ask(vec![("client_roots", roots())], None),
                Some(a) => {
                    let uris: Vec<&str> =
                        a["roots"].as_array().into_iter().flatten().filter_map(|r| r["uri"].as_str()).collect();
                    done(text(format!("roots: {}", uris.join(", "))))
                }
            },
            "test_input_required_result_request_state" | "test_input_required_result_tampered_state" => {
                let prefix = if p.name.contains("tampered") { "tamper" } else { "confirm" };
                match answer("confirm") {
                    None => ask(vec![("confirm", elicit("Please confirm", "ok", "boolean"))], Some(self.issue(prefix))),
                    Some(_) => {
                        self.redeem(state, prefix)?;
                        done(text("state-ok: confirmed"))
                    }
                }
            }
            "test_input_required_result_multiple_inputs" => {
                let keys = ["user_name", "greeting", "client_roots"];
                if keys.iter().all(|k| responses.contains_key(*k)) {
                    self.redeem(state, "multi")?;
                    return done(text("all inputs received"));
                }
                ask(
                    vec![
                        ("user_name", elicit("What is your name?", "name", "string")),
                        ("greeting", sample("Generate a greeting", 50)),
                        ("client_roots", roots()),
                    ],
                    Some(self.issue("multi")),
                )
            }
            "test_input_required_result_multi_round" => {
                if answer("step2").is_some() {
                    self.redeem(state, "round-2")?;
                    return done(text("both steps done"));
                }
                if answer("step1").is_some() {
                    self.redeem(state, "round-1")?;
                    let step2 = elicit("Step 2: What is your favorite color?", "color", "string");
                    return ask(vec![("step2", step2)], Some(self.issue("round-2")));
                }
                ask(
                    vec![("step1", elicit("Step 1: What is your name?", "name", "string"))],
                    Some(self.issue("round-1")),
                )
            }
            "test_input_required_result_capabilities" => {
                if !responses.is_empty() {
                    return done(text("capabilities respected"));
                }
                // Only what the client declared.
                let caps = caps.unwrap_or_default();
                let mut requests = Vec::new();
                if caps.sampling.is_some() {
                    requests.push(("answer", sample("Say hello", 20)));
                }
                if caps.elicitation.is_some() {
                    requests.push(("name", elicit("What is your name?", "name", "string")));
                }
                if requests.is_empty() {
                    return done(text("nothing to ask a client that declared nothing"));
                }
                ask(requests, None)
            }
            other => Err(ErrorData::invalid_params(format!("unknown tool `{other}`"), None)),
        }
    }
}

impl ServerHandler for Mrtr {
    fn get_info(&self) -> ServerConfig {
        // Tool-list changes are announced (test_trigger_tool_change): without the capability, a
        // listen stream is acknowledged with an empty filter and carries nothing.
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_tasks()
            .build();
        ServerConfig::new(caps).with_server_info(Implementation::new("conformance-mrtr", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = Arc::new(json!({"type": "object"}).as_object().cloned().unwrap_or_default());
        let mut tools: Vec<Tool> =
            TOOLS.iter().map(|n| Tool::new(*n, "An input-required conformance scenario", schema.clone())).collect();
        tools.push(custom_header_tool());
        tools.extend(self.tasks.tools());
        tools.extend(DIAGNOSTICS.iter().map(|n| Tool::new(*n, "A stateless-server diagnostic", schema.clone())));
        let added = self.added.lock().expect("added lock").clone();
        tools.extend(added.into_iter().map(|n| Tool::new(n, "Added by test_trigger_tool_change", schema.clone())));
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn accepted_subscription_filter(&self, _requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// `subscriptions/listen`: `tools/list_changed` each time `test_trigger_tool_change` runs.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.changed.subscribe();
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                r = changes.changed() => if r.is_err() { return Ok(()) },
            }
            if context.sink().notify_tool_list_changed().await.is_err() {
                return Ok(());
            }
        }
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == CUSTOM_HEADER).then(custom_header_tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caps = context.meta.client_capabilities().unwrap_or_default();
        match request.name.as_ref() {
            CUSTOM_HEADER => {
                let region = request.arguments.as_ref().and_then(|a| a.get("region")).and_then(Value::as_str);
                Ok(text(format!("region={}", region.unwrap_or_default())).into())
            }
            // A server must not rely on a capability the client did not declare: -32021.
            "test_missing_capability" if caps.sampling.is_none() => Err(ErrorData::new(
                ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
                "this tool needs the sampling capability",
                Some(json!({"requiredCapabilities": {"sampling": {}}})),
            )),
            "test_missing_capability" => Ok(text("sampling declared").into()),
            // Asks with an input-required result, never with a request on the response stream.
            "test_streaming_elicitation" => match request.input_responses.as_ref().and_then(|r| r.get("answer")) {
                None if caps.elicitation.is_some() => {
                    let ask = elicit("Anything to add?", "note", "string");
                    Ok(CallToolResponse::InputRequired(input_required(vec![("answer", ask)], None)?))
                }
                _ => Ok(text("done").into()),
            },
            // Logs whether asked to or not: what a client hears is the gateway's to filter.
            "test_logging_tool" => {
                #[expect(deprecated, reason = "logging notifications are what the scenario checks")]
                let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, json!("a log line"));
                #[expect(deprecated, reason = "logging notifications are what the scenario checks")]
                let _ = context.peer.notify_logging_message(param).await;
                Ok(text("logged").into())
            }
            "test_trigger_tool_change" => {
                let name = {
                    let mut added = self.added.lock().expect("added lock");
                    let name = format!("test_added_tool_{}", added.len() + 1);
                    added.push(name.clone());
                    name
                };
                self.changed.send_modify(|n| *n += 1);
                Ok(text(format!("added {name}")).into())
            }
            name if tasks::Tasks::serves(name) => self.tasks.call(&request, &caps),
            _ => self.call(&request, Some(caps)),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.get(request)
    }

    async fn update_task(&self, request: UpdateTaskParams, _c: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.tasks.update(request)
    }

    async fn cancel_task(&self, request: CancelTaskParams, _c: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.tasks.cancel(request)
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(PROMPT, Some("A prompt that needs input first"), None)]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != PROMPT {
            return Err(ErrorData::invalid_params(format!("unknown prompt `{}`", request.name), None));
        }
        match request.input_responses.as_ref().and_then(|r| r.get("user_context")) {
            None => {
                let ask = elicit("What context should the prompt use?", "context", "string");
                Ok(GetPromptResponse::InputRequired(input_required(vec![("user_context", ask)], None)?))
            }
            Some(a) => {
                let context = a["content"]["context"].as_str().unwrap_or("none");
                let message = PromptMessage::new_text(Role::User, format!("Use this context: {context}"));
                Ok(GetPromptResponse::Complete(GetPromptResult::new(vec![message])))
            }
        }
    }
}
