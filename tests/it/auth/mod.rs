//! Who may connect and what each caller may use: bearer tokens and JWTs at the edge (a real
//! JWKS served over HTTP from keys in `tests/fixtures/jwt`, real signed tokens), sessions bound
//! to their principal, `[[policy]]` scopes, and the caller's identity carried to backends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice};

use crate::harness::*;

mod exchange;
mod jwt;

pub(crate) use jwt::{SigningKey, claims_in, now, serve_jwks};

const ACCEPT: &str = "application/json, text/event-stream";

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

async fn passthrough(extra: &str, backends: &str) -> App {
    gateway(
        &format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{extra}{backends}"),
        EmbedderChoice::None,
    )
    .await
}

/// POSTs `body` with `token` (and `session`), returning the status, headers and body text.
async fn post(
    app: &App,
    token: Option<&str>,
    session: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, String) {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let mut r = reqwest::Client::new().post(url).header("accept", ACCEPT).json(body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(s) = session {
        r = r.header("mcp-session-id", s).header("mcp-protocol-version", "2025-11-25");
    }
    let r = r.send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.text().await.unwrap())
}

#[tokio::test]
async fn bearer_tokens_guard_the_endpoint_and_401_names_the_metadata() {
    let kit = http_backend("testkit").await;
    let app = passthrough(&bearer_auth(&["alice"]), &http_backend_toml("kit", &kit.url)).await;
    let base = format!("http://{}", app.addr.unwrap());
    for token in [None, Some("wrong"), Some("")] {
        let (status, headers, body) = post(&app, token, None, &initialize()).await;
        assert_eq!(status, 401, "{token:?}: {body}");
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.starts_with("Bearer resource_metadata=\""), "{challenge}");
        assert!(challenge.contains("/.well-known/oauth-protected-resource/mcp"), "{challenge}");
        assert_eq!(challenge.contains("invalid_token"), token.is_some(), "{challenge}");
        assert!(!body.contains("unknown bearer token"), "the reason stays in the log: {body}");
    }
    let (status, _, _) = post(&app, Some("alice"), None, &initialize()).await;
    assert_eq!(status, 200);
    // Health stays open; the metadata tells clients where to get a token.
    assert_eq!(reqwest::get(format!("{base}/readyz")).await.unwrap().status(), 200);
    let meta: Value =
        reqwest::get(format!("{base}/.well-known/oauth-protected-resource/mcp")).await.unwrap().json().await.unwrap();
    assert_eq!(meta["resource"], format!("{base}/mcp"));
    assert_eq!(meta["bearer_methods_supported"], json!(["header"]));
    // A real client with the token works.
    let (c, _) = client_with_auth(&app, Some("alice")).await;
    assert!(c.list_all_tools().await.unwrap().iter().any(|t| t.name == "kit_echo"));
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn a_session_answers_404_to_any_other_principal() {
    let kit = http_backend("testkit").await;
    let app = passthrough(&bearer_auth(&["alice", "bob"]), &http_backend_toml("kit", &kit.url)).await;
    let (status, headers, _) = post(&app, Some("alice"), None, &initialize()).await;
    assert_eq!(status, 200);
    let id = headers["mcp-session-id"].to_str().unwrap().to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(&app, Some("alice"), Some(&id), &initialized).await.0, 202);
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    // Bob with Alice's session id: as if the session did not exist, for every method.
    assert_eq!(post(&app, Some("bob"), Some(&id), &list).await.0, 404);
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let http = reqwest::Client::new();
    let get = http.get(&url).bearer_auth("bob").header("accept", "text/event-stream").header("mcp-session-id", &id);
    assert_eq!(get.send().await.unwrap().status(), 404, "Bob cannot open Alice's event stream");
    let delete = http.delete(&url).bearer_auth("bob").header("mcp-session-id", &id);
    assert_eq!(delete.send().await.unwrap().status(), 404, "nor end her session");
    // Without a token it is a 401 before anything else.
    assert_eq!(post(&app, None, Some(&id), &list).await.0, 401);
    // Alice's session is untouched.
    let (status, _, body) = post(&app, Some("alice"), Some(&id), &list).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("kit_echo"), "{body}");
    app.shutdown().await;
}

