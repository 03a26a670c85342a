//! Backends as groups (`[groups]`, the progressive-disclosure draft `io.modelcontextprotocol/groups`)
//! with real rmcp clients: a client that declares the extension lists only the top-level tools
//! and gets the rest by group; one that does not sees everything and no groups; groups follow
//! the caller's policy and the backends present, and a change is announced.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, CustomNotification, CustomRequest,
    ExtensionCapabilities, Implementation, ServerResult,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice};
use toolmux::config::Config;

use crate::harness::*;

/// A client that declares the groups extension and counts `notifications/groups/list_changed`.
#[derive(Clone, Default)]
struct Grouping {
    changed: Arc<AtomicUsize>,
}

impl ClientHandler for Grouping {
    fn get_info(&self) -> ClientConfig {
        let mut extensions = ExtensionCapabilities::new();
        extensions.insert("io.modelcontextprotocol/groups".into(), Default::default());
        let mut caps = ClientCapabilities::default();
        caps.extensions = Some(extensions);
        ClientConfig::new(caps, Implementation::new("grouping", "1"))
    }

    async fn on_custom_notification(&self, n: CustomNotification, _c: NotificationContext<RoleClient>) {
        if n.method == "notifications/groups/list_changed" {
            self.changed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn grouping_client(app: &App, token: &str) -> (RunningService<RoleClient, Grouping>, Grouping) {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let cfg = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_string());
    let handler = Grouping::default();
    let c = handler.clone().serve(StreamableHttpClientTransport::from_config(cfg)).await.unwrap();
    (c, handler)
}

async fn custom<S: rmcp::Service<RoleClient>>(
    c: &RunningService<RoleClient, S>,
    method: &str,
    params: Value,
) -> Result<Value, ServiceError> {
    let request = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
    match c.peer().send_request(request).await? {
        ServerResult::CustomResult(r) => Ok(r.0),
        other => panic!("{method}: {other:?}"),
    }
}

fn code(e: ServiceError) -> i32 {
    match e {
        ServiceError::McpError(d) => d.code.0,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

#[tokio::test]
async fn backends_are_groups_for_clients_that_ask() {
    let kit = http_backend("testkit").await;
    let echo = http_backend("echo").await;
    let base = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n[health]\ninterval = \"1s\"\n\
         [groups]\nenabled = true\ntop_level = [\"echo_*\"]\n{}\
         [[policy]]\nprincipals = [\"alice\"]\nbackends = [\"*\"]\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"echo\"]\n{}{}",
        bearer_tokens(&["alice", "bob"]),
        http_backend_toml("kit", &kit.url),
        http_backend_toml("echo", &echo.url),
    );
    let app = gateway(&base, EmbedderChoice::None).await;
    let (alice, heard) = grouping_client(&app, "alice").await;
    let info = alice.peer_info().unwrap();
    let ext = info.capabilities.extensions.as_ref().unwrap();
    assert_eq!(ext["io.modelcontextprotocol/groups"]["listChanged"], json!(true));

    // Top level only, the rest by group.
    let listed = names(&alice.list_all_tools().await.unwrap());
    assert!(!listed.is_empty() && listed.iter().all(|n| n.starts_with("echo_")), "{listed:?}");
    let groups = custom(&alice, "groups/list", json!({})).await.unwrap();
    assert_eq!(groups["groups"].as_array().unwrap().len(), 1, "{groups}");
    assert_eq!(groups["groups"][0]["name"], "kit");
    assert!(groups["groups"][0]["description"].as_str().unwrap().contains("misbehave"), "{groups}");
    let kit_group = custom(&alice, "groups/get", json!({"name": "kit"})).await.unwrap();
    let tools: Vec<&str> =
        kit_group["contents"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(tools.contains(&"kit_echo") && !tools.iter().any(|t| t.starts_with("echo_")), "{tools:?}");
    assert!(kit_group["contents"]["tools"][0]["inputSchema"].is_object(), "whole definitions");
    assert!(kit_group["instructions"].is_string(), "the backend's instructions come with it");
    assert_eq!(code(custom(&alice, "groups/get", json!({"name": "nope"})).await.unwrap_err()), -32002);
    assert_eq!(code(custom(&alice, "groups/get", json!({})).await.unwrap_err()), -32602);
    // Discovery, not access: the scoped tool is called by name.
    let r = alice
        .call_tool(
            CallToolRequestParams::new("kit_echo").with_arguments(json!({"input": "hi"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(text(&r), "hi");

    // Bob's policy has no kit: no group, and its name is unknown to him.
    let (bob, _) = grouping_client(&app, "bob").await;
    assert_eq!(custom(&bob, "groups/list", json!({})).await.unwrap()["groups"], json!([]));
    assert_eq!(code(custom(&bob, "groups/get", json!({"name": "kit"})).await.unwrap_err()), -32002);

    // A client that did not declare the extension sees every tool and no groups.
    let (plain, _) = client_with_auth(&app, Some("alice")).await;
    let all = names(&plain.list_all_tools().await.unwrap());
    assert!(all.contains(&"kit_echo".to_string()) && all.contains(&"echo_echo".to_string()));
    assert_eq!(code(custom(&plain, "groups/list", json!({})).await.unwrap_err()), -32021);

    // The kit backend goes away: alice is told her groups changed, and has none left.
    let without_kit = base.replace(&http_backend_toml("kit", &kit.url), "");
    app.reload(Config::parse(&without_kit).unwrap()).await;
    let told = eventually(Duration::from_secs(30), || async { heard.changed.load(Ordering::SeqCst) > 0 }).await;
    assert!(told, "notifications/groups/list_changed");
    assert_eq!(custom(&alice, "groups/list", json!({})).await.unwrap()["groups"], json!([]));
}

#[tokio::test]
async fn groups_are_off_by_default() {
    let kit = http_backend("testkit").await;
    let toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{}", http_backend_toml("kit", &kit.url));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = grouping_client(&app, "x").await;
    assert!(
        c.peer_info()
            .unwrap()
            .capabilities
            .extensions
            .as_ref()
            .is_none_or(|e| !e.contains_key("io.modelcontextprotocol/groups"))
    );
    assert!(names(&c.list_all_tools().await.unwrap()).contains(&"kit_echo".to_string()), "every tool, as before");
    assert_eq!(code(custom(&c, "groups/list", json!({})).await.unwrap_err()), -32601);
}
