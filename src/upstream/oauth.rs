//! OAuth-protected backends (`auth = "oauth"`): the user logs in once (`toolmux login BACKEND`),
//! and every connection to the backend carries the grant, refreshed before it expires.
//!
//! rmcp's `auth` module does the protocol: discovery from the 401's `WWW-Authenticate`
//! (protected-resource metadata, authorization-server metadata, the 2025-03-26 fallbacks), client
//! registration (pre-registered, Client ID Metadata Documents, dynamic), authorization code with
//! PKCE and resource indicators, scope selection, the `iss` checks, refresh. toolmux adds what a
//! gateway needs around it: a grant kept per backend in a file only the user can read
//! ([`FileStore`]), a login that runs the browser flow on a loopback redirect ([`login`]), and a
//! backend without a grant reported as needing one ([`NeedsLogin`]) instead of failing silently.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession, CredentialStore,
    StoredCredentials,
};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::adopt::OwnSessionClient;
use crate::config::OAuthClient;

/// The backend has no usable grant: `toolmux login` gives it one.
///
/// What it displays goes to clients (find_tool's `needs_login`, a call's `isError`): the
/// backend and the command, never a path on the gateway's host. The operator's form
/// ([`NeedsLogin::for_operator`], in the log and an admin's `/status`) adds the configuration
/// file and what exactly went wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("needs a login: run `toolmux login {backend}` where the gateway runs{why}")]
pub struct NeedsLogin {
    pub backend: String,
    config: String,
    /// Said to clients: why, in words that name nothing on the host.
    why: String,
    /// For the operator only (it may name files).
    detail: Option<String>,
}

impl NeedsLogin {
    /// `why` is said to clients: it must name nothing on the gateway's host.
    pub fn new(backend: &str, why: Option<String>) -> Self {
        let config = CONFIG_FILE.get().map(|p| format!(" --config {}", p.display())).unwrap_or_default();
        Self {
            backend: backend.to_string(),
            config,
            why: why.map(|w| format!(" ({w})")).unwrap_or_default(),
            detail: None,
        }
    }

    /// With what went wrong in the operator's terms (a grant file that does not read).
    fn with_detail(mut self, detail: String) -> Self {
        self.detail = Some(detail);
        self
    }

    /// The exact command, with the configuration file, and the whole reason.
    pub fn for_operator(&self) -> String {
        let detail = self.detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default();
        format!("needs a login: run `toolmux login {}{}`{}{detail}", self.backend, self.config, self.why)
    }
}

/// The configuration file a running gateway was started with, named in [`NeedsLogin`]'s advice.
static CONFIG_FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Records the configuration file, so that a backend needing a login names the exact command.
pub fn set_config_file(path: &Path) {
    let _ = CONFIG_FILE.set(std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()));
}

/// The folder toolmux keeps per-user state in: `TOOLMUX_CONFIG_DIR`, else `$XDG_CONFIG_HOME/toolmux`,
/// else `~/.config/toolmux` (`%APPDATA%\toolmux` on Windows).
pub fn config_folder() -> anyhow::Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("TOOLMUX_CONFIG_DIR") {
        return Ok(dir);
    }
    if cfg!(windows)
        && let Some(appdata) = var("APPDATA")
    {
        return Ok(appdata.join("toolmux"));
    }
    if let Some(xdg) = var("XDG_CONFIG_HOME") {
        return Ok(xdg.join("toolmux"));
    }
    let home = var("HOME").or_else(|| var("USERPROFILE")).context("neither HOME nor USERPROFILE is set")?;
    Ok(home.join(".config").join("toolmux"))
}

/// Where one backend's grant is kept: by name and URL, so a backend pointed elsewhere never
/// sends a token minted for another server.
pub fn grant_file(backend: &str, url: &str) -> anyhow::Result<PathBuf> {
    let digest = Sha256::digest(url.as_bytes());
    let tag = base16ct::lower::encode_string(&digest[..6]);
    Ok(config_folder()?.join("oauth").join(format!("{backend}-{tag}.json")))
}

/// A grant (tokens and the client registration they belong to) in a file readable by its
/// owner only, replaced whole on every save.
#[derive(Debug, Clone)]
pub struct FileStore {
    path: PathBuf,
}

impl FileStore {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }
}

