//! JWTs at the edge: real signed tokens checked against a JWKS served over HTTP (keys in
//! `tests/fixtures/jwt`), the JWKS down, garbled or slow, and a session's rights following the
//! token each request presents.

use super::*;

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
