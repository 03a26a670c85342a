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

/// The requests the teach step asks, each with the tool it is aimed at.
const TEACH: [(&str, &str); 4] = [
    ("create an issue in a repository", "github_create_issue"),
    ("remember a value", "kit_remember"),
    ("create a ticket in a tracker project", "jira_create_ticket"),
    ("list pull requests of a repository", "github_list_pull_requests"),
];

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

    async fn remember(&mut self, who: Who) {
        let value = format!("{}-{}", PRINCIPALS[who.principal()], self.step);
        let c = self.client(who).await;
        let r = self.call(&c, "kit_remember", json!({"value": value})).await;
        if self.allowed[who.principal()].contains("kit") {
            assert_ne!(r.is_error, Some(true), "{}: {who:?} remember: {r:?}", self.at());
            self.remembered.insert((who, self.last_replica), value);
        } else {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
        }
    }

    async fn recall(&mut self, who: Who) {
        let c = self.client(who).await;
        let r = self.call(&c, "kit_recall", json!({})).await;
        if !self.allowed[who.principal()].contains("kit") {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
            return;
        }
        let expected = self.remembered.get(&(who, self.last_replica)).cloned().unwrap_or_default();
        assert_eq!(text(&r), expected, "{}: {who:?} recalls another caller's state", self.at());
    }

    /// A call that asks the calling client's model (sampling) and one that logs: the question
    /// reaches the caller's own client only, and so does the log line, never another session's.
    async fn ask_and_log(&mut self, who: Who) {
        let Who::Session(p, i) = who else { return self.recall(who).await };
        let c = self.client(who).await;
        let question = format!("q{}", self.step);
        let r = self.call(&c, "kit_ask", json!({"prompt": question})).await;
        if !self.allowed[p].contains("kit") {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
            return;
        }
        let me = format!("{}#{i}", PRINCIPALS[p]);
        assert_eq!(text(&r), format!("{me} answers {question}"), "{}: {who:?}'s question", self.at());
        let line = format!("log {}", self.step);
        let r = self.call(&c, "kit_log", json!({"level": "info", "message": line})).await;
        assert_eq!(text(&r), "sent", "{}", self.at());
        // The client hands notifications to a task of their own: the line may trail the answer.
        let heard = || async { c.service().logs.lock().unwrap().contains(&line) };
        assert!(eventually(std::time::Duration::from_secs(10), heard).await, "{}: {who:?} got its log line", self.at());
        for ((q, j), other) in &self.sessions {
            let logs = other.service().logs.lock().unwrap().clone();
            let mine = (*q, *j) == (p, i);
            assert_eq!(logs.contains(&line), mine, "{}: {who:?}'s log line in session {q}.{j}: {logs:?}", self.at());
        }
    }

    fn in_scope(&self, who: Who, name: &str) -> bool {
        let p = who.principal();
        let backend = name.split_once('_').map_or(name, |(b, _)| b);
        self.allowed[p].contains(backend) && !(self.no_create[p] && name.starts_with("github_create_"))
    }

    /// The backends whose resources and prompts principal `p` gets: those it may use whole.
    fn whole(&self, p: usize) -> BTreeSet<&'static str> {
        self.allowed[p].iter().copied().filter(|b| !(*b == "github" && self.no_create[p])).collect()
    }

    /// Whether principal `p` may use `backend` (one with tools, or the one waiting for a login).
    fn may_use(&self, p: usize, backend: &str) -> bool {
        self.allowed[p].contains(backend) || (backend == LOCKED && self.locked[p])
    }

    async fn list(&mut self, who: Who) {
        let c = self.client(who).await;
        let tools = c.list_all_tools().await.unwrap_or_else(|e| panic!("{}: tools/list: {e}", self.at()));
        for t in tools.iter().filter(|t| !["find_tool", "call_tool", "read_result"].contains(&t.name.as_ref())) {
            assert!(self.in_scope(who, &t.name), "{}: {who:?} listed {} outside its scope", self.at(), t.name);
        }
        if self.mode == "passthrough" {
            let backends: BTreeSet<&str> =
                tools.iter().filter_map(|t| t.name.split_once('_')).map(|(b, _)| b).collect();
            let mut allowed: BTreeSet<&str> = self.allowed[who.principal()].iter().copied().collect();
            // A client of groups lists only the top-level tools: github's.
            if self.variant == Variant::StatelessWithGroups {
                allowed.retain(|b| *b == "github");
            }
            assert_eq!(backends, allowed, "{}: {who:?} lists every backend of its scope", self.at());
        }
        // In every mode, a call: answered inside the scope, refused outside it.
        let calls = [
            ("kit_echo", json!({"input": "walk"})),
            ("github_list_pull_requests", json!({"owner": "o", "repo": "r"})),
            ("github_create_issue", json!({"owner": "o", "repo": "r", "title": "walk"})),
        ];
        let (tool, args) = calls[self.rng.random_range(0..calls.len())].clone();
        let r = self.call(&c, tool, args).await;
        let answered = r.is_error != Some(true);
        assert_eq!(answered, self.in_scope(who, tool), "{}: {who:?} called {tool}: {}", self.at(), text(&r));
    }

    /// `resources/list` and `prompts/list`: exactly those of the backends the caller may use
    /// whole (each demo backend has one of each).
    async fn parts(&mut self, who: Who) {
        let c = self.client(who).await;
        let resources = c.list_all_resources().await.unwrap_or_else(|e| panic!("{}: resources/list: {e}", self.at()));
        let of_resources: BTreeSet<String> = resources
            .iter()
            .filter(|r| r.uri.ends_with("/about"))
            .map(|r| r.uri.trim_start_matches("demo://").trim_end_matches("/about").replace("testkit", "kit"))
            .collect();
        let prompts = c.list_all_prompts().await.unwrap_or_else(|e| panic!("{}: prompts/list: {e}", self.at()));
        let of_prompts: BTreeSet<String> =
            prompts.iter().filter_map(|p| p.name.strip_suffix("_summarize")).map(str::to_owned).collect();
        let whole: BTreeSet<String> = self.whole(who.principal()).iter().map(|b| b.to_string()).collect();
        assert_eq!(of_resources, whole, "{}: {who:?}'s resources", self.at());
        assert_eq!(of_prompts, whole, "{}: {who:?}'s prompts", self.at());
    }

    /// `groups/list`: exactly the caller's backends; `groups/get` of one: its tools, all in
    /// scope, or, for a backend outside it, the same error as a group that does not exist.
    async fn groups(&mut self, who: Who) {
        let c = self.client(who).await;
        let listed =
            custom(&c, "groups/list", json!({})).await.unwrap_or_else(|e| panic!("{}: groups/list: {e}", self.at()));
        let names: BTreeSet<String> =
            listed["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap().to_string()).collect();
        // github's tools are all top level (`[groups] top_level`): it has no group.
        let allowed: BTreeSet<String> =
            self.allowed[who.principal()].iter().filter(|b| **b != "github").map(|b| b.to_string()).collect();
        assert_eq!(names, allowed, "{}: {who:?} lists groups of its own backends only", self.at());
        let backend = BACKENDS[self.rng.random_range(0..BACKENDS.len())];
        match custom(&c, "groups/get", json!({"name": backend})).await {
            Ok(group) => {
                assert!(allowed.contains(backend), "{}: {who:?} got group {backend} outside its scope", self.at());
                for t in group["contents"]["tools"].as_array().unwrap() {
                    let name = t["name"].as_str().unwrap();
                    assert!(self.in_scope(who, name), "{}: {who:?} got {name} outside its scope", self.at());
                }
            }
            Err(ServiceError::McpError(e)) => {
                assert!(!allowed.contains(backend), "{}: {who:?} refused its own group {backend}: {e:?}", self.at());
                // Resource not found: -32002, which rmcp answers 2026-07-28 callers as -32602.
                let expected = if matches!(who, Who::Session(..)) { -32002 } else { -32602 };
                assert_eq!(e.code.0, expected, "{}: {who:?}, like a group that does not exist", self.at());
            }
            Err(e) => panic!("{}: groups/get: {e}", self.at()),
        }
    }

    async fn find(&mut self, who: Who) {
        if self.mode != "optimizer" {
            return self.list(who).await;
        }
        // Each request with the tool it is aimed at.
        let requests = [
            ("remember a value", "kit_remember"),
            ("create an issue in a repository", "github_create_issue"),
            ("create a ticket in a tracker project", "jira_create_ticket"),
            ("list pull requests of a repository", "github_list_pull_requests"),
        ];
        let (request, aimed_at) = requests[self.rng.random_range(0..requests.len())];
        let c = self.client(who).await;
        let r = call(&*c, "find_tool", json!({"tool_description": request})).await;
        assert_ne!(r.is_error, Some(true), "{}: find_tool: {r:?}", self.at());
        let names = found(&r);
        for name in &names {
            assert!(self.in_scope(who, name), "{}: {who:?} found {name} outside its scope", self.at());
        }
        // Not an empty answer that would pass anything: the tool it asks for, when it may use it.
        assert_eq!(
            names.iter().any(|n| n == aimed_at),
            self.in_scope(who, aimed_at),
            "{}: {who:?} asked for {aimed_at}: {names:?}",
            self.at()
        );
        let sc = r.structured_content.as_ref().expect("structured content");
        let waiting: Vec<&str> = sc.get("needs_login").and_then(Value::as_array).map_or(Vec::new(), |names| {
            names.iter().map(|n| n.as_str().unwrap().split('`').nth(1).expect("a backend in backticks")).collect()
        });
        let expected: Vec<&str> = if self.locked[who.principal()] { vec![LOCKED] } else { vec![] };
        assert_eq!(waiting, expected, "{}: {who:?} told of backends waiting for a login", self.at());
    }

    /// One principal's labels alone never change another principal's ranking: `who` asks
    /// find_tool and calls the lowest-ranked tool it was offered but jira's (with arguments made
    /// from its schema: a label where the call succeeds), four times in four sessions of its own
    /// (a label each); another principal's ranking of the same request is the same before and
    /// after, unless a tool someone else had labelled got labels of `who` too (as the store
    /// counts principals, not as the rule that applies them: a rule that let one principal's
    /// labels count fails here). Learning is active from the start ([`Walk::seed_learning`]). One
    /// replica only: on two, labels reach each through Redis in their own time.
    async fn teach(&mut self, who: Who) {
        if self.mode != "optimizer" || self.variant == Variant::Replicas {
            return self.find(who).await;
        }
        let request = TEACH[self.rng.random_range(0..TEACH.len())].0;
        let p = who.principal();
        let other = Who::Sessionless((p + self.rng.random_range(1..PRINCIPALS.len())) % PRINCIPALS.len());
        let learned = self.app.gateway.store.learned().expect("learning on").clone();
        let (was, labels) = (learned.principals_per_tool(), learned.total());
        let before = self.ranking(other, request).await;
        for i in 0..4 {
            // A session of its own (labels are made per session), apart from the walk's: its
            // calls change no state the walk keeps count of.
            let c = open_session(&self.app, PRINCIPALS[p], &format!("{}#teach{i}", PRINCIPALS[p])).await;
            let r = call(&c, "find_tool", json!({"tool_description": request})).await;
            let sc = r.structured_content.expect("structured content");
            // Not jira's: its calls spend the quota the walk keeps count of in `spend`.
            let offered = sc["tools"].as_array().cloned().unwrap_or_default();
            let Some(last) = offered.iter().rev().find(|t| !t["name"].as_str().unwrap().starts_with("jira_")).cloned()
            else {
                continue;
            };
            let name = last["name"].as_str().expect("a name");
            assert!(self.in_scope(who, name), "{}: {who:?} was offered {name} outside its scope", self.at());
            call(&c, "call_tool", json!({"tool_name": name, "parameters": arguments(&last["inputSchema"])})).await;
            c.cancel().await.expect("the session closes");
        }
        self.taught += learned.total() - labels;
        let now = learned.principals_per_tool();
        // A tool someone else had labelled and `who` now has too: its labels may count, or
        // count more; the check is for labels of `who` alone.
        let shared = now.iter().any(|(tool, &n)| was.get(tool).is_some_and(|&m| m >= 1 && n > m));
        let after = self.ranking(other, request).await;
        if !shared {
            assert_eq!(
                after,
                before,
                "{}: {who:?}'s labels alone changed {other:?}'s ranking of {request:?}",
                self.at()
            );
            self.teach_checks += 1;
        }
    }

    /// Learning made active from the first step, by principals outside the walk: for each
    /// request the teach step asks, labels of the tool it is aimed at from ten principals.
    async fn seed_learning(&self) {
        let learned = self.app.gateway.store.learned().expect("learning on");
        let requests: Vec<String> = TEACH.iter().map(|(r, _)| r.to_string()).collect();
        let vectors = model().embed(requests).await.expect("the model embeds");
        let tools = self.app.gateway.store.current().catalog.tools().iter().map(|t| t.key.clone()).collect::<Vec<_>>();
        for ((_, aimed), v) in TEACH.iter().zip(&vectors) {
            let tool = tools.iter().find(|t| format!("{}_{}", t.backend, t.tool) == *aimed).expect("the aimed tool");
            for seeder in 0..10 {
                learned.record(v, tool, &format!("seed-{seeder}"));
            }
        }
        assert!(learned.active(), "seeded learning is active");
    }

    /// The tools find_tool offers `who` for `request`, in order.
    async fn ranking(&mut self, who: Who, request: &str) -> Vec<String> {
        let c = self.client(who).await;
        let r = call(&*c, "find_tool", json!({"tool_description": request})).await;
        assert_ne!(r.is_error, Some(true), "{}: find_tool: {r:?}", self.at());
        found(&r)
    }

    /// The operator console's views, as this principal (no admin here): every tool they name is
    /// in scope, no principal but this one is shown, nothing outside the scope is listed as
    /// excluded, and another principal's scope cannot be searched.
    async fn console(&mut self, p: usize) {
        let who = Who::Sessionless(p);
        let http = reqwest::Client::new();
        let base = format!("http://{}/ui/api", self.some_replica().1.addr.unwrap());
        let get = |path: &str| http.get(format!("{base}/{path}")).bearer_auth(PRINCIPALS[p]).send();
        let tools: Value = get("tools").await.unwrap().json().await.unwrap();
        let mut shown = BTreeSet::new();
        for backend in tools["backends"].as_array().unwrap() {
            let name = backend["name"].as_str().unwrap();
            shown.insert(name.to_string());
            let listed = backend["tools"].as_array().unwrap();
            for t in listed {
                let tool = t["name"].as_str().unwrap();
                assert!(self.in_scope(who, tool), "{}: {who:?} shown {tool} in the console", self.at());
            }
            if self.allowed[p].contains(name) {
                assert!(!listed.is_empty(), "{}: {who:?} shown {name} without its tools", self.at());
            }
        }
        let expected: BTreeSet<String> =
            BACKENDS.iter().chain(&[LOCKED]).filter(|b| self.may_use(p, b)).map(|b| b.to_string()).collect();
        assert_eq!(shown, expected, "{}: {who:?}'s backends in the console", self.at());
        assert!(tools["held"].is_number(), "{}: held details are for admins", self.at());
        let overview: Value = get("overview").await.unwrap().json().await.unwrap();
        for row in overview["principals"].as_array().unwrap() {
            assert_eq!(row["principal"], PRINCIPALS[p], "{}: {who:?} shown another principal", self.at());
        }
        for b in overview["status"]["backends"].as_array().unwrap() {
            let name = b["name"].as_str().unwrap();
            assert!(self.may_use(p, name), "{}: {who:?} shown backend {name} in the overview", self.at());
        }
        let post = |body: Value| {
            http.post(format!("{base}/search"))
                .bearer_auth(PRINCIPALS[p])
                .header("x-toolmux-console", "1")
                .json(&body)
                .send()
        };
        let searched = post(json!({"request": "create an issue"})).await.unwrap();
        assert_eq!(searched.status(), 200, "{}", self.at());
        let searched: Value = searched.json().await.unwrap();
        let ranked = searched["ranked"].as_array().unwrap();
        for hit in ranked {
            let tool = hit["name"].as_str().unwrap();
            assert!(self.in_scope(who, tool), "{}: {who:?} found {tool} in the playground", self.at());
        }
        // github and jira both have tools that create or concern issues; kit has none.
        let has_issues = self.allowed[p].contains("github") || self.allowed[p].contains("jira");
        assert!(!has_issues || !ranked.is_empty(), "{}: {who:?}'s playground search ranks nothing", self.at());
        assert!(searched.get("excluded").is_none(), "{}: excluded tools are for admins", self.at());
        let other = PRINCIPALS[(p + 1) % PRINCIPALS.len()];
        let refused = post(json!({"request": "create an issue", "principal": other})).await.unwrap();
        assert_eq!(refused.status(), 403, "{}: {who:?} searched {other}'s scope", self.at());
    }

    async fn make_task(&mut self, who: Who) {
        let c = self.client(who).await;
        let args = json!({"ms": 600_000, "label": "walk"});
        let request = match self.mode {
            "optimizer" => params("call_tool", json!({"tool_name": "kit_job", "parameters": args})),
            _ => params("kit_job", args),
        };
        let answer = c.peer().call_tool_once(request).await;
        match (self.allowed[who.principal()].contains("kit"), answer) {
            (true, Ok(CallToolResponse::Task(t))) => self.tasks.push((t.task.task_id, who, false)),
            (true, other) => panic!("{}: {who:?} expected a task, got {other:?}", self.at()),
            (false, Ok(CallToolResponse::Complete(r))) => {
                assert_eq!(r.is_error, Some(true), "{}: {who:?} ran kit_job outside its scope", self.at())
            }
            (false, Err(ServiceError::McpError(e))) => assert_eq!(e.code.0, -32602, "{}", self.at()),
            (false, other) => panic!("{}: {who:?} ran kit_job outside its scope: {other:?}", self.at()),
        }
    }

    async fn follow_task(&mut self, who: Who) {
        if self.tasks.is_empty() && self.dead.is_empty() {
            return self.make_task(who).await;
        }
        let n = self.rng.random_range(0..self.tasks.len() + self.dead.len());
        let (id, owner, cancelled) = match self.tasks.get(n) {
            Some((id, owner, cancelled)) => (id.clone(), Some(*owner), *cancelled),
            None => (self.dead[n - self.tasks.len()].clone(), None, false),
        };
        let c = self.client(who).await;
        let got = c.peer().get_task(GetTaskParams::new(id.clone())).await;
        let owns = owner == Some(who);
        let may = self.allowed[who.principal()].contains("kit");
        match got {
            Ok(t) => {
                assert!(owns, "{}: {who:?} read task {id} of {owner:?}", self.at());
                assert!(may, "{}: {who:?} read a task whose tool it may no longer use", self.at());
                assert_eq!(t.task.task.task_id, id, "{}", self.at());
                let status = t.task.status();
                let expected =
                    if cancelled { [TaskStatus::Cancelled, TaskStatus::Working] } else { [TaskStatus::Working; 2] };
                assert!(expected.contains(&status), "{}: task {id} is {status:?}", self.at());
            }
            Err(ServiceError::McpError(e)) if e.code.0 == -32602 => {
                assert!(!(owns && may), "{}: {who:?} lost its own task {id}", self.at());
                if owns {
                    // Used while revoked: cancelled at the backend and forgotten for good.
                    self.kill(&id);
                }
            }
            Err(e) => panic!("{}: tasks/get: {e}", self.at()),
        }
        // Someone else's cancel is refused as for a task that does not exist; the task goes on.
        if let Some(owner) = owner.filter(|o| *o != who) {
            let refused = c.peer().cancel_task(CancelTaskParams::new(id.clone())).await;
            match refused {
                Err(ServiceError::McpError(e)) => assert_eq!(e.code.0, -32602, "{}: {e:?}", self.at()),
                other => panic!("{}: {who:?} cancelled {owner:?}'s task {id}: {other:?}", self.at()),
            }
        }
        if owns && may && !cancelled && self.rng.random_bool(0.2) {
            c.peer().cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
            // Still its owner's to read (cancelled), and nobody else's.
            if let Some(t) = self.tasks.iter_mut().find(|(t, _, _)| *t == id) {
                t.2 = true;
            }
        }
    }

    fn kill(&mut self, id: &str) {
        self.tasks.retain(|(t, _, _)| t != id);
        self.dead.push(id.to_string());
    }

    /// One jira call against the caller's own quota: served while its principal has some left,
    /// refused by `walk` after, whatever the other principals spent.
    async fn spend(&mut self, who: Who) {
        let p = who.principal();
        let c = self.client(who).await;
        let r = self.call(&c, "jira_get_ticket", json!({"key": "OPS-1"})).await;
        let said = text(&r);
        if !self.allowed[p].contains("jira") {
            assert!(
                r.is_error == Some(true) && !said.contains("`walk`"),
                "{}: out of scope, not limited: {said}",
                self.at()
            );
        } else if self.spent[p] < QUOTA {
            assert_ne!(
                r.is_error,
                Some(true),
                "{}: {} spent {} of {QUOTA}: {said}",
                self.at(),
                PRINCIPALS[p],
                self.spent[p]
            );
            self.spent[p] += 1;
        } else {
            assert!(r.is_error == Some(true) && said.contains("limit `walk`"), "{}: past the quota: {said}", self.at());
        }
    }

    /// A result over the walk's limit: cut, and kept for this principal.
    async fn keep(&mut self, who: Who) {
        let p = who.principal();
        let c = self.client(who).await;
        let r = self.call(&c, "kit_big", json!({"kind": "text", "bytes": 4000})).await;
        if !self.allowed[p].contains("kit") {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
            return;
        }
        let cut = r.meta.as_ref().map(|m| m.0["toolmux/cut"]["id"].clone());
        let id = cut.and_then(|v| v.as_str().map(str::to_owned));
        let id = id.unwrap_or_else(|| panic!("{}: {who:?}'s long result was not cut and kept: {r:?}", self.at()));
        self.kept.push((id, p));
    }

    /// A kept result read by `who`: whole for its principal, non-existent for anyone else.
    async fn read_kept(&mut self, who: Who) {
        if self.kept.is_empty() {
            return self.keep(who).await;
        }
        let (id, owner) = self.kept[self.rng.random_range(0..self.kept.len())].clone();
        let c = self.client(who).await;
        let r = self.call(&c, "read_result", json!({"id": id, "length": 100_000})).await;
        let read =
            c.read_resource(rmcp::model::ReadResourceRequestParams::new(format!("toolmux://results/{id}/0"))).await;
        let said = text(&r);
        if who.principal() == owner {
            assert!(
                r.is_error != Some(true) && said.starts_with("line 0: "),
                "{}: {who:?} reads its own: {said}",
                self.at()
            );
            assert!(said.len() >= 4000, "{}: the whole: {} bytes", self.at(), said.len());
            assert!(read.is_ok(), "{}: {who:?} reads its own as a resource: {read:?}", self.at());
        } else {
            assert!(
                r.is_error == Some(true) && said.contains("no kept result") && !said.contains("line 0"),
                "{}: {who:?} read {}'s kept result: {said}",
                self.at(),
                PRINCIPALS[owner]
            );
            let refused = read.expect_err("another principal's kept result is not read").to_string();
            assert!(refused.contains("no kept result") && !refused.contains("line 0"), "{}: {refused}", self.at());
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

/// Arguments for a call of a tool with `schema`: each required property, a value of its type.
fn arguments(schema: &Value) -> Value {
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    let values = required.iter().filter_map(Value::as_str).map(|k| {
        let v = match schema["properties"][k]["type"].as_str() {
            Some("integer" | "number") => json!(1),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("walk"),
        };
        (k.to_string(), v)
    });
    Value::Object(values.collect())
}
