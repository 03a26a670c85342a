//! Each client gets the surface its host uses best (`[optimizer] surface`), with real rmcp clients
//! presenting hosts' names and capabilities at initialize: what `tools/list` holds, what
//! `initialize` says and why, what may be called by name, what the caller's own use marks to
//! load up front, and `/status` per session. Two principals prove that one's use and scope never
//! show in the other's listing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ExtensionCapabilities, Implementation, Tool,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice};

use crate::harness::*;

/// A client that introduces itself as a host would, and counts `tools/list_changed`.
#[derive(Clone)]
struct Host {
    name: &'static str,
    groups: bool,
    changed: Arc<AtomicUsize>,
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        if self.groups {
            let mut extensions = ExtensionCapabilities::new();
            extensions.insert("io.modelcontextprotocol/groups".into(), Default::default());
            caps.extensions = Some(extensions);
        }
        ClientConfig::new(caps, Implementation::new(self.name, "1.0"))
    }

    async fn on_tool_list_changed(&self, _c: NotificationContext<RoleClient>) {
        self.changed.fetch_add(1, Ordering::SeqCst);
    }
}

async fn host(app: &App, token: &str, name: &'static str, groups: bool) -> (RunningService<RoleClient, Host>, Host) {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let cfg = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_string());
    let handler = Host { name, groups, changed: Arc::default() };
    let c = handler.clone().serve(StreamableHttpClientTransport::from_config(cfg)).await.unwrap();
    (c, handler)
}

fn names(tools: &[Tool]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_ref()).collect()
}

fn meta<'a>(tools: &'a [Tool], name: &str) -> &'a serde_json::Map<String, Value> {
    let t = tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} not listed in {:?}", names(tools)));
    &t.meta.as_ref().unwrap_or_else(|| panic!("{name} has no _meta")).0
}

/// `/status` as `token`'s principal sees it.
async fn status_as(app: &App, token: &str) -> Value {
    let url = format!("http://{}/status", app.addr.unwrap());
    reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap().json().await.unwrap()
}

fn instructions(c: &RunningService<RoleClient, Host>) -> String {
    c.peer_info().and_then(|i| i.instructions.clone()).unwrap_or_default()
}

fn echo(input: &str) -> serde_json::Map<String, Value> {
    json!({"input": input}).as_object().unwrap().clone()
}

