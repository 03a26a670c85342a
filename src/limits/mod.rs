//! `[[limits]]` in force: a [`Limiter`] admits or refuses each tool call, resource read, prompt
//! get and find_tool search against every rule that covers it.
//!
//! A rule's budget is kept per principal (or, with `per = "rule"`, once for everyone it
//! matches) under a key made of the rule's name, a hash of the principal and the limit. A
//! request is checked against all of its keys at once and spends from all of them or from none,
//! so a refusal never uses up another limit. Without a shared store the counts live in this
//! process ([`book`]); with `[sessions] store = "redis"` one Lua script per request checks and
//! spends them in Redis for every replica ([`shared`]), and while Redis does not answer the
//! setting `sessions.limits_when_unreachable` decides (counting alone, by default).
//!
//! Quotas run per clock hour and per UTC day. Result tokens are counted after a call returns, so
//! a token quota stops the calls that start after it was reached (the call that crosses it
//! completes).

mod book;
pub mod shared;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use globset::GlobSet;
use sha2::{Digest, Sha256};

use crate::auth::policy::set;
use crate::config::{LimitRule, WhenUnreachable};
use crate::metrics::LimitCounters;
use crate::session::Caller;
use crate::session::shared::SharedSessions;

pub use book::Reading;

/// Callers remembered for the console's view of use against limits.
const REMEMBERED: usize = 1024;

/// What a request would spend.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// A tool call; `tool` is the backend's own name for it (as `[[policy]]` matches it).
    Call { backend: &'a str, tool: &'a str },
    /// A resource read or a prompt get: counted by rules that cover the whole backend.
    Read { backend: &'a str },
    /// A find_tool search: counted by `find_tool_rate` only.
    Search,
}

/// Which of a rule's limits a check is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Rate,
    FindToolRate,
    CallsPerHour,
    CallsPerDay,
    TokensPerHour,
    TokensPerDay,
    /// Not a rule's: the shared store did not answer and the setting refuses.
    Store,
}

impl Limit {
    /// The limit's key in the rule, as written in the config.
    pub fn key(self) -> &'static str {
        match self {
            Limit::Rate => "rate",
            Limit::FindToolRate => "find_tool_rate",
            Limit::CallsPerHour => "calls_per_hour",
            Limit::CallsPerDay => "calls_per_day",
            Limit::TokensPerHour => "result_tokens_per_hour",
            Limit::TokensPerDay => "result_tokens_per_day",
            Limit::Store => "limits_when_unreachable",
        }
    }
}

/// One key a request is checked against.
#[derive(Debug, Clone)]
pub struct Check {
    /// The rule's place in the rules in force.
    pub rule: usize,
    pub limit: Limit,
    /// Unique per rule, budget owner, limit (and window).
    pub key: String,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A token bucket: one request per `refill`, up to `burst` at once.
    Bucket { burst: u32, refill: Duration },
    /// Requests in a window that ends in `ends_in`: at most `max`, one spent per request.
    Calls { max: u64, ends_in: Duration },
    /// Result tokens in a window: read here, added when the call returns.
    Tokens { max: u64, ends_in: Duration },
}

/// A request refused: which limit, and when to try again.
#[derive(Debug, Clone)]
pub struct Refused {
    pub rule: String,
    pub limit: Limit,
    /// What the limit allows, as written (`5/s (burst 10)`, `1000 per day`).
    pub allows: String,
    pub retry_after: Duration,
}

impl Refused {
    /// Whole seconds to wait, at least one.
    pub fn retry_secs(&self) -> u64 {
        self.retry_after.as_secs_f64().ceil().max(1.0) as u64
    }

    /// What the caller is told: the limit by name, and when to try again.
    pub fn message(&self, what: &str) -> String {
        if self.limit == Limit::Store {
            return format!(
                "{what} refused: the limits store does not answer and limits refuse while it is down (sessions.limits_when_unreachable = \"refuse\"); try again in {} s",
                self.retry_secs()
            );
        }
        format!(
            "{what} refused: limit `{}` ({} = {}) is used up; try again in {} s",
            self.rule,
            self.limit.key(),
            self.allows,
            self.retry_secs()
        )
    }
}

