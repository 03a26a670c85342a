//! The trail on disk: lines appended to one file, created 0600, rotated by size and age into
//! `FILE.YYYYMMDDTHHMMSSZ` beside it, the chain carried on from the last line written (in this
//! file or, after a rotation, the newest rotated one), so that it spans rotations and restarts.

use std::fs::File;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use serde::Serialize;

use super::Entry;
use super::chain::{self, GENESIS};
use crate::config::AuditConfig;

pub struct Trail {
    path: PathBuf,
    file: Option<File>,
    /// Bytes in the current file.
    bytes: u64,
    /// When this process started the current file, or took it over.
    since: Instant,
    /// The last line's `seq` and hash.
    seq: u64,
    head: String,
    key: Option<Vec<u8>>,
    max_bytes: u64,
    max_age: std::time::Duration,
}

#[derive(Serialize)]
struct Line<'a> {
    seq: u64,
    time: String,
    #[serde(flatten)]
    entry: &'a Entry,
    prev: &'a str,
}

impl Trail {
    /// Opens the trail at `cfg.file`, carrying the chain on from what is there.
    pub fn open(cfg: &AuditConfig) -> std::io::Result<Self> {
        let path = cfg.file.clone().expect("an audit file");
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode_private().create(dir)?;
        }
        let (seq, head) = match last_line(&path)? {
            Some(l) => l,
            None => newest_rotated(&path)?.map(|p| last_line(&p)).transpose()?.flatten().unwrap_or((0, GENESIS.into())),
        };
        let mut trail = Self {
            path,
            file: None,
            bytes: 0,
            since: Instant::now(),
            seq,
            head,
            key: cfg.key.as_ref().map(|k| k.0.clone()),
            max_bytes: cfg.max_bytes,
            max_age: cfg.max_age,
        };
        trail.reopen()?;
        Ok(trail)
    }

    fn reopen(&mut self) -> std::io::Result<()> {
        let file = append_private(&self.path)?;
        self.bytes = file.metadata()?.len();
        self.since = Instant::now();
        self.file = Some(file);
        Ok(())
    }

    /// The last line's hash: what the next line will chain to.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Appends `entry` as the next line of the chain (rotating first when the file is due), and
    /// answers the line as written.
    pub fn append(&mut self, entry: &Entry) -> std::io::Result<String> {
        if self.bytes > 0 && (self.bytes >= self.max_bytes || self.since.elapsed() >= self.max_age) {
            self.rotate()?;
        }
        if self.file.is_none() {
            self.reopen()?;
        }
        let line = Line {
            seq: self.seq + 1,
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            entry,
            prev: &self.head,
        };
        let body = serde_json::to_string(&line).map_err(std::io::Error::other)?;
        let (mut sealed, hash) = chain::seal(&body, self.key.as_deref());
        sealed.push('\n');
        let file = self.file.as_mut().expect("opened above");
        if let Err(e) = file.write_all(sealed.as_bytes()) {
            // A partial line would break the chain for good: start a fresh file next time.
            self.file = None;
            return Err(e);
        }
        self.bytes += sealed.len() as u64;
        self.seq += 1;
        self.head = hash;
        sealed.pop();
        Ok(sealed)
    }

    /// Moves the current file aside under the time and starts a new one.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.file = None;
        let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string().replace(['-', ':'], "");
        let name = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut to = self.path.with_file_name(format!("{name}.{stamp}"));
        let mut n = 1;
        while to.exists() {
            to = self.path.with_file_name(format!("{name}.{stamp}-{n}"));
            n += 1;
        }
        std::fs::rename(&self.path, &to)?;
        tracing::info!(rotated = %to.display(), "audit trail rotated");
        self.reopen()
    }
}

/// Opens `path` for appending, creating it readable and writable by the owner only.
fn append_private(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// A folder made for the trail is its owner's alone (an existing one is left as it is).
trait PrivateDir {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateDir for std::fs::DirBuilder {
    fn mode_private(&mut self) -> &mut Self {
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(self, 0o700);
        self
    }
}

/// The `seq` and hash of the last line of `path`, if it has one.
fn last_line(path: &Path) -> std::io::Result<Option<(u64, String)>> {
    let file = match File::open(path) {
        // A device (say /dev/null, to keep no trail on disk) has no lines to carry on from.
        Ok(f) if !f.metadata()?.is_file() => return Ok(None),
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut last = None;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if !line.trim().is_empty() {
            last = Some(line);
        }
    }
    Ok(last.and_then(|l| {
        let (body, hash) = chain::unseal(&l)?;
        let seq = serde_json::from_str::<serde_json::Value>(&body).ok()?["seq"].as_u64()?;
        Some((seq, hash.to_string()))
    }))
}

/// The newest `FILE.<stamp>` beside `path` (stamps sort by time).
pub fn newest_rotated(path: &Path) -> std::io::Result<Option<PathBuf>> {
    Ok(rotated(path)?.pop())
}

/// Every `FILE.<stamp>` beside `path`, oldest first.
pub fn rotated(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Some(name) = path.file_name().map(|n| format!("{}.", n.to_string_lossy())) else { return Ok(Vec::new()) };
    let mut found = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&name)))
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    found.sort();
    Ok(found)
}