#[tokio::test]
async fn each_client_gets_the_surface_its_host_uses_best() {
    let kit = http_backend("testkit").await;
    let echo_backend = http_backend("echo").await;
    let auth = bearer_tokens(&["alice", "bob", "carol"])
        .replace("mode = \"bearer\"\n", "mode = \"bearer\"\nadmins = [\"alice\"]\n");
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n[health]\ninterval = \"1s\"\n\
         [optimizer]\npinned = [\"echo_get_current_time\"]\nalways_load = 1\n\
         [groups]\nenabled = true\ntop_level = [\"echo_echo\"]\n{auth}\
         [[policy]]\nprincipals = [\"alice\"]\nbackends = [\"*\"]\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"echo\"]\n\
         [[policy]]\nprincipals = [\"carol\"]\nbackends = [\"*\"]\nsurface = \"tools\"\n{}{}",
        http_backend_toml("kit", &kit.url),
        http_backend_toml("echo", &echo_backend.url),
    );
    let app = gateway(&config, EmbedderChoice::None).await;

    // Claude Code defers tools itself: alice's whole scope, with hints, and the meta-tools.
    let (claude, claude_heard) = host(&app, "alice", "claude-code", false).await;
    let said = instructions(&claude);
    assert!(said.contains("Surface: deferred (auto: `claude-code`"), "{said}");
    let caps = claude.peer_info().unwrap().capabilities.tools.clone().unwrap();
    assert_eq!(caps.list_changed, Some(true), "a deferred list follows the catalog");
    let listed = claude.list_all_tools().await.unwrap();
    let shown = names(&listed);
    for expected in ["find_tool", "call_tool", "kit_echo", "kit_whoami", "echo_echo", "echo_get_current_time"] {
        assert!(shown.contains(&expected), "{expected} missing from {shown:?}");
    }
    assert_eq!(meta(&listed, "echo_get_current_time")["anthropic/alwaysLoad"], true, "pinned loads up front");
    assert!(meta(&listed, "kit_echo").get("anthropic/alwaysLoad").is_none(), "not used yet");
    let hint = meta(&listed, "kit_echo")["anthropic/searchHint"].as_str().unwrap();
    assert!(hint.contains("echo") && hint.contains("input"), "{hint}");
    assert!(meta(&listed, "kit_echo")["anthropic/maxResultSizeChars"].as_u64().unwrap() > 0);
    // Listed, so callable by its own name; after use it is alice's to load up front.
    let r = claude.call_tool(CallToolRequestParams::new("kit_echo").with_arguments(echo("hi"))).await.unwrap();
    assert_eq!((text(&r), r.is_error), ("hi".to_string(), Some(false)));
    let listed = claude.list_all_tools().await.unwrap();
    assert_eq!(meta(&listed, "kit_echo")["anthropic/alwaysLoad"], true, "alice's most used tool");
    assert!(claude_heard.changed.load(Ordering::SeqCst) == 0, "nothing changed in the catalog");

    // Bob, also on Claude Code: his own scope, and alice's use marks nothing of his.
    let (bob, _) = host(&app, "bob", "claude-code", false).await;
    let listed = bob.list_all_tools().await.unwrap();
    let shown = names(&listed);
    assert!(shown.contains(&"echo_echo") && !shown.iter().any(|n| n.starts_with("kit_")), "{shown:?}");
    let r = bob.call_tool(CallToolRequestParams::new("kit_echo").with_arguments(echo("hi"))).await.unwrap();
    assert_eq!(r.is_error, Some(true), "outside bob's scope: {}", text(&r));
    assert!(meta(&listed, "echo_echo").get("anthropic/alwaysLoad").is_none());

    // Without a session (2026-07-28), the name travels with each request: the same surface, and
    // alice's calls made without a session count for her alone too.
    let handler = Host { name: "claude-code", groups: false, changed: Arc::default() };
    let alice_stateless = stateless_client(&app, handler.clone(), Some("alice")).await;
    let listed = alice_stateless.list_all_tools().await.unwrap();
    assert!(names(&listed).contains(&"kit_whoami"), "the deferred listing without a session");
    for _ in 0..3 {
        let r = alice_stateless.call_tool(CallToolRequestParams::new("echo_echo").with_arguments(echo("x"))).await;
        assert_eq!(r.unwrap().is_error, Some(false));
    }
    let bob_stateless = stateless_client(&app, handler, Some("bob")).await;
    let listed = bob_stateless.list_all_tools().await.unwrap();
    assert!(!names(&listed).iter().any(|n| n.starts_with("kit_")), "bob's scope without a session too");
    assert!(meta(&listed, "echo_echo").get("anthropic/alwaysLoad").is_none(), "alice's use is not bob's");
    let listed = claude.list_all_tools().await.unwrap();
    assert_eq!(meta(&listed, "echo_echo")["anthropic/alwaysLoad"], true, "alice's most used, whichever way she called");
    for c in [alice_stateless, bob_stateless] {
        c.cancel().await.unwrap();
    }

    // Cursor is in no entry: the meta-tools, the pinned tool, nothing else callable by name.
    let (cursor, _) = host(&app, "alice", "cursor-vscode", false).await;
    let said = instructions(&cursor);
    assert!(said.contains("Surface: tools (auto: `cursor-vscode`") && said.contains("find_tool"), "{said}");
    assert_eq!(cursor.peer_info().unwrap().capabilities.tools.clone().unwrap().list_changed, Some(true), "pinned");
    let listed = cursor.list_all_tools().await.unwrap();
    assert_eq!(names(&listed), ["find_tool", "call_tool", "read_result", "echo_get_current_time"]);
    let r = cursor.call_tool(CallToolRequestParams::new("kit_echo").with_arguments(echo("hi"))).await.unwrap();
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("find_tool"), "the refusal says what to use: {}", text(&r));

    // A client that declares groups gets them, with the top-level tool beside the meta-tools.
    let (grouping, _) = host(&app, "alice", "some-agent", true).await;
    assert!(instructions(&grouping).contains("Surface: groups (auto: `some-agent` declared groups)"));
    let listed = grouping.list_all_tools().await.unwrap();
    assert_eq!(names(&listed), ["find_tool", "call_tool", "read_result", "echo_echo", "echo_get_current_time"]);

    // Carol's rule says tools, whatever her host.
    let (carol, _) = host(&app, "carol", "claude-code", false).await;
    assert!(instructions(&carol).contains("Surface: tools (policy[2] names the caller)"), "{}", instructions(&carol));
    assert_eq!(
        names(&carol.list_all_tools().await.unwrap()),
        ["find_tool", "call_tool", "read_result", "echo_get_current_time"]
    );

    // /status counts sessions by surface, and lists each for an admin.
    let status = status_as(&app, "alice").await;
    let by = &status["sessions"]["by_surface"];
    assert_eq!(
        (by["deferred"].as_u64(), by["tools"].as_u64(), by["groups"].as_u64()),
        (Some(2), Some(2), Some(1)),
        "{by}"
    );
    let rows = status["sessions"]["list"].as_array().unwrap();
    let cursor_row = rows.iter().find(|r| r["client"] == "cursor-vscode 1.0").unwrap();
    assert_eq!((&cursor_row["principal"], &cursor_row["surface"]), (&json!("alice"), &json!("tools")));
    let bobs = status_as(&app, "bob").await;
    assert!(bobs["sessions"]["list"].is_null(), "sessions are listed to admins only");

    // A backend going away reaches the deferred client as a list change, not the tools client.
    drop(kit);
    let gone = eventually(Duration::from_secs(30), || {
        let claude = &claude;
        async move { !names(&claude.list_all_tools().await.unwrap()).iter().any(|n| n.starts_with("kit_")) }
    })
    .await;
    assert!(gone, "kit's tools leave the deferred listing");
    let told =
        eventually(Duration::from_secs(10), || std::future::ready(claude_heard.changed.load(Ordering::SeqCst) > 0))
            .await;
    assert!(told, "the deferred client is told its list changed");
    for c in [claude, bob, cursor, grouping, carol] {
        c.cancel().await.unwrap();
    }
}