/// An admitted request's token windows, to which its result's tokens are added.
#[derive(Debug, Default)]
pub struct Admitted {
    tokens: Vec<(String, Duration)>,
    /// Counted in the shared store (else here).
    shared: bool,
}

impl Admitted {
    /// Whether the result's tokens count against anything.
    pub fn counts_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }
}

/// One caller's use of one limit, for the console.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Usage {
    /// The principal, or `*` for a rule everyone shares.
    pub principal: String,
    pub rule: String,
    pub limit: &'static str,
    pub used: u64,
    pub allowed: u64,
}

struct Rule {
    cfg: LimitRule,
    principals: GlobSet,
    groups: GlobSet,
    backends: GlobSet,
    tools: GlobSet,
    /// `tools` is `*`: the rule also counts the backend's resource reads and prompt gets.
    whole: bool,
}

impl Rule {
    fn new(cfg: &LimitRule) -> Self {
        Self {
            principals: set(&cfg.principals),
            groups: set(&cfg.groups),
            backends: set(&cfg.backends),
            tools: set(&cfg.tools),
            whole: cfg.tools.iter().any(|t| t == "*"),
            cfg: cfg.clone(),
        }
    }

    fn covers_caller(&self, caller: &Caller) -> bool {
        self.principals.is_match(&caller.principal) || caller.groups.iter().any(|g| self.groups.is_match(g))
    }

    fn covers(&self, action: Action<'_>) -> bool {
        match action {
            Action::Call { backend, tool } => self.backends.is_match(backend) && self.tools.is_match(tool),
            Action::Read { backend } => self.whole && self.backends.is_match(backend),
            Action::Search => self.cfg.find_tool_rate.is_some(),
        }
    }

    /// Whose budget a caller spends: the principal's (hashed: keys are not a list of names), or
    /// the rule's own.
    fn owner(&self, caller: &Caller) -> String {
        if self.cfg.shared {
            "*".into()
        } else {
            let digest = Sha256::digest(caller.principal.as_bytes());
            base16ct::lower::encode_string(&digest[..12])
        }
    }

    /// The keys `action` is checked against under this rule, as of `now`.
    fn checks(&self, at: usize, owner: &str, action: Action<'_>, now: SystemTime, out: &mut Vec<Check>) {
        let c = &self.cfg;
        let key = |limit: Limit, window: Option<u64>| match window {
            None => format!("{}:{owner}:{}", c.name, limit.key()),
            Some(w) => format!("{}:{owner}:{}:{w}", c.name, limit.key()),
        };
        let bucket = |limit, r: crate::config::Rate| Check {
            rule: at,
            limit,
            key: key(limit, None),
            kind: Kind::Bucket { burst: r.burst, refill: r.refill() },
        };
        if let Action::Search = action {
            out.extend(c.find_tool_rate.map(|r| bucket(Limit::FindToolRate, r)));
            return;
        }
        out.extend(c.rate.map(|r| bucket(Limit::Rate, r)));
        let ms = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let window = |len_ms: u64| (ms / len_ms, Duration::from_millis((ms / len_ms + 1) * len_ms - ms));
        let (hour, hour_ends) = window(3_600_000);
        let (day, day_ends) = window(86_400_000);
        for (limit, max, (w, ends_in)) in [
            (Limit::CallsPerHour, c.calls_per_hour, (hour, hour_ends)),
            (Limit::CallsPerDay, c.calls_per_day, (day, day_ends)),
        ] {
            if let Some(max) = max {
                out.push(Check { rule: at, limit, key: key(limit, Some(w)), kind: Kind::Calls { max, ends_in } });
            }
        }
        if let Action::Call { .. } = action {
            for (limit, max, (w, ends_in)) in [
                (Limit::TokensPerHour, c.result_tokens_per_hour, (hour, hour_ends)),
                (Limit::TokensPerDay, c.result_tokens_per_day, (day, day_ends)),
            ] {
                if let Some(max) = max {
                    out.push(Check { rule: at, limit, key: key(limit, Some(w)), kind: Kind::Tokens { max, ends_in } });
                }
            }
        }
    }

