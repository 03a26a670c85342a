//! Relayed tasks' routes in the store, for the replicas that did not create them (`mcp::tasks`).

use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::{SharedSessions, Unreachable, one};

/// Task routes stored for one principal, at most (see [`SharedSessions::put_task`]).
const TASKS_PER_PRINCIPAL: usize = 1024;
/// How long an owner's set of routes outlives its last write: the longest a route lives.
const OWNER_SET_TTL: Duration = Duration::from_secs(24 * 3600);
/// Stores a task route and counts it in its owner's set, scored by when it expires: expired
/// entries leave the set, and past the bound the entries that expire first go, keys and all.
/// KEYS: the route's key, the owner's set. ARGV: value, ttl ms, now ms, expiry ms, bound, the
/// set's own lifetime ms.
const PUT_TASK: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], KEYS[1])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #gone, 2 do redis.call('DEL', gone[i]) end
end
redis.call('PEXPIRE', KEYS[2], ARGV[6])
"#;

impl SharedSessions {
    fn task_key(&self, id: &str) -> String {
        format!("{}task:{}", self.prefix, base16ct::lower::encode_string(&Sha256::digest(id.as_bytes())))
    }

    /// Stores a relayed task's route (`value`, opaque here) for `ttl`, for the replicas that
    /// did not create it (see `mcp::tasks`), counted against its owner `principal`: past
    /// [`TASKS_PER_PRINCIPAL`] routes stored, that principal's routes that expire first are
    /// dropped, so one principal can fill neither the store nor anyone else's share of it.
    pub async fn put_task(&self, id: &str, value: &str, ttl: Duration, principal: &str) -> Result<(), Unreachable> {
        let ms = ttl.as_millis().clamp(1, i64::MAX as u128) as u64;
        let now = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let owner = format!(
            "{}task-owner:{}",
            self.prefix,
            base16ct::lower::encode_string(&Sha256::digest(principal.as_bytes()))
        );
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(PUT_TASK)
            .arg(2)
            .arg(self.task_key(id))
            .arg(owner)
            .arg(value)
            .arg(ms)
            .arg(now)
            .arg(now.saturating_add(ms))
            .arg(TASKS_PER_PRINCIPAL)
            .arg(OWNER_SET_TTL.as_millis() as u64)
            .ignore();
        self.run::<()>(&pipe).await
    }

    /// Routes stored for one principal's tasks in the store, at most.
    pub fn tasks_per_principal(&self) -> usize {
        TASKS_PER_PRINCIPAL
    }

    /// Forgets a task route everywhere (its owner may no longer use it).
    pub async fn forget_task(&self, id: &str) -> Result<(), Unreachable> {
        self.run::<()>(redis::pipe().del(self.task_key(id)).ignore()).await
    }

    /// A task route another replica stored.
    pub async fn fetch_task(&self, id: &str) -> Result<Option<String>, Unreachable> {
        self.run(redis::pipe().get(self.task_key(id))).await.map(one)
    }
}
