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
        Self::start_at(name, "127.0.0.1:0").await
    }

    pub async fn start_at(name: &str, listen: &str) -> Self {
        let mut child = tokio::process::Command::new(BIN)
            .args(["backend", name, "--listen", listen])
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

/// The real model, loaded once per test binary.
pub fn model() -> Arc<ModelEmbedder> {
    static MODEL: OnceLock<Arc<ModelEmbedder>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let files = toolmux::embed::files::locate(
                "all-MiniLM-L6-v2",
                None,
                &toolmux::embed::files::default_model_roots(),
                false,
            )
            .expect("the model is fetched (models/fetch.sh)");
            Arc::new(ModelEmbedder::start(&files).expect("model loads"))
        })
        .clone()
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

pub fn http_backend_toml(name: &str, url: &str) -> String {
    format!("[[backends]]\nname = \"{name}\"\nurl = \"{url}\"\n")
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
