//! Tenants stay apart, as a property: a seeded random walk drives three principals through
//! sessions (2025-11-25) and session-less requests (2026-07-28), in passthrough and optimizer
//! mode, over a stateful `per_client` backend and two others (again with that backend on the
//! 2026-07-28 revision and `[groups]` on, the clients declaring groups, and again on two
//! replicas sharing one Redis, each session and each session-less request on either), with
//! policy reloads between steps, and after every step checks what the answer may hold:
//! - the walk starts from a random restricted policy, with tool-level rules (a principal may be
//!   denied github's `create_*` tools, which also takes github's resources and prompts away);
//! - no tool outside the caller's current scope, and every tool inside it reachable: tools/list
//!   (in passthrough the caller's backends exactly; a client of groups gets github's tools top
//!   level), a call of a tool in or out of scope (answered or refused, in every mode), find_tool
//!   (never empty for a request aimed at a backend the caller may use);
//! - resources and prompts only of backends the caller may use whole, all of them;
//! - no backend state but the caller's own (what `recall` returns is what this caller, in this
//!   session or as this session-less principal, last remembered);
//! - a backend's sampling request reaches the client whose call made it, and its log line that
//!   client alone, never another session;
//! - no task but the caller's own, and none whose tool the caller may no longer use; a
//!   cancel by anyone else is refused as for a task that does not exist, and the task goes on;
//! - no group but of the caller's own backends, and no group's tools outside its scope;
//! - no backend waiting for a login named to a caller that may not use it (find_tool's
//!   `needs_login`), and the one waiting named to every caller that may;
//! - in the operator console's views (tools, overview, playground): exactly the backends the
//!   caller may use, no tool outside the scope, no other principal, no search of another
//!   principal's scope, and a search that finds something when the scope has what it asks for;
//! - `[[limits]]`: each principal has a quota of jira calls of its own, spent alike by its
//!   sessions and its session-less requests; one principal's calls never spend another's, and
//!   the call past the quota is refused naming the limit;
//! - `[results]`: a result cut to the walk's small limit is kept for the principal that made
//!   the call, who reads it back (through read_result and `resources/read`, from any of its
//!   sessions or none); every other principal is told it does not exist;
//! - learning from use (optimizer mode with the real model, one replica): one principal's
//!   labels alone never change another principal's find_tool ranking.
//!
//! `TOOLMUX_TENANT_SEED=N` replays one walk; `TOOLMUX_TENANT_STEPS=N` makes each walk longer
//! (CI runs a bounded number of steps). A failure prints the seed and the step.

#![allow(deprecated, reason = "sampling and logging are what 2025-11-25 clients use")]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rmcp::model::{
    CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig, ClientRequest, CustomRequest, GetTaskParams,
    Implementation, ServerResult, TaskStatus,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice};
use toolmux::embed::Embedder;

use crate::harness::*;

mod learning;
mod scope;
mod state;

/// A client that declares the tasks and groups extensions and sampling: it answers a sampling
/// request as itself, and keeps the log messages it is sent.
#[derive(Clone, Default)]
struct Tenant {
    /// Who it is, e.g. `alice#1`.
    name: String,
    logs: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ClientHandler for Tenant {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::builder().enable_tasks().enable_sampling().build();
        let mut extensions = caps.extensions.take().unwrap_or_default();
        extensions.insert("io.modelcontextprotocol/groups".into(), Default::default());
        caps.extensions = Some(extensions);
        ClientConfig::new(caps, Implementation::new("tenant", "1"))
    }

    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _c: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let asked = serde_json::to_value(&params.messages[0].content).unwrap()["text"].clone();
        let answer = format!("{} answers {}", self.name, asked.as_str().unwrap_or_default());
        Ok(rmcp::model::CreateMessageResult::new(rmcp::model::SamplingMessage::assistant_text(answer), "m".into()))
    }

    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _c: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params.data.as_str().unwrap_or_default().to_string());
    }
}

type TaskClient = RunningService<RoleClient, Tenant>;

/// The backend `kit` (testkit) as one walk has it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    /// 2025-11-25, a backend session per client (`per_client`), no groups.
    Sessions,
    /// 2026-07-28 (no backend sessions: its state is not per caller, so the walk does not
    /// remember through it), with `[groups]` on.
    StatelessWithGroups,
    /// As `Sessions`, on two replicas sharing one Redis: each session is opened on either, each
    /// session-less request and console view goes to either, reloads reach both.
    Replicas,
}

const PRINCIPALS: [&str; 3] = ["alice", "bob", "carol"];
const BACKENDS: [&str; 3] = ["kit", "github", "jira"];
/// An `auth = "oauth"` backend no one has logged in to: it has no tools, only a login to ask for.
const LOCKED: &str = "tracker";

