//! The limits every replica shares, kept in Redis beside the sessions: one Lua script checks a
//! request's keys and spends from all of them or none, atomically, with the server's clock for
//! the buckets (so that replicas whose clocks differ still refill them alike).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::{Check, Kind, Reading};
use crate::session::shared::{SharedSessions, Unreachable};

/// KEYS: one per check. ARGV: four per check: kind (`b` bucket, `w` windowed count, `t` token
/// count) and three numbers — for `b` the burst, the ms one token takes to come back and the
/// ms until a full bucket may be forgotten; for `w` and `t` the most allowed, the ms the key
/// lives and the ms until the window ends. Answers `{0, 0}` when admitted (every count spent),
/// else `{i, ms}`: check `i` (from 1) refuses longest, for `ms`.
const ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local worst, wait, left = 0, 0, {}
for i = 1, #KEYS do
  local kind, a, b, c = ARGV[4*i-3], tonumber(ARGV[4*i-2]), tonumber(ARGV[4*i-1]), tonumber(ARGV[4*i])
  local w = 0
  if kind == 'b' then
    local s = redis.call('HMGET', KEYS[i], 'n', 't')
    local n, at = tonumber(s[1]), tonumber(s[2])
    if n == nil or at == nil then n, at = a, now end
    n = math.min(a, n + math.max(0, now - at) / b)
    left[i] = n
    if n < 1 then w = math.ceil((1 - n) * b) end
  else
    if (tonumber(redis.call('GET', KEYS[i])) or 0) >= a then w = c end
  end
  if w > wait then worst, wait = i, w end
end
if worst > 0 then return {worst, wait} end
for i = 1, #KEYS do
  local kind, a, b, c = ARGV[4*i-3], tonumber(ARGV[4*i-2]), tonumber(ARGV[4*i-1]), tonumber(ARGV[4*i])
  if kind == 'b' then
    redis.call('HSET', KEYS[i], 'n', tostring(left[i] - 1), 't', now)
    redis.call('PEXPIRE', KEYS[i], c)
  elseif kind == 'w' then
    if redis.call('INCR', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], b) end
  end
end
return {0, 0}
"#;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ADMIT));

/// A key outlives its window by this much (clocks differ between replicas).
const WINDOW_SLACK: Duration = Duration::from_secs(60);

fn key(store: &SharedSessions, c: &str) -> String {
    format!("{}limit:{c}", store.prefix())
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// Checks and spends `checks` in one script run: `Ok(Err((i, wait)))` when check `i` refuses.
pub async fn admit(store: &SharedSessions, checks: &[Check]) -> Result<Result<(), (usize, Duration)>, Unreachable> {
    let mut invocation = SCRIPT.prepare_invoke();
    for c in checks {
        invocation.key(key(store, &c.key));
        let (kind, a, b, c) = match c.kind {
            Kind::Bucket { burst, refill } => {
                let refill_ms = refill.as_secs_f64() * 1000.0;
                (
                    "b",
                    u64::from(burst).to_string(),
                    refill_ms.to_string(),
                    (refill_ms * f64::from(burst)).ceil() as u64 + 1000,
                )
            }
            Kind::Calls { max, ends_in } => ("w", max.to_string(), ms(ends_in + WINDOW_SLACK).to_string(), ms(ends_in)),
            Kind::Tokens { max, ends_in } => {
                ("t", max.to_string(), ms(ends_in + WINDOW_SLACK).to_string(), ms(ends_in))
            }
        };
        invocation.arg(kind).arg(a).arg(b).arg(c);
    }
    let (i, wait): (usize, u64) = store.invoke(&invocation).await?;
    Ok(match i {
        0 => Ok(()),
        i => Err((i - 1, Duration::from_millis(wait))),
    })
}

/// Adds `tokens` to each token window (a call's result).
pub async fn add(store: &Arc<SharedSessions>, windows: &[(String, Duration)], tokens: u64) {
    let mut pipe = redis::pipe();
    for (k, ends_in) in windows {
        let k = key(store, k);
        pipe.incr(&k, tokens).ignore().pexpire(&k, ms(*ends_in + WINDOW_SLACK) as i64).ignore();
    }
    if let Err(e) = store.query::<()>(&pipe).await {
        tracing::debug!(error = %e.0, "result tokens not counted in the limits store");
    }
}

/// What each check's key holds now (buckets refilled to now by this replica's clock).
pub async fn read(store: &SharedSessions, checks: &[Check]) -> Result<Vec<Reading>, Unreachable> {
    if checks.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.cmd("TIME");
    for c in checks {
        match c.kind {
            Kind::Bucket { .. } => pipe.cmd("HMGET").arg(key(store, &c.key)).arg("n").arg("t"),
            _ => pipe.get(key(store, &c.key)),
        };
    }
    let values: Vec<redis::Value> = store.query(&pipe).await?;
    let mut values = values.into_iter();
    let now = match values.next() {
        Some(v) => {
            redis::from_redis_value::<(u64, u64)>(v).map_or(0.0, |(s, us)| s as f64 * 1000.0 + us as f64 / 1000.0)
        }
        None => 0.0,
    };
    Ok(checks
        .iter()
        .zip(values)
        .map(|(c, v)| match c.kind {
            Kind::Bucket { burst, refill } => {
                let full = f64::from(burst);
                let (n, at) = redis::from_redis_value::<(Option<f64>, Option<f64>)>(v).unwrap_or((None, None));
                match (n, at) {
                    (Some(n), Some(at)) => {
                        Reading::Tokens((n + (now - at).max(0.0) / (refill.as_secs_f64() * 1000.0)).min(full))
                    }
                    _ => Reading::Tokens(full),
                }
            }
            _ => Reading::Count(redis::from_redis_value::<Option<u64>>(v).ok().flatten().unwrap_or(0)),
        })
        .collect())
}
