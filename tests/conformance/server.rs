//! The server that the MCP conformance suite's server scenarios expect: its tools, resources,
//! prompts and completions. toolmux fronts it (passthrough, bare names) and the suite checks
//! toolmux; anything the gateway fails to carry shows as a failed scenario. Shared by the
//! `conformance-backend` example (for tests/conformance/run.sh) and the relay integration tests.

#![allow(deprecated, reason = "sampling and logging are what the 2025-11-25 scenarios exercise")]
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

#[path = "mrtr.rs"]
pub mod mrtr;

/// A 1×1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A 44-byte silent WAV.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=";

#[derive(Clone, Default)]
struct Conformance {
    subscribed: Arc<Mutex<HashSet<String>>>,
    /// Send sampling and elicitation requests unlinked to the call that needs them.
    unlinked: bool,
}

impl Conformance {
    /// Runs a request to the client from the call's own task, where rmcp ties it to the call's
    /// stream, or, when `unlinked`, from another task: it then goes out on the session's
    /// standalone stream, as the TypeScript SDK's example servers send theirs.
    async fn ask<T: Send + 'static>(
        &self,
        request: impl Future<Output = Result<T, rmcp::ServiceError>> + Send + 'static,
    ) -> Result<T, ErrorData> {
        let answer = if self.unlinked {
            tokio::spawn(request).await.map_err(|e| ErrorData::internal_error(e.to_string(), None))?
        } else {
            request.await
        };
        answer.map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

fn tool(name: &str, description: &str, schema: Value) -> Tool {
    Tool::new(name.to_string(), description.to_string(), Arc::new(schema.as_object().cloned().unwrap_or_default()))
}

fn empty() -> Value {
    json!({"type": "object", "properties": {}})
}

fn tools() -> Vec<Tool> {
    vec![
        tool("test_simple_text", "Returns simple text", empty()),
        tool("test_image_content", "Returns an image", empty()),
        tool("test_audio_content", "Returns audio", empty()),
        tool("test_embedded_resource", "Returns an embedded resource", empty()),
        tool("test_multiple_content_types", "Returns text, image and a resource", empty()),
        tool("test_tool_with_logging", "Logs while it runs", empty()),
        tool("test_tool_with_progress", "Reports progress while it runs", empty()),
        tool("test_error_handling", "Always fails", empty()),
        tool(
            "test_sampling",
            "Asks the client's LLM",
            json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
        ),
        tool(
            "test_elicitation",
            "Asks the user",
            json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
        ),
        tool("test_elicitation_sep1034_defaults", "Asks the user, with defaults", empty()),
        tool("test_elicitation_sep1330_enums", "Asks the user, with every enum form", empty()),
        tool(
            "test_reconnection",
            "A tool that triggers SSE stream closure to test client reconnection behavior",
            empty(),
        ),
        tool(
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
                "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                "additionalProperties": false
            }),
        ),
    ]
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn elicit(v: Value) -> Result<ElicitRequestParams, ErrorData> {
    serde_json::from_value(v).map_err(|e| ErrorData::internal_error(format!("elicitation schema: {e}"), None))
}

async fn log(peer: &Peer<RoleServer>, message: &str) {
    let _ = peer
        .notify_logging_message(
            LoggingMessageNotificationParam::new(LoggingLevel::Info, json!(message)).with_logger("conformance"),
        )
        .await;
}