#[async_trait::async_trait]
impl CredentialStore for FileStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        match tokio::fs::read(&self.path).await {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                AuthError::CredentialStoreError(format!(
                    "{} is not a grant ({e}); remove it and log in again",
                    self.path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(AuthError::CredentialStoreError(format!("reading {}: {e}", self.path.display()))),
        }
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let bytes = serde_json::to_vec(&credentials).map_err(|e| AuthError::CredentialStoreError(e.to_string()))?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || crate::store::write_whole(&path, &bytes))
            .await
            .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?
            .map_err(|e| AuthError::CredentialStoreError(format!("{e:#}")))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match tokio::fs::remove_file(&self.path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(AuthError::CredentialStoreError(format!("removing {}: {e}", self.path.display()))),
        }
    }

    /// The authorization server refused the grant's refresh token for good (`invalid_grant`):
    /// its tokens are dropped from the file (the client registration stays), so the backend is
    /// reported as needing a login and the refused token is never sent again. A grant replaced
    /// meanwhile (a new login) is left alone.
    async fn on_refresh_token_rejected(&self, used: &StoredCredentials) -> Result<(), AuthError> {
        let Some(now) = self.load().await? else { return Ok(()) };
        let refresh = |c: &StoredCredentials| {
            serde_json::to_value(&c.token_response).ok().and_then(|t| t.get("refresh_token").cloned())
        };
        if now.token_response.is_none() || refresh(&now) != refresh(used) {
            return Ok(());
        }
        tracing::warn!(grant = %self.path.display(), "the authorization server refused the refresh token: a new login is needed");
        let issuer = now.issuer.clone();
        self.save(StoredCredentials::new(now.client_id, None, Vec::new(), None).with_issuer(issuer)).await
    }
}

/// One backend's authorization, shared by all its connections: one manager, so one refresh at a
/// time; dropped after an authorization failure so the next attempt reads the file again (where
/// `toolmux login` may have put a new grant).
pub struct Grant {
    backend: String,
    url: String,
    client: Mutex<Option<AuthClient<OwnSessionClient>>>,
    /// The scope the backend last asked for beyond the grant's (from a 403 `insufficient_scope`).
    wanted: std::sync::Mutex<Option<String>>,
}

impl Grant {
    pub fn new(backend: &str, url: &str) -> Self {
        Self {
            backend: backend.to_string(),
            url: url.to_string(),
            client: Mutex::new(None),
            wanted: std::sync::Mutex::new(None),
        }
    }
}

impl super::adopt::WantsScope for Grant {
    /// The backend refused a request for want of scope (`challenge`: its `WWW-Authenticate`).
    /// Kept beside the grant, so that the next `toolmux login` asks for that scope too.
    fn wants(&self, challenge: &str) {
        let scope = scope_of(challenge);
        tracing::warn!(backend = %self.backend, scope = scope.as_deref().unwrap_or("?"), "the backend wants more scope than the grant holds; a new login is needed");
        *self.wanted.lock().expect("wanted scope") = scope;
        match grant_file(&self.backend, &self.url) {
            Ok(file) => {
                if let Err(e) = crate::store::write_whole(&wants_file(&file), challenge.as_bytes()) {
                    tracing::warn!(backend = %self.backend, error = %e, "could not keep the wanted scope for the next login");
                }
            }
            Err(e) => tracing::warn!(backend = %self.backend, error = %e, "no folder for the wanted scope"),
        }
    }
}

impl Grant {
    /// What the last refusal for want of scope asked for, as a reason to log in again.
    pub fn wanted_scope(&self) -> Option<String> {
        self.wanted.lock().expect("wanted scope").as_ref().map(|s| format!("the backend wants scope `{s}`"))
    }

    /// Whether no refusal for want of scope waits for a login any more (the login that asks for
    /// the scope removes the challenge it kept); the scope wanted is then forgotten.
    pub fn settled(&self) -> bool {
        let pending = grant_file(&self.backend, &self.url).is_ok_and(|f| wants_file(&f).exists());
        if !pending {
            *self.wanted.lock().expect("wanted scope") = None;
        }
        !pending
    }

