//! Whole results kept after a cut, for the principal that made the call to read page by page.
//!
//! Bounded three ways: each entry lives `keep_for`; one principal's entries hold at most
//! `keep_bytes_per_principal` (its oldest go first to make room); all entries hold at most
//! `keep_bytes` (the oldest of anyone's go first). A result larger than one principal's share is
//! not kept, and the cut says so. Ids are random (128 bits) and carry this replica's tag, so a
//! read that reaches another replica can say where the result is.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;

use super::cut::{ceil_boundary, floor_boundary};

/// One kept part of a result: a cut text (as it was), a JSON value (compact), or binary data
/// (its base64, as the backend sent it).
#[derive(Debug, Clone)]
pub struct Part {
    /// `0`, `1`, … for the result's content blocks; `structured` for its `structuredContent`.
    pub name: String,
    pub text: Arc<str>,
    pub mime_type: Option<String>,
    pub binary: bool,
}

struct Entry {
    principal: String,
    parts: Vec<Part>,
    bytes: u64,
    until: Instant,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Ids in the order they were kept (some may be gone already).
    order: VecDeque<String>,
    total: u64,
    by_principal: HashMap<String, u64>,
    /// Ids removed to make room, for the shared store to forget too.
    evicted: Vec<String>,
}

pub struct Kept {
    state: Mutex<State>,
    keep_for: Duration,
    max_total: u64,
    max_per_principal: u64,
    /// This process's tag, in every id it hands out.
    replica: String,
}

/// Why a read found nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum Miss {
    /// Unknown, expired, evicted, or another principal's: one answer for all of them.
    Gone,
    /// An id another replica handed out (named).
    Elsewhere(String),
    /// The result exists but has no part of that name (the parts it has).
    NoPart(Vec<String>),
}

impl Kept {
    pub fn new(keep_for: Duration, max_total: u64, max_per_principal: u64) -> Self {
        let tag: u32 = rand::rng().random();
        Self {
            state: Mutex::default(),
            keep_for,
            max_total,
            max_per_principal,
            replica: format!("{:06x}", tag & 0xff_ffff),
        }
    }

    pub fn keep_for(&self) -> Duration {
        self.keep_for
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Keeps `parts` for `principal`; the id to read them by, or why they were not kept.
    pub fn keep(&self, principal: &str, parts: Vec<Part>) -> Result<String, String> {
        let bytes: u64 = parts.iter().map(|p| p.text.len() as u64).sum();
        if self.max_total == 0 {
            return Err("results are not kept here (results.keep_bytes = 0)".into());
        }
        if bytes > self.max_per_principal {
            return Err(format!(
                "it is {bytes} bytes, more than the {} kept per caller (results.keep_bytes_per_principal)",
                self.max_per_principal
            ));
        }
        let now = Instant::now();
        let mut s = self.state.lock().expect("kept results");
        s.expire(now);
        // Room in the principal's share, then in the whole, oldest first.
        while s.by_principal.get(principal).copied().unwrap_or(0) + bytes > self.max_per_principal {
            let Some(oldest) =
                s.order.iter().find(|id| s.entries.get(*id).is_some_and(|e| e.principal == principal)).cloned()
            else {
                break;
            };
            s.remove(&oldest);
        }
        while s.total + bytes > self.max_total {
            let Some(oldest) = s.order.pop_front() else { break };
            s.remove(&oldest);
        }
        let random: u128 = rand::rng().random();
        let id = format!("{}-{random:032x}", self.replica);
        s.total += bytes;
        *s.by_principal.entry(principal.to_string()).or_default() += bytes;
        s.order.push_back(id.clone());
        s.entries
            .insert(id.clone(), Entry { principal: principal.to_string(), parts, bytes, until: now + self.keep_for });
        Ok(id)
    }

    /// Part `name` (none: the first) of result `id`, if `principal` kept it and it is still here.
    pub fn read(&self, principal: &str, id: &str, name: Option<&str>) -> Result<Part, Miss> {
        let mut s = self.state.lock().expect("kept results");
        s.expire(Instant::now());
        let Some(entry) = s.entries.get(id).filter(|e| e.principal == principal) else {
            return match id.split_once('-') {
                Some((tag, _)) if tag != self.replica && tag.len() == self.replica.len() => {
                    Err(Miss::Elsewhere(tag.into()))
                }
                _ => Err(Miss::Gone),
            };
        };
        entry
            .parts
            .iter()
            .find(|p| name.is_none_or(|n| p.name == n))
            .cloned()
            .ok_or_else(|| Miss::NoPart(entry.parts.iter().map(|p| p.name.clone()).collect()))
    }

    /// The ids evicted to make room since the last call.
    pub fn take_evicted(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().expect("kept results").evicted)
    }

    /// Bytes kept now, in all.
    pub fn bytes(&self) -> u64 {
        let mut s = self.state.lock().expect("kept results");
        s.expire(Instant::now());
        s.total
    }
}

impl State {
    fn expire(&mut self, now: Instant) {
        while let Some(id) = self.order.front() {
            match self.entries.get(id) {
                Some(e) if e.until > now => break,
                _ => {
                    let id = self.order.pop_front().expect("front");
                    self.remove(&id);
                }
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(e) = self.entries.remove(id) {
            self.total -= e.bytes;
            if let Some(b) = self.by_principal.get_mut(&e.principal) {
                *b -= e.bytes;
                if *b == 0 {
                    self.by_principal.remove(&e.principal);
                }
            }
        }
    }
}

/// The byte range `[start, end)` of `text` that a read of `length` bytes from `offset` returns:
/// both ends moved down to char boundaries, so that reads that each start where the last ended
/// put the text back together byte for byte. Never empty before the end.
pub fn span(text: &str, offset: usize, length: usize) -> (usize, usize) {
    let start = floor_boundary(text, offset.min(text.len()));
    let mut end = floor_boundary(text, start.saturating_add(length.max(1)).min(text.len()));
    if end == start && start < text.len() {
        end = ceil_boundary(text, start + 1);
    }
    (start, end)
}

/// The byte range of page `page` (from 1) of `text` in pages of `size` bytes (at least 4, so
/// that a page always holds a character): pages end at char boundaries and tile the text.
/// `None` past the last page.
pub fn page_span(text: &str, page: usize, size: usize) -> Option<(usize, usize)> {
    let size = size.max(4);
    let start = floor_boundary(text, page.checked_sub(1)?.saturating_mul(size).min(text.len()));
    if start >= text.len() && !(page == 1 && text.is_empty()) {
        return None;
    }
    let end = floor_boundary(text, page.saturating_mul(size).min(text.len()));
    Some((start, end))
}
