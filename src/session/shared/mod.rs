//! Client sessions kept in Redis (`[sessions] store = "redis"`), so that any replica can serve a
//! session another one created.
//!
//! A session is one Redis hash, `{prefix}session:{sha256 of the session id}`: the id itself (what
//! a client presents to resume) is never stored. Its fields are the principal, the client's
//! `initialize` parameters (revision, capabilities, client info), its logging level, one
//! `sub:{uri}` per resource subscription, one `upstream:{backend}` per backend it holds a
//! session of its own with, and created/seen times. The hash expires after the idle timeout,
//! pushed back while the session is in use. No scope, snapshot or vector is stored: a replica
//! that rebuilds a session derives its scope with the same function as for a new one.
//!
//! Every replica keeps a copy of the fields of the sessions it serves. Redis is asked only for a
//! session this replica has not seen, and written when a session is created, changes or is
//! ended. A Redis command that fails or takes longer than `sessions.timeout` fails the store
//! operation, never the session: local sessions keep working, new ones are created here, and
//! the sessions whose writes failed are written through once Redis answers again (all of them
//! after an outage, since a Redis that restarted may have lost every key). Fields are written
//! one by one (`HSET`/`HDEL`), so two replicas serving one session in turn do not overwrite
//! each other's changes.
//!
//! Every write bumps the record's `version`. A replica knows the version its copy is at: a
//! change that finds the version moved by more than its own bump reads the record back (another
//! replica changed it), and a whole write (the write-through after an outage, a record the store
//! lost) replaces the record only if no other replica wrote it since; otherwise the store's
//! record wins and this replica takes it. So a write-through never puts back a subscription
//! another replica removed, nor an older level over a newer one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use rmcp::model::InitializeRequestParams;
use rmcp::transport::streamable_http_server::session::store::{SessionState, SessionStore, SessionStoreError};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::{RedisConfig, SealKey};
use crate::upstream::adopt::StoredUpstream;

mod learning;
mod record;
mod tasks;
#[cfg(test)]
mod tests;

pub use learning::LedgerFields;
use record::*;
pub use record::{Change, Record};

/// The store could not be asked (down, slow, or an error): the caller answers without it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the session store did not answer: {0}")]
pub struct Unreachable(pub String);

/// What `/status` shows of the store.
#[derive(Debug, Clone, Serialize)]
pub struct StoreStatus {
    pub kind: &'static str,
    /// `unknown` (not asked yet), `up` or `down`.
    pub state: &'static str,
    pub last_error: Option<String>,
    pub last_error_secs_ago: Option<u64>,
    /// Sessions whose last write failed, to be written when the store answers.
    pub pending_writes: usize,
    /// Sessions this replica rebuilt from the store.
    pub restored: u64,
    pub errors: u64,
    /// How often held sessions are checked for having been ended on another replica.
    pub sweep_every_ms: u64,
    /// Those checks started so far, and the number of the last one that ended a session here
    /// (0: none has): a session ended elsewhere ends here in the first sweep that starts after.
    pub sweeps: u64,
    pub last_sweep_that_ended: u64,
}

/// The share of the state other replicas need, and this replica's copy of it.
pub struct SharedSessions {
    redis: ConnectionManager,
    prefix: String,
    /// Every command's deadline.
    timeout: Duration,
    /// A record's time to live: the idle timeout.
    ttl: Duration,
    /// How often a session in use pushes its expiry back.
    refresh_every: Duration,
    /// Seals backend session ids (`sessions.secret`); without it they are not stored.
    seal_key: Option<SealKey>,
    local: Mutex<HashMap<String, Local>>,
    /// Sessions ended here while the store was down: deleted when it answers.
    ended: Mutex<HashSet<String>>,
    /// `initialize` parameters rmcp hands over for a new session, until the edge knows its principal.
    inits: Mutex<HashMap<String, InitializeRequestParams>>,
    /// Records the edge has checked for a restore, for rmcp's `load` that follows.
    prefetched: Mutex<HashMap<String, Record>>,
    state: AtomicU8,
    last_error: Mutex<Option<(String, SystemTime)>>,
    errors: AtomicU64,
    restored: AtomicU64,
    /// Sweeps for sessions ended elsewhere started so far, and the number of the last one that
    /// ended a session here (0: none yet).
    sweeps: AtomicU64,
    swept_end: AtomicU64,
    /// Woken when a write fails, so that the write-through starts trying.
    wake: tokio::sync::Notify,
}