/// Alice (group dev) may use every backend but kit's `exit` and `add_*`; Bob only kit's `echo`.
fn alice_and_bob() -> String {
    let digest = |t: &str| base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()));
    format!(
        "[auth]\nmode = \"bearer\"\n\
         [[auth.tokens]]\nprincipal = \"alice\"\ngroups = [\"dev\"]\nsha256 = \"{}\"\n\
         [[auth.tokens]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n\
         [[policy]]\ngroups = [\"dev\"]\nbackends = [\"*\"]\n\
         [[policy]]\ngroups = [\"dev\"]\nbackends = [\"kit\"]\ntools = [\"exit\", \"add_*\"]\neffect = \"deny\"\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"kit\"]\ntools = [\"echo\"]\n",
        digest("alice-token"),
        digest("bob-token")
    )
}

#[tokio::test]
async fn policy_scopes_tools_resources_and_calls_per_principal() {
    let kit = http_backend("testkit").await;
    let web = http_backend("fetch").await;
    let backends = format!("{}{}", http_backend_toml("kit", &kit.url), http_backend_toml("web", &web.url));
    let app = passthrough(&alice_and_bob(), &backends).await;
    let (alice, _) = client_with_auth(&app, Some("alice-token")).await;
    let (bob, _) = client_with_auth(&app, Some("bob-token")).await;
    let names = |tools: Vec<rmcp::model::Tool>| tools.into_iter().map(|t| t.name.to_string()).collect::<Vec<_>>();
    let a = names(alice.list_all_tools().await.unwrap());
    assert!(a.contains(&"kit_echo".to_string()) && a.iter().any(|n| n.starts_with("web_")), "{a:?}");
    assert!(!a.contains(&"kit_exit".to_string()) && !a.contains(&"kit_add_tool".to_string()), "denied: {a:?}");
    assert_eq!(names(bob.list_all_tools().await.unwrap()), vec!["kit_echo"]);
    // A tool outside the caller's scope is answered exactly like one that does not exist.
    let outside = bob.call_tool(rmcp::model::CallToolRequestParams::new("web_fetch_url")).await.unwrap_err();
    let missing = bob.call_tool(rmcp::model::CallToolRequestParams::new("no_such_tool")).await.unwrap_err();
    // Suggestions come from the caller's own scope only, so they tell nothing of other tools.
    let unsuggested = |e: String| match e.split_once(" Did you mean ") {
        Some((head, tail)) => {
            let named = tail.split_once('?').map_or("", |(n, _)| n);
            for n in named.split([',', ' ']).filter(|w| !w.is_empty() && *w != "or") {
                assert_eq!(n, "kit_echo", "a suggestion outside bob's scope: {e}");
            }
            format!("{head}{}", tail.split_once('?').map_or("", |(_, rest)| rest))
        }
        None => e,
    };
    assert_eq!(
        unsuggested(outside.to_string()).replace("web_fetch_url", "X"),
        unsuggested(missing.to_string()).replace("no_such_tool", "X"),
        "no tell-tale difference"
    );
    // A misspelt name gets a fix-it, from the caller's scope only.
    let typo = bob.call_tool(rmcp::model::CallToolRequestParams::new("kit_ecoh")).await.unwrap_err();
    assert!(typo.to_string().contains("Did you mean kit_echo?"), "{typo}");
    let denied = alice.call_tool(rmcp::model::CallToolRequestParams::new("kit_exti")).await.unwrap_err();
    assert!(!denied.to_string().contains("kit_exit"), "a denied tool is never suggested: {denied}");
    assert_eq!(text(&call(&bob, "kit_echo", json!({"input": "hi"})).await), "hi");
    // Resources and prompts need the whole backend: Bob has one tool of kit and nothing of web.
    assert!(bob.list_all_prompts().await.unwrap().is_empty());
    assert!(!alice.list_all_prompts().await.unwrap().is_empty());
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    app.shutdown().await;
}

