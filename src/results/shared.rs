//! Kept results shared by the replicas (`[sessions] store = "redis"`): behind a plain balancer
//! a client's next request, its read of a kept result included, may reach any replica. Each
//! kept result is one Redis hash, written before the cut result is answered and expiring with
//! `keep_for`: who made the call (a sha256 of the principal, so the store holds no names), the
//! names of its parts, and each part's text, MIME type and kind. Each replica bounds what it
//! wrote (`results::kept::Kept`, per principal and in all) and deletes what it evicts, so the
//! store holds at most `keep_bytes` per replica.

use std::time::Duration;

use sha2::Digest;

use super::kept::{Miss, Part};
use crate::session::shared::{SharedSessions, Unreachable};

fn key(store: &SharedSessions, id: &str) -> String {
    format!("{}result:{id}", store.prefix())
}

fn who(principal: &str) -> String {
    base16ct::lower::encode_string(&sha2::Sha256::digest(principal.as_bytes()))
}

/// Writes a kept result for `principal`, to expire after `keep_for`.
pub async fn put(
    store: &SharedSessions,
    id: &str,
    principal: &str,
    parts: &[Part],
    keep_for: Duration,
) -> Result<(), Unreachable> {
    let key = key(store, id);
    let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
    let mut pipe = redis::pipe();
    pipe.atomic().hset(&key, "who", who(principal)).ignore().hset(&key, "parts", names.join(",")).ignore();
    for p in parts {
        pipe.hset(&key, format!("t:{}", p.name), p.text.as_bytes()).ignore();
        pipe.hset(&key, format!("m:{}", p.name), p.mime_type.as_deref().unwrap_or("")).ignore();
        pipe.hset(&key, format!("b:{}", p.name), if p.binary { "1" } else { "0" }).ignore();
    }
    pipe.pexpire(&key, keep_for.as_millis().min(i64::MAX as u128) as i64).ignore();
    store.query::<()>(&pipe).await
}

/// Part `name` (none: the first) of kept result `id`, if `principal` kept it.
pub async fn get(
    store: &SharedSessions,
    id: &str,
    principal: &str,
    name: Option<&str>,
) -> Result<Result<Part, Miss>, Unreachable> {
    let key = key(store, id);
    let mut pipe = redis::pipe();
    pipe.hget(&key, "who").hget(&key, "parts");
    let (owner, parts): (Option<String>, Option<String>) = store.query(&pipe).await?;
    if owner.as_deref() != Some(who(principal).as_str()) {
        return Ok(Err(Miss::Gone));
    }
    let parts: Vec<String> = parts.unwrap_or_default().split(',').map(str::to_owned).collect();
    let Some(name) = name.map(str::to_owned).or_else(|| parts.first().cloned()).filter(|n| parts.contains(n)) else {
        return Ok(Err(Miss::NoPart(parts)));
    };
    let mut pipe = redis::pipe();
    pipe.hget(&key, format!("t:{name}")).hget(&key, format!("m:{name}")).hget(&key, format!("b:{name}"));
    let (text, mime, binary): (Option<Vec<u8>>, Option<String>, Option<String>) = store.query(&pipe).await?;
    // Expired between the two reads: as if it never was.
    let Some(text) = text.and_then(|t| String::from_utf8(t).ok()) else { return Ok(Err(Miss::Gone)) };
    Ok(Ok(Part {
        name,
        text: text.into(),
        mime_type: mime.filter(|m| !m.is_empty()),
        binary: binary.as_deref() == Some("1"),
    }))
}

/// Deletes kept results this replica evicted to make room.
pub async fn forget(store: &SharedSessions, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.del(key(store, id)).ignore();
    }
    if let Err(e) = store.query::<()>(&pipe).await {
        tracing::debug!(error = %e.0, "evicted kept results not deleted from the store (they expire)");
    }
}