/// Who is asking: a principal's session (by its index among that principal's sessions), or the
/// principal without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Who {
    Session(usize, usize),
    Sessionless(usize),
}

impl Who {
    fn principal(self) -> usize {
        match self {
            Who::Session(p, _) | Who::Sessionless(p) => p,
        }
    }
}

struct Walk {
    mode: &'static str,
    variant: Variant,
    base: String,
    app: App,
    /// The second replica, in [`Variant::Replicas`].
    replica: Option<App>,
    /// The replica each session was opened on (0: `app`, 1: `replica`), and the one the last
    /// client was taken from.
    opened_on: HashMap<(usize, usize), usize>,
    last_replica: usize,
    rng: StdRng,
    /// Backends with tools each principal may use now.
    allowed: [BTreeSet<&'static str>; 3],
    /// Whether each principal may use [`LOCKED`] now.
    locked: [bool; 3],
    /// Whether each principal is denied github's `create_*` tools now (a tool-level rule).
    no_create: [bool; 3],
    sessions: HashMap<(usize, usize), Arc<TaskClient>>,
    /// What `kit` remembers for each caller on each replica, as far as the walk knows (replicas
    /// share no backend session of a session-less caller: each opens its own).
    remembered: HashMap<(Who, usize), String>,
    /// Tasks made: id, who made it, whether it cancelled it.
    tasks: Vec<(String, Who, bool)>,
    /// Tasks nobody may read any more: revoked, or their session ended.
    dead: Vec<String>,
    /// jira calls each principal made within its [`QUOTA`].
    spent: [usize; 3],
    /// Results cut and kept: id, and the principal that made the call.
    kept: Vec<(String, usize)>,
    step: usize,
    seed: u64,
    /// Labels the teach step made, and how many of its checks held a ranking to be unchanged.
    taught: u64,
    teach_checks: usize,
}

/// Each principal's jira calls per hour (`[[limits]]` named `walk`).
const QUOTA: usize = 2;

impl Walk {
    async fn start(
        mode: &'static str,
        variant: Variant,
        seed: u64,
        kit: &HttpBackend,
        others: &[HttpBackend],
        redis: &crate::redis_server::Redis,
    ) -> Self {
        let mut base = format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n[results]\nmax_tokens = 250\n");
        if variant == Variant::Replicas {
            // A prefix of the walk's own: the quotas and kept results of one walk are not another's.
            base += &format!(
                "[sessions]\nstore = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"walk-{mode}-{seed}:\"\n",
                redis.url()
            );
        }
        if variant == Variant::StatelessWithGroups {
            // A client of groups still lists github's tools itself: its tools/list has something
            // to check.
            base += "[groups]\nenabled = true\ntop_level = [\"github_*\"]\n";
        }
        base += &bearer_tokens(&PRINCIPALS);
        base += &http_backend_toml("kit", &kit.url);
        if variant == Variant::StatelessWithGroups {
            base += "protocol = \"2026-07-28\"\n";
        }
        for (name, b) in ["github", "jira"].iter().zip(others) {
            base += &http_backend_toml(name, &b.url);
        }
        // Nothing listens there; the grant file is named after this URL, so no grant exists.
        base += &http_backend_toml(LOCKED, "http://127.0.0.1:9/tenant-walk/mcp");
        base += "auth = \"oauth\"\n";
        base += &format!(
            "[[limits]]\nname = \"walk\"\nprincipals = [\"*\"]\nbackends = [\"jira\"]\ncalls_per_hour = {QUOTA}\n"
        );
        // From the first step on, each principal may use only part of the catalog.
        let mut rng = StdRng::seed_from_u64(seed);
        let (allowed, locked, no_create) = draw(&mut rng);
        let config = base.clone() + &policy(&allowed, &locked, &no_create);
        // The real model where the walk teaches (optimizer mode, one replica): learning needs
        // request vectors. Keyword search elsewhere.
        let embedder = match (mode, variant) {
            ("optimizer", Variant::Sessions | Variant::StatelessWithGroups) => EmbedderChoice::Given(model()),
            _ => EmbedderChoice::None,
        };
        let app = gateway(&config, embedder).await;
        let replica = match variant {
            Variant::Replicas => Some(gateway(&config, EmbedderChoice::None).await),
            _ => None,
        };
        Self {
            mode,
            variant,
            base,
            app,
            replica,
            opened_on: HashMap::new(),
            last_replica: 0,
            rng,
            allowed,
            locked,
            no_create,
            sessions: HashMap::new(),
            remembered: HashMap::new(),
            tasks: Vec::new(),
            dead: Vec::new(),
            spent: [0; 3],
            kept: Vec::new(),
            step: 0,
            seed,
            taught: 0,
            teach_checks: 0,
        }
    }

