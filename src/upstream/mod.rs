//! Backend MCP servers, as an rmcp client sees them: streamable HTTP or a stdio child process.
//!
//! Each [`Backend`] is driven by one supervisor task ([`Backend::supervise`]): connect,
//! initialize, list tools (all pages), resources, templates and prompts, then wait until the
//! connection ends or the backend says its tools changed; reconnect with backoff. A backend that
//! is down at start only delays itself. The last listing is kept while the backend is down, so a
//! recovery with an unchanged catalog needs no re-embedding.
//!
//! Forwarded calls carry the backend's `timeout` and the client's cancellation: dropping the
//! rmcp request future sends `notifications/cancelled` to the backend.
//!
//! Besides the gateway's own connection (listing, list changes, health probes, and the calls of
//! `shared` backends), a `per_client` backend gets an upstream session per client session
//! ([`ClientUpstreams`]). Every request names the connection it travels on with a [`Link`].
//!
//! A backend speaks 2025-11-25 (initialize, a session) unless `protocol` says 2026-07-28 or
//! `auto`. On a 2026-07-28 connection list changes arrive through a `subscriptions/listen`
//! stream the supervisor holds open, and a backend that needs input from the client answers
//! `tools/call`, `prompts/get` or `resources/read` with an input-required result, which the
//! forwarding calls return as it is ([`Answer::InputRequired`]): what to do with it depends on
//! the client, and that is the `mcp` layer's business.

pub mod adopt;
mod answer;
mod child;
pub mod children;
mod client;
pub mod exchange;
pub mod identity;
mod link;
mod listing;
pub mod oauth;
mod principals;
mod session;
mod set;
mod sleep;
mod sse;
mod supervise;
pub mod words;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use rmcp::ClientServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelTaskParams, ClientCapabilities, ClientRequest,
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetTaskParams,
    GetTaskResult, ProgressToken, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    RequestId, RequestMetaObject, ServerResult, SubscribeRequestParams, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, RunningService, ServiceError};
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{BackendConfig, Protocol, SessionMode, Transport};
use crate::telemetry::Trace;
use listing::list_everything;

pub use answer::{Answer, CallError};
pub use client::UpstreamClient;
pub use identity::{Identity, LiveIdentity};
pub use link::Link;
use link::Outstanding;
pub use listing::Listing;
pub use principals::PrincipalUpstreams;
pub use session::{ClientUpstreams, InUse};
pub use set::Upstream;

/// First and last reconnect delays.
const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Deadline for connect + initialize + listing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A backend's connection, for the rest of the gateway.
pub struct Backend {
    pub config: BackendConfig,
    /// The gateway's own connection: set by the supervisor while connected; read by callers.
    shared: ArcSwapOption<Link>,
    /// Per-client stdio children that may run at once (`max_instances`).
    instances: Arc<Semaphore>,
    /// Per-client upstream sessions open now.
    client_sessions: std::sync::atomic::AtomicUsize,
    /// Written only by the supervisor.
    listing: ArcSwap<Listing>,
    /// True once the first connection attempt has finished, either way.
    tried: AtomicBool,
    /// Rung by [`UpstreamClient`] when the backend reports a list change.
    relist: Arc<Notify>,
    /// Rung when a call saw the connection fail, to reconnect without waiting out the backoff.
    suspect: Notify,
    /// Shared with every backend: bumped on any listing or connection change.
    changes: watch::Sender<u64>,
    /// Server-to-client traffic (notifications, requests) relayed to the gateway's sessions.
    relay: Arc<dyn client::Relay>,
    /// One HTTP client for the gateway's connection and every per-client session: building one
    /// loads the TLS roots, which costs tens of KiB and a millisecond or so each time.
    http: std::sync::OnceLock<reqwest::Client>,
    /// Unique in the process: tells this backend from a later one of the same name.
    pub(crate) instance: u64,
    /// Cancelled when the gateway stops or a reload removes or replaces this backend: its
    /// supervisor, health probes and per-client sessions end; calls under way finish.
    retired: CancellationToken,
    /// The gateway's registry of stdio process groups.
    groups: children::Groups,
    /// The last failed connection attempt, and when (for `/status`).
    last_error: std::sync::Mutex<Option<(String, std::time::SystemTime)>>,
    /// A stdio backend: the child of the gateway's own connection, to tell how it ended.
    child: std::sync::Mutex<Option<Arc<child::ChildStory>>>,
    /// The gateway's own connection failed its last attempt (a child's stderr is then quiet).
    failing: AtomicBool,
    /// `auth = "token_exchange"`: each caller's token for this backend.
    pub(crate) exchanger: Option<Arc<exchange::Exchanger>>,
    /// `auth = "oauth"`: the user's grant, carried by every connection.
    grant: Option<Arc<oauth::Grant>>,
    /// The last connection attempt failed for want of a login: what to run.
    login_needed: std::sync::Mutex<Option<oauth::NeedsLogin>>,
    /// `idle_stop`: the shared connection's use, and the backend asleep (`sleep`).
    sleep: sleep::Sleep,
}