    /// `http` wrapped to carry the grant; [`NeedsLogin`] when there is none.
    pub async fn wrap(self: &Arc<Self>, http: OwnSessionClient) -> anyhow::Result<AuthClient<OwnSessionClient>> {
        let mut cached = self.client.lock().await;
        if let Some(template) = cached.as_ref() {
            let mut client = template.clone();
            client.http_client = http;
            return Ok(client);
        }
        let mut manager = AuthorizationManager::new(self.url.as_str())
            .await
            .map_err(|e| anyhow::anyhow!("the backend's OAuth setup: {e}"))?;
        manager.set_credential_store(FileStore::new(grant_file(&self.backend, &self.url)?));
        match manager.initialize_from_store().await {
            Ok(true) => {}
            Ok(false) => return Err(NeedsLogin::new(&self.backend, None).into()),
            Err(AuthError::CredentialStoreError(e)) => {
                let needs = NeedsLogin::new(&self.backend, Some("its saved grant could not be read".into()));
                return Err(needs.with_detail(e).into());
            }
            Err(e) => return Err(anyhow::anyhow!("the backend's authorization server: {e}")),
        }
        let client = AuthClient::new(http, manager);
        *cached = Some(client.clone());
        Ok(client)
    }

    /// Forgets the manager after the backend refused the grant: the next connection reads the
    /// file again. Returns the error to report.
    pub async fn refused(&self, why: &str) -> NeedsLogin {
        *self.client.lock().await = None;
        NeedsLogin::new(&self.backend, Some(why.to_string()))
    }
}

/// The file beside a grant that keeps the challenge of the backend's last refusal for want of
/// scope, read (and removed) by the next login.
fn wants_file(grant: &Path) -> PathBuf {
    grant.with_extension("wants")
}

/// What a login after a refusal for want of scope (`challenge`) asks for: the configured scopes,
/// those granted before, and those the refusal named, each once. `None` if it named none.
fn widened_scopes(configured: &[String], granted: Vec<String>, challenge: &str) -> Option<Vec<String>> {
    let wanted = scope_of(challenge)?;
    let mut scopes: Vec<String> = configured.iter().cloned().chain(granted).collect();
    scopes.extend(wanted.split_whitespace().map(str::to_string));
    let mut seen = std::collections::HashSet::new();
    scopes.retain(|s| seen.insert(s.clone()));
    Some(scopes)
}

/// The scopes the grant saved at `file` holds; none when there is no grant to read.
fn granted_scopes(file: &Path) -> Vec<String> {
    let Some(stored) = std::fs::read(file).ok().and_then(|b| serde_json::from_slice::<StoredCredentials>(&b).ok())
    else {
        return Vec::new();
    };
    if !stored.granted_scopes.is_empty() {
        return stored.granted_scopes;
    }
    // A grant saved without its scopes (an older file, or a server that named none at the time):
    // the token response's `scope`, if any, says what was granted.
    let response = serde_json::to_value(&stored.token_response).unwrap_or_default();
    response["scope"].as_str().map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

/// The `scope` parameter of a `WWW-Authenticate` challenge.
fn scope_of(challenge: &str) -> Option<String> {
    let at = challenge.find("scope=")? + "scope=".len();
    let rest = &challenge[at..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split([',', ' ']).next()?,
    };
    Some(value.to_string())
}

/// Whether a connection error says the backend wants (other) authorization: rmcp's own typed
/// answer, from a failed `initialize` or request anywhere in the error's chain, not its wording.
pub fn is_auth_refusal(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        if let Some(e) = e.downcast_ref::<rmcp::ServiceError>() {
            return is_refused_request(e);
        }
        e.downcast_ref::<rmcp::service::ClientInitializeError>()
            .is_some_and(|e| e.is_authorization_required() || e.auth_challenge().is_some())
    })
}

/// Whether a request failed because the backend wants (other) authorization: a 401 or 403
/// challenge, or no token the grant could give.
pub fn is_refused_request(err: &rmcp::ServiceError) -> bool {
    err.is_authorization_required() || err.auth_challenge().is_some()
}

/// How the login hands the user the authorization URL.
pub enum Browser {
    /// Opens the system browser (and prints the URL too).
    Open,
    /// Prints the URL only.
    Print,
}