    fn at(&self) -> String {
        format!("{} mode, {:?}, seed {}, step {}", self.mode, self.variant, self.seed, self.step)
    }

    /// A replica at random (the only one but in [`Variant::Replicas`]): its index and itself.
    fn some_replica(&mut self) -> (usize, &App) {
        let second = self.replica.is_some() && self.rng.random_bool(0.5);
        match (second, &self.replica) {
            (true, Some(r)) => (1, r),
            _ => (0, &self.app),
        }
    }

    /// A client for `who`: its session (opened on a replica at random), or a new session-less
    /// connection of its principal to a replica at random.
    async fn client(&mut self, who: Who) -> Arc<TaskClient> {
        match who {
            Who::Session(p, i) => {
                if !self.sessions.contains_key(&(p, i)) {
                    let (at, app) = self.some_replica();
                    let c = open_session(app, PRINCIPALS[p], &format!("{}#{i}", PRINCIPALS[p])).await;
                    self.sessions.insert((p, i), Arc::new(c));
                    self.opened_on.insert((p, i), at);
                }
                self.last_replica = self.opened_on[&(p, i)];
                self.sessions[&(p, i)].clone()
            }
            Who::Sessionless(p) => {
                let tenant = Tenant { name: PRINCIPALS[p].to_string(), ..Tenant::default() };
                let (at, app) = self.some_replica();
                let c = Arc::new(stateless_client(app, tenant, Some(PRINCIPALS[p])).await);
                self.last_replica = at;
                c
            }
        }
    }

    fn pick(&mut self) -> Who {
        let p = self.rng.random_range(0..PRINCIPALS.len());
        match self.rng.random_bool(0.5) {
            true => Who::Session(p, self.rng.random_range(0..2)),
            false => Who::Sessionless(p),
        }
    }

    async fn step(&mut self) {
        self.step += 1;
        let who = self.pick();
        match self.rng.random_range(0..100) {
            0..16 if self.variant != Variant::StatelessWithGroups => self.remember(who).await,
            16..32 if self.variant != Variant::StatelessWithGroups => self.recall(who).await,
            32..40 if self.variant != Variant::StatelessWithGroups => self.ask_and_log(who).await,
            0..40 => self.groups(who).await,
            40..50 => self.list(who).await,
            50..55 => self.parts(who).await,
            55..58 => self.find(who).await,
            58..61 => self.teach(who).await,
            61..65 => self.console(who.principal()).await,
            65..73 => self.make_task(who).await,
            73..84 => self.follow_task(who).await,
            84..88 => self.spend(who).await,
            88..90 => self.keep(who).await,
            90..92 => self.read_kept(who).await,
            92..97 => self.reload().await,
            _ => self.end_session(who).await,
        }
    }

    /// Calls `tool` (a passthrough name) as the mode exposes it.
    async fn call(&self, c: &TaskClient, tool: &str, args: Value) -> rmcp::model::CallToolResult {
        match self.mode {
            "optimizer" => call(c, "call_tool", json!({"tool_name": tool, "parameters": args})).await,
            _ => match c.call_tool(params(tool, args)).await {
                Ok(r) => r,
                // Passthrough refuses a tool outside the scope as invalid params.
                Err(ServiceError::McpError(e)) if e.code.0 == -32602 => {
                    rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(e.message)])
                }
                Err(e) => panic!("{}: {tool}: {e}", self.at()),
            },
        }
    }

    async fn reload(&mut self) {
        (self.allowed, self.locked, self.no_create) = draw(&mut self.rng);
        let rules = policy(&self.allowed, &self.locked, &self.no_create);
        let config = toolmux::config::Config::parse(&(self.base.clone() + &rules)).unwrap();
        self.app.reload(config.clone()).await;
        if let Some(r) = &self.replica {
            r.reload(config).await;
        }
    }

    async fn end_session(&mut self, who: Who) {
        let Who::Session(p, i) = who else { return };
        if let Some(c) = self.sessions.remove(&(p, i)) {
            // The walk's steps are sequential: nothing else holds the session when it ends, and
            // its close must succeed (a close that fails would leave it open behind the walk).
            let c =
                Arc::try_unwrap(c).unwrap_or_else(|_| panic!("{}: the session is still in use as it ends", self.at()));
            c.cancel().await.unwrap_or_else(|e| panic!("{}: the session did not close: {e}", self.at()));
            // The next session of that slot starts afresh: its backend session is a new one,
            // and the old session's tasks are nobody's.
            self.remembered.retain(|(w, _), _| *w != who);
            let ended: Vec<String> =
                self.tasks.iter().filter(|(_, w, _)| *w == who).map(|(id, _, _)| id.clone()).collect();
            for id in ended {
                self.kill(&id);
            }
        }
    }
}

