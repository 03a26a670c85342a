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

/// A signing key from `tests/fixtures/jwt` and its public JWK (with `kid`).
pub(crate) struct SigningKey {
    alg: Algorithm,
    kid: String,
    key: EncodingKey,
}

impl SigningKey {
    pub(crate) fn load(alg: Algorithm) -> Self {
        let (file, kid) = match alg {
            Algorithm::RS256 => ("rs256.pem", "rsa-1"),
            Algorithm::ES256 => ("es256.pem", "ec-1"),
            _ => ("eddsa.pem", "ed-1"),
        };
        let pem = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt").join(file))
            .unwrap();
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            _ => EncodingKey::from_ed_pem(&pem),
        }
        .unwrap();
        Self { alg, kid: kid.into(), key }
    }

    pub(crate) fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).unwrap();
        jwk.common.key_id = Some(self.kid.clone());
        jwk
    }

    pub(crate) fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn claims(sub: &str) -> Value {
    json!({"iss": "https://idp.test", "aud": "toolmux", "sub": sub, "groups": ["dev"], "exp": now() + 300, "iat": now()})
}

/// Serves `keys` as a JWKS at `/jwks` on 127.0.0.1 (port 0); its URL.
pub(crate) async fn serve_jwks(listener: tokio::net::TcpListener, keys: Vec<Jwk>) {
    let set = serde_json::to_value(JwkSet { keys }).unwrap();
    let app = axum::Router::new().route("/jwks", axum::routing::get(move || async move { axum::Json(set) }));
    tokio::spawn(async move { axum::serve(listener, app).await });
}

fn jwt_auth(jwks_url: &str) -> String {
    format!(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"toolmux\"]\njwks_url = \"{jwks_url}\"\n\
         [[policy]]\ngroups = [\"dev\"]\nbackends = [\"*\"]\n"
    )
}