impl ServerHandler for Conformance {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_completions()
                .enable_prompts()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_tools()
                .build(),
        )
        .with_server_info(Implementation::new("conformance-backend", "0"))
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let arg = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let peer = &context.peer;
        let result = match request.name.as_ref() {
            "test_simple_text" => text("This is a simple text response for testing."),
            "test_image_content" => CallToolResult::success(vec![ContentBlock::image(PNG, "image/png")]),
            "test_audio_content" => CallToolResult::success(vec![ContentBlock::audio(WAV, "audio/wav")]),
            "test_embedded_resource" => {
                CallToolResult::success(vec![ContentBlock::resource(ResourceContents::TextResourceContents {
                    uri: "test://embedded-resource".into(),
                    mime_type: Some("text/plain".into()),
                    text: "This is an embedded resource content.".into(),
                    meta: None,
                })])
            }
            "test_multiple_content_types" => CallToolResult::success(vec![
                ContentBlock::text("Multiple content types test:"),
                ContentBlock::image(PNG, "image/png"),
                ContentBlock::resource(ResourceContents::TextResourceContents {
                    uri: "test://mixed-content-resource".into(),
                    mime_type: Some("application/json".into()),
                    text: r#"{"test":"data","value":123}"#.into(),
                    meta: None,
                }),
            ]),
            "test_tool_with_logging" => {
                log(peer, "Tool execution started").await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                log(peer, "Tool processing data").await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                log(peer, "Tool execution completed").await;
                text("Tool with logging executed successfully")
            }
            "test_tool_with_progress" => {
                let token = context.meta.get_progress_token();
                for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    if let Some(t) = &token {
                        let _ =
                            peer.notify_progress(ProgressNotificationParam::new(t.clone(), p).with_total(100.0)).await;
                    }
                }
                text("Tool with progress executed successfully")
            }
            "test_error_handling" => {
                CallToolResult::error(vec![ContentBlock::text("This tool intentionally returns an error for testing")])
            }
            "test_sampling" => {
                let params = CreateMessageRequestParams::new(vec![SamplingMessage::user_text(arg("prompt"))], 100);
                let peer = peer.clone();
                let r = self.ask(async move { peer.create_message(params).await }).await?;
                let reply = serde_json::to_value(&r.message.content).unwrap_or_default();
                let said = reply["text"].as_str().map(str::to_string).unwrap_or_else(|| reply.to_string());
                text(format!("LLM response: {said}"))
            }
            "test_elicitation" => {
                let params = elicit(json!({"mode": "form", "message": arg("message"), "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "description": "User's response"},
                        "email": {"type": "string", "description": "User's email address"}
                    },
                    "required": ["username", "email"]
                }}))?;
                let peer = peer.clone();
                let r = self.ask(async move { peer.create_elicitation(params).await }).await?;
                text(format!("User response: {}", serde_json::to_string(&r).unwrap_or_default()))
            }
            "test_elicitation_sep1034_defaults" => {
                let params = elicit(
                    json!({"mode": "form", "message": "Please review your information", "requestedSchema": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "description": "User name", "default": "John Doe"},
                            "age": {"type": "integer", "description": "User age", "default": 30},
                            "score": {"type": "number", "description": "User score", "default": 95.5},
                            "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                            "verified": {"type": "boolean", "description": "Verification status", "default": true}
                        }
                    }}),
                )?;
                let peer = peer.clone();
                let r = self.ask(async move { peer.create_elicitation(params).await }).await?;
                text(format!("Elicitation completed: {}", serde_json::to_string(&r).unwrap_or_default()))
            }
            "test_elicitation_sep1330_enums" => {
                let params = elicit(json!({"mode": "form", "message": "Please select options", "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                        "titledSingle": {"type": "string", "oneOf": [
                            {"const": "value1", "title": "First Option"},
                            {"const": "value2", "title": "Second Option"},
                            {"const": "value3", "title": "Third Option"}]},
                        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                        "titledMulti": {"type": "array", "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"}]}}
                    }
                }}))?;
                let peer = peer.clone();
                let r = self.ask(async move { peer.create_elicitation(params).await }).await?;
                text(format!("Elicitation completed: {}", serde_json::to_string(&r).unwrap_or_default()))
            }
            "test_reconnection" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                text("Reconnection test completed")
            }
            "json_schema_2020_12_tool" => text(format!("received {}", Value::Object(args.clone()))),
            other => return Err(ErrorData::invalid_params(format!("unknown tool {other}"), None)),
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mk = |uri: &str, name: &str, desc: &str, mime: &str| {
            let mut r = Resource::new(uri, name);
            r.description = Some(desc.into());
            r.mime_type = Some(mime.into());
            r
        };
        Ok(ListResourcesResult::with_all_items(vec![
            mk("test://static-text", "static-text", "A static text resource", "text/plain"),
            mk("test://static-binary", "static-binary", "A static binary resource", "image/png"),
            mk("test://watched-resource", "watched-resource", "A resource that can be subscribed to", "text/plain"),
        ]))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut t = ResourceTemplate::new("test://template/{id}/data", "template-data");
        t.description = Some("Data for an id".into());
        t.mime_type = Some("application/json".into());
        Ok(ListResourceTemplatesResult::with_all_items(vec![t]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let text_of = |uri: &str, mime: &str, t: String| ResourceContents::TextResourceContents {
            uri: uri.into(),
            mime_type: Some(mime.into()),
            text: t,
            meta: None,
        };
        let contents = match uri.as_str() {
            "test://static-text" => {
                text_of(&uri, "text/plain", "This is the content of the static text resource.".into())
            }
            "test://watched-resource" => text_of(&uri, "text/plain", "Watched resource content.".into()),
            "test://static-binary" => ResourceContents::BlobResourceContents {
                uri: uri.clone(),
                mime_type: Some("image/png".into()),
                blob: PNG.into(),
                meta: None,
            },
            other => match other.strip_prefix("test://template/").and_then(|r| r.strip_suffix("/data")) {
                Some(id) => text_of(
                    &uri,
                    "application/json",
                    json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string(),
                ),
                None => return Err(ErrorData::resource_not_found(format!("no resource {uri}"), None)),
            },
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscribed.lock().unwrap().insert(request.uri.clone());
        let peer = context.peer.clone();
        let subscribed = self.subscribed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if subscribed.lock().unwrap().contains(&request.uri) {
                let _ = peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(request.uri)).await;
            }
        });
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscribed.lock().unwrap().remove(&request.uri);
        Ok(())
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let arg = |n: &str, d: &str| {
            let mut a = PromptArgument::new(n);
            a.description = Some(d.into());
            a.required = Some(true);
            a
        };
        Ok(ListPromptsResult::with_all_items(vec![
            Prompt::new("test_simple_prompt", Some("A simple prompt without arguments"), None),
            Prompt::new(
                "test_prompt_with_arguments",
                Some("A prompt with arguments"),
                Some(vec![arg("arg1", "First test argument"), arg("arg2", "Second test argument")]),
            ),
            Prompt::new(
                "test_prompt_with_embedded_resource",
                Some("A prompt with an embedded resource"),
                Some(vec![arg("resourceUri", "URI of the resource to embed")]),
            ),
            Prompt::new("test_prompt_with_image", Some("A prompt with an image"), None),
        ]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let arg = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let messages = match request.name.as_str() {
            "test_simple_prompt" => vec![PromptMessage::new_text(Role::User, "This is a simple prompt for testing.")],
            "test_prompt_with_arguments" => vec![PromptMessage::new_text(
                Role::User,
                format!("Prompt with arguments: arg1='{}', arg2='{}'", arg("arg1"), arg("arg2")),
            )],
            "test_prompt_with_embedded_resource" => {
                let uri = arg("resourceUri");
                vec![
                    PromptMessage::new(
                        Role::User,
                        ContentBlock::resource(ResourceContents::TextResourceContents {
                            uri,
                            mime_type: Some("text/plain".into()),
                            text: "Embedded resource content for testing.".into(),
                            meta: None,
                        }),
                    ),
                    PromptMessage::new_text(Role::User, "Please process the embedded resource above."),
                ]
            }
            "test_prompt_with_image" => vec![
                PromptMessage::new(Role::User, ContentBlock::image(PNG, "image/png")),
                PromptMessage::new_text(Role::User, "Please analyze the image above."),
            ],
            other => return Err(ErrorData::invalid_params(format!("unknown prompt {other}"), None)),
        };
        Ok(GetPromptResult::new(messages).into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let all = ["paris", "park", "party", "pasta"];
        let prefix = request.argument.value.to_lowercase();
        let values: Vec<String> = all.iter().filter(|v| v.starts_with(&prefix)).map(|v| v.to_string()).collect();
        let mut info = CompletionInfo::default();
        info.total = Some(values.len() as u32);
        info.has_more = Some(false);
        info.values = values;
        Ok(CompleteResult::new(info))
    }

    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}

/// Serves the conformance server over streamable HTTP on `listener` until the task is dropped:
/// at `/mcp`, and its input-required scenarios (2026-07-28) at `/mrtr` ([`mrtr`]).
/// Serves the conformance server at `/mcp` and the 2026-07-28 one at `/mrtr`; with `unlinked`,
/// sampling and elicitation requests go out unlinked to their calls.
pub async fn serve(listener: tokio::net::TcpListener, unlinked: bool) -> std::io::Result<()> {
    let service = StreamableHttpService::new(
        move || Ok(Conformance { unlinked, ..Conformance::default() }),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let rounds = mrtr::Mrtr::default();
    let mrtr = StreamableHttpService::new(
        move || Ok(rounds.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    axum::serve(listener, axum::Router::new().nest_service("/mcp", service).nest_service("/mrtr", mrtr)).await
}