    /// What `limit` allows, as the config says it.
    fn allows(&self, limit: Limit) -> String {
        let c = &self.cfg;
        let per = |n: Option<u64>, unit: &str| n.map_or_else(String::new, |n| format!("{n} per {unit}"));
        match limit {
            Limit::Rate => c.rate.map_or_else(String::new, |r| r.to_string()),
            Limit::FindToolRate => c.find_tool_rate.map_or_else(String::new, |r| r.to_string()),
            Limit::CallsPerHour => per(c.calls_per_hour, "hour"),
            Limit::CallsPerDay => per(c.calls_per_day, "day"),
            Limit::TokensPerHour => per(c.result_tokens_per_hour, "hour"),
            Limit::TokensPerDay => per(c.result_tokens_per_day, "day"),
            Limit::Store => String::new(),
        }
    }
}

pub struct Limiter {
    rules: arc_swap::ArcSwap<Vec<Rule>>,
    book: Mutex<Book>,
    /// The store every replica counts in, and what to do while it does not answer.
    shared: OnceLock<(Arc<SharedSessions>, WhenUnreachable)>,
    counters: LimitCounters,
    /// Callers seen by a check, most recent first, for [`Limiter::usage`].
    seen: Mutex<lru::LruCache<String, Caller>>,
    /// Whether this outage of the shared store was logged already.
    outage_logged: AtomicBool,
}

use book::Book;

