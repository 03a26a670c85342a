//! `toolmux login` against an authorization server the test runs on 127.0.0.1: discovery from
//! the backend's 401, dynamic registration, the browser redirect, the code exchange. What is
//! checked is what a hostile page or server could try: a forged callback (wrong `state`) is
//! refused while the login goes on waiting, and a login page that is not a web page (`file:`)
//! is never handed to the system's URL opener. And after a login, through a running gateway: an
//! expired access token refreshed and the new grant kept, and a backend that refuses a call for
//! want of scope: the refusal names the scope, and the next login asks for it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_toolmux");

/// The authorization server's state: where its login page is, the scopes each login asked for,
/// the codes it exchanged, the refresh tokens presented and those it took, the access tokens it
/// issued that are still good; and the MCP server its tokens are for, if any.
#[derive(Clone)]
struct Server {
    base: String,
    authorization_endpoint: String,
    scopes_asked: Arc<Mutex<Vec<String>>>,
    exchanged: Arc<Mutex<Vec<String>>>,
    refreshed: Arc<Mutex<Vec<String>>>,
    /// Every refresh token presented, good or not.
    presented: Arc<Mutex<Vec<String>>>,
    valid: Arc<Mutex<Vec<String>>>,
    /// How long the access token of a login lasts (in seconds; 0: expired as it is issued).
    login_token_lasts: u64,
    /// Whether it refuses every refresh token (`invalid_grant`), as after a revocation.
    refuses_refresh: Arc<AtomicBool>,
    /// Where `/mcp` forwards the requests that carry a good access token; `None`: it only
    /// challenges.
    backend: Option<String>,
}

/// Starts an MCP endpoint that wants OAuth (`/mcp`) and its authorization server, at one
/// address; `page` is the login page's URL, `{base}` replaced by the server's own.
async fn authorization_server(page: &str) -> (Server, SocketAddr) {
    authorization_server_for(page, None, 3600).await
}

/// The same, with `/mcp` serving `backend` (an MCP endpoint's URL) to the holder of a good token
/// ([`protected`]), and a login's access token lasting `login_token_lasts` seconds.
async fn authorization_server_for(page: &str, backend: Option<String>, login_token_lasts: u64) -> (Server, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base = format!("http://{addr}");
    let server = Server {
        authorization_endpoint: page.replace("{base}", &base),
        base,
        scopes_asked: Arc::default(),
        exchanged: Arc::default(),
        refreshed: Arc::default(),
        presented: Arc::default(),
        valid: Arc::default(),
        login_token_lasts,
        refuses_refresh: Arc::default(),
        backend,
    };
    let app = Router::new()
        .route("/mcp", axum::routing::any(protected))
        .route("/.well-known/oauth-protected-resource/mcp", get(resource))
        .route("/.well-known/oauth-protected-resource", get(resource))
        .route("/.well-known/oauth-authorization-server", get(metadata))
        .route("/register", post(register))
        .route("/authorize", get(authorize))
        .route("/token", post(token))
        .with_state(server.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (server, addr)
}

fn challenge(s: &Server) -> Response {
    let value = format!("Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"", s.base);
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, value)]).into_response()
}

/// The scope the protected resource's metadata names, which a first login asks for.
const FIRST_SCOPE: &str = "notes:read";
/// The backend's tool that needs a scope no login has asked for yet, and that scope.
const GUARDED: (&str, &str) = ("remember", "notes:write");