/// The browser flow for one backend: a loopback listener for the redirect, the authorization URL
/// opened (or printed), the code exchanged, the grant saved. Returns the grant's file.
pub async fn login(
    backend: &str,
    url: &str,
    client: &OAuthClient,
    browser: Browser,
    timeout: Duration,
) -> anyhow::Result<PathBuf> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", client.redirect_port))
        .await
        .with_context(|| format!("listening for the redirect on 127.0.0.1:{}", client.redirect_port))?;
    let redirect_uri = format!("http://127.0.0.1:{}/callback", listener.local_addr()?.port());

    // The challenge of an unauthenticated request names the metadata and the scopes to ask for.
    let challenge = reqwest::Client::new()
        .post(url)
        .header(http::header::ACCEPT, "application/json, text/event-stream")
        .json(&serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "ping"}))
        .send()
        .await
        .ok()
        .filter(|r| r.status() == reqwest::StatusCode::UNAUTHORIZED)
        .and_then(|r| r.headers().get(http::header::WWW_AUTHENTICATE)?.to_str().ok().map(str::to_string));

    let file = grant_file(backend, url)?;
    // A refusal for want of scope at run time names the scope this login must ask for, beside
    // those the grant holds and those configured: a new login asks for their union (SEP-2350),
    // so that getting one scope never loses another.
    let wanted = std::fs::read_to_string(wants_file(&file)).ok();
    let widened = wanted.as_deref().and_then(|c| widened_scopes(&client.scopes, granted_scopes(&file), c));
    let challenge = wanted.or(challenge);
    let mut manager = AuthorizationManager::new(url).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    manager.set_credential_store(FileStore::new(file.clone()));
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("discovering the backend's authorization server: {e}"))?;
    manager.set_metadata(resolution.metadata);

    let mut request = AuthorizationRequest::new(redirect_uri.clone()).with_client_name("toolmux");
    if let Some(c) = &challenge {
        request = request.with_challenge(c.clone());
    }
    request = match widened {
        Some(scopes) => request.with_scopes(scopes),
        None if !client.scopes.is_empty() => request.with_scopes(client.scopes.iter().cloned()),
        None => request.with_initial_scope_selection(),
    };
    if let Some(id) = &client.client_id {
        request = request.with_preregistered_client(id.clone());
        if let Some(secret) = &client.client_secret {
            request = request.with_client_secret(secret.clone());
        }
    }
    if let Some(u) = &client.client_metadata_url {
        request = request.with_client_metadata_url(u.clone());
    }
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, e)| anyhow::anyhow!("starting the authorization: {e}"))?;
    let auth_url = session.get_authorization_url().to_string();

    println!("Log in to `{backend}` in your browser:\n\n  {auth_url}\n");
    if matches!(browser, Browser::Open) {
        match openable(&auth_url) {
            Err(why) => println!("(not opened: {why}; open it yourself only if you trust it)"),
            Ok(()) if !open_browser(&auth_url) => {
                println!("(no browser could be opened here: open the URL above yourself)")
            }
            Ok(()) => {}
        }
    }
    println!("Waiting for the redirect to {redirect_uri} (up to {}s)…", timeout.as_secs());

    // The redirect must carry the state this login sent; anything else reaching the port (a page
    // that knows it, a stale tab) is answered and ignored, and the login goes on waiting.
    let state = reqwest::Url::parse(&auth_url)
        .ok()
        .and_then(|u| u.query_pairs().find(|(k, _)| k == "state").map(|(_, v)| v.into_owned()))
        .context("the authorization URL carries no state")?;
    let callback = tokio::time::timeout(timeout, redirect(&listener, &state))
        .await
        .map_err(|_| anyhow::anyhow!("no login within {}s; run the command again", timeout.as_secs()))??;
    session
        .handle_callback_url(&callback)
        .await
        .map_err(|e| anyhow::anyhow!("the authorization server's answer was refused: {e}"))?;
    let _ = std::fs::remove_file(wants_file(&file));
    Ok(file)
}

/// Waits for the browser's redirect on `listener` that carries `state` and answers it; returns
/// the full callback URL. A callback with another state (or none) gets 400 and changes nothing.
async fn redirect(listener: &tokio::net::TcpListener, state: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let (mut stream, _) = listener.accept().await?;
        let mut buf = vec![0u8; 8192];
        let mut read = 0;
        // The request line and headers; nothing of the body is needed.
        while read < buf.len() {
            let n = stream.read(&mut buf[read..]).await?;
            if n == 0 {
                break;
            }
            read += n;
            if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buf[..read]);
        let target = head.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("").to_string();
        if !target.starts_with("/callback") {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
            continue;
        }
        let query = target.split_once('?').map_or("", |(_, q)| q);
        let mut params = form_urlencoded::parse(query.as_bytes());
        if !params.any(|(k, v)| k == "state" && v == state) {
            tracing::warn!("a login callback with the wrong state was refused; still waiting for the right one");
            let body = "toolmux: this callback does not belong to the login in progress; it was ignored.";
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            continue;
        }
        let failed = target.contains("error=");
        let body = if failed {
            "toolmux: the authorization server refused the login. See the terminal."
        } else {
            "toolmux: logged in. You can close this tab."
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        if failed {
            let error: Vec<String> = form_urlencoded::parse(query.as_bytes())
                .filter(|(k, _)| k == "error" || k == "error_description")
                .map(|(_, v)| v.into_owned())
                .collect();
            anyhow::bail!("the authorization server refused: {}", error.join(": "));
        }
        return Ok(format!("http://127.0.0.1{target}"));
    }
}

