//! The conformance suite's task fixtures (SEP-2663, `io.modelcontextprotocol/tasks`), served by
//! the 2026-07-28 backend ([`super::Mrtr`]) so that the suite's tasks scenarios run through
//! toolmux: the backend creates and runs the tasks (rmcp's `TaskManager`), toolmux relays the
//! calls that create them and `tasks/get|update|cancel`.
//!
//! - `greet`: never a task;
//! - `slow_compute`: a task when the request declares the extension (else it runs inline),
//!   `seconds` long, settling `cancelled` when cancelled;
//! - `failing_job`: needs the extension (-32021 without it); a task that ends in a tool error;
//! - `protocol_error_job`: a task that fails with a protocol error;
//! - `confirm_delete`, `multi_input`: tasks that ask the client for one / two answers at once
//!   (`confirm_delete` asks in an input-required round for a client without tasks);
//! - `test_tool_with_task`: one input-required round, then a task whose result uses the answer.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::*;
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};
use serde_json::{Value, json};

pub const TOOLS: &[(&str, &str)] = &[
    ("greet", "Says hello to `name`"),
    ("slow_compute", "Sleeps `seconds` seconds, then answers (a task when the client supports tasks)"),
    ("failing_job", "A task that always ends in a tool error"),
    ("protocol_error_job", "A task that fails with a protocol error"),
    ("confirm_delete", "Asks the client to confirm deleting `filename`, as a task"),
    ("multi_input", "Asks the client two questions at once, as a task"),
    ("test_tool_with_task", "Asks for the user's name, then continues as a task"),
];

/// Short enough for the suite's polls, long enough to be seen working.
const POLL_MS: u64 = 100;

#[derive(Clone, Default)]
pub struct Tasks {
    manager: TaskManager,
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn elicitation(message: &str) -> Result<InputRequest, TaskExit> {
    let request = json!({"method": "elicitation/create", "params": {
        "message": message,
        "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}}}});
    serde_json::from_value(request).map_err(|e| TaskExit::Error(ErrorData::internal_error(e.to_string(), None)))
}

fn accepted(answer: &Value) -> bool {
    answer["action"] == "accept"
}

impl Tasks {
    pub fn tools(&self) -> Vec<Tool> {
        let schema = Arc::new(json!({"type": "object"}).as_object().cloned().unwrap_or_default());
        TOOLS.iter().map(|(name, about)| Tool::new(*name, *about, schema.clone())).collect()
    }

    pub fn serves(name: &str) -> bool {
        TOOLS.iter().any(|(n, _)| *n == name)
    }

    fn spawn<F>(&self, work: impl FnOnce(TaskContext) -> F + Send + 'static) -> CallToolResponse
    where
        F: Future<Output = Result<CallToolResult, TaskExit>> + Send + 'static,
    {
        let options = TaskOptions::new().with_poll_interval_ms(POLL_MS);
        let task = self.manager.spawn(options, move |cx| Box::pin(work(cx)));
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    pub fn call(&self, p: &CallToolRequestParams, caps: &ClientCapabilities) -> Result<CallToolResponse, ErrorData> {
        let tasks = caps.supports_tasks();
        let args = p.arguments.clone().unwrap_or_default();
        let arg = |k: &str| args.get(k).cloned().unwrap_or(Value::Null);
        let required =
            || ErrorData::missing_required_client_capability(ClientCapabilities::builder().enable_tasks().build());
        match p.name.as_ref() {
            "greet" => Ok(text(format!("Hello, {}!", arg("name").as_str().unwrap_or("stranger"))).into()),
            "slow_compute" => {
                let seconds = arg("seconds").as_f64().unwrap_or(0.0).max(0.0);
                let label = arg("label").as_str().unwrap_or_default().to_string();
                if !tasks {
                    // Inline: only the instant case, as the suite calls it without the extension.
                    return Ok(text(format!("computed {label}")).into());
                }
                Ok(self.spawn(move |cx| async move {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => Ok(text(format!("computed {label}"))),
                        _ = cx.cancelled() => Err(TaskExit::Cancelled),
                    }
                }))
            }
            "failing_job" if !tasks => Err(required()),
            "failing_job" => Ok(self.spawn(|_| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(CallToolResult::error(vec![ContentBlock::text("the job failed, as it always does")]))
            })),
            "protocol_error_job" if !tasks => Err(required()),
            "protocol_error_job" => {
                Ok(self.spawn(|_| async { Err(TaskExit::Error(ErrorData::internal_error("the job crashed", None))) }))
            }
            // Without tasks, the confirmation is one input-required round instead.
            "confirm_delete" if !tasks => {
                let file = arg("filename").as_str().unwrap_or("a file").to_string();
                match p.input_responses.as_ref().and_then(|r| r.get("confirm")) {
                    Some(answer) => {
                        Ok(text(if accepted(answer) { format!("deleted {file}") } else { format!("kept {file}") })
                            .into())
                    }
                    None => {
                        let ask = elicitation(&format!("Delete {file}?"))
                            .map_err(|_| ErrorData::internal_error("the question does not parse", None))?;
                        let mut requests = InputRequests::new();
                        requests.insert("confirm".to_string(), ask);
                        Ok(CallToolResponse::InputRequired(InputRequiredResult::new(Some(requests), None)))
                    }
                }
            }
            "confirm_delete" => {
                let file = arg("filename").as_str().unwrap_or("a file").to_string();
                Ok(self.spawn(move |cx| async move {
                    let answer = cx.request_input("confirm", elicitation(&format!("Delete {file}?"))?).await?;
                    Ok(text(if accepted(&answer) { format!("deleted {file}") } else { format!("kept {file}") }))
                }))
            }
            "multi_input" if !tasks => Err(required()),
            "multi_input" => Ok(self.spawn(|cx| async move {
                let (a, b) = tokio::try_join!(
                    cx.request_input("first", elicitation("First question?")?),
                    cx.request_input("second", elicitation("Second question?")?),
                )?;
                Ok(text(format!("answers: {} and {}", a["action"], b["action"])))
            })),
            "test_tool_with_task" => match p.input_responses.as_ref().and_then(|r| r.get("user_name")) {
                None => {
                    let ask = json!({"method": "elicitation/create", "params": {"message": "What is your name?",
                        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}});
                    let ask =
                        serde_json::from_value(ask).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                    let mut requests = InputRequests::new();
                    requests.insert("user_name".to_string(), ask);
                    Ok(CallToolResponse::InputRequired(InputRequiredResult::new(Some(requests), None)))
                }
                Some(_) if !tasks => Err(required()),
                Some(answer) => {
                    let name = answer["content"]["name"].as_str().unwrap_or("stranger").to_string();
                    Ok(self.spawn(move |_| async move {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok(text(format!("Hello, {name}, from a task")))
                    }))
                }
            },
            other => Err(ErrorData::invalid_params(format!("unknown tool `{other}`"), None)),
        }
    }

    pub fn get(&self, p: GetTaskParams) -> Result<GetTaskResult, ErrorData> {
        self.manager.get_task(&p.task_id).map(GetTaskResult::new)
    }

    pub fn update(&self, p: UpdateTaskParams) -> Result<(), ErrorData> {
        self.manager.update_task(&p.task_id, p.input_responses)
    }

    pub fn cancel(&self, p: CancelTaskParams) -> Result<(), ErrorData> {
        self.manager.cancel_task(&p.task_id)
    }
}
