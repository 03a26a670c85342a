//! The composition root: builds every part from a [`Config`], owns every long-lived task
//! (backend supervisors, health watchers, the catalog task, the HTTP server), reports readiness,
//! and stops in order: not ready → running calls finish (up to
//! `server.shutdown_grace`) → stop accepting and cancel the rest → end stdio process groups.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog::ledger::Listed;
use crate::catalog::{Catalog, Clash, Listing};
use crate::config::{Config, Mode};
use crate::embed::Embedder;
use crate::embed::cache::{self, VectorCache};
use crate::embed::files;
use crate::embed::worker::ModelEmbedder;
use crate::health::Monitor;
use crate::mcp::Gateway;
use crate::mcp::gateway::Parts;
use crate::mcp::relay::Hub;
use crate::session::Policy;
use crate::session::shared::SharedSessions;
use crate::store::Store;
use crate::store::integrity::Integrity;
use crate::store::learned::Learned;
use crate::upstream::{Backend, Upstream};

mod learning;
mod reload;
pub use reload::Reloaded;

/// How long a stop waits for tasks to finish once everything is cancelled.
const DRAIN: Duration = Duration::from_secs(5);
/// First and longest waits before a catalog build whose texts could not be embedded is retried.
const EMBED_RETRY_START: Duration = Duration::from_secs(1);
const EMBED_RETRY_MAX: Duration = Duration::from_secs(300);
/// How long stdio backends' process groups get between SIGTERM and SIGKILL.
const CHILD_GRACE: Duration = Duration::from_secs(2);

/// Which embedder the store gets.
pub enum EmbedderChoice {
    /// Load the configured model (optimizer mode); none in passthrough mode.
    FromConfig,
    /// Use this one (tests, benchmarks).
    Given(Arc<dyn Embedder>),
    /// Keyword search only.
    None,
}

pub struct Options {
    pub embedder: EmbedderChoice,
    /// Replaces the policy the config's `[[policy]]` rules make.
    pub policy: Option<Arc<dyn Policy>>,
    /// Serve HTTP (false for `toolmux find` and stdio serving).
    pub http: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { embedder: EmbedderChoice::FromConfig, policy: None, http: true }
    }
}

/// A running gateway.
pub struct App {
    pub gateway: Arc<Gateway>,
    /// The bound HTTP address, when serving HTTP.
    pub addr: Option<SocketAddr>,
    clashes: Arc<Mutex<Vec<Clash>>>,
    ct: CancellationToken,
    tasks: TaskTracker,
    /// The configuration in force (a reload replaces what can change live).
    config: Mutex<Config>,
    /// Whether the policy comes from `[[policy]]` (else a test gave one, and a reload keeps it).
    policy_from_config: bool,
    auth_required: bool,
    /// Who may connect; replaced whole by a reload that changes tokens or JWT settings.
    authenticator: Arc<arc_swap::ArcSwap<crate::auth::Authenticator>>,
    /// Ends the JWT key refresh of the authenticator in force.
    key_refresh: Mutex<CancellationToken>,
    /// Cancelled once a stop has finished: backend sessions closed, tasks ended.
    stopped: CancellationToken,
}

/// Loads the configured model, with an error that says what to run when it is missing.
pub fn load_embedder(config: &Config) -> anyhow::Result<Arc<ModelEmbedder>> {
    let roots = files::default_model_roots();
    let files = files::locate(&config.optimizer.model, config.optimizer.model_dir.as_deref(), &roots, true)?;
    let precision = config.optimizer.precision;
    let kernel = crate::simd::int8::choice();
    tracing::info!(
        model = %files.manifest.id,
        source = %files.source,
        simd = crate::simd::path(),
        precision = precision.name(),
        int8_kernel = %kernel.kernel,
        why = %kernel.why,
        "model files verified"
    );
    let batching = crate::embed::worker::Batching::default();
    Ok(Arc::new(ModelEmbedder::start_with(&files, batching, precision)?))
}