/// Through call_tool too, a tool outside the caller's scope is answered word for word as one
/// that does not exist (a suggestion, if any, from the caller's own scope), and a tool inside it
/// runs: what Alice may use tells Bob nothing.
#[tokio::test]
async fn call_tool_answers_a_tool_outside_the_scope_as_one_that_does_not_exist() {
    let kit = http_backend("testkit").await;
    let web = http_backend("fetch").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n{}{}{}",
        alice_and_bob(),
        http_backend_toml("kit", &kit.url),
        http_backend_toml("web", &web.url)
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (alice, _) = client_with_auth(&app, Some("alice-token")).await;
    let (bob, _) = client_with_auth(&app, Some("bob-token")).await;
    let through = |name: &str| json!({"tool_name": name, "parameters": {"url": "https://example.org"}});
    let answer = |r: rmcp::model::CallToolResult| (r.is_error == Some(true), text(&r));
    // Alice may: the call runs (its answer is the fetch backend's, not a gateway refusal).
    let (refused, said) = answer(call(&alice, "call_tool", through("web_fetch_url")).await);
    assert!(!said.contains("unknown tool") && !said.contains("not found"), "alice may: {refused} {said}");
    let (outside_err, outside) = answer(call(&bob, "call_tool", through("web_fetch_url")).await);
    let (missing_err, missing) = answer(call(&bob, "call_tool", through("no_such_tool")).await);
    assert!(outside_err && missing_err, "both refused: {outside} / {missing}");
    assert!(!outside.is_empty(), "a refusal says why");
    assert_eq!(
        outside.replace("web_fetch_url", "X"),
        missing.replace("no_such_tool", "X"),
        "no tell-tale difference between a tool Bob may not use and one that does not exist"
    );
    // Beyond the name Bob sent, nothing of web is named to him (a suggestion would be his own).
    assert!(!outside.replace("web_fetch_url", "X").contains("web_"), "nothing of web is named: {outside}");
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn per_client_backends_carry_each_callers_identity() {
    let kit = http_backend("testkit").await;
    let backend = format!(
        "{}[backends.headers]\nX-User = \"${{client.principal}}\"\nAuthorization = \"Bearer ${{client.token}}\"\n",
        http_backend_toml("kit", &kit.url)
    );
    let app = passthrough(&bearer_auth(&["alice", "bob"]), &backend).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    assert_eq!(text(&call(&alice, "kit_whoami", json!({})).await), "user=alice authorization=Bearer alice");
    assert_eq!(text(&call(&bob, "kit_whoami", json!({})).await), "user=bob authorization=Bearer bob");
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    app.shutdown().await;
}

#[test]
fn unsafe_auth_configs_are_errors_naming_the_key() {
    let errors = |toml: &str| toolmux::config::Config::parse(toml).unwrap_err().to_string();
    let e = errors("[server]\nlisten = \"0.0.0.0:4483\"\n");
    assert!(e.contains("`auth.mode`") && e.contains("insecure_no_auth_on_network"), "{e}");
    assert!(
        toolmux::config::Config::parse(
            "[server]\nlisten = \"0.0.0.0:4483\"\n[auth]\ninsecure_no_auth_on_network = true\n"
        )
        .is_ok()
    );
    let e = errors(
        "[[backends]]\nname = \"kit\"\nurl = \"http://127.0.0.1:1/mcp\"\nsession = \"shared\"\n[backends.headers]\nX-User = \"${client.principal}\"\n",
    );
    assert!(e.contains("`backends[0].headers.X-User`") && e.contains("per_client"), "{e}");
    let e = errors(
        "[[backends]]\nname = \"kit\"\nurl = \"http://127.0.0.1:1/mcp\"\n[[policy]]\nprincipals = [\"*\"]\nbackends = [\"kti\"]\n",
    );
    assert!(e.contains("`policy[0].backends`") && e.contains("kti"), "{e}");
    let e = errors(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://idp\"\njwks_url = \"https://idp/jwks\"\nalgorithms = [\"HS256\"]\n",
    );
    assert!(e.contains("`auth.jwt.audiences`") && e.contains("`auth.jwt.algorithms`"), "{e}");
}

/// `serve --stdio` has no transport to authenticate: its client is `auth.stdio_principal`, and
/// the policy applies to that principal like to any other.
#[tokio::test]
async fn stdio_serving_runs_as_the_configured_principal() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    let toml = format!(
        "[server]\nmode = \"passthrough\"\n[auth]\nstdio_principal = \"carol\"\n\
         [[policy]]\nprincipals = [\"carol\"]\nbackends = [\"diag\"]\n\
         [[policy]]\nprincipals = [\"anonymous\"]\nbackends = [\"*\"]\n{}{}",
        stdio_backend_toml("diag", "echo"),
        stdio_backend_toml("kit", "testkit")
    );
    std::fs::write(&config, toml).unwrap();
    let (c, _) = stdio_gateway(&config, "diag_echo").await;
    let tools = c.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| t.name.starts_with("diag_")), "carol may use diag only: {tools:?}");
    assert!(c.call_tool(rmcp::model::CallToolRequestParams::new("kit_echo")).await.is_err());
    c.cancel().await.unwrap();
}