/// Follows a backend's redirect only when it keeps the message and the credentials where they
/// were sent: a 307 or 308 to the same origin, a few hops at most. Anything else comes back as
/// the redirect itself, and the call fails saying so.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    const MAX_HOPS: usize = 5;
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        let same_origin = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_HOPS {
            attempt.error(format!("more than {MAX_HOPS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

impl Backend {
    fn new(
        config: BackendConfig,
        changes: watch::Sender<u64>,
        relay: Arc<dyn client::Relay>,
        retired: CancellationToken,
        groups: children::Groups,
    ) -> Arc<Self> {
        Arc::new(Self {
            groups,
            instance: session::next_conn(),
            retired,
            last_error: Default::default(),
            child: Default::default(),
            failing: AtomicBool::new(false),
            shared: ArcSwapOption::empty(),
            instances: Arc::new(Semaphore::new(config.max_instances)),
            client_sessions: Default::default(),
            listing: ArcSwap::from_pointee(Listing::default()),
            tried: AtomicBool::new(false),
            relist: Arc::new(Notify::new()),
            suspect: Notify::new(),
            changes,
            relay,
            http: std::sync::OnceLock::new(),
            exchanger: config.token_exchange.clone().map(|t| Arc::new(exchange::Exchanger::new(t))),
            login_needed: Default::default(),
            sleep: sleep::Sleep::new(config.idle_stop),
            grant: match (&config.oauth, &config.transport) {
                (Some(_), Transport::Http { url, .. }) => Some(Arc::new(oauth::Grant::new(&config.name, url))),
                _ => None,
            },
            config,
        })
    }

    fn http_client(&self) -> anyhow::Result<reqwest::Client> {
        if let Some(c) = self.http.get() {
            return Ok(c.clone());
        }
        let client = reqwest::Client::builder()
            // rmcp's own choice: a pooled connection whose last answer was not read to the end
            // stalls the next request for a delayed ACK.
            .pool_max_idle_per_host(0)
            .redirect(same_origin_redirects())
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build an HTTP client: {e}"))?;
        Ok(self.http.get_or_init(|| client).clone())
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn is_connected(&self) -> bool {
        self.shared.load().is_some()
    }

    /// Whether each client session gets a backend session of its own: configured `per_client`,
    /// and the backend speaks a revision that has sessions (a 2026-07-28 backend keeps no
    /// per-session state, so its shared connection serves everyone alike).
    pub fn per_client(&self) -> bool {
        self.config.session == SessionMode::PerClient
            && (self.carries_identity()
                || match self.peer().and_then(|p| p.peer_info()) {
                    Some(info) => info.protocol_version.has_initialize(),
                    None => self.config.protocol != Protocol::Stateless,
                })
    }

    /// Whether what it is sent carries the caller's identity (a header with `${client.…}`, or
    /// a token exchanged for the caller's): then each client needs a connection of its own
    /// whatever revision the backend speaks. A backend that negotiates 2026-07-28 under
    /// `protocol = "auto"` would otherwise be served over the gateway's own connection, which
    /// carries no one's identity.
    fn carries_identity(&self) -> bool {
        if self.exchanger.is_some() {
            return true;
        }
        match &self.config.transport {
            Transport::Http { headers, .. } => headers.values().any(|v| crate::config::carries_identity(v)),
            Transport::Stdio { .. } => false,
        }
    }

    fn is_stdio(&self) -> bool {
        matches!(self.config.transport, Transport::Stdio { .. })
    }

    /// Per-client upstream sessions open now, over all client sessions.
    pub fn client_sessions(&self) -> usize {
        self.client_sessions.load(Ordering::Acquire)
    }

    /// The gateway's own connection, for a request that uses it.
    pub fn shared_link(&self) -> Result<Link, CallError> {
        self.shared
            .load_full()
            .map(|l| (*l).clone())
            .ok_or_else(|| CallError::NotConnected { backend: self.name().to_string() })
    }

    /// Stopped after `idle_stop` unused; its listing stays, and a call starts it again
    /// ([`Backend::awake_link`]).
    pub fn is_dormant(&self) -> bool {
        self.sleep.is_dormant()
    }

    /// The gateway's own connection for a call, starting a dormant backend first and waiting
    /// for it until the call's deadline (`timeout`).
    pub async fn awake_link(&self) -> Result<Link, CallError> {
        if !self.sleep.is_dormant() {
            return self.shared_link();
        }
        let mut changes = self.changes.subscribe();
        tracing::info!(backend = self.name(), "a call needs the dormant backend: starting it");
        self.sleep.wake();
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        loop {
            if let Ok(link) = self.shared_link() {
                return Ok(link);
            }
            if !self.sleep.is_dormant() {
                // The supervisor logged why, and /status has it.
                return Err(CallError::WakeFailed { backend: self.name().to_string() });
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return self.shared_link() },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(CallError::Timeout { backend: self.name().to_string(), after: self.config.timeout });
                }
            }
        }
    }

    pub fn was_tried(&self) -> bool {
        self.tried.load(Ordering::Acquire)
    }

    pub fn listing(&self) -> Arc<Listing> {
        self.listing.load_full()
    }

    /// The gateway's own connection's peer, while connected.
    pub fn peer(&self) -> Option<Arc<Peer<RoleClient>>> {
        self.shared.load().as_ref().map(|l| l.peer.clone())
    }

    fn bump(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// The last failed connection attempt's error and when it happened.
    pub fn last_error(&self) -> Option<(String, std::time::SystemTime)> {
        self.last_error.lock().expect("last error").clone()
    }

    /// Whether the backend waits for a login (`auth = "oauth"` with no usable grant), and the
    /// advice that says which command gives it one.
    pub fn needs_login(&self) -> Option<oauth::NeedsLogin> {
        self.login_needed.lock().expect("login flag").clone()
    }

    /// A request was refused for want of a login (a revoked grant, a refused refresh, more
    /// scope): said at once in `/status` and find_tool's `needs_login`, not at the next
    /// connection attempt or health check.
    pub fn login_refused(&self, needs: &oauth::NeedsLogin) {
        tracing::warn!(backend = self.name(), advice = %needs.for_operator(), "the backend refused the grant");
        *self.last_error.lock().expect("last error") = Some((needs.for_operator(), std::time::SystemTime::now()));
        *self.login_needed.lock().expect("login flag") = Some(needs.clone());
    }

    /// Cancelled when this backend is stopped, removed or replaced.
    pub fn retired(&self) -> &CancellationToken {
        &self.retired
    }

    async fn connect(&self) -> anyhow::Result<(RunningService<RoleClient, UpstreamClient>, Listing)> {
        let conn = session::next_conn();
        let handler = UpstreamClient::new(self.name().to_string(), conn, Some(self.relist.clone()), self.relay.clone());
        let service = self.open(handler, None).await?;
        let listing = match list_everything(service.peer()).await {
            Ok(listing) => listing,
            Err(e) => return Err(self.refused(e).await),
        };
        Ok((service, listing))
    }

    /// A connection's failure, as [`oauth::NeedsLogin`] when the backend refused the grant.
    async fn refused(&self, e: anyhow::Error) -> anyhow::Error {
        match &self.grant {
            Some(grant) if oauth::is_auth_refusal(&e) => {
                let why = grant.wanted_scope().unwrap_or_else(|| "the backend refused the grant".into());
                grant.refused(&why).await.into()
            }
            _ => e,
        }
    }

    /// Opens a connection (initialize or discover) with `handler` on the gateway's side, for one
    /// client (`own`: its identity and the adoption state of its session) or (`None`) the
    /// gateway's own. Headers that carry the caller's identity are filled in on every request
    /// of a client's connection, and left out of the gateway's own. Every header is sent as
    /// configured (rmcp's `auth_header` would prefix `Bearer ` to any value).
    async fn open(
        &self,
        mut handler: UpstreamClient,
        own: Option<(&LiveIdentity, Arc<adopt::Adoption>)>,
    ) -> anyhow::Result<RunningService<RoleClient, UpstreamClient>> {
        let service = match &self.config.transport {
            Transport::Http { url, headers, sse: true } => {
                let (fixed, per_caller) = identity::split_headers(headers)?;
                let caller = own.map(|(identity, _)| {
                    identity::CallerHeaders::new(identity.clone(), per_caller, self.exchanger.clone())
                });
                let transport = sse::SseTransport::connect(self.http_client()?, url, fixed, caller)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                handler.serve_with_lifecycle(transport, self.lifecycle()).await?
            }
            Transport::Http { url, headers, sse: false } => {
                use rmcp::transport::StreamableHttpClientTransport;
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let (fixed, per_caller) = identity::split_headers(headers)?;
                let cfg = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(fixed);
                let client = match own {
                    None => adopt::OwnSessionClient::gateways(self.http_client()?),
                    Some((identity, adoption)) => {
                        let caller = identity::CallerHeaders::new(identity.clone(), per_caller, self.exchanger.clone());
                        adopt::OwnSessionClient { inner: self.http_client()?, adoption, caller, grant: None }
                    }
                };
                match &self.grant {
                    None => {
                        let transport = StreamableHttpClientTransport::with_client(client, cfg);
                        handler.serve_with_lifecycle(transport, self.lifecycle()).await?
                    }
                    Some(grant) => {
                        let client = adopt::OwnSessionClient { grant: Some(grant.clone()), ..client };
                        let transport = StreamableHttpClientTransport::with_client(grant.wrap(client).await?, cfg);
                        match handler.serve_with_lifecycle(transport, self.lifecycle()).await {
                            Ok(service) => service,
                            Err(e) => return Err(self.refused(e.into()).await),
                        }
                    }
                }
            }
            Transport::Stdio { command, args, env, cwd } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                crate::descriptors::as_started(&mut cmd);
                let quiet = own.is_none() && self.failing.load(Ordering::Acquire);
                let (transport, story) = child::start(self.name(), command, cmd, quiet)?;
                handler.group = transport.id().and_then(|pid| self.groups.register(pid));
                if own.is_none() {
                    *self.child.lock().expect("child story") = Some(story.clone());
                }
                match handler.serve_with_lifecycle(transport, self.lifecycle()).await {
                    Ok(service) => service,
                    Err(e) => {
                        let e = anyhow::Error::from(e);
                        return Err(match story.words().await {
                            Some(why) => e.context(words::Told(why)),
                            None => e,
                        });
                    }
                }
            }
        };
        Ok(service)
    }

    fn lifecycle(&self) -> rmcp::ClientLifecycleMode {
        use rmcp::ClientLifecycleMode as L;
        match self.config.protocol {
            Protocol::Session => L::Initialize,
            Protocol::Stateless => L::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
            Protocol::Auto => L::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
        }
    }

    /// Whether the live connection speaks a revision without sessions (2026-07-28 or later).
    pub fn is_stateless(&self) -> bool {
        self.peer().and_then(|p| p.peer_info()).is_some_and(|i| !i.protocol_version.has_initialize())
    }

    fn other_kind_of_result(&self) -> CallError {
        tracing::warn!(backend = self.name(), "the backend answered with another kind of result");
        CallError::ConnectionLost { backend: self.name().to_string() }
    }

    /// Tells the supervisor a call saw the connection fail.
    pub fn mark_suspect(&self) {
        self.suspect.notify_one();
    }

    /// A failed request's error. A connection that failed is dropped: the gateway's own is
    /// reconnected at once, a client's own session is opened afresh by its next request.
    fn map_error(&self, link: &Link, e: ServiceError) -> CallError {
        let backend = self.name().to_string();
        match e {
            ServiceError::McpError(error) => CallError::Remote { backend, error },
            ServiceError::Timeout { timeout } => CallError::Timeout { backend, after: timeout },
            ServiceError::Cancelled { .. } => CallError::Cancelled,
            // Refused for want of scope: the session is fine, this call needs a new login.
            other if self.grant.is_some() && oauth::is_refused_request(&other) => {
                let why = self.grant.as_ref().and_then(|g| g.wanted_scope());
                let needs = oauth::NeedsLogin::new(self.name(), why);
                self.login_refused(&needs);
                CallError::NeedsLogin(needs)
            }
            other => {
                match &link.own {
                    Some(conn) => conn.closed.cancel(),
                    None => self.mark_suspect(),
                }
                let error = crate::redact::urls(&other.to_string());
                tracing::warn!(%backend, %error, "a request to the backend failed on its connection");
                CallError::ConnectionLost { backend }
            }
        }
    }

    /// Runs `f` on `link` with the backend's timeout, giving up if `ct` fires. Giving up drops
    /// `f`'s request future, and rmcp's client requests send the backend
    /// `notifications/cancelled` when dropped unanswered: abandoned reads, prompts, completions
    /// and task requests end at the backend too (`an_abandoned_resource_read_is_cancelled_at_the_backend`).
    async fn forward<T, F, Fut>(&self, link: &Link, ct: &CancellationToken, f: F) -> Result<T, CallError>
    where
        F: FnOnce(Arc<Peer<RoleClient>>) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let _in_use = link.using();
        let _busy = (!link.is_own()).then(|| self.sleep.using());
        let timeout = self.config.timeout;
        tokio::select! {
            _ = ct.cancelled() => Err(CallError::Cancelled),
            r = tokio::time::timeout(timeout, f(link.peer.clone())) => match r {
                Err(_) => Err(CallError::Timeout { backend: self.name().to_string(), after: timeout }),
                Ok(Ok(r)) => {
                    self.answered();
                    Ok(r)
                }
                Ok(Err(e)) => Err(self.map_error(link, e)),
            },
        }
    }

    /// A request was answered, so the backend takes the grant: if it waited for a login, someone
    /// gave it one, and it waits no more (unless a refusal for want of scope still waits for the
    /// login that asks for that scope).
    fn answered(&self) {
        let Some(grant) = &self.grant else { return };
        let mut needed = self.login_needed.lock().expect("login flag");
        if needed.is_some() && grant.settled() {
            tracing::info!(backend = self.name(), "the backend takes the grant again");
            *needed = None;
        }
    }

    /// Forwards a tool call. rmcp gives every outgoing request an id and a progress token of its
    /// own; `on_sent` learns both as soon as the request is queued, so that what the backend
    /// sends during the call (progress, sampling, elicitation) can be routed back to the caller.
    /// A call given up (timeout, client cancellation) is cancelled at the backend.
    ///
    /// `client` is what the calling client declared it can do: a 2026-07-28 backend is told
    /// exactly that with this request, not what the gateway itself could relay. (A 2025-11-25
    /// backend learnt the gateway's capabilities once, at initialize.)
    pub async fn call_tool(
        &self,
        link: &Link,
        params: CallToolRequestParams,
        client: Option<ClientCapabilities>,
        trace: &Trace,
        ct: &CancellationToken,
        on_sent: impl FnOnce(&RequestId, &ProgressToken),
    ) -> Result<Answer<CallToolResult>, CallError> {
        let backend = self.name().to_string();
        let _in_use = link.using();
        let _busy = (!link.is_own()).then(|| self.sleep.using());
        let peer = link.peer.clone();
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut options = PeerRequestOptions::no_options();
        // Merged over what rmcp stamps on every request.
        let mut meta = RequestMetaObject::default();
        if peer.peer_info().is_some_and(|i| !i.protocol_version.has_initialize()) {
            meta.set_client_capabilities(client.unwrap_or_default());
        }
        trace.apply(&mut meta);
        if !meta.is_empty() {
            options.meta = Some(meta);
        }
        let handle = peer.send_request_with_option(request, options).await.map_err(|e| self.map_error(link, e))?;
        on_sent(&handle.id, &handle.progress_token);
        // From here until an answer, the backend is working for us: a call abandoned on the way
        // (its client gone, its parked wait expired, the gateway stopping) tells it so.
        let mut outstanding = Outstanding { peer: peer.clone(), id: Some(handle.id.clone()) };
        let timeout = self.config.timeout;
        let outcome = tokio::select! {
            _ = ct.cancelled() => Err(CallError::Cancelled),
            r = tokio::time::timeout(timeout, handle.await_response()) => match r {
                Err(_) => Err(CallError::Timeout { backend: backend.clone(), after: timeout }),
                Ok(r) => r.map_err(|e| self.map_error(link, e)),
            },
        };
        if !matches!(outcome, Err(CallError::Cancelled | CallError::Timeout { .. })) {
            // Answered (with a result or an error), or the connection is gone.
            outstanding.answered();
        }
        if outcome.is_ok() {
            self.answered();
        }
        match outcome {
            Ok(ServerResult::CallToolResult(r)) => Ok(Answer::Complete(r)),
            Ok(ServerResult::InputRequiredResult(r)) => Ok(Answer::InputRequired(r)),
            Ok(ServerResult::CreateTaskResult(r)) => Ok(Answer::Task(r)),
            Ok(ServerResult::EmptyResult(_)) => Ok(Answer::Complete(CallToolResult::success(Vec::new()))),
            Ok(_) => Err(self.other_kind_of_result()),
            Err(e @ (CallError::Cancelled | CallError::Timeout { .. })) => {
                let reason = if matches!(e, CallError::Cancelled) {
                    "cancelled by the client"
                } else {
                    "timed out at the gateway"
                };
                outstanding.cancel(reason).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    pub async fn read_resource(
        &self,
        link: &Link,
        params: ReadResourceRequestParams,
        ct: &CancellationToken,
    ) -> Result<Answer<ReadResourceResult>, CallError> {
        match self.forward(link, ct, |p| async move { p.read_resource_once(params).await }).await? {
            ReadResourceResponse::Complete(r) => Ok(Answer::Complete(r)),
            ReadResourceResponse::InputRequired(r) => Ok(Answer::InputRequired(r)),
            _ => Err(self.other_kind_of_result()),
        }
    }

    pub async fn get_prompt(
        &self,
        link: &Link,
        params: GetPromptRequestParams,
        ct: &CancellationToken,
    ) -> Result<Answer<GetPromptResult>, CallError> {
        match self.forward(link, ct, |p| async move { p.get_prompt_once(params).await }).await? {
            GetPromptResponse::Complete(r) => Ok(Answer::Complete(r)),
            GetPromptResponse::InputRequired(r) => Ok(Answer::InputRequired(r)),
            _ => Err(self.other_kind_of_result()),
        }
    }

    /// `tasks/get` for a task this backend created (its own id in `params`).
    pub async fn get_task(
        &self,
        link: &Link,
        params: GetTaskParams,
        ct: &CancellationToken,
    ) -> Result<GetTaskResult, CallError> {
        self.forward(link, ct, |p| async move { p.get_task(params).await }).await
    }

    /// `tasks/update`: the client's answers to a task's input requests.
    pub async fn update_task(
        &self,
        link: &Link,
        params: UpdateTaskParams,
        ct: &CancellationToken,
    ) -> Result<(), CallError> {
        self.forward(link, ct, |p| async move { p.update_task(params).await }).await
    }

    /// `tasks/cancel`: asks the backend to stop a task (cooperative: it settles as it decides).
    pub async fn cancel_task(
        &self,
        link: &Link,
        params: CancelTaskParams,
        ct: &CancellationToken,
    ) -> Result<(), CallError> {
        self.forward(link, ct, |p| async move { p.cancel_task(params).await }).await
    }

    pub async fn complete(
        &self,
        link: &Link,
        params: CompleteRequestParams,
        ct: &CancellationToken,
    ) -> Result<CompleteResult, CallError> {
        self.forward(link, ct, |p| async move { p.complete(params).await }).await
    }

    #[expect(deprecated, reason = "resources/subscribe is how 2025-11-25 clients subscribe")]
    pub async fn subscribe(
        &self,
        link: &Link,
        params: SubscribeRequestParams,
        ct: &CancellationToken,
    ) -> Result<(), CallError> {
        self.forward(link, ct, |p| async move { p.subscribe(params).await }).await
    }

    #[expect(deprecated, reason = "resources/unsubscribe is how 2025-11-25 clients unsubscribe")]
    pub async fn unsubscribe(
        &self,
        link: &Link,
        params: UnsubscribeRequestParams,
        ct: &CancellationToken,
    ) -> Result<(), CallError> {
        self.forward(link, ct, |p| async move { p.unsubscribe(params).await }).await
    }

    /// One health probe on the gateway's own connection: `ping`, or on a 2026-07-28 connection
    /// (which has none) a raw `tools/list`. Both go to the backend: rmcp's `list_tools` helper
    /// may answer from its response cache, which would call a dead backend healthy.
    pub async fn probe(&self, timeout: Duration) -> Result<Duration, CallError> {
        let start = tokio::time::Instant::now();
        let link = self.shared_link()?;
        let request = if self.is_stateless() {
            ClientRequest::ListToolsRequest(Default::default())
        } else {
            ClientRequest::PingRequest(Default::default())
        };
        let outcome = match tokio::time::timeout(timeout, link.peer.send_request(request)).await {
            Err(_) => Err(CallError::Timeout { backend: self.name().to_string(), after: timeout }),
            Ok(Err(e)) => Err(self.map_error(&link, e)),
            Ok(Ok(_)) => {
                self.answered();
                Ok(start.elapsed())
            }
        };
        if outcome.is_err() {
            self.mark_suspect();
        }
        outcome
    }
}

pub use client::{NoRelay, Relay, Source, request_name};