impl App {
    pub async fn start(config: Config, opts: Options) -> anyhow::Result<App> {
        let ct = CancellationToken::new();
        let tasks = TaskTracker::new();
        let embedder: Option<Arc<dyn Embedder>> = match opts.embedder {
            EmbedderChoice::FromConfig if config.server.mode == Mode::Optimizer => Some(load_embedder(&config)?),
            EmbedderChoice::FromConfig | EmbedderChoice::None => None,
            EmbedderChoice::Given(e) => Some(e),
        };
        let vector_cache = match &embedder {
            Some(e) => {
                let dir: Option<PathBuf> = config.optimizer.cache_dir.clone().or_else(cache::default_dir);
                match VectorCache::open(dir.as_deref(), e.model_id(), e.dim()) {
                    Ok(c) => Some(c),
                    Err(err) => {
                        tracing::warn!(%err, "vector cache unavailable; vectors kept in memory only");
                        VectorCache::open(None, e.model_id(), e.dim()).ok()
                    }
                }
            }
            None => None,
        };
        let dim = embedder.as_ref().map(|e| e.dim());
        let store = Arc::new(Store::new(embedder, vector_cache));
        // What find_tool learns from use: in optimizer mode, where there is a find_tool. With
        // replicas the store keeps it (see `share_learned`), not a file.
        let replicated = opts.http && matches!(config.sessions.store, crate::config::SessionStore::Redis(_));
        let mut learned = None;
        if let (Some(dim), Mode::Optimizer) = (dim, config.server.mode) {
            let opt = &config.optimizer;
            let file = opt.learning_file.clone().filter(|_| !replicated);
            let l = Arc::new(Learned::open(opt.learning, dim, file.clone()));
            store.set_learned(l.clone());
            if file.is_some() {
                tasks.spawn(learning::keep(l.clone(), ct.clone()));
            }
            learned = Some(l);
        }
        let rules = crate::catalog::ledger::Rules {
            frozen: config.health.freeze_tools,
            trust_first: config.health.trust_first_listing,
        };
        let integrity = Arc::new(Integrity::open(rules, config.health.tool_ledger.clone())?);
        let relay = Hub::new();
        let upstream = Arc::new(Upstream::new(&config.backends, relay.clone(), ct.child_token()));
        let health = Monitor::new(config.health.clone(), &upstream);
        let authenticator = Arc::new(crate::auth::Authenticator::new(&config.auth).await);
        let key_refresh = ct.child_token();
        if let Some(jwt) = authenticator.jwt() {
            tasks.spawn(jwt.run_refresh(key_refresh.clone()));
        }
        let policy_from_config = opts.policy.is_none();
        let auth_required = authenticator.required();
        let policy = opts.policy.unwrap_or_else(|| {
            Arc::new(crate::auth::policy::Rules::new(&config.policy, authenticator.required())) as Arc<dyn Policy>
        });
        let authenticator = Arc::new(arc_swap::ArcSwap::new(authenticator));
        let gateway = Gateway::new(Parts {
            mode: config.server.mode,
            max_tools: config.optimizer.max_tools_to_return,
            find_tool_description: config.optimizer.find_tool_description.clone(),
            pinned: config.optimizer.pinned.clone(),
            answer: config.optimizer.answer,
            integrity,
            groups: config.groups.clone(),
            aggregation: config.aggregation.clone(),
            store: store.clone(),
            upstream: upstream.clone(),
            health: health.clone(),
            policy,
            relay,
            notice_window: config.health.interval,
            limits: config.server.limits.clone(),
            max_query_chars: config.optimizer.max_query_chars,
            local_caller: crate::session::Caller::named(&config.auth.stdio_principal, config.auth.stdio_groups.clone()),
            ct: ct.clone(),
        });
        gateway.set_auth(config.auth.clone());
        gateway.limiter.set_rules(&config.limits);
        gateway.hooks.set(&config.hooks);
        gateway.scrubbing.set(&config.scrub);
        gateway.results.set(&config.results);
        gateway.surfaces.set(&config.surface);
        gateway.set_audit(crate::audit::Audit::start(&config.audit, gateway.metrics.audit.clone())?);

        tasks.spawn(gateway.clone().run_notices(ct.child_token()));
        let clashes = Arc::new(Mutex::new(Vec::new()));
        tasks.spawn(catalog_task(gateway.clone(), clashes.clone(), ct.child_token()));
        if gateway.audit().is_on() {
            tasks.spawn(audit_logins(gateway.clone(), ct.child_token()));
        }

        let mut shared_store = None;
        if opts.http
            && let crate::config::SessionStore::Redis(redis) = &config.sessions.store
        {
            let shared = SharedSessions::new(redis, config.server.limits.session_idle_timeout)?;
            tasks.spawn(shared.clone().run_write_through(ct.child_token()));
            if let Some(learned) = learned.clone().filter(|l| l.is_enabled()) {
                tasks.spawn(learning::share(learned, shared.clone(), ct.child_token()));
            }
            shared_store = Some(shared.clone());
            gateway.limiter.share(shared.clone(), config.sessions.limits_when_unreachable);
            gateway.results.share(shared.clone());
            gateway.share_sessions(shared);
        }
        if let Some(learned) = learned.filter(|l| l.is_enabled()) {
            tasks.spawn(learning::fit_adapter(learned, store.clone(), shared_store, ct.child_token()));
        }
        let addr = if opts.http {
            let listener = tokio::net::TcpListener::bind(config.server.listen)
                .await
                .with_context(|| format!("cannot listen on {} (server.listen)", config.server.listen))?;
            let addr = listener.local_addr()?;
            let router =
                crate::http::router(gateway.clone(), &config.server, (&config.auth, authenticator.clone()), addr, &ct);
            let limits = crate::http::serve::Limits {
                max_connections: config.server.limits.max_connections,
                header_timeout: config.server.limits.header_timeout,
                counters: gateway.metrics.connections.clone(),
            };
            tasks.spawn(crate::http::serve::serve(listener, router, limits, ct.clone()));
            Some(addr)
        } else {
            None
        };
        let app = App {
            gateway,
            addr,
            clashes,
            ct,
            tasks,
            config: Mutex::new(config),
            policy_from_config,
            auth_required,
            authenticator,
            key_refresh: Mutex::new(key_refresh),
            stopped: CancellationToken::new(),
        };
        for b in app.gateway.upstream.backends().iter() {
            app.start_backend(b.clone());
        }
        Ok(app)
    }