/// Whether the authorization URL may go to the system's URL handler. It comes from the
/// authorization server's metadata, which whoever runs the backend writes: a `file:`, `smb:` or
/// application-scheme URL would make the OS open a local file or start a program. Only `https`,
/// and `http` to this machine, are a web page to log in on.
fn openable(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("the authorization URL does not parse ({e})"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&parsed) => Ok(()),
        "http" => Err("the authorization server's login page is plain http to another machine".into()),
        other => Err(format!("its scheme is `{other}`, not https")),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or("");
    let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>();
    host.eq_ignore_ascii_case("localhost") || ip.is_ok_and(|ip| ip.is_loopback())
}

/// Opens `url` in the system browser; false where there is none to open.
fn open_browser(url: &str) -> bool {
    let mut command = if cfg!(target_os = "macos") {
        std::process::Command::new("open")
    } else if cfg!(windows) {
        let mut c = std::process::Command::new("rundll32");
        c.arg("url.dll,FileProtocolHandler");
        c
    } else {
        std::process::Command::new("xdg-open")
    };
    command
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_told_by_rmcp_s_error_types_not_by_their_words() {
        use rmcp::transport::DynamicTransportError;
        use rmcp::transport::streamable_http_client::{AuthRequiredError, InsufficientScopeError, StreamableHttpError};
        type Http = StreamableHttpError<std::io::Error>;
        let sent = |e: Box<dyn std::error::Error + Send + Sync>| {
            rmcp::ServiceError::TransportSend(DynamicTransportError::from_parts(
                "test",
                std::any::TypeId::of::<()>(),
                e,
            ))
        };
        let challenge = r#"Bearer error="insufficient_scope", scope="notes:write""#.to_string();
        let unauthorised = sent(Box::new(Http::AuthRequired(AuthRequiredError::new("Bearer".into()))));
        let scope = sent(Box::new(Http::InsufficientScope(InsufficientScopeError::new(challenge, None))));
        assert!(is_refused_request(&unauthorised) && is_refused_request(&scope));
        // Through anyhow, under context of the gateway's own, as a failed listing reaches it.
        assert!(is_auth_refusal(&anyhow::Error::from(scope).context("listing the backend's tools")));
        // The same words from elsewhere are not a refusal.
        let worded = sent(Box::new(std::io::Error::other("Auth required: Insufficient scope")));
        assert!(!is_refused_request(&worded));
        assert!(!is_auth_refusal(&anyhow::Error::from(worded)));
        assert!(!is_auth_refusal(&anyhow::anyhow!("OAuth authorization required")));
    }

    #[test]
    fn the_scope_a_challenge_asks_for() {
        let c = r#"Bearer error="insufficient_scope", scope="files:read files:write", resource_metadata="https://x/.well-known/oauth-protected-resource""#;
        assert_eq!(scope_of(c).as_deref(), Some("files:read files:write"));
        assert_eq!(scope_of("Bearer scope=admin, error=insufficient_scope").as_deref(), Some("admin"));
        assert_eq!(scope_of("Bearer error=\"invalid_token\""), None);
    }

    /// A login after a refusal asks for what the refusal named without losing what is configured
    /// or was granted.
    #[test]
    fn a_login_after_a_refusal_asks_for_the_union() {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = r#"Bearer error="insufficient_scope", scope="files:write admin""#;
        let asked = widened_scopes(&owned(&["files:read"]), owned(&["files:read", "profile"]), c);
        assert_eq!(asked, Some(owned(&["files:read", "profile", "files:write", "admin"])));
        assert_eq!(widened_scopes(&[], Vec::new(), c), Some(owned(&["files:write", "admin"])));
        assert_eq!(widened_scopes(&owned(&["a"]), Vec::new(), "Bearer error=\"insufficient_scope\""), None);
    }

    #[tokio::test]
    async fn a_grant_file_is_private_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("oauth").join("b-0.json");
        let store = FileStore::new(path.clone());
        assert!(store.load().await.unwrap().is_none());
        store.save(StoredCredentials::new("client-1".into(), None, vec!["read".into()], Some(7))).await.unwrap();
        let back = store.load().await.unwrap().unwrap();
        assert_eq!((back.client_id.as_str(), back.granted_scopes.as_slice()), ("client-1", &["read".to_string()][..]));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
            let folder = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
            assert_eq!(folder, 0o700, "the folder the grants are kept in is the user's only");
        }
        std::fs::write(&path, "not json").unwrap();
        let err = store.load().await.unwrap_err().to_string();
        assert!(err.contains("log in again"), "{err}");
        store.clear().await.unwrap();
        assert!(store.load().await.unwrap().is_none());
    }

    #[test]
    fn only_a_web_page_is_handed_to_the_browser() {
        for ok in [
            "https://auth.example/authorize?x=1",
            "http://127.0.0.1:9/authorize",
            "http://localhost/a",
            "http://[::1]/a",
        ] {
            assert_eq!(openable(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("file:///etc/passwd", "`file`"),
            ("smb://host/share", "`smb`"),
            ("vscode://x/y", "`vscode`"),
            ("javascript:alert(1)", "`javascript`"),
            ("http://auth.example/authorize", "plain http"),
            ("http://127.0.0.1.evil.example/a", "plain http"),
        ] {
            let err = openable(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    /// A refresh token the server refused is dropped (the backend then needs a login, and the
    /// token is never sent again); a grant a new login replaced meanwhile is kept.
    #[tokio::test]
    async fn a_refused_refresh_token_is_dropped_unless_the_grant_was_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("oauth").join("b-0.json"));
        let grant = |refresh: &str| -> StoredCredentials {
            serde_json::from_value(serde_json::json!({
                "client_id": "client-1",
                "token_response": {"access_token": "at", "token_type": "bearer", "refresh_token": refresh},
                "granted_scopes": ["read"],
            }))
            .unwrap()
        };
        store.save(grant("rt-new")).await.unwrap();
        store.on_refresh_token_rejected(&grant("rt-old")).await.unwrap();
        assert!(store.load().await.unwrap().unwrap().token_response.is_some(), "a replaced grant was dropped");
        store.on_refresh_token_rejected(&grant("rt-new")).await.unwrap();
        let left = store.load().await.unwrap().unwrap();
        assert!(left.token_response.is_none(), "the refused token is still there");
        assert_eq!(left.client_id, "client-1", "the registration stays");
        let mut manager = AuthorizationManager::new("http://127.0.0.1:9/mcp").await.unwrap();
        manager.set_credential_store(store.clone());
        assert!(!manager.initialize_from_store().await.unwrap(), "the backend now needs a login");
    }

    #[test]
    fn the_advice_names_the_command() {
        let n = NeedsLogin::new("linear", Some("the backend wants scope `admin`".into()));
        let text = n.to_string();
        assert!(text.starts_with("needs a login: run `toolmux login linear"), "{text}");
        assert!(text.ends_with("(the backend wants scope `admin`)"), "{text}");
    }

    /// What a client reads names no file on the gateway's host; the operator's form does.
    #[test]
    fn a_client_is_told_no_path_of_the_host() {
        set_config_file(Path::new("/srv/private-place/toolmux.toml"));
        let n = NeedsLogin::new("linear", Some("its saved grant could not be read".into()))
            .with_detail("/srv/private-place/oauth/linear-0.json is not a grant".into());
        let client = n.to_string();
        assert!(!client.contains("private-place"), "{client}");
        assert!(client.contains("toolmux login linear") && client.contains("could not be read"), "{client}");
        let operator = n.for_operator();
        assert!(operator.contains("--config /srv/private-place/toolmux.toml"), "{operator}");
        assert!(operator.contains("oauth/linear-0.json is not a grant"), "{operator}");
    }

    #[test]
    fn grants_are_kept_per_backend_and_url() {
        let a = grant_file("b", "https://one.example/mcp").unwrap();
        let b = grant_file("b", "https://two.example/mcp").unwrap();
        assert_ne!(a, b);
        assert!(a.to_string_lossy().contains("oauth"));
    }
}