/// Bearer tokens rotated by a reload, without a restart: a removed token is refused (401) on its
/// session's next request, a kept one carries on in its session, a new one connects. Turning
/// authentication off is not a live change: it is reported as needing a restart and the tokens
/// in force stay.
#[tokio::test]
async fn a_reload_rotates_bearer_tokens_under_open_sessions() {
    let echo = http_backend("echo").await;
    let config = |auth: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{auth}{}",
            http_backend_toml("echo", &echo.url)
        )
    };
    let app = gateway(&config(&bearer_auth(&["alice", "bob"])), EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let alice = RawSession::open_as(&url, Some("alice")).await;
    let bob = RawSession::open_as(&url, Some("bob")).await;

    let done = app.reload(toolmux::config::Config::parse(&config(&bearer_auth(&["bob", "carol"]))).unwrap()).await;
    assert!(done.auth && done.needs_restart.is_empty(), "{done}");
    assert_eq!(done.to_string(), "authentication changed");
    let refused = alice.try_request("tools/list", json!({})).await.unwrap_err();
    assert!(refused.contains("401"), "{refused}");
    let r = bob.call("echo_echo", json!({"input": "still here"})).await;
    assert_eq!(r["content"][0]["text"], "still here");
    let carol = RawSession::open_as(&url, Some("carol")).await;
    assert_eq!(carol.call("echo_echo", json!({"input": "new"})).await["content"][0]["text"], "new");

    let done = app.reload(toolmux::config::Config::parse(&config("")).unwrap()).await;
    assert_eq!(done.needs_restart, ["[auth]"], "{done}");
    assert!(!done.auth);
    assert!(alice.try_request("tools/list", json!({})).await.unwrap_err().contains("401"), "tokens still required");
    assert_eq!(post(&app, None, None, &initialize()).await.0, 401);
    app.shutdown().await;
}