/// The MCP endpoint: without a good access token, the 401 challenge; a call of the guarded tool,
/// a 403 `insufficient_scope` naming its scope; anything else forwarded to the backend, its
/// answer (an event stream, perhaps) streamed back.
async fn protected(State(s): State<Server>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let presented = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()?.strip_prefix("Bearer "));
    let good = presented.is_some_and(|t| s.valid.lock().unwrap().iter().any(|v| v == t));
    let Some(backend) = s.backend.as_ref().filter(|_| good) else {
        return challenge(&s);
    };
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let message: Value = serde_json::from_slice(&body).unwrap_or_default();
    if message["method"] == "tools/call" && message["params"]["name"] == GUARDED.0 {
        let value = format!(
            "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
            GUARDED.1, s.base
        );
        return (StatusCode::FORBIDDEN, [(header::WWW_AUTHENTICATE, value)]).into_response();
    }
    let mut forward = reqwest::Client::new().request(parts.method, backend).body(body);
    for (k, v) in &parts.headers {
        if k != header::HOST && k != header::CONTENT_LENGTH && k != header::AUTHORIZATION {
            forward = forward.header(k, v);
        }
    }
    let answer = forward.send().await.unwrap();
    let mut response = Response::builder().status(answer.status());
    for (k, v) in answer.headers() {
        response = response.header(k, v);
    }
    response.body(axum::body::Body::from_stream(answer.bytes_stream())).unwrap()
}

async fn resource(State(s): State<Server>) -> Json<Value> {
    let resource = format!("{}/mcp", s.base);
    Json(json!({ "resource": resource, "authorization_servers": [s.base], "scopes_supported": [FIRST_SCOPE] }))
}

async fn metadata(State(s): State<Server>) -> Json<Value> {
    Json(json!({
        "issuer": s.base,
        "authorization_endpoint": s.authorization_endpoint,
        "token_endpoint": format!("{}/token", s.base),
        "registration_endpoint": format!("{}/register", s.base),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
    }))
}

async fn register(Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    let answer = json!({
        "client_id": "login-test-client",
        "redirect_uris": body["redirect_uris"],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
    });
    (StatusCode::CREATED, Json(answer))
}

/// The user "logs in" at once: back to the redirect URI with a code and the login's state.
async fn authorize(State(s): State<Server>, Query(q): Query<std::collections::HashMap<String, String>>) -> Response {
    s.scopes_asked.lock().unwrap().push(q.get("scope").cloned().unwrap_or_default());
    let mut to = reqwest::Url::parse(&q["redirect_uri"]).unwrap();
    to.query_pairs_mut().append_pair("code", "the-code").append_pair("state", &q["state"]);
    (StatusCode::FOUND, [(header::LOCATION, to.to_string())]).into_response()
}

/// A code or a refresh token for tokens `at-N` and `rt-N`, N counting every grant. A login's
/// access token lasts `login_token_lasts`, a refreshed one an hour; each refresh token is good
/// once (rotated), and the scope granted is the one the last login asked for.
async fn token(State(s): State<Server>, _h: HeaderMap, body: String) -> Response {
    let form: std::collections::HashMap<String, String> =
        form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let lasts = match form.get("grant_type").map(String::as_str) {
        Some("refresh_token") => {
            let mut refreshed = s.refreshed.lock().unwrap();
            let issued = s.exchanged.lock().unwrap().len() + refreshed.len();
            let presented = form.get("refresh_token").cloned().unwrap_or_default();
            s.presented.lock().unwrap().push(presented.clone());
            if s.refuses_refresh.load(Ordering::Relaxed) || presented != format!("rt-{issued}") {
                return (StatusCode::BAD_REQUEST, Json(json!({"error": "invalid_grant"}))).into_response();
            }
            refreshed.push(presented);
            3600
        }
        _ => {
            s.exchanged.lock().unwrap().push(form.get("code").cloned().unwrap_or_default());
            s.login_token_lasts
        }
    };
    let n = s.exchanged.lock().unwrap().len() + s.refreshed.lock().unwrap().len();
    let access = format!("at-{n}");
    if lasts > 0 {
        s.valid.lock().unwrap().push(access.clone());
    }
    let scope = s.scopes_asked.lock().unwrap().last().cloned().unwrap_or_default();
    Json(json!({
        "access_token": access, "token_type": "Bearer", "expires_in": lasts, "refresh_token": format!("rt-{n}"),
        "scope": scope
    }))
    .into_response()
}

/// A configuration with one OAuth backend at `addr`, and a folder for its grant.
fn setup(addr: SocketAddr) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    std::fs::write(
        &config,
        format!("[[backends]]\nname = \"tracker\"\nurl = \"http://{addr}/mcp\"\nauth = \"oauth\"\n"),
    )
    .unwrap();
    (dir, config)
}