    /// Starts `backend`'s supervisor and health probes (they end when it is retired).
    fn start_backend(&self, backend: Arc<Backend>) {
        let gw = &self.gateway;
        self.tasks.spawn(backend.clone().supervise());
        self.tasks.spawn(gw.health.clone().watch_backend(backend, gw.upstream.subscribe()));
    }

    /// Waits until every backend was listed or failed once and the index is built (or `timeout`
    /// passes).
    pub async fn ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.gateway.is_ready() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Name clashes that `manual` conflict resolution could not settle, in the current catalog.
    pub fn clashes(&self) -> Vec<Clash> {
        self.clashes.lock().expect("clashes lock").clone()
    }

    pub fn cancellation(&self) -> CancellationToken {
        self.ct.clone()
    }

    /// Stops at once: what is running is cancelled.
    pub async fn shutdown(self) {
        self.stop(Duration::ZERO).await;
    }

    /// Stops gracefully: `/readyz` turns 503 and new sessions are refused (503) at once; requests
    /// under way get up to `grace` to finish and have their answers delivered; then the listener
    /// closes, the rest is cancelled (backends are sent `notifications/cancelled`), stdio
    /// backends' process groups are ended, and the gateway's tasks are waited for.
    ///
    /// The listener stays open while requests finish, so that a load balancer's readiness probe
    /// sees the 503 and a session can still answer what its running call asks of it.
    pub async fn stop(self, grace: Duration) {
        self.gateway.begin_drain();
        if self.gateway.shared_sessions().is_some_and(|s| s.hands_over_backend_sessions()) {
            // Other replicas take these sessions over: their backend sessions stay open for them.
            self.gateway.upstream.keep_sessions.store(true, std::sync::atomic::Ordering::Release);
        }
        let inflight = &self.gateway.inflight;
        inflight.close();
        if !grace.is_zero() && tokio::time::timeout(grace, inflight.wait()).await.is_err() {
            tracing::warn!(
                running = inflight.len(),
                "cancelling requests still running after {} (server.shutdown_grace)",
                humantime::format_duration(grace)
            );
        }
        self.ct.cancel();
        // Session-less principals' backend sessions close with the gateway, like sessions'.
        self.gateway.sessionless.clear();
        self.tasks.close();
        if tokio::time::timeout(DRAIN, self.tasks.wait()).await.is_err() {
            tracing::warn!("some tasks did not stop within {DRAIN:?}");
        }
        self.gateway.upstream.children().terminate_all(CHILD_GRACE).await;
        // Every line queued is written before the stop is done.
        let gateway = self.gateway.clone();
        let _ = tokio::task::spawn_blocking(move || gateway.audit().close()).await;
        self.stopped.cancel();
    }

    /// Cancelled once a stop has finished (what the gateway held is closed).
    pub fn stopped(&self) -> CancellationToken {
        self.stopped.clone()
    }
}