#[tokio::test]
async fn jwts_are_verified_and_every_bad_one_is_a_401() {
    let keys = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA].map(SigningKey::load);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks_url = format!("http://{}/jwks", listener.local_addr().unwrap());
    serve_jwks(listener, keys.iter().map(SigningKey::jwk).collect()).await;
    let kit = http_backend("testkit").await;
    let app = passthrough(&jwt_auth(&jwks_url), &http_backend_toml("kit", &kit.url)).await;

    for k in &keys {
        let (status, _, body) = post(&app, Some(&k.sign(&claims("alice"))), None, &initialize()).await;
        assert_eq!(status, 200, "{:?}: {body}", k.alg);
    }
    let rsa = &keys[0];
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims("alice");
        f(&mut c);
        rsa.sign(&c)
    };
    let b64 = |v: &Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let valid = rsa.sign(&claims("alice"));
    let (head, rest) = valid.split_once('.').unwrap();
    let (payload, signature) = rest.split_once('.').unwrap();
    let mut tampered = claims("alice");
    tampered["sub"] = json!("admin");
    let mut unknown_kid = Header::new(Algorithm::RS256);
    unknown_kid.kid = Some("no-such-key".into());
    let public_pem = b"-----BEGIN PUBLIC KEY-----\nnot really\n-----END PUBLIC KEY-----\n";
    let bad: Vec<(&str, String)> = vec![
        ("malformed", "not.a.token".into()),
        ("expired", with(&|c| c["exp"] = json!(now() - 3600))),
        ("not yet valid", with(&|c| c["nbf"] = json!(now() + 3600))),
        ("wrong audience", with(&|c| c["aud"] = json!("someone-else"))),
        ("wrong issuer", with(&|c| c["iss"] = json!("https://evil.test"))),
        ("no subject", with(&|c| c.as_object_mut().unwrap().retain(|k, _| k != "sub"))),
        ("alg none", format!("{}.{payload}.", b64(&json!({"alg": "none", "typ": "JWT", "kid": "rsa-1"})))),
        (
            "HS256 with a public key as the secret",
            jsonwebtoken::encode(
                &Header { kid: Some("rsa-1".into()), ..Header::new(Algorithm::HS256) },
                &claims("alice"),
                &EncodingKey::from_secret(public_pem).unwrap(),
            )
            .unwrap(),
        ),
        ("unknown kid", jsonwebtoken::encode(&unknown_kid, &claims("alice"), &rsa.key).unwrap()),
        ("tampered payload", format!("{head}.{}.{signature}", b64(&tampered))),
    ];
    for (what, token) in &bad {
        let (status, headers, body) = post(&app, Some(token), None, &initialize()).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(headers["www-authenticate"].to_str().unwrap().contains("invalid_token"), "{what}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn a_jwks_that_is_down_at_start_is_fetched_once_it_answers() {
    // Reserve a port, start the gateway while nothing listens there, then serve the keys on it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let kit = http_backend("testkit").await;
    let app = passthrough(&jwt_auth(&format!("http://{addr}/jwks")), &http_backend_toml("kit", &kit.url)).await;
    let key = SigningKey::load(Algorithm::ES256);
    let token = key.sign(&claims("alice"));
    assert_eq!(post(&app, Some(&token), None, &initialize()).await.0, 401, "no keys yet");
    serve_jwks(tokio::net::TcpListener::bind(addr).await.unwrap(), vec![key.jwk()]).await;
    // An unknown key id refetches (at most every second while there are no keys).
    let accepted =
        eventually(Duration::from_secs(10), || async { post(&app, Some(&token), None, &initialize()).await.0 == 200 })
            .await;
    assert!(accepted, "the token is accepted once the key set can be fetched");
    app.shutdown().await;
}

#[tokio::test]
async fn a_jwks_that_answers_garbage_leaves_tokens_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/jwks", axum::routing::get(|| async { "<html>not a key set</html>" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let kit = http_backend("testkit").await;
    let app = passthrough(&jwt_auth(&url), &http_backend_toml("kit", &kit.url)).await;
    let token = SigningKey::load(Algorithm::RS256).sign(&claims("alice"));
    assert_eq!(post(&app, Some(&token), None, &initialize()).await.0, 401);
    assert_eq!(reqwest::get(format!("http://{}/healthz", app.addr.unwrap())).await.unwrap().status(), 200);
    app.shutdown().await;
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

/// A JWKS that answers once and then stalls: each scheduled refresh gives up at `jwks_timeout`,
/// the keys of the last good fetch stay in use, and no request waits on the stalled endpoint
/// beyond that timeout.
#[tokio::test]
async fn a_jwks_that_turns_slow_keeps_the_last_good_keys() {
    use axum::response::IntoResponse;
    let key = SigningKey::load(Algorithm::EdDSA);
    let set = serde_json::to_value(JwkSet { keys: vec![key.jwk()] }).unwrap();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stalled_tx, mut stalled) = tokio::sync::mpsc::unbounded_channel::<()>();
    let route = move || {
        let (set, served, stalled_tx) = (set.clone(), served.clone(), stalled_tx.clone());
        async move {
            if served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return axum::Json(set).into_response();
            }
            let _ = stalled_tx.send(());
            tokio::time::sleep(Duration::from_secs(60)).await;
            "too late".into_response()
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    let router = axum::Router::new().route("/jwks", axum::routing::get(route));
    tokio::spawn(async move { axum::serve(listener, router).await });
    let auth = format!(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"toolmux\"]\n\
         jwks_url = \"{url}\"\njwks_refresh = \"1s\"\njwks_timeout = \"300ms\"\n\
         [[policy]]\ngroups = [\"dev\"]\nbackends = [\"*\"]\n"
    );
    let kit = http_backend("testkit").await;
    let app = passthrough(&auth, &http_backend_toml("kit", &kit.url)).await;
    let token = key.sign(&claims("alice"));
    assert_eq!(post(&app, Some(&token), None, &initialize()).await.0, 200);
    // Two stalled refreshes: the first has timed out by the time the second starts.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(20), stalled.recv()).await.expect("a scheduled refresh");
    }
    let bounded = |token: String| {
        let app = &app;
        async move { tokio::time::timeout(Duration::from_secs(5), post(app, Some(&token), None, &initialize())).await }
    };
    assert_eq!(bounded(token.clone()).await.expect("not held up by the stalled JWKS").0, 200, "last good keys");
    let mut other = Header::new(Algorithm::EdDSA);
    other.kid = Some("rotated-key".into());
    let unknown = jsonwebtoken::encode(&other, &claims("alice"), &key.key).unwrap();
    assert_eq!(bounded(unknown).await.expect("an unknown kid waits at most jwks_timeout").0, 401);
    app.shutdown().await;
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

pub(crate) fn claims_in(sub: &str, groups: &[&str], iat: u64) -> Value {
    json!({"iss": "https://idp.test", "aud": "toolmux", "sub": sub, "groups": groups, "exp": now() + 300, "iat": iat})
}

/// A tool call by `name` through the mode's surface: the tool's text, or the error that refused it.
async fn try_call(s: &RawSession, mode: &str, name: &str, args: Value) -> Result<String, String> {
    let (tool, arguments) = match mode {
        "optimizer" => ("call_tool", json!({"tool_name": name, "parameters": args})),
        _ => (name, args),
    };
    let r = s.try_request("tools/call", json!({"name": tool, "arguments": arguments})).await?;
    let text = r["content"][0]["text"].as_str().unwrap_or_default().to_string();
    if r["isError"] == json!(true) { Err(text) } else { Ok(text) }
}

/// A session is its caller's as each request presents it: a token re-issued with fewer groups
/// loses the denied tools on the very next request of the open session, and a refreshed token
/// is what the caller's own backend session sends from the next call on.
async fn a_sessions_rights_follow_each_requests_token_in(mode: &str) {
    let key = SigningKey::load(Algorithm::RS256);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks_url = format!("http://{}/jwks", listener.local_addr().unwrap());
    serve_jwks(listener, vec![key.jwk()]).await;
    let kit = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n\
         [auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"toolmux\"]\njwks_url = \"{jwks_url}\"\n\
         [[policy]]\ngroups = [\"dev\"]\nbackends = [\"kit\"]\ntools = [\"echo\", \"whoami\"]\n\
         [[policy]]\ngroups = [\"admin\"]\nbackends = [\"kit\"]\ntools = [\"*\"]\n\
         {}session = \"per_client\"\nscrub = false\n[backends.headers]\nAuthorization = \"Bearer ${{client.token}}\"\n",
        http_backend_toml("kit", &kit.url)
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let wide = key.sign(&claims_in("alice", &["dev", "admin"], now()));
    let s = RawSession::open_as(&url, Some(&wide)).await;
    let sleep = json!({"ms": 0});
    assert_eq!(try_call(&s, mode, "kit_sleep", sleep.clone()).await, Ok("slept 0 ms".into()), "{mode}: admin may");
    let whoami = try_call(&s, mode, "kit_whoami", json!({})).await.unwrap();
    assert_eq!(whoami, format!("user= authorization=Bearer {wide}"), "{mode}");
    if mode == "passthrough" {
        let tools = s.request("tools/list", json!({})).await.to_string();
        assert!(tools.contains("kit_sleep"), "{mode}: {tools}");
    }

    // The same principal, re-issued without `admin`: the same session, from this request on.
    // (Its event stream is open, to see what it is told.)
    let mut events = s.listen().await;
    let narrow = key.sign(&claims_in("alice", &["dev"], now() - 1));
    let s = s.presented(&url, Some(&narrow));
    let refused = try_call(&s, mode, "kit_sleep", sleep.clone()).await.unwrap_err();
    assert!(refused.contains("tool not found: kit_sleep"), "{mode}: {refused}");
    if mode == "passthrough" {
        // The narrowed list is announced on the session's stream, as docs/security.md says.
        let list_changed = "notifications/tools/list_changed";
        assert!(
            told(&mut events, list_changed, std::time::Duration::from_secs(10)).await,
            "{mode}: tools/list_changed after the token narrowed"
        );
        let tools = s.request("tools/list", json!({})).await.to_string();
        assert!(!tools.contains("kit_sleep") && tools.contains("kit_echo"), "{mode}: {tools}");
    } else {
        let found = s.call("find_tool", json!({"tool_description": "sleep for some milliseconds"})).await.to_string();
        assert!(!found.contains("kit_sleep"), "{mode}: find_tool must not name it: {found}");
    }
    // ... and the backend is sent the token this request presented.
    let whoami = try_call(&s, mode, "kit_whoami", json!({})).await.unwrap();
    assert_eq!(whoami, format!("user= authorization=Bearer {narrow}"), "{mode}");

    // Groups given back: the tool is back, on the same session.
    let again = key.sign(&claims_in("alice", &["admin", "dev"], now() - 2));
    let s = s.presented(&url, Some(&again));
    assert_eq!(try_call(&s, mode, "kit_sleep", sleep).await, Ok("slept 0 ms".into()), "{mode}");
    // Another principal's token is still a 404, whatever its groups.
    let bob = s.presented(&url, Some(&key.sign(&claims_in("bob", &["dev", "admin"], now()))));
    let err = bob.try_request("tools/list", json!({})).await.unwrap_err();
    assert!(err.contains("404"), "{mode}: {err}");
    app.shutdown().await;
}

#[tokio::test]
async fn a_sessions_rights_follow_each_requests_token() {
    a_sessions_rights_follow_each_requests_token_in("passthrough").await;
}

#[tokio::test]
async fn a_sessions_rights_follow_each_requests_token_through_call_tool() {
    a_sessions_rights_follow_each_requests_token_in("optimizer").await;
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

/// A minimal OAuth 2.0 token endpoint for RFC 8693 exchanges: it checks the client's Basic
/// credentials and the grant, refuses `mallory`'s token, and answers `x-{token}-{n}` valid for
/// `lifetime` seconds. Its URL, and the subject tokens it was sent in order.
async fn token_endpoint(lifetime: u64) -> (String, Arc<Mutex<Vec<String>>>) {
    use axum::http::{HeaderMap, StatusCode};
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/token",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let log = log.clone();
            async move {
                use base64::Engine;
                let basic = base64::engine::general_purpose::STANDARD.encode("toolmux:s3cret");
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Basic {basic}")) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "invalid_client"})));
                }
                let form: HashMap<String, String> = form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                assert_eq!(form["grant_type"], "urn:ietf:params:oauth:grant-type:token-exchange");
                assert_eq!(form["subject_token_type"], "urn:ietf:params:oauth:token-type:access_token");
                assert_eq!(form.get("audience").map(String::as_str), Some("kit-api"));
                let subject = form["subject_token"].clone();
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push(subject.clone());
                    log.iter().filter(|s| **s == subject).count()
                };
                if subject == "mallory" {
                    return (
                        StatusCode::BAD_REQUEST,
                        axum::Json(json!({"error": "invalid_grant", "error_description": "no"})),
                    );
                }
                let token = json!({"access_token": format!("x-{subject}-{n}"), "issued_token_type":
                    "urn:ietf:params:oauth:token-type:access_token", "token_type": "Bearer", "expires_in": lifetime});
                (StatusCode::OK, axum::Json(token))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/token", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// `auth = "token_exchange"`: each caller's backend session is sent a token exchanged for the
/// caller's own, cached until shortly before it expires and then exchanged again; a refused
/// exchange is a tool error naming the backend, and the caller's own token never reaches it.
#[tokio::test]
async fn token_exchange_gives_each_caller_a_token_of_its_own() {
    let (token_url, seen) = token_endpoint(2).await;
    let kit = http_backend("testkit").await;
    let backend = format!(
        "{}session = \"per_client\"\nauth = \"token_exchange\"\n[backends.token_exchange]\ntoken_url = \"{token_url}\"\n\
         client_id = \"toolmux\"\nclient_secret = \"s3cret\"\naudience = \"kit-api\"\n",
        http_backend_toml("kit", &kit.url)
    );
    let app = passthrough(&bearer_auth(&["alice", "bob", "mallory"]), &backend).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let whoami = |c| async move { text(&call(c, "kit_whoami", json!({})).await) };
    assert_eq!(whoami(&alice).await, "user= authorization=Bearer x-alice-1");
    assert_eq!(whoami(&bob).await, "user= authorization=Bearer x-bob-1");
    assert_eq!(whoami(&alice).await, "user= authorization=Bearer x-alice-1", "cached while fresh");
    assert_eq!(seen.lock().unwrap().iter().filter(|s| *s == "alice").count(), 1);
    // Two seconds of life, refreshed half a second before the end.
    let refreshed = eventually(Duration::from_secs(10), || async {
        whoami(&alice).await == "user= authorization=Bearer x-alice-2"
    })
    .await;
    assert!(refreshed, "exchanged again near expiry: {}", whoami(&alice).await);

    let (mallory, _) = client_with_auth(&app, Some("mallory")).await;
    let r = call(&mallory, "kit_whoami", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(
        text(&r),
        "backend `kit` takes a token exchanged for yours, and the exchange failed: the token endpoint refused the exchange (invalid_grant)"
    );
    assert!(seen.lock().unwrap().contains(&"mallory".to_string()), "the endpoint was asked");
    for c in [alice, bob, mallory] {
        c.cancel().await.unwrap();
    }
    app.shutdown().await;
}

/// From the review: with `protocol = "auto"` a backend that negotiates 2026-07-28 was served over
/// the gateway's own connection, which carries no caller's token. Each caller still gets its own
/// connection with its own exchanged token, whatever revision the backend speaks.
#[tokio::test]
async fn token_exchange_keeps_the_callers_identity_when_the_backend_speaks_2026_07_28() {
    let (token_url, _) = token_endpoint(600).await;
    let kit = http_backend("testkit").await;
    let backend = format!(
        "{}session = \"per_client\"\nprotocol = \"auto\"\nauth = \"token_exchange\"\n[backends.token_exchange]\n\
         token_url = \"{token_url}\"\nclient_id = \"toolmux\"\nclient_secret = \"s3cret\"\naudience = \"kit-api\"\n",
        http_backend_toml("kit", &kit.url)
    );
    let app = passthrough(&bearer_auth(&["alice", "bob"]), &backend).await;
    let kit_backend = app.gateway.upstream.get("kit").unwrap();
    assert!(kit_backend.is_stateless(), "the test needs a backend that negotiates 2026-07-28");
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let whoami = |c| async move { text(&call(c, "kit_whoami", json!({})).await) };
    assert_eq!(whoami(&alice).await, "user= authorization=Bearer x-alice-1");
    assert_eq!(whoami(&bob).await, "user= authorization=Bearer x-bob-1");
    for c in [alice, bob] {
        c.cancel().await.unwrap();
    }
    app.shutdown().await;
}

#[test]
fn token_exchange_configs_are_checked_by_key() {
    let load = |backend: &str| toolmux::config::Config::parse(backend).unwrap_err().to_string();
    let e = load(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nsession = \"shared\"\nauth = \"token_exchange\"\n\
         [backends.token_exchange]\ntoken_url = \"ftp://idp\"\nclient_id = \"c\"\n",
    );
    for key in
        ["backends[0].session", "backends[0].token_exchange.client_secret", "backends[0].token_exchange.token_url"]
    {
        assert!(e.contains(key), "{key}: {e}");
    }
    // Callers' tokens and the client secret travel in the clear only to this machine.
    let e = load(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nauth = \"token_exchange\"\n\
         [backends.token_exchange]\ntoken_url = \"http://idp.example/token\"\nclient_id = \"c\"\nclient_secret = \"s\"\n",
    );
    assert!(e.contains("backends[0].token_exchange.token_url") && e.contains("https://"), "{e}");
    let e = load("[[backends]]\nname = \"a\"\nurl = \"http://x\"\nauth = \"token_exchange\"\n");
    assert!(e.contains("backends[0].token_exchange"), "{e}");
    let e = load("[[backends]]\nname = \"a\"\nurl = \"http://x\"\nauth = \"magic\"\n");
    assert!(e.contains("backends[0].auth"), "{e}");
    let e = load(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nauth = \"token_exchange\"\nheaders = { Authorization = \"Bearer t\" }\n\
         [backends.token_exchange]\ntoken_url = \"https://idp\"\nclient_id = \"c\"\nclient_secret = \"${TOOLMUX_TEST_NO_SUCH_VAR}\"\n",
    );
    assert!(e.contains("backends[0].headers.Authorization"), "{e}");
    assert!(e.contains("TOOLMUX_TEST_NO_SUCH_VAR"), "{e}");
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
