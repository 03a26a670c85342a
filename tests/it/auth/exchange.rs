//! Token exchange (RFC 8693): each caller's token traded for one of its own at a real token
//! endpoint before it reaches a backend, and its configuration checked by key.

use super::*;

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