/// Rebuilds the store when the backends' tools change and tells sessions when their scope may
/// have changed (new generation, or a backend's advertisability flipped). Sole writer of the
/// store's generations.
/// Writes a `login` line in the audit trail each time a backend comes to need a login (its
/// grant refused or revoked) and each time a grant is in use again (after `toolmux login`).
async fn audit_logins(gw: Arc<Gateway>, ct: CancellationToken) {
    let mut backends = gw.upstream.subscribe();
    let mut health = gw.health.subscribe();
    let mut waiting: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
    // A refusal is recorded on the backend at once, with no notice: looked at every few seconds.
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = ct.cancelled() => return,
            r = backends.changed() => if r.is_err() { return },
            r = health.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
        }
        for b in gw.upstream.backends().iter() {
            let needs = b.needs_login();
            let was = waiting.insert(b.name().to_string(), needs.is_some());
            let mut e = match (was, &needs) {
                (Some(false) | None, Some(n)) => {
                    let mut e = crate::audit::Entry::new("login", "operator", "refused");
                    e.detail = Some(n.for_operator());
                    e
                }
                (Some(true), None) => crate::audit::Entry::new("login", "operator", "allowed"),
                _ => continue,
            };
            e.backend = Some(b.name().to_string());
            gw.audit().record(e);
        }
    }
}

async fn catalog_task(gw: Arc<Gateway>, clashes: Arc<Mutex<Vec<Clash>>>, ct: CancellationToken) {
    let mut backends = gw.upstream.subscribe();
    let mut health = gw.health.subscribe();
    let mut ledger = gw.integrity.subscribe();
    let mut first = true;
    // A build that could not embed is retried with backoff: (when, the wait that led there).
    let mut retry: Option<(tokio::time::Instant, Duration)> = None;
    loop {
        // A health flip always changes scopes; a backend change only if it changes the catalog
        // (connections coming and going are health's business).
        let mut scopes_changed = first;
        let mut rebuild = false;
        if !first {
            let retry_at = retry.map(|(at, _)| at);
            tokio::select! {
                _ = ct.cancelled() => return,
                _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)), if retry_at.is_some() => {
                    rebuild = true;
                }
                r = backends.changed() => if r.is_err() { return },
                // An operator accepted held tool changes: the listings go through the ledger again.
                r = ledger.changed() => if r.is_err() { return },
                r = health.changed() => {
                    if r.is_err() { return }
                    scopes_changed = true;
                }
            }
        }
        first = false;
        // Read before the listings: ready means the index covers every backend's first answer.
        let backends = gw.upstream.backends();
        let settled = backends.iter().all(|b| settled(&gw, b));
        // Each listing as the tool ledger lets it through (the replicas' shared one taken first):
        // changes recorded, and held back when tools are frozen.
        share_ledger(&gw).await;
        let listings: Vec<_> = backends
            .iter()
            .map(|b| {
                let listing = b.listing();
                let parts = &listing.parts;
                let listed = Listed {
                    tools: &listing.tools,
                    prompts: &parts.prompts,
                    resources: &parts.resources,
                    templates: &parts.templates,
                };
                let tools = gw.integrity.observe(b.name(), listed);
                gw.integrity.observe_server(b.name(), listing.instructions.as_deref(), listing.about.as_deref());
                (b.name().to_string(), listing, tools)
            })
            .collect();
        let views: Vec<Listing<'_>> =
            listings.iter().map(|(n, l, tools)| Listing { backend: n, tools, server: l.server.as_deref() }).collect();
        let (catalog, found) = Catalog::resolve(&views, &gw.aggregation);
        for c in &found {
            tracing::error!("{c}");
        }
        *clashes.lock().expect("clashes lock") = found;
        let current = gw.store.current();
        if rebuild || current.id == 0 || !same_catalog(&current.catalog, &catalog) {
            let built = gw.store.rebuild(catalog).await;
            scopes_changed = true;
            let failed = built.dense.is_none() && gw.store.embedder().is_some() && !built.catalog.is_empty();
            retry = failed.then(|| {
                let wait = retry.map_or(EMBED_RETRY_START, |(_, w)| (w * 2).min(EMBED_RETRY_MAX));
                tracing::warn!("embedding will be retried in {}", humantime::format_duration(wait));
                (tokio::time::Instant::now() + wait, wait)
            });
        }
        if scopes_changed || !gw.health.enabled() {
            gw.scopes_changed();
        }
        // What this pass saw first reaches the other replicas.
        share_ledger(&gw).await;
        if !gw.is_ready() && settled {
            gw.set_ready();
            tracing::info!(tools = gw.store.current().catalog.len(), "ready");
        }
    }
}