impl Limiter {
    /// A limiter with `rules`, counting in this process until [`Limiter::share`].
    pub fn new(rules: &[LimitRule], counters: LimitCounters) -> Self {
        Self {
            rules: arc_swap::ArcSwap::from_pointee(rules.iter().map(Rule::new).collect()),
            book: Mutex::default(),
            shared: OnceLock::new(),
            counters,
            seen: Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(REMEMBERED).expect("nonzero"))),
            outage_logged: AtomicBool::new(false),
        }
    }

    /// Puts new rules in force (a reload). Counts kept under a rule's name carry over.
    pub fn set_rules(&self, rules: &[LimitRule]) {
        self.rules.store(Arc::new(rules.iter().map(Rule::new).collect()));
    }

    /// Counts in `store` from now on, shared with every replica that uses it; `when_unreachable`
    /// says what a check does while it does not answer.
    pub fn share(&self, store: Arc<SharedSessions>, when_unreachable: WhenUnreachable) {
        let _ = self.shared.set((store, when_unreachable));
    }

    /// Whether any rule is in force.
    pub fn is_active(&self) -> bool {
        !self.rules.load().is_empty()
    }

    /// Admits `action` for `caller`, spending from every limit that covers it, or refuses it
    /// with the limit that refuses longest.
    pub async fn check(&self, caller: &Caller, action: Action<'_>) -> Result<Admitted, Refused> {
        let rules = self.rules.load();
        if rules.is_empty() {
            return Ok(Admitted::default());
        }
        let mut checks = Vec::new();
        let now = SystemTime::now();
        for (i, r) in rules.iter().enumerate() {
            if r.covers_caller(caller) && r.covers(action) {
                r.checks(i, &r.owner(caller), action, now, &mut checks);
            }
        }
        if checks.is_empty() {
            return Ok(Admitted::default());
        }
        self.seen.lock().expect("limits seen lock").put(caller.principal.clone(), caller.without_token());
        let tokens = || {
            checks
                .iter()
                .filter_map(|c| match c.kind {
                    Kind::Tokens { ends_in, .. } => Some((c.key.clone(), ends_in)),
                    _ => None,
                })
                .collect()
        };
        let outcome = match self.shared.get() {
            None => self.admit_here(&checks).map(|()| false),
            Some((store, when_unreachable)) => match shared::admit(store, &checks).await {
                Ok(outcome) => {
                    if self.outage_logged.swap(false, Ordering::Relaxed) {
                        tracing::info!("the limits store answers again: limits are shared by the replicas again");
                    }
                    outcome.map(|()| true)
                }
                Err(e) => {
                    let action = match when_unreachable {
                        WhenUnreachable::Local => "local",
                        WhenUnreachable::Refuse => "refused",
                        WhenUnreachable::Allow => "allowed",
                    };
                    self.counters.unreachable(action);
                    if !self.outage_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e.0, action, "the limits store does not answer (sessions.limits_when_unreachable)");
                    }
                    match when_unreachable {
                        WhenUnreachable::Local => self.admit_here(&checks).map(|()| false),
                        WhenUnreachable::Allow => return Ok(Admitted::default()),
                        WhenUnreachable::Refuse => {
                            self.counters.refused("", Limit::Store.key());
                            return Err(Refused {
                                rule: String::new(),
                                limit: Limit::Store,
                                allows: String::new(),
                                retry_after: Duration::from_secs(5),
                            });
                        }
                    }
                }
            },
        };
        match outcome {
            Ok(shared) => Ok(Admitted { tokens: tokens(), shared }),
            Err((i, retry_after)) => {
                let c = &checks[i];
                let rule = &rules[c.rule];
                self.counters.refused(&rule.cfg.name, c.limit.key());
                Err(Refused { rule: rule.cfg.name.clone(), limit: c.limit, allows: rule.allows(c.limit), retry_after })
            }
        }
    }

    fn admit_here(&self, checks: &[Check]) -> Result<(), (usize, Duration)> {
        self.book.lock().expect("limits book lock").admit(checks, Instant::now())
    }

    /// Adds a returned result's tokens to the windows that count them (off the request path
    /// when shared).
    pub fn spend_tokens(&self, admitted: Admitted, tokens: u64) {
        if admitted.tokens.is_empty() || tokens == 0 {
            return;
        }
        match (admitted.shared, self.shared.get()) {
            (true, Some((store, _))) => {
                let store = store.clone();
                tokio::spawn(async move { shared::add(&store, &admitted.tokens, tokens).await });
            }
            _ => {
                let now = Instant::now();
                let mut book = self.book.lock().expect("limits book lock");
                for (key, ends_in) in &admitted.tokens {
                    book.add(key, tokens, now + *ends_in, now);
                }
            }
        }
    }

    /// Each remembered caller's use of every limit that covers them (`only`: one principal's).
    pub async fn usage(&self, only: Option<&str>) -> Vec<Usage> {
        let rules = self.rules.load();
        let callers: Vec<Caller> = {
            let seen = self.seen.lock().expect("limits seen lock");
            seen.iter().filter(|(p, _)| only.is_none_or(|o| o == p.as_str())).map(|(_, c)| c.clone()).collect()
        };
        let now = SystemTime::now();
        let mut rows = Vec::new();
        let mut checks = Vec::new();
        let mut owners = std::collections::HashSet::new();
        for caller in &callers {
            for (i, r) in rules.iter().enumerate() {
                if !r.covers_caller(caller) {
                    continue;
                }
                let owner = r.owner(caller);
                if !owners.insert((i, owner.clone())) {
                    continue;
                }
                let before = checks.len();
                // Every limit of the rule: a call that the rule covers, and a search.
                r.checks(i, &owner, Action::Call { backend: "", tool: "" }, now, &mut checks);
                r.checks(i, &owner, Action::Search, now, &mut checks);
                let who = if r.cfg.shared { "*".to_string() } else { caller.principal.clone() };
                rows.extend((before..checks.len()).map(|_| who.clone()));
            }
        }
        let readings = match self.shared.get() {
            Some((store, _)) => match shared::read(store, &checks).await {
                Ok(r) => r,
                Err(_) => self.read_here(&checks),
            },
            None => self.read_here(&checks),
        };
        checks
            .iter()
            .zip(rows)
            .zip(readings)
            .map(|((c, principal), reading)| {
                let (used, allowed) = match (c.kind, reading) {
                    (Kind::Bucket { burst, .. }, Reading::Tokens(left)) => {
                        ((f64::from(burst) - left).max(0.0).round() as u64, u64::from(burst))
                    }
                    (Kind::Calls { max, .. } | Kind::Tokens { max, .. }, Reading::Count(n)) => (n, max),
                    (_, _) => (0, 0),
                };
                Usage { principal, rule: rules[c.rule].cfg.name.clone(), limit: c.limit.key(), used, allowed }
            })
            .collect()
    }

    fn read_here(&self, checks: &[Check]) -> Vec<Reading> {
        let book = self.book.lock().expect("limits book lock");
        let now = Instant::now();
        checks.iter().map(|c| book.reading(c, now)).collect()
    }
}

#[cfg(test)]
mod tests;