/// `toolmux login tracker`, its state folder in `dir`, with `path` first on PATH.
fn login(dir: &Path, config: &Path, extra: &[&str], path: Option<&Path>) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(["login", "tracker", "--config", config.to_str().unwrap()])
        .args(extra)
        .env("TOOLMUX_CONFIG_DIR", dir.join("state"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(p) = path {
        let old = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![p.to_path_buf()];
        paths.extend(std::env::split_paths(&old));
        command.env("PATH", std::env::join_paths(paths).unwrap());
    }
    command.spawn().unwrap()
}

/// Reads the child's stdout up to the printed authorization URL; returns it and what came before.
async fn auth_url(child: &mut tokio::process::Child) -> (String, Vec<String>) {
    let out = child.stdout.as_mut().unwrap();
    let mut lines = BufReader::new(out).lines();
    let mut seen = Vec::new();
    let wait = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let t = line.trim().to_string();
            seen.push(line);
            if t.contains("authorize") || t.starts_with("file:") {
                return t;
            }
        }
        panic!("no authorization URL: {seen:?}");
    };
    let url = tokio::time::timeout(std::time::Duration::from_secs(30), wait).await.expect("the URL is printed");
    let mut rest = Vec::new();
    // What follows the URL up to the "Waiting" line (the opener's verdict).
    while let Ok(Ok(Some(line))) = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line()).await {
        let waiting = line.starts_with("Waiting");
        rest.push(line);
        if waiting {
            break;
        }
    }
    (url, rest)
}

#[tokio::test]
async fn a_callback_with_the_wrong_state_is_refused_and_the_login_waits_for_the_right_one() {
    let (server, addr) = authorization_server("{base}/authorize").await;
    let (dir, config) = setup(addr);
    let mut child = login(dir.path(), &config, &["--no-browser", "--timeout", "60s"], None);
    let (url, _) = auth_url(&mut child).await;
    let parsed = reqwest::Url::parse(&url).unwrap();
    let param = |k: &str| parsed.query_pairs().find(|(n, _)| n == k).map(|(_, v)| v.into_owned()).unwrap();
    let (redirect, state) = (param("redirect_uri"), param("state"));
    let http = reqwest::Client::new();
    for forged in [
        format!("{redirect}?code=forged&state=not-{state}"),
        format!("{redirect}?code=forged"),
        format!("{redirect}?error=access_denied&state=forged"),
    ] {
        let r = http.get(&forged).send().await.unwrap();
        assert_eq!(r.status(), 400, "{forged}");
        assert!(r.text().await.unwrap().contains("ignored"));
    }
    assert!(child.try_wait().unwrap().is_none(), "the login ended on a forged callback");
    assert!(server.exchanged.lock().unwrap().is_empty(), "a forged code was exchanged");
    // The real redirect, through the authorization server's page.
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("logged in"));
    let out =
        tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(*server.exchanged.lock().unwrap(), ["the-code"]);
    let grants: Vec<_> = std::fs::read_dir(dir.path().join("state/oauth")).unwrap().collect();
    assert_eq!(grants.len(), 1);
}