/// Trades tool-ledger entries with the other replicas (`[sessions] store = "redis"`): their
/// baselines and decisions are taken, this replica's new ones written (a baseline only where no
/// replica set one first). With the store unreachable each replica goes by its own ledger.
async fn share_ledger(gw: &Gateway) {
    let Some(store) = gw.shared_sessions() else { return };
    let writes = match store.ledger_fields().await {
        Ok((accepted, held)) => gw.integrity.sync_with(&accepted, &held),
        Err(e) => {
            tracing::warn!(error = %e.0, "the shared tool ledger could not be read: this replica goes by its own");
            return;
        }
    };
    if let Err(e) = store.ledger_write(&writes).await {
        tracing::warn!(error = %e.0, "the shared tool ledger could not be written");
    }
}

/// Whether a backend has given its first answer: its first attempt failed, or it connected,
/// listed and health has ruled on it (at once: a first connection counts as a successful probe),
/// so that a session opened now sees its tools.
fn settled(gw: &Gateway, b: &crate::upstream::Backend) -> bool {
    use crate::health::Status;
    b.was_tried() && (!b.is_connected() || !gw.health.enabled() || gw.health.status(b.name()) != Status::Unknown)
}

fn same_catalog(a: &Catalog, b: &Catalog) -> bool {
    a.len() == b.len()
        && a.tools().iter().zip(b.tools()).all(|(x, y)| x.key == y.key && x.tool == y.tool && x.text == y.text)
}

/// Serves one client over stdin/stdout (for desktop clients that launch their servers).
///
/// A stop (`stop` cancelled) lets running calls finish first, as over HTTP. `started` is given
/// the gateway's stdio process groups once it runs (for a second signal to end them).
pub async fn serve_stdio(
    config: Config,
    stop: CancellationToken,
    started: impl FnOnce(crate::upstream::children::Groups),
    mut reloads: tokio::sync::mpsc::UnboundedReceiver<anyhow::Result<Config>>,
) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let grace = config.server.shutdown_grace;
    let app = App::start(config, Options { http: false, ..Options::default() }).await?;
    started(app.gateway.upstream.children());
    app.ready(Duration::from_secs(60)).await;
    let service = crate::mcp::GatewayHandler::new(app.gateway.clone()).serve(rmcp::transport::stdio()).await?;
    let client = service.cancellation_token();
    let ended = service.waiting();
    tokio::pin!(ended);
    loop {
        tokio::select! {
            _ = &mut ended => break,
            _ = stop.cancelled() => {
                app.gateway.begin_drain();
                app.gateway.inflight.close();
                let _ = tokio::time::timeout(grace, app.gateway.inflight.wait()).await;
                client.cancel();
                let _ = ended.await;
                break;
            }
            Some(next) = reloads.recv() => app.apply_reload(next).await,
        }
    }
    app.shutdown().await;
    Ok(())
}

/// What find_tool would answer an anonymous caller now, as JSON.
pub async fn find(app: &App, query: &str, keywords: Vec<String>) -> serde_json::Value {
    let mut args = serde_json::Map::new();
    args.insert("tool_description".into(), query.into());
    args.insert("tool_keywords".into(), keywords.into());
    let snap = app.gateway.scope_for(&crate::session::Caller::anonymous());
    let handler = crate::mcp::GatewayHandler::new(app.gateway.clone());
    let (r, _) = handler.find_tool(Some(&args), &snap).await;
    r.structured_content.unwrap_or_else(|| serde_json::json!({"error": format!("{:?}", r.content)}))
}

/// Starts every built-in demo backend on a free loopback port and the gateway in front of them.
pub async fn demo(listen: &str, mode: &str) -> anyhow::Result<App> {
    let servers = CancellationToken::new();
    let mut toml = format!("[server]\nlisten = \"{listen}\"\nmode = \"{mode}\"\n");
    for b in crate::demo::backends() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        toml.push_str(&format!("[[backends]]\nname = \"{}\"\nurl = \"http://{addr}/mcp\"\n", b.name));
        tokio::spawn(crate::demo::serve_http(b, listener, servers.child_token()));
    }
    let config = Config::parse(&toml)?;
    let app = App::start(config, Options::default()).await?;
    // The demo's backends stop after the gateway: its backend sessions are closed (DELETE)
    // while the backends still answer.
    let stopped = app.stopped();
    tokio::spawn(async move {
        stopped.cancelled().await;
        servers.cancel();
    });
    Ok(app)
}
