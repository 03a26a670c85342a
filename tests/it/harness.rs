//! Shared test harness: real demo backends (in-process HTTP servers on 127.0.0.1:0, and child
//! processes), the gateway on 127.0.0.1:0, and real rmcp clients.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;
use toolmux::app::{App, EmbedderChoice, Options};
use toolmux::config::Config;
use toolmux::embed::worker::ModelEmbedder;

pub const BIN: &str = env!("CARGO_BIN_EXE_toolmux");

/// A demo backend served in this process over HTTP.
pub struct HttpBackend {
    pub url: String,
    ct: CancellationToken,
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

pub async fn http_backend(name: &str) -> HttpBackend {
    let backend = toolmux::demo::backend(name).unwrap_or_else(|| panic!("no demo backend {name}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let ct = CancellationToken::new();
    tokio::spawn(toolmux::demo::serve_http(backend, listener, ct.clone()));
    HttpBackend { url, ct }
}

/// A demo backend in a child process over HTTP, restartable on the same port.
pub struct ChildBackend {
    pub name: String,
    pub addr: SocketAddr,
    child: Option<tokio::process::Child>,
}

impl ChildBackend {
    pub async fn start(name: &str) -> Self {
        Self::start_with(name, &[]).await
    }

    /// Starts it with more arguments for `toolmux backend`, e.g. `--list-delay-ms 800`.
    pub async fn start_with(name: &str, extra: &[&str]) -> Self {
        let mut child = tokio::process::Command::new(BIN)
            .args(["backend", name, "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start backend child");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("backend prints its address")
            .unwrap()
            .expect("a line");
        let addr = line.trim_start_matches("http://").trim_end_matches("/mcp").parse().unwrap();
        Self { name: name.into(), addr, child: Some(child) }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
            let _ = c.wait().await;
        }
    }

    /// Starts it again on the same port.
    pub async fn restart(&mut self) {
        self.kill().await;
        let mut last = None;
        for _ in 0..50 {
            match tokio::time::timeout(Duration::from_secs(5), Self::try_start_at(&self.name, self.addr)).await {
                Ok(Some(c)) => {
                    self.child = Some(c);
                    return;
                }
                other => last = Some(other.is_ok()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not restart {} on {} ({last:?})", self.name, self.addr);
    }

    async fn try_start_at(name: &str, addr: SocketAddr) -> Option<tokio::process::Child> {
        let mut child = tokio::process::Command::new(BIN)
            .args(["backend", name, "--listen", &addr.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        let mut lines = tokio::io::BufReader::new(child.stdout.take()?).lines();
        match lines.next_line().await {
            Ok(Some(_)) => Some(child),
            _ => None,
        }
    }
}

/// A running `toolmux serve` child and the URL it printed.
pub struct Served {
    pub child: tokio::process::Child,
    pub url: String,
    pub base: String,
}

impl Served {
    pub async fn start(config: &std::path::Path) -> Self {
        Self::start_with(config, &[]).await
    }

    pub async fn start_with(config: &std::path::Path, extra: &[&str]) -> Self {
        Self::start_env(config, extra, &[]).await
    }

    /// Starts it with `extra` arguments and `env` added to its environment.
    pub async fn start_env(config: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_limited(config, extra, env, None).await
    }

    /// Starts it as a shell or service manager would with `nofile` as its descriptor limits
    /// (soft, hard).
    pub async fn start_limited(
        config: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
        nofile: Option<(u64, u64)>,
    ) -> Self {
        Self::spawn(config, extra, env, nofile, Stdio::null()).await
    }

    /// Starts it with its log (stderr, at the default level) written to `log`.
    pub async fn start_logging(config: &std::path::Path, log: &std::path::Path) -> Self {
        Self::spawn(config, &[], &[], None, std::fs::File::create(log).unwrap().into()).await
    }

    async fn spawn(
        config: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
        nofile: Option<(u64, u64)>,
        stderr: Stdio,
    ) -> Self {
        let mut command = tokio::process::Command::new(BIN);
        command
            .args(["serve", "--config", config.to_str().unwrap()])
            .args(extra)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        if let Some((soft, hard)) = nofile {
            // SAFETY: between fork and exec the closure makes one system call and allocates nothing.
            unsafe {
                command.pre_exec(move || rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard));
            }
        }
        let mut child = command.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("serve prints its URL")
            .unwrap()
            .expect("a line");
        let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
        let base = url.trim_end_matches("/mcp").to_string();
        let s = Served { child, url, base };
        assert!(
            eventually(Duration::from_secs(60), || async { s.get("/readyz").await.0 == 200 }).await,
            "the gateway gets ready"
        );
        s
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        match reqwest::get(format!("{}{path}", self.base)).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    pub async fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/status").await.1).unwrap_or_default()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }
}

/// The real model, loaded once per test binary.
pub fn model() -> Arc<ModelEmbedder> {
    static MODEL: OnceLock<Arc<ModelEmbedder>> = OnceLock::new();
    loaded_once(&MODEL, toolmux::config::Precision::F32)
}

/// The real model with int8 dense layers (`optimizer.precision = "int8"`), loaded once.
pub fn model_int8() -> Arc<ModelEmbedder> {
    static MODEL: OnceLock<Arc<ModelEmbedder>> = OnceLock::new();
    loaded_once(&MODEL, toolmux::config::Precision::int8())
}

fn loaded_once(
    cell: &'static OnceLock<Arc<ModelEmbedder>>,
    precision: toolmux::config::Precision,
) -> Arc<ModelEmbedder> {
    cell.get_or_init(|| model_of_its_own(precision)).clone()
}

/// The real model, loaded for one test alone: for a test that counts the model's work, which
/// other tests sharing [`model`] would add to.
pub fn model_of_its_own(precision: toolmux::config::Precision) -> Arc<ModelEmbedder> {
    let roots = toolmux::embed::files::default_model_roots();
    let files = toolmux::embed::files::locate("all-MiniLM-L6-v2", None, &roots, false)
        .expect("the model is fetched (models/fetch.sh)");
    let batching = toolmux::embed::worker::Batching::default();
    Arc::new(ModelEmbedder::start_with(&files, batching, precision).expect("model loads"))
}

/// A vector cache folder shared by the tests of this binary (tool texts repeat across tests).
pub fn shared_cache_dir() -> String {
    std::env::temp_dir().join("toolmux-test-vectors").display().to_string()
}

/// Starts the gateway from TOML text (listening on 127.0.0.1:0) and waits until it is ready.
pub async fn gateway(toml: &str, embedder: EmbedderChoice) -> App {
    let config = Config::parse(toml).unwrap_or_else(|e| panic!("test config: {e}"));
    let app = App::start(config, Options { embedder, ..Options::default() }).await.expect("gateway starts");
    assert!(app.ready(Duration::from_secs(60)).await, "gateway ready");
    app
}

/// Counts what the server pushes to this client.
#[derive(Clone, Default)]
pub struct Recorder {
    pub tools_changed: Arc<AtomicUsize>,
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("toolmux-tests", "0"))
    }

    async fn on_tool_list_changed(&self, _c: NotificationContext<RoleClient>) {
        self.tools_changed.fetch_add(1, Ordering::SeqCst);
    }
}

pub type Client = RunningService<RoleClient, Recorder>;

pub async fn client(app: &App) -> (Client, Recorder) {
    client_with_auth(app, None).await
}

/// `[auth]` with static bearer tokens, one principal each (named like its token), and a policy
/// that lets each of them use every backend.
pub fn bearer_auth(tokens: &[&str]) -> String {
    bearer_tokens(tokens) + "[[policy]]\nprincipals = [\"*\"]\nbackends = [\"*\"]\n"
}

/// `[auth]` with static bearer tokens, one principal each (named like its token), no policy.
pub fn bearer_tokens(tokens: &[&str]) -> String {
    let mut toml = String::from("[auth]\nmode = \"bearer\"\n");
    for t in tokens {
        let digest = base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()));
        toml += &format!("[[auth.tokens]]\nprincipal = \"{t}\"\nsha256 = \"{digest}\"\n");
    }
    toml
}

pub async fn client_with_auth(app: &App, token: Option<&str>) -> (Client, Recorder) {
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(t) = token {
        cfg = cfg.auth_header(t.to_string());
    }
    let rec = Recorder::default();
    let c = rec.clone().serve(StreamableHttpClientTransport::from_config(cfg)).await.expect("client connects");
    (c, rec)
}

/// A 2026-07-28 client (`server/discover`, no session) with `handler`; `token`, if any, is
/// sent as its bearer credentials (and so decides who it is).
pub async fn stateless_client<H: ClientHandler>(
    app: &App,
    handler: H,
    token: Option<&str>,
) -> RunningService<RoleClient, H> {
    use rmcp::{ClientLifecycleMode, ClientServiceExt, model::ProtocolVersion};
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(t) = token {
        cfg = cfg.auth_header(t.to_string());
    }
    handler
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(cfg),
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
        )
        .await
        .expect("a 2026-07-28 client connects")
}

/// A config file in `dir` for a small optimizer catalog of two stdio backends (`kit`: testkit,
/// `github`), with its vector cache in `dir` too.
pub fn small_catalog_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("toolmux.toml");
    let toml = format!(
        "[optimizer]\ncache_dir = \"{}\"\n{}{}",
        dir.join("vectors").display(),
        stdio_backend_toml("kit", "testkit"),
        stdio_backend_toml("github", "github"),
    );
    std::fs::write(&config, toml).unwrap();
    config
}

pub async fn call<S: rmcp::Service<RoleClient>>(
    c: &RunningService<RoleClient, S>,
    name: &str,
    args: Value,
) -> CallToolResult {
    let mut p = CallToolRequestParams::new(name.to_string());
    if let Value::Object(m) = args {
        p = p.with_arguments(m);
    }
    c.call_tool(p).await.unwrap_or_else(|e| panic!("call {name}: {e}"))
}

/// The first text content of a result.
pub fn text(r: &CallToolResult) -> String {
    r.content.iter().find_map(|c| c.as_text().map(|t| t.text.clone())).unwrap_or_default()
}

/// Tool names in find_tool's structured answer.
pub fn found(r: &CallToolResult) -> Vec<String> {
    let sc = r.structured_content.as_ref().expect("structured content");
    sc["tools"].as_array().expect("tools array").iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

pub fn stdio_backend_toml(name: &str, backend: &str) -> String {
    format!("[[backends]]\nname = \"{name}\"\ncommand = \"{BIN}\"\nargs = [\"backend\", \"{backend}\", \"--stdio\"]\n")
}

/// A stdio MCP server in POSIX sh, written to `dir`, answering `initialize` with
/// `capabilities` (JSON) and each `(method, result)` in `answers` with that result (JSON, in
/// which printf's escapes such as `\\377` work), any other request with `{}`. Returns its
/// `[[backends]]` entry as `name`.
pub fn sh_backend_toml(dir: &std::path::Path, name: &str, capabilities: &str, answers: &[(&str, String)]) -> String {
    // Inside a single-quoted printf format: `%` doubled, `'` closed and reopened around it.
    let format = |json: &str| json.replace('%', "%%").replace('\'', r"'\''");
    let mut script = String::from(
        "while IFS= read -r line; do\n  id=$(printf '%s' \"$line\" | sed -n 's/.*\"id\":\\([0-9][0-9]*\\).*/\\1/p')\n  case \"$line\" in\n",
    );
    let init = format!(
        r#"{{"protocolVersion":"2025-06-18","capabilities":{capabilities},"serverInfo":{{"name":"{name}","version":"1"}}}}"#
    );
    for (method, result) in
        std::iter::once(("initialize", init.as_str())).chain(answers.iter().map(|(m, r)| (*m, r.as_str())))
    {
        script += &format!(
            "    *'\"{method}\"'*) printf '{{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}}\\n' \"$id\" ;;\n",
            format(result)
        );
    }
    script += "    *'\"id\":'*) printf '{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\\n' \"$id\" ;;\n  esac\ndone\n";
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(&path, script).unwrap();
    format!("[[backends]]\nname = \"{name}\"\ncommand = \"sh\"\nargs = [{:?}]\n", path.display().to_string())
}

pub fn http_backend_toml(name: &str, url: &str) -> String {
    format!("[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\n")
}

/// Waits up to `within` for a message whose `method` is `method` on `events` (a session's
/// stream, from [`RawSession::listen`]); true if it came.
pub async fn told(events: &mut tokio::sync::mpsc::UnboundedReceiver<Value>, method: &str, within: Duration) -> bool {
    let seen = tokio::time::timeout(within, async {
        while let Some(m) = events.recv().await {
            if m["method"] == method {
                return true;
            }
        }
        false
    });
    seen.await.unwrap_or(false)
}

/// Polls `f` until it is true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An MCP session spoken over raw HTTP: initialize, requests by POST, and the session's GET
/// event stream read as it arrives, so a test sees exactly what the server pushes there.
pub struct RawSession {
    http: reqwest::Client,
    url: String,
    pub id: String,
    /// Sent as `Authorization: Bearer …` with every request.
    token: Option<String>,
    next: AtomicUsize,
}

impl RawSession {
    pub async fn open(app: &App) -> Self {
        Self::open_url(&format!("http://{}/mcp", app.addr.unwrap())).await
    }

    /// A session with the gateway at `url` (a child process, say).
    pub async fn open_url(url: &str) -> Self {
        Self::open_as(url, None).await
    }

    /// A session with the gateway at `url`, presenting `token`.
    pub async fn open_as(url: &str, token: Option<&str>) -> Self {
        let url = url.to_string();
        let http = reqwest::Client::new();
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
        let mut r = http.post(&url).header("accept", SSE_OR_JSON).json(&init);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.unwrap();
        assert!(r.status().is_success(), "initialize: {}", r.status());
        let id = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        let s = Self { http, url, id, token: token.map(str::to_owned), next: AtomicUsize::new(1) };
        let _ = response_of(r, 0).await;
        let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let r = s.post(&initialized).send().await.unwrap();
        assert!(r.status().is_success(), "initialized: {}", r.status());
        s
    }

    /// Where its requests go.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The same session id, sent to `url` by `token`'s holder: another replica, another caller.
    pub fn presented(&self, url: &str, token: Option<&str>) -> Self {
        Self {
            http: self.http.clone(),
            url: url.to_string(),
            id: self.id.clone(),
            token: token.map(str::to_owned),
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed) + 1000),
        }
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let r = self
            .http
            .post(&self.url)
            .header("accept", SSE_OR_JSON)
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25")
            .json(body);
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends a request; its `result`, or what went wrong (HTTP status, JSON-RPC error, no answer).
    pub async fn try_request(&self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let r = self.post(&body).send().await.map_err(|e| format!("{method}: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("{method}: HTTP {}: {}", r.status(), r.text().await.unwrap_or_default()));
        }
        let text = tokio::time::timeout(Duration::from_secs(30), r.text())
            .await
            .map_err(|_| format!("{method}: no answer within 30 s"))?
            .map_err(|e| format!("{method}: the answer broke off: {e}"))?;
        // Plain JSON, or an event stream whose `data:` lines carry messages.
        let answer = std::iter::once(text.as_str())
            .chain(text.lines().filter_map(|l| l.strip_prefix("data:")))
            .filter_map(|m| serde_json::from_str::<Value>(m.trim()).ok())
            .find(|m| m["id"] == id)
            .ok_or_else(|| format!("{method}: no answer to request {id} in {text:?}"))?;
        match answer.get("error") {
            Some(e) => Err(format!("{method}: {e}")),
            None => Ok(answer["result"].clone()),
        }
    }

    /// Sends a request and returns once the gateway has taken it (the answer's headers are
    /// in): its id and the response whose body will carry the answer ([`Self::answer`]).
    pub async fn send(&self, method: &str, params: Value) -> (usize, reqwest::Response) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let r = self.post(&body).send().await.unwrap();
        assert!(r.status().is_success(), "{method}: {}", r.status());
        (id, r)
    }

    /// The JSON-RPC message answering request `id` in `r`.
    pub async fn answer(r: reqwest::Response, id: usize) -> Value {
        response_of(r, id).await
    }

    /// Sends a request and returns its `result` (panics on a JSON-RPC error).
    pub async fn request(&self, method: &str, params: Value) -> Value {
        let (id, r) = self.send(method, params).await;
        let answer = response_of(r, id).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// `tools/call`, returning the tool result.
    pub async fn call(&self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", serde_json::json!({"name": name, "arguments": arguments})).await
    }

    /// Ends the session (`DELETE`); returns the status.
    pub async fn delete(self) -> reqwest::StatusCode {
        let mut r = self.http.delete(&self.url).header("mcp-session-id", &self.id);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        r.send().await.unwrap().status()
    }

    /// Opens the session's GET event stream; every JSON-RPC message on it arrives on the channel.
    pub async fn listen(&self) -> tokio::sync::mpsc::UnboundedReceiver<Value> {
        let mut r = self
            .http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.unwrap();
        assert!(r.status().is_success(), "GET stream: {}", r.status());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut events = sse_messages(r);
            while let Some(m) = futures::StreamExt::next(&mut events).await {
                if tx.send(m).is_err() {
                    return;
                }
            }
        });
        rx
    }
}

const SSE_OR_JSON: &str = "application/json, text/event-stream";

/// The JSON-RPC response with `id` in a POST's answer (plain JSON, or an event stream).
async fn response_of(r: reqwest::Response, id: usize) -> Value {
    let is_sse =
        r.headers().get("content-type").is_some_and(|c| c.to_str().unwrap_or("").starts_with("text/event-stream"));
    if !is_sse {
        return r.json().await.unwrap();
    }
    let mut events = sse_messages(r);
    while let Some(m) = futures::StreamExt::next(&mut events).await {
        if m["id"] == id {
            return m;
        }
    }
    panic!("the stream ended without a response to request {id}");
}

/// The JSON messages of an event stream (events whose data is not JSON, e.g. primers, skipped).
fn sse_messages(r: reqwest::Response) -> impl futures::Stream<Item = Value> + Send + Unpin {
    let bytes = r.bytes_stream();
    Box::pin(futures::stream::unfold((bytes, Vec::<u8>::new()), |(mut bytes, mut buf)| async move {
        loop {
            if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buf.drain(..end + 2).collect();
                let event = String::from_utf8_lossy(&event);
                let data: Vec<&str> =
                    event.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim_start()).collect();
                if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
                    return Some((v, (bytes, buf)));
                }
                continue;
            }
            match futures::StreamExt::next(&mut bytes).await {
                Some(Ok(chunk)) => buf.extend(chunk.iter().filter(|&&b| b != b'\r')),
                _ => return None,
            }
        }
    }))
}

/// `toolmux serve --stdio --config config` as a child process, with a client connected once the
/// gateway lists `tool`, and the gateway's process id (to signal it).
pub async fn stdio_gateway(config: &std::path::Path, tool: &str) -> (RunningService<RoleClient, Recorder>, u32) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["serve", "--stdio", "--config", config.to_str().unwrap()]).stderr(Stdio::null());
    let transport = rmcp::transport::TokioChildProcess::new(cmd).unwrap();
    let pid = transport.id().expect("the gateway runs");
    let c = Recorder::default().serve(transport).await.expect("stdio gateway answers");
    let listed = eventually(Duration::from_secs(20), || async {
        c.list_all_tools().await.map(|t| t.iter().any(|t| t.name == tool)).unwrap_or(false)
    })
    .await;
    assert!(listed, "the stdio gateway lists {tool}");
    (c, pid)
}