/// A fake system URL opener (`xdg-open`, and `open` as macOS names it) that records what it
/// was asked to open.
#[cfg(unix)]
fn fake_opener(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let opened = dir.join("opened");
    for name in ["xdg-open", "open"] {
        let script = bin.join(name);
        std::fs::write(&script, format!("#!/bin/sh\nprintf '%s\\n' \"$@\" >> '{}'\n", opened.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (bin, opened)
}

#[cfg(unix)]
#[tokio::test]
async fn a_login_page_that_is_not_a_web_page_is_never_opened() {
    for (page, opens) in [("file:///etc/passwd", false), ("{base}/authorize", true)] {
        let (_server, addr) = authorization_server(page).await;
        let (dir, config) = setup(addr);
        let (bin, opened) = fake_opener(dir.path());
        let mut child = login(dir.path(), &config, &["--timeout", "2s"], Some(&bin));
        let (url, said) = auth_url(&mut child).await;
        let out =
            tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output()).await.unwrap().unwrap();
        assert!(!out.status.success(), "nobody logged in, so the login times out");
        let recorded = std::fs::read_to_string(&opened).unwrap_or_default();
        if opens {
            assert_eq!(recorded.trim(), url, "an https-or-loopback page is opened: {said:?}");
        } else {
            assert!(recorded.is_empty(), "the opener was handed {recorded}");
            assert!(said.iter().any(|l| l.contains("not opened: its scheme is `file`")), "{said:?}");
            assert!(url.starts_with("file:"), "the URL is still printed for the user to judge: {url}");
        }
    }
}

/// Before anyone logs in, an OAuth backend's tools are not listed: a call of one is "not found",
/// and the answer says which backend waits for a login and how to give it one, in both modes.
#[tokio::test]
async fn a_call_before_the_first_login_names_the_backend_that_waits_for_one() {
    use crate::harness::*;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kit = http_backend("testkit").await;
    let backends = format!(
        "{}[[backends]]\nname = \"tracker\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nauth = \"oauth\"\n",
        http_backend_toml("kit", &kit.url)
    );
    for mode in ["passthrough", "optimizer"] {
        let toml = format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n{backends}");
        let app = gateway(&toml, toolmux::app::EmbedderChoice::None).await;
        let waiting = eventually(std::time::Duration::from_secs(10), || async {
            app.gateway.upstream.get("tracker").is_some_and(|b| b.needs_login().is_some())
        })
        .await;
        assert!(waiting, "the backend is known to wait for a login");
        // `/status` says which backend waits, and only that one.
        let status = serde_json::to_value(app.gateway.status()).unwrap();
        let waits = |name: &str| {
            let b = status["backends"].as_array().unwrap().iter().find(|b| b["name"] == name).cloned();
            b.unwrap_or_else(|| panic!("{name} missing: {status}"))["needs_login"].clone()
        };
        assert_eq!((waits("tracker"), waits("kit")), (json!(true), json!(false)), "{mode}: {status}");
        let table = toolmux::mcp::status::table(&status);
        assert!(table.contains("toolmux login tracker"), "{mode}: {table}");
        let (client, _) = client(&app).await;
        let said = match mode {
            "passthrough" => {
                let params = rmcp::model::CallToolRequestParams::new("tracker_create_issue");
                client.peer().call_tool(params).await.unwrap_err().to_string()
            }
            _ => {
                let args = json!({"tool_name": "tracker_create_issue", "parameters": {}});
                text(&call(&client, "call_tool", args).await)
            }
        };
        assert!(said.contains("tool not found: tracker_create_issue"), "{mode}: {said}");
        assert!(said.contains("backend `tracker`") && said.contains("toolmux login tracker"), "{mode}: {said}");
        client.cancel().await.unwrap();
        app.shutdown().await;
    }

    // A caller who is not an admin is shown no backend errors, and still that one waits.
    let auth = bearer_tokens(&["alice", "bob"]).replacen(
        "mode = \"bearer\"\n",
        "mode = \"bearer\"\nadmins = [\"alice\"]\n",
        1,
    );
    let policy = "[[policy]]\nprincipals = [\"bob\"]\nbackends = [\"*\"]\n";
    let toml = format!("[server]\nlisten = \"127.0.0.1:0\"\n{auth}{policy}{backends}");
    let app = gateway(&toml, toolmux::app::EmbedderChoice::None).await;
    let waiting = eventually(std::time::Duration::from_secs(10), || async {
        app.gateway.upstream.get("tracker").is_some_and(|b| b.needs_login().is_some())
    })
    .await;
    assert!(waiting, "the backend is known to wait for a login");
    let shown = app.gateway.status_for(&toolmux::session::Caller::named("bob", Vec::new()));
    assert_eq!(shown["details"], json!(false), "{shown}");
    let tracker = shown["backends"].as_array().unwrap().iter().find(|b| b["name"] == "tracker");
    let tracker = tracker.unwrap_or_else(|| panic!("{shown}"));
    assert_eq!((&tracker["needs_login"], &tracker["last_error"]), (&json!(true), &json!(null)), "{shown}");
    let table = toolmux::mcp::status::table(&shown);
    let row = table.lines().find(|l| l.starts_with("tracker")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.ends_with("waits for a login"), "{table}");
    app.shutdown().await;
}

/// [`setup`], for a gateway in passthrough mode on a port of its own.
fn setup_served(addr: SocketAddr) -> (tempfile::TempDir, PathBuf) {
    let (dir, config) = setup(addr);
    let toml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{toml}")).unwrap();
    (dir, config)
}

/// `toolmux serve` with its grants in `state`, and a session with it once the OAuth backend's
/// tools are listed (the grant read and the backend connected).
async fn serve(config: &Path, state: &Path) -> (crate::harness::Served, crate::harness::RawSession) {
    use crate::harness::*;
    let served = Served::start_env(config, &[], &[("TOOLMUX_CONFIG_DIR", state.to_str().unwrap())]).await;
    let session = RawSession::open_url(&served.url).await;
    let listed = eventually(std::time::Duration::from_secs(30), || async {
        let tools = session.request("tools/list", json!({})).await;
        tools["tools"].as_array().unwrap().iter().any(|t| t["name"] == "tracker_echo")
    })
    .await;
    assert!(listed, "the backend's tools are listed once the grant is read");
    (served, session)
}

/// `toolmux login tracker` from start to end, the user logging in at once; returns the
/// authorization URL it printed.
async fn log_in(dir: &Path, config: &Path) -> reqwest::Url {
    let mut child = login(dir, config, &["--no-browser", "--timeout", "60s"], None);
    let (url, _) = auth_url(&mut child).await;
    let r = reqwest::get(&url).await.unwrap();
    assert!(r.text().await.unwrap().contains("logged in"));
    let out =
        tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    reqwest::Url::parse(&url).unwrap()
}

/// A gateway's configuration with one OAuth backend (testkit's tools, behind [`protected`]),
/// whose user logged in once; a login's access token lasts `login_token_lasts` seconds.
struct LoggedIn {
    server: Server,
    dir: tempfile::TempDir,
    config: PathBuf,
    /// The gateway's state folder, where the grant is.
    state: PathBuf,
    /// The first login's authorization URL.
    first: reqwest::Url,
    _kit: crate::harness::HttpBackend,
}

impl LoggedIn {
    async fn new(login_token_lasts: u64) -> Self {
        let kit = crate::harness::http_backend("testkit").await;
        let (server, addr) =
            authorization_server_for("{base}/authorize", Some(kit.url.clone()), login_token_lasts).await;
        let (dir, config) = setup_served(addr);
        let first = log_in(dir.path(), &config).await;
        let state = dir.path().join("state");
        Self { server, dir, config, state, first, _kit: kit }
    }
}

/// The files `*.{ext}` in a gateway's OAuth folder (`json`: grants; `wants`: kept challenges).
fn oauth_files(state: &Path, ext: &str) -> Vec<PathBuf> {
    std::fs::read_dir(state.join("oauth"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect()
}

/// The one grant in a gateway's OAuth folder, as saved.
fn saved_grant(state: &Path) -> Value {
    let grants = oauth_files(state, "json");
    assert_eq!(grants.len(), 1, "{grants:?}");
    serde_json::from_str(&std::fs::read_to_string(&grants[0]).unwrap()).unwrap()
}

/// The OAuth backend's row of `/status`, as text (empty when it has none).
fn tracker_row(status: &Value) -> String {
    let backends = status["backends"].as_array().into_iter().flatten();
    backends.filter(|b| b["name"] == "tracker").map(Value::to_string).collect()
}

/// What a client is told: a call's result or a JSON-RPC error, as text.
fn answer_text(answer: Result<Value, String>) -> String {
    answer.map_or_else(|e| e, |result| result.to_string())
}

/// What a call of a tool the backend does not have is told (it names the backends that wait for
/// a login).
async fn told_of_an_unknown_tool(session: &crate::harness::RawSession) -> String {
    let r = session.try_request("tools/call", json!({"name": "tracker_nope", "arguments": {}})).await;
    r.expect_err("no such tool")
}

/// A backend that refuses a call for want of scope (403 `insufficient_scope`): the call's answer
/// names the scope and the login that gets it, the backend's other tools go on working, and the
/// next `toolmux login` asks the authorization server for that scope beside the one it holds.
#[tokio::test]
async fn a_refusal_for_want_of_scope_is_named_and_the_next_login_asks_for_it() {
    let LoggedIn { server, dir, config, state, first, _kit } = LoggedIn::new(3600).await;
    let asked = |url: &reqwest::Url| url.query_pairs().find(|(k, _)| k == "scope").map(|(_, v)| v.into_owned());
    assert_eq!(asked(&first).as_deref(), Some(FIRST_SCOPE), "a first login asks for what the resource names");

    let (served, session) = serve(&config, &state).await;
    let echoed = session.call("tracker_echo", json!({"input": "with the grant"})).await;
    assert_eq!(echoed["isError"], json!(false), "{echoed}");
    let refused =
        match session.try_request("tools/call", json!({"name": "tracker_remember", "arguments": {"value": "x"}})).await
        {
            Ok(result) => {
                assert_eq!(result["isError"], json!(true), "{result}");
                result["content"][0]["text"].as_str().unwrap().to_string()
            }
            Err(e) => e,
        };
    assert!(refused.contains(&format!("scope `{}`", GUARDED.1)), "the refusal names the scope: {refused}");
    assert!(refused.contains("toolmux login tracker"), "and the way to get it: {refused}");
    let tracker = tracker_row(&served.status().await);
    assert!(tracker.contains(GUARDED.1), "/status says at once what the backend wants: {tracker}");
    let again = session.call("tracker_echo", json!({"input": "still"})).await;
    assert_eq!(again["isError"], json!(false), "a refusal for want of scope leaves the session working: {again}");

    let kept = oauth_files(&state, "wants");
    assert_eq!(kept.len(), 1, "the challenge is kept beside the grant");
    assert!(std::fs::read_to_string(&kept[0]).unwrap().contains("insufficient_scope"));

    let said = told_of_an_unknown_tool(&session).await;
    assert!(said.contains("toolmux login tracker"), "other tools working does not end the wait for the scope: {said}");

    let second = log_in(dir.path(), &config).await;
    let scope = asked(&second).unwrap_or_default();
    let mut scopes: Vec<&str> = scope.split(' ').collect();
    scopes.sort();
    assert_eq!(scopes, [FIRST_SCOPE, GUARDED.1], "the next login asks for the wanted scope and keeps the granted one");
    assert_eq!(server.scopes_asked.lock().unwrap().len(), 2);
    assert!(!kept[0].exists(), "a login that got the scope forgets the challenge");
    let after = session.call("tracker_echo", json!({"input": "after the login"})).await;
    assert_eq!(after["isError"], json!(false), "{after}");
    let said = told_of_an_unknown_tool(&session).await;
    assert!(!said.contains("toolmux login tracker"), "once the login was given, the wait ends: {said}");
}

/// An access token that has expired is refreshed before the backend is asked (the backend never
/// sees it), the refreshed grant is saved whole, and a gateway started later uses the saved
/// token without refreshing again.
#[tokio::test]
async fn an_expired_access_token_is_refreshed_and_the_refreshed_grant_kept() {
    let LoggedIn { server, config, state, dir: _dir, _kit, .. } = LoggedIn::new(0).await;
    {
        let (_served, session) = serve(&config, &state).await;
        let echoed = session.call("tracker_echo", json!({"input": "refreshed"})).await;
        assert_eq!(echoed["isError"], json!(false), "{echoed}");
    }
    assert_eq!(*server.refreshed.lock().unwrap(), ["rt-1"], "the login's expired token was refreshed, once");
    let saved = saved_grant(&state);
    assert_eq!(saved["token_response"]["refresh_token"], "rt-2", "the refreshed grant is saved: {saved}");

    let (_served, session) = serve(&config, &state).await;
    let echoed = session.call("tracker_echo", json!({"input": "after a restart"})).await;
    assert_eq!(echoed["isError"], json!(false), "{echoed}");
    assert_eq!(server.refreshed.lock().unwrap().len(), 1, "the saved access token was still good");
}

/// A refresh token the authorization server refuses (`invalid_grant`, as after a revocation) is
/// dropped from the grant (the client registration stays), never sent again, and the backend
/// waits for a login that `/status` and a call of its tool name.
#[tokio::test]
async fn a_refused_refresh_token_leaves_the_backend_waiting_for_a_login() {
    use crate::harness::*;
    let LoggedIn { server, config, state, dir: _dir, _kit, .. } = LoggedIn::new(0).await;
    server.refuses_refresh.store(true, Ordering::Relaxed);
    let served = Served::start_env(&config, &[], &[("TOOLMUX_CONFIG_DIR", state.to_str().unwrap())]).await;
    let waiting = eventually(std::time::Duration::from_secs(30), || async {
        tracker_row(&served.status().await).contains("toolmux login tracker")
    })
    .await;
    assert!(waiting, "/status says the backend waits for a login: {}", served.status().await);
    let saved = saved_grant(&state);
    assert!(saved["token_response"].is_null(), "the refused tokens are dropped: {saved}");
    assert_eq!(saved["client_id"], "login-test-client", "the client registration stays");
    assert_eq!(*server.presented.lock().unwrap(), ["rt-1"], "the login's refresh token was tried");

    let session = RawSession::open_url(&served.url).await;
    let said = answer_text(
        session.try_request("tools/call", json!({"name": "tracker_echo", "arguments": {"input": "x"}})).await,
    );
    assert!(said.contains("toolmux login tracker"), "a call names the login: {said}");
    assert_eq!(*server.presented.lock().unwrap(), ["rt-1"], "the refused refresh token is never sent again");
    assert!(server.refreshed.lock().unwrap().is_empty());
}

/// While the gateway runs: an access token the backend stops taking is refreshed and the call
/// goes through; a grant revoked whole (its refresh token refused too) makes the next call an
/// error naming the login, `/status` says the backend waits for one, and once the user logs in
/// again the running gateway uses the new grant, with no restart.
#[tokio::test]
async fn a_grant_revoked_at_run_time_is_named_and_a_new_login_is_used_without_a_restart() {
    let LoggedIn { server, dir, config, state, _kit, .. } = LoggedIn::new(3600).await;
    let (served, session) = serve(&config, &state).await;
    let echo = || session.try_request("tools/call", json!({"name": "tracker_echo", "arguments": {"input": "x"}}));
    assert_eq!(echo().await.unwrap()["isError"], json!(false));

    server.valid.lock().unwrap().clear();
    assert_eq!(echo().await.unwrap()["isError"], json!(false), "a refused access token is refreshed");
    assert_eq!(*server.refreshed.lock().unwrap(), ["rt-1"]);

    server.valid.lock().unwrap().clear();
    server.refuses_refresh.store(true, Ordering::Relaxed);
    let said = answer_text(echo().await);
    assert!(said.contains("toolmux login tracker"), "the call names the login: {said}");
    let tracker = tracker_row(&served.status().await);
    assert!(tracker.contains("toolmux login tracker"), "/status says so at once: {tracker}");

    server.refuses_refresh.store(false, Ordering::Relaxed);
    log_in(dir.path(), &config).await;
    let back = crate::harness::eventually(std::time::Duration::from_secs(60), || async {
        echo().await.is_ok_and(|r| r["isError"] == json!(false))
    })
    .await;
    assert!(back, "the running gateway uses the new grant");
    let said = told_of_an_unknown_tool(&session).await;
    assert!(!said.contains("toolmux login tracker"), "the backend no longer waits for a login: {said}");
}