/// Headers go to the backend exactly as configured: `Basic` stays Basic (it used to be sent as
/// `Bearer Basic …`). (The backend echoes it: not scrubbed, to be compared.)
#[tokio::test]
async fn a_configured_authorization_header_is_sent_as_it_is() {
    let kit = http_backend("testkit").await;
    let backend = format!(
        "{}scrub = false\n[backends.headers]\nAuthorization = \"Basic dXNlcjpwdw==\"\n",
        http_backend_toml("kit", &kit.url)
    );
    let app = passthrough("", &backend).await;
    let (c, _) = client(&app).await;
    assert_eq!(text(&call(&c, "kit_whoami", json!({})).await), "user= authorization=Basic dXNlcjpwdw==");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A backend URL's secrets (`?api_key=…`, `user:pw@`, a key as a path segment) reach neither
/// `/status` nor a client: what the client is told names the backend only.
#[tokio::test]
async fn a_backends_url_secrets_are_not_shown() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let secret_url = format!("http://user:pw-s3cret@127.0.0.1:{port}/keys/sk0123456789s3cret/mcp?api_key=s3cret");
    let down = http_backend_toml("down", &secret_url);
    let kit = http_backend("testkit").await;
    let app = passthrough("", &format!("{down}{}", http_backend_toml("kit", &kit.url))).await;
    let url = format!("http://{}/status", app.addr.unwrap());
    let status = || async { reqwest::get(&url).await.unwrap().text().await.unwrap() };
    assert!(
        eventually(Duration::from_secs(10), || async { status().await.contains("?***") }).await,
        "the error is shown, redacted: {}",
        status().await
    );
    let shown = status().await;
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("/keys/***/mcp"), "{shown}");
    // What a client sees of the down backend: its listing, a call, a resource read.
    let (c, _) = client(&app).await;
    let mut seen = format!("{:?}", c.list_all_tools().await);
    seen += &format!("{:?}", c.call_tool(rmcp::model::CallToolRequestParams::new("down_anything")).await);
    seen += &format!("{:?}", c.read_resource(rmcp::model::ReadResourceRequestParams::new("demo://down/about")).await);
    seen += &format!("{:?}", c.list_all_resources().await);
    assert!(!seen.contains("s3cret") && !seen.contains(&port.to_string()), "{seen}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// `/status` shows backend errors, the tool ledger and reload details only to `[auth] admins`
/// (a name, or `group:NAME`); anyone else authenticated gets counts, of the backends their
/// policy lets them use only, and a reload changes who is an admin at once.
#[tokio::test]
async fn status_details_are_for_admins_only() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kit = http_backend("testkit").await;
    let backends = format!(
        "{}{}",
        http_backend_toml("down", &format!("http://127.0.0.1:{port}/mcp")),
        http_backend_toml("kit", &kit.url)
    );
    // `admins` sits in [auth], before its tables.
    let toml = |admins: &str| {
        let auth = bearer_tokens(&["alice", "bob"]).replacen(
            "mode = \"bearer\"\n",
            &format!("mode = \"bearer\"\nadmins = [{admins}]\n"),
            1,
        );
        let policy = "[[policy]]\nprincipals = [\"alice\"]\nbackends = [\"*\"]\n\n\
                      [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"kit\"]\n";
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{auth}{policy}{backends}")
    };
    let app = gateway(&toml("\"alice\""), EmbedderChoice::None).await;
    let url = format!("http://{}/status", app.addr.unwrap());
    let status = |token: &'static str| {
        let url = url.clone();
        async move {
            let r = reqwest::Client::new().get(&url).bearer_auth(token).send().await.unwrap();
            r.json::<serde_json::Value>().await.unwrap()
        }
    };
    let down = |v: &serde_json::Value| {
        v["backends"].as_array().unwrap().iter().find(|b| b["name"] == "down").cloned().unwrap()
    };
    assert!(
        eventually(Duration::from_secs(10), || async { !down(&status("alice").await)["last_error"].is_null() }).await
    );
    let alice = status("alice").await;
    assert_eq!(alice["details"], true);
    assert!(alice["integrity"]["held"].is_array(), "{alice}");
    let bob = status("bob").await;
    assert_eq!(bob["details"], false, "{bob}");
    assert!(bob["integrity"]["held"].is_number() && bob["integrity"]["recent"].is_number(), "{bob}");
    let names: Vec<&str> = bob["backends"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["kit"], "only the backends bob's policy lets him use: {bob}");
    assert!(bob["backends"][0]["last_error"].is_null() && bob["backends"][0]["health"].is_string(), "{bob}");
    assert_eq!(alice["backends"].as_array().unwrap().len(), 2, "an admin sees every backend");
    // Without a token: 401, as before.
    let anonymous = reqwest::get(&url).await.unwrap().status();
    assert_eq!(anonymous, 401);
    // A reload makes bob an admin at once.
    app.reload(toolmux::config::Config::parse(&toml("\"alice\", \"bob\"")).unwrap()).await;
    let bob = status("bob").await;
    assert_eq!(bob["details"], true);
    assert_eq!(bob["backends"].as_array().unwrap().len(), 2, "as an admin, bob sees every backend");
    app.shutdown().await;
}