struct Local {
    /// The record's fields as this replica has them, `version` included (the store's version
    /// this copy was last in step with).
    fields: Fields,
    /// Its last write failed (or the store lost it): write it whole when the store answers.
    dirty: bool,
    refreshed: Instant,
}

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// How often the write-through asks a store that is down whether it is back.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Replaces a record whole (`KEYS[1]`) with the fields in `ARGV[3..]`, unless the session was
/// ended (its marker `KEYS[2]` is there: -2) or another replica wrote it after version `ARGV[1]`
/// (it is left as it is: -1). Otherwise the record gets the next version (past both its own and
/// ours: a store that lost it starts from ours) and expires in `ARGV[2]` ms; the new version is
/// returned.
const WRITE_WHOLE: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return -2 end
local stored = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local base = tonumber(ARGV[1])
if stored > base then return -1 end
local next = math.max(stored, base) + 1
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'version', next, unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return next
"#;
/// Entries of the hand-over maps kept at most. Each is taken by the next step of its request, or
/// dropped when its session ends here or its rebuild fails; past this, a new one is not kept (its
/// session is then not shared, or is read from the store again), and none is thrown away.
const HANDOVER_LIMIT: usize = 4096;

impl SharedSessions {
    /// Connects lazily: the gateway starts, and serves, while Redis is down.
    pub fn new(cfg: &RedisConfig, ttl: Duration) -> anyhow::Result<Arc<Self>> {
        let client = match &cfg.tls_ca {
            None => redis::Client::open(cfg.url.as_str()),
            Some(pem) => {
                let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) };
                redis::Client::build_with_tls(cfg.url.as_str(), certs)
            }
        }
        .map_err(|e| anyhow::anyhow!("sessions.redis_url: {}", e.detail().unwrap_or(e.category())))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.timeout))
            .set_response_timeout(Some(cfg.timeout))
            .set_number_of_retries(1)
            .set_max_delay(cfg.timeout);
        let redis = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Arc::new(Self {
            redis,
            prefix: cfg.key_prefix.clone(),
            timeout: cfg.timeout,
            ttl,
            refresh_every: (ttl / 4).min(Duration::from_secs(5)),
            seal_key: cfg.seal_key.clone(),
            local: Mutex::default(),
            ended: Mutex::default(),
            inits: Mutex::default(),
            prefetched: Mutex::default(),
            state: AtomicU8::new(UNKNOWN),
            last_error: Mutex::new(None),
            errors: AtomicU64::new(0),
            restored: AtomicU64::new(0),
            sweeps: AtomicU64::new(0),
            swept_end: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
        }))
    }

    fn key(&self, id: &str) -> String {
        format!("{}session:{}", self.prefix, base16ct::lower::encode_string(&Sha256::digest(id.as_bytes())))
    }

    fn ttl_ms(&self) -> i64 {
        self.ttl.as_millis().min(i64::MAX as u128) as i64
    }

    /// Runs one command (or pipeline) against the deadline, recording how the store is doing.
    /// While the store is down, fails at once: the write-through's probe finds out when it is
    /// back, so an outage costs requests nothing but the lookups they cannot have.
    async fn run<T: redis::FromRedisValue>(&self, cmd: &redis::Pipeline) -> Result<T, Unreachable> {
        if let Some(down) = self.down() {
            return Err(down);
        }
        self.probe(cmd).await
    }

    /// Runs one command (or pipeline) against the deadline, whatever the store's state.
    async fn probe<T: redis::FromRedisValue>(&self, cmd: &redis::Pipeline) -> Result<T, Unreachable> {
        self.attempt(|mut conn| async move { cmd.query_async::<T>(&mut conn).await }).await
    }

    /// Runs `request` on a connection against the deadline, recording how the store is doing.
    async fn attempt<T, F, Fut>(&self, request: F) -> Result<T, Unreachable>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let outcome = tokio::time::timeout(self.timeout, request(self.redis.clone())).await;
        let error = match outcome {
            Ok(Ok(v)) => {
                self.state.store(UP, Ordering::Release);
                return Ok(v);
            }
            Ok(Err(e)) => crate::redact::urls(&e.to_string()),
            Err(_) => format!("no answer within {}", humantime::format_duration(self.timeout)),
        };
        if self.state.swap(DOWN, Ordering::AcqRel) != DOWN {
            tracing::warn!(%error, "session store unreachable: sessions are kept here and written through when it answers");
        }
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().expect("store error lock") = Some((error.clone(), SystemTime::now()));
        self.wake.notify_one();
        Err(Unreachable(error))
    }

    /// While the store is down: its last error.
    fn down(&self) -> Option<Unreachable> {
        if self.state.load(Ordering::Acquire) != DOWN {
            return None;
        }
        let last = self.last_error.lock().expect("store error lock").as_ref().map(|(e, _)| e.clone());
        Some(Unreachable(last.unwrap_or_else(|| "down".into())))
    }

    /// What every key toolmux writes starts with (`sessions.key_prefix`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Runs a pipeline for another part of the gateway (as every command here: failing at once
    /// while the store is down).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Pipeline) -> Result<T, Unreachable> {
        self.run(cmd).await
    }

    /// Runs a script (EVALSHA, loading it first if the server does not have it), failing at
    /// once while the store is down.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Unreachable> {
        if let Some(down) = self.down() {
            return Err(down);
        }
        self.attempt(|mut conn| async move { invocation.invoke_async::<T>(&mut conn).await }).await
    }

    /// The stored session `id`, for a replica that has not seen it.
    pub async fn fetch(&self, id: &str) -> Result<Option<Record>, Unreachable> {
        let fields: HashMap<String, String> = self.run(redis::pipe().hgetall(self.key(id))).await.map(one)?;
        if fields.is_empty() {
            return Ok(None);
        }
        match Record::from_fields(&fields) {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                // Written by something else, or by an incompatible version: not a session to resume.
                tracing::warn!(error = %e, "a stored session is unreadable; answered as unknown");
                Ok(None)
            }
        }
    }

    /// Hands `record` to the restore rmcp runs next for `id`, and keeps its fields here.
    pub fn restoring(&self, id: &str, record: &Record) {
        let fields = Self::fields_of(record);
        let mut prefetched = self.prefetched.lock().expect("prefetched lock");
        if prefetched.len() < HANDOVER_LIMIT {
            prefetched.insert(id.to_string(), record.clone());
        }
        drop(prefetched);
        self.restored.fetch_add(1, Ordering::Relaxed);
        self.local
            .lock()
            .expect("local lock")
            .insert(id.to_string(), Local { fields, dirty: false, refreshed: Instant::now() });
    }

    /// Records the new session `id` of `principal` (its `initialize` parameters came from rmcp).
    /// Returns once written, or once the write failed (then it is written through later).
    pub async fn created(&self, id: &str, principal: &str) {
        let Some(client) = self.inits.lock().expect("inits lock").remove(id) else {
            tracing::warn!("a new session's initialize parameters were not handed over; it is not shared");
            return;
        };
        let now = now_ms();
        let record = Record {
            principal: principal.to_string(),
            client,
            level: None,
            subscriptions: Vec::new(),
            upstreams: BTreeMap::new(),
            created_ms: now,
            seen_ms: now,
            version: 0,
        };
        let fields = Self::fields_of(&record);
        self.local
            .lock()
            .expect("local lock")
            .insert(id.to_string(), Local { fields, dirty: false, refreshed: Instant::now() });
        self.write_through(id).await;
    }

    /// Writes this replica's copy of session `id` whole, unless another replica wrote the record
    /// since the copy's version: then the store's record replaces the copy. Returns false when
    /// the store could not be asked (the copy is marked to be written later).
    async fn write_through(&self, id: &str) -> bool {
        let Some(fields) = self.local.lock().expect("local lock").get(id).map(|e| e.fields.clone()) else {
            return true;
        };
        let base = fields.get(VERSION).cloned().unwrap_or_else(|| "0".into());
        let key = self.key(id);
        let mut pipe = redis::pipe();
        let eval =
            pipe.cmd("EVAL").arg(WRITE_WHOLE).arg(2).arg(&key).arg(self.ended_key(id)).arg(&base).arg(self.ttl_ms());
        for (k, v) in fields.iter().filter(|(k, _)| k.as_str() != VERSION) {
            eval.arg(k).arg(v);
        }
        let written = match self.run::<(i64,)>(&pipe).await {
            Ok((v,)) => v,
            Err(_) => {
                self.mark_dirty(id);
                return false;
            }
        };
        if written >= 0 {
            if let Some(entry) = self.local.lock().expect("local lock").get_mut(id) {
                entry.fields.insert(VERSION.into(), written.to_string());
                entry.dirty = false;
            }
            return true;
        }
        if written == -2 {
            // Ended on another replica meanwhile: not brought back (the sweep ends it here).
            self.local.lock().expect("local lock").remove(id);
            return true;
        }
        tracing::info!("a session changed on another replica since this one last wrote it; the store's record is kept");
        self.reread(id).await
    }

    /// Replaces this replica's copy of session `id` with the store's record.
    async fn reread(&self, id: &str) -> bool {
        let record = match self.fetch(id).await {
            Err(_) => {
                self.mark_dirty(id);
                return false;
            }
            Ok(r) => r,
        };
        let mut local = self.local.lock().expect("local lock");
        match record {
            Some(r) => {
                if let Some(entry) = local.get_mut(id) {
                    entry.fields = Self::fields_of(&r);
                    entry.dirty = false;
                }
            }
            // Ended (or expired) meanwhile: nothing to keep in step with.
            None => {
                local.remove(id);
            }
        }
        true
    }

    fn mark_dirty(&self, id: &str) {
        if let Some(entry) = self.local.lock().expect("local lock").get_mut(id) {
            entry.dirty = true;
        }
    }

    /// Applies `change` to the session `id` here and in the store.
    pub async fn change(&self, id: &str, change: Change) {
        let (set, del, identity, version, dirty) = {
            let mut local = self.local.lock().expect("local lock");
            let Some(entry) = local.get_mut(id) else { return };
            let (set, del) = change.apply(&mut entry.fields);
            // The fields that never change go along: a record the store lost comes back whole enough to resume.
            let identity: Vec<(String, String)> = [PRINCIPAL, CLIENT, REVISION, CREATED]
                .iter()
                .filter_map(|k| entry.fields.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            let version: i64 = entry.fields.get(VERSION).and_then(|v| v.parse().ok()).unwrap_or(0);
            (set, del, identity, version, entry.dirty)
        };
        if dirty {
            // Changes made while the store was away go together, with the version check.
            self.write_through(id).await;
            return;
        }
        let key = self.key(id);
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut pairs = identity;
        pairs.extend(set);
        pipe.hset_multiple(&key, &pairs).ignore();
        if let Some(field) = del {
            pipe.hdel(&key, field).ignore();
        }
        pipe.hincr(&key, VERSION, 1).pexpire(&key, self.ttl_ms()).ignore();
        match self.run::<(i64,)>(&pipe).await {
            Err(_) => self.mark_dirty(id),
            Ok((now,)) if now == version + 1 => {
                if let Some(entry) = self.local.lock().expect("local lock").get_mut(id) {
                    entry.fields.insert(VERSION.into(), now.to_string());
                }
            }
            // The store lost the record (a restart it did not show as an outage, an eviction):
            // what it has now is this change alone, so this replica's whole copy goes back.
            Ok((now,)) if now <= version => {
                self.write_through(id).await;
            }
            // Another replica wrote the record since this copy was in step: read it back.
            Ok(_) => {
                self.reread(id).await;
            }
        }
    }

    /// Whether the session `id` is due to push its expiry back (at most every few seconds).
    pub fn due(&self, id: &str) -> bool {
        let mut local = self.local.lock().expect("local lock");
        match local.get_mut(id) {
            Some(entry) if entry.refreshed.elapsed() >= self.refresh_every => {
                entry.refreshed = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// Pushes the expiry of session `id` back. Returns false when the session was ended
    /// elsewhere (a `DELETE` on another replica): this replica should end it too.
    pub async fn refresh(&self, id: &str) -> bool {
        let key = self.key(id);
        let mut pipe = redis::pipe();
        pipe.pexpire(&key, self.ttl_ms()).exists(self.ended_key(id));
        let Ok((kept, ended)) = self.run::<(bool, bool)>(&pipe).await else {
            return true;
        };
        if ended {
            return false;
        }
        if kept {
            let mut pipe = redis::pipe();
            pipe.hset(&key, SEEN, now_ms().to_string()).ignore();
            let _ = self.run::<()>(&pipe).await;
        } else {
            // The store lost it (a restart without persistence, or eviction): write it again.
            self.write_through(id).await;
        }
        true
    }

    /// Which of the sessions `ids` (held here) were ended on another replica. One pipeline for
    /// all; none when the store cannot say.
    pub async fn ended_among(&self, ids: &[String]) -> Vec<String> {
        if ids.is_empty() {
            return Vec::new();
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.exists(self.ended_key(id));
        }
        let Ok(ended) = self.run::<Vec<bool>>(&pipe).await else { return Vec::new() };
        // Their copies here go when rmcp closes them (`ended_here`, through the registry).
        ids.iter().zip(ended).filter(|(_, e)| *e).map(|(id, _)| id.clone()).collect()
    }

    /// How often a held session is checked for having been ended elsewhere, and pushes its
    /// expiry back while in use: a quarter of the idle timeout, at most 5 s.
    pub fn refresh_every(&self) -> Duration {
        self.refresh_every
    }

    /// A sweep for sessions ended elsewhere starts: its number.
    pub fn sweep_starts(&self) -> u64 {
        self.sweeps.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Sweep `n` ended a session here.
    pub fn sweep_ended_one(&self, n: u64) {
        self.swept_end.fetch_max(n, Ordering::Relaxed);
    }

    fn ended_key(&self, id: &str) -> String {
        let key = self.key(id);
        format!("{}ended:{}", self.prefix, &key[self.prefix.len() + "session:".len()..])
    }

    /// Ends session `id` everywhere: its record goes, and a marker tells the replicas that still
    /// hold it to end it too (see [`SharedSessions::refresh`]).
    pub async fn delete(&self, id: &str) {
        self.local.lock().expect("local lock").remove(id);
        if !self.delete_stored(id).await {
            let mut ended = self.ended.lock().expect("ended lock");
            if ended.len() < HANDOVER_LIMIT {
                ended.insert(id.to_string());
            }
        }
    }

    async fn delete_stored(&self, id: &str) -> bool {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .del(self.key(id))
            .ignore()
            .set(self.ended_key(id), 1)
            .ignore()
            .pexpire(self.ended_key(id), self.ttl_ms());
        pipe.ignore();
        self.run::<()>(&pipe).await.is_ok()
    }

    /// Forgets what this replica kept of session `id`, which ended here or whose rebuild here
    /// failed (the record stays in the store until it expires, or another replica ends it).
    pub fn ended_here(&self, id: &str) {
        self.local.lock().expect("local lock").remove(id);
        self.inits.lock().expect("inits lock").remove(id);
        self.prefetched.lock().expect("prefetched lock").remove(id);
    }

    /// Sessions kept here.
    pub fn local_count(&self) -> usize {
        self.local.lock().expect("local lock").len()
    }

    /// Writes through what failed, once the store answers again; runs until `ct` is cancelled.
    pub async fn run_write_through(self: Arc<Self>, ct: CancellationToken) {
        let ping = {
            let mut p = redis::pipe();
            p.cmd("PING");
            p
        };
        loop {
            if self.state.load(Ordering::Acquire) != DOWN && self.pending_writes() == 0 {
                if self.state.load(Ordering::Acquire) == UNKNOWN {
                    // Say early, in /status and the log, whether the store can be reached.
                    let _ = self.probe::<Vec<String>>(&ping).await;
                    continue;
                }
                tokio::select! {
                    _ = ct.cancelled() => return,
                    _ = self.wake.notified() => {}
                }
                continue;
            }
            tokio::select! {
                _ = ct.cancelled() => return,
                _ = tokio::time::sleep(RETRY_EVERY) => {}
            }
            let was_down = self.state.load(Ordering::Acquire) == DOWN;
            if self.probe::<Vec<String>>(&ping).await.is_err() {
                continue;
            }
            if was_down {
                // A Redis that restarted may have lost every key: write all of this replica's.
                for entry in self.local.lock().expect("local lock").values_mut() {
                    entry.dirty = true;
                }
                tracing::info!("session store reachable again; writing this replica's sessions through");
            }
            self.flush().await;
        }
    }

    async fn flush(&self) {
        let dirty: Vec<String> =
            self.local.lock().expect("local lock").iter().filter(|(_, e)| e.dirty).map(|(id, _)| id.clone()).collect();
        for id in dirty {
            if !self.write_through(&id).await {
                return;
            }
        }
        let ended: Vec<String> = self.ended.lock().expect("ended lock").iter().cloned().collect();
        for id in ended {
            if !self.delete_stored(&id).await {
                return;
            }
            self.ended.lock().expect("ended lock").remove(&id);
        }
    }

    fn pending_writes(&self) -> usize {
        let dirty = self.local.lock().expect("local lock").values().filter(|e| e.dirty).count();
        dirty + self.ended.lock().expect("ended lock").len()
    }

    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == UP
    }

    pub fn status(&self) -> StoreStatus {
        let last = self.last_error.lock().expect("store error lock").clone();
        StoreStatus {
            kind: "redis",
            state: match self.state.load(Ordering::Acquire) {
                UP => "up",
                DOWN => "down",
                _ => "unknown",
            },
            last_error_secs_ago: last.as_ref().and_then(|(_, at)| at.elapsed().ok()).map(|d| d.as_secs()),
            last_error: last.map(|(e, _)| e),
            pending_writes: self.pending_writes(),
            restored: self.restored.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            sweep_every_ms: self.refresh_every.as_millis() as u64,
            sweeps: self.sweeps.load(Ordering::Relaxed),
            last_sweep_that_ended: self.swept_end.load(Ordering::Relaxed),
        }
    }

    /// Whether backend sessions are stored for other replicas to take over (`sessions.secret`).
    pub fn hands_over_backend_sessions(&self) -> bool {
        self.seal_key.is_some()
    }

    /// A backend session of session `id`, sealed for the store: ChaCha20-Poly1305 under the key
    /// from `sessions.secret`, bound to the session and the backend (a sealed value moved to
    /// another record does not open). `-` when no secret is set: nothing to take over then.
    pub fn seal(&self, id: &str, backend: &str, stored: &StoredUpstream) -> String {
        use chacha20poly1305::aead::{Aead, KeyInit, Payload};
        let Some(key) = &self.seal_key else { return "-".into() };
        let cipher = chacha20poly1305::ChaCha20Poly1305::new((&key.0).into());
        let nonce: [u8; 12] = rand::random();
        let plain = serde_json::to_vec(stored).expect("a backend session serialises");
        let aad = format!("{}\n{backend}", self.key(id));
        let Ok(sealed) = cipher.encrypt((&nonce).into(), Payload { msg: &plain, aad: aad.as_bytes() }) else {
            return "-".into();
        };
        base16ct::lower::encode_string(&[nonce.as_slice(), &sealed].concat())
    }

    /// What [`SharedSessions::seal`] sealed, if this key sealed it for this session and backend.
    pub fn unseal(&self, id: &str, backend: &str, sealed: &str) -> Option<StoredUpstream> {
        use chacha20poly1305::aead::{Aead, KeyInit, Payload};
        let key = self.seal_key.as_ref()?;
        let bytes = base16ct::lower::decode_vec(sealed).ok()?;
        if bytes.len() < 12 {
            return None;
        }
        let (nonce, body) = bytes.split_at(12);
        let cipher = chacha20poly1305::ChaCha20Poly1305::new((&key.0).into());
        let aad = format!("{}\n{backend}", self.key(id));
        let plain = cipher.decrypt(nonce.into(), Payload { msg: body, aad: aad.as_bytes() }).ok()?;
        serde_json::from_slice(&plain).ok()
    }

    /// The record's fields as this replica keeps them (seen now).
    fn fields_of(record: &Record) -> Fields {
        let mut fields = Fields::new();
        fields.insert(PRINCIPAL.into(), record.principal.clone());
        fields.insert(REVISION.into(), record.client.protocol_version.to_string());
        fields.insert(CLIENT.into(), serde_json::to_string(&record.client).expect("initialize parameters serialise"));
        fields.insert(CREATED.into(), record.created_ms.to_string());
        fields.insert(SEEN.into(), now_ms().to_string());
        fields.insert(VERSION.into(), record.version.to_string());
        if let Some(level) = &record.level {
            fields.insert(LEVEL.into(), level.clone());
        }
        for uri in &record.subscriptions {
            fields.insert(format!("{SUB}{uri}"), "1".into());
        }
        for (b, sealed) in &record.upstreams {
            fields.insert(format!("{UPSTREAM}{b}"), sealed.clone());
        }
        fields
    }
}

/// The first (only) value of a one-command pipeline.
fn one<T>(mut v: Vec<T>) -> T {
    v.swap_remove(0)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// rmcp's view of the store: it asks for a session's `initialize` parameters to replay them on
/// a replica that has not seen the session, hands them over for a new session, and ends one on
/// `DELETE`.
pub struct RmcpStore(pub Arc<SharedSessions>);

#[async_trait::async_trait]
impl SessionStore for RmcpStore {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let prefetched = self.0.prefetched.lock().expect("prefetched lock").remove(id);
        let record = match prefetched {
            Some(r) => Some(r),
            None => self.0.fetch(id).await?,
        };
        Ok(record.map(|r| SessionState::new(r.client)))
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let mut inits = self.0.inits.lock().expect("inits lock");
        if inits.len() < HANDOVER_LIMIT {
            inits.insert(id.to_string(), state.initialize_params.clone());
        }
        Ok(())
    }

    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        self.0.delete(id).await;
        Ok(())
    }
}

/// The record of a session a replica is rebuilding, on the request that rebuilds it: the
/// handler's replayed `initialize` reads it to restore the level and subscriptions.
#[derive(Debug, Clone)]
pub struct Restored(pub Arc<Record>);

/// The session id a request carries (set by the HTTP edge), for changes the handler records.
#[derive(Debug, Clone)]
pub struct SessionKey(pub Arc<str>);