fn params(tool: &str, args: Value) -> rmcp::model::CallToolRequestParams {
    rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(args.as_object().unwrap().clone())
}

/// A random policy: for each principal the backends it may use, whether it may use [`LOCKED`],
/// and whether it is denied github's `create_*` tools.
fn draw(rng: &mut StdRng) -> ([BTreeSet<&'static str>; 3], [bool; 3], [bool; 3]) {
    let mut backends = || BACKENDS.into_iter().filter(|_| rng.random_bool(0.7)).collect::<BTreeSet<_>>();
    let allowed = [backends(), backends(), backends()];
    let locked = [rng.random_bool(0.7), rng.random_bool(0.7), rng.random_bool(0.7)];
    let no_create = [rng.random_bool(0.3), rng.random_bool(0.3), rng.random_bool(0.3)];
    (allowed, locked, no_create)
}

/// One `[[policy]]` per principal, allowing exactly its backends and, when `locked` says so,
/// [`LOCKED`] (none: a rule denying all); and, where `no_create` says so, one denying github's
/// `create_*` tools.
fn policy(allowed: &[BTreeSet<&'static str>; 3], locked: &[bool; 3], no_create: &[bool; 3]) -> String {
    let mut toml = String::new();
    for (p, denied) in PRINCIPALS.iter().zip(no_create) {
        if *denied {
            toml += &format!(
                "[[policy]]\nprincipals = [\"{p}\"]\nbackends = [\"github\"]\ntools = [\"create_*\"]\neffect = \"deny\"\n"
            );
        }
    }
    for ((p, backends), locked) in PRINCIPALS.iter().zip(allowed).zip(locked) {
        let mut list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
        if *locked {
            list.push(format!("\"{LOCKED}\""));
        }
        toml += &match list.is_empty() {
            true => format!("[[policy]]\nprincipals = [\"{p}\"]\nbackends = [\"*\"]\neffect = \"deny\"\n"),
            false => format!("[[policy]]\nprincipals = [\"{p}\"]\nbackends = [{}]\n", list.join(", ")),
        };
    }
    toml
}

async fn open_session(app: &App, token: &str, name: &str) -> TaskClient {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let cfg = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_string());
    let tenant = Tenant { name: name.to_string(), ..Tenant::default() };
    tenant.serve(StreamableHttpClientTransport::from_config(cfg)).await.expect("client connects")
}

/// A request of the groups extension, as the client sends it.
async fn custom(c: &TaskClient, method: &str, params: Value) -> Result<Value, ServiceError> {
    let request = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
    match c.peer().send_request(request).await? {
        ServerResult::CustomResult(r) => Ok(r.0),
        other => panic!("{method}: {other:?}"),
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_stay_apart_on_a_random_walk() {
    let steps = env("TOOLMUX_TENANT_STEPS").unwrap_or(120) as usize;
    let seeds: Vec<u64> = match env("TOOLMUX_TENANT_SEED") {
        Some(seed) => vec![seed],
        None => vec![rand::random(), rand::random()],
    };
    let kit = http_backend("testkit").await;
    let others = [http_backend("github").await, http_backend("jira").await];
    let redis = crate::redis_server::Redis::start().await;
    let mut total = 0;
    let mut taught = 0;
    for seed in seeds {
        for (mode, variant) in [
            ("passthrough", Variant::Sessions),
            ("optimizer", Variant::Sessions),
            ("passthrough", Variant::StatelessWithGroups),
            ("optimizer", Variant::StatelessWithGroups),
            ("passthrough", Variant::Replicas),
            ("optimizer", Variant::Replicas),
        ] {
            println!("tenant walk: {mode} mode, {variant:?}, seed {seed} (replay with TOOLMUX_TENANT_SEED={seed})");
            let mut walk = Walk::start(mode, variant, seed, &kit, &others, &redis).await;
            if mode == "optimizer" && variant != Variant::Replicas {
                walk.seed_learning().await;
            }
            for _ in 0..steps {
                walk.step().await;
            }
            if walk.teach_checks > 0 {
                println!("tenant walk: {} labels taught, {} rankings held", walk.taught, walk.teach_checks);
            }
            total += walk.step;
            taught += walk.taught;
            walk.app.shutdown().await;
            if let Some(r) = walk.replica {
                r.shutdown().await;
            }
        }
    }
    println!("tenant walk: {total} steps ran clean");
    // The teach step made labels: its checks were not of a learning that never happened.
    assert!(steps < 60 || taught > 0, "no label was ever taught");
}
