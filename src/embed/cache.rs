//! Vectors on disk, keyed by sha256(model id, revision, text), so a restart with an unchanged
//! catalog runs the model on nothing.
//!
//! One append-only file per model, shared by every toolmux process of the user (a desktop
//! client starts one `serve --stdio` per window). The file starts with a header (magic, format
//! version, dimension); then records, each self-checking: its payload's length, the payload (a
//! 32-byte key and `dim` little-endian f32s) and a CRC-32 of both. Appends take an exclusive
//! lock on a lock file beside it and write one whole record batch at a time, so records from two
//! processes never interleave. Loading skips (and counts) records whose checksum fails, stops at
//! a torn tail (a crash mid-write) and cuts it off, and rewrites the file without its dead
//! records (duplicates, corrupt ones) when they are most of it. A rewrite replaces the file by a
//! rename, so a process appending to the old file notices (another inode at the path) and
//! reopens it before its next append.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

pub type Key = [u8; 32];

const MAGIC: &[u8; 4] = b"TMXV";
const FORMAT: u32 = 2;
const HEADER: usize = 12;

pub struct VectorCache {
    dim: usize,
    model_id: String,
    map: Mutex<HashMap<Key, Vec<f32>>>,
    /// `None` when the cache is memory-only (no folder could be used).
    disk: Option<Mutex<Disk>>,
    path: Option<PathBuf>,
    /// Corrupt records skipped when the file was loaded.
    pub corrupt: usize,
}

/// The file and the lock file beside it.
struct Disk {
    path: PathBuf,
    dim: usize,
    lock: File,
    file: File,
}

impl Disk {
    /// Runs `f` with the file under the exclusive lock, reopened first if a rewrite replaced it.
    fn locked<T>(&mut self, f: impl FnOnce(&mut File) -> std::io::Result<T>) -> std::io::Result<T> {
        self.lock.lock()?;
        let result = (|| {
            let replaced = std::fs::metadata(&self.path).map(|m| m.ino()).ok() != Some(self.file.metadata()?.ino());
            if replaced {
                self.file = open_data(&self.path, self.dim)?;
            }
            f(&mut self.file)
        })();
        self.lock.unlock()?;
        result
    }
}

/// Opens (creating, with its header) the data file for vectors of `dim` floats.
fn open_data(path: &Path, dim: usize) -> std::io::Result<File> {
    let mut f = OpenOptions::new().create(true).read(true).append(true).open(path)?;
    if f.metadata()?.len() == 0 {
        f.write_all(&header(dim))?;
    }
    Ok(f)
}

fn header(dim: usize) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend(FORMAT.to_le_bytes());
    h.extend((dim as u32).to_le_bytes());
    h
}

/// One record's bytes: length, key and vector, checksum.
fn record(key: &Key, v: &[f32]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(32 + v.len() * 4);
    payload.extend_from_slice(key);
    for x in v {
        payload.extend(x.to_le_bytes());
    }
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend((payload.len() as u32).to_le_bytes());
    out.extend(&payload);
    out.extend(crc32fast::hash(&payload).to_le_bytes());
    out
}

/// What a file's bytes hold.
#[derive(Debug, Default)]
struct Loaded {
    map: HashMap<Key, Vec<f32>>,
    /// Records read (duplicates included).
    records: usize,
    corrupt: usize,
    /// Where the last whole record ends: past it is a torn tail.
    good_end: usize,
}

fn parse(bytes: &[u8], dim: usize) -> Loaded {
    let mut out = Loaded::default();
    if bytes.len() < HEADER || &bytes[..4] != MAGIC || bytes[4..12] != header(dim)[4..12] {
        return out;
    }
    let want = 32 + dim * 4;
    let mut at = HEADER;
    out.good_end = at;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len != want {
            // A length that cannot be right: nothing after it can be trusted to align.
            out.corrupt += 1;
            break;
        }
        let end = at + 4 + len + 4;
        if end > bytes.len() {
            break;
        }
        let payload = &bytes[at + 4..at + 4 + len];
        let crc = u32::from_le_bytes(bytes[end - 4..end].try_into().expect("4 bytes"));
        if crc32fast::hash(payload) == crc {
            let key: Key = payload[..32].try_into().expect("32-byte key");
            let v = payload[32..].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
            out.map.insert(key, v);
            out.records += 1;
        } else {
            out.corrupt += 1;
        }
        at = end;
        out.good_end = at;
    }
    out
}

impl VectorCache {
    /// Opens (creating) the cache file for `model_id` under `dir`; memory-only if `dir` is `None`.
    pub fn open(dir: Option<&Path>, model_id: &str, dim: usize) -> std::io::Result<Self> {
        let Some(dir) = dir else {
            return Ok(Self {
                dim,
                model_id: model_id.to_string(),
                map: Mutex::default(),
                disk: None,
                path: None,
                corrupt: 0,
            });
        };
        std::fs::create_dir_all(dir)?;
        let tag = base16ct::lower::encode_string(&Sha256::digest(model_id.as_bytes())[..8]);
        let path = dir.join(format!("vectors-{tag}-{dim}.v{FORMAT}.bin"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("vectors-{tag}-{dim}.lock")))?;
        let mut disk = Disk { file: open_data(&path, dim)?, path: path.clone(), dim, lock };
        let loaded = disk.locked(|f| {
            let mut bytes = Vec::new();
            let mut reader = File::open(&path)?;
            reader.read_to_end(&mut bytes)?;
            let loaded = parse(&bytes, dim);
            let dead = loaded.records - loaded.map.len() + loaded.corrupt;
            if loaded.good_end < HEADER || dead > loaded.map.len() {
                // Most of it is dead (or the header is not ours): write the live records afresh.
                rewrite(&path, dim, &loaded.map)?;
            } else if loaded.good_end < bytes.len() {
                // A torn tail: cut it off so later appends stay aligned.
                f.set_len(loaded.good_end as u64)?;
            }
            Ok(loaded)
        })?;
        if loaded.corrupt > 0 {
            tracing::warn!(corrupt = loaded.corrupt, path = %path.display(), "vector cache: corrupt records skipped");
        }
        Ok(Self {
            dim,
            model_id: model_id.to_string(),
            map: Mutex::new(loaded.map),
            disk: Some(Mutex::new(disk)),
            path: Some(path),
            corrupt: loaded.corrupt,
        })
    }

    pub fn key(&self, text: &str) -> Key {
        let mut h = Sha256::new();
        h.update(self.model_id.as_bytes());
        h.update([0u8]);
        h.update(text.as_bytes());
        h.finalize().into()
    }

    pub fn get(&self, key: &Key) -> Option<Vec<f32>> {
        self.map.lock().expect("cache lock").get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.map.lock().expect("cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Stores new vectors in memory and appends them to the file, as one write under the lock.
    pub fn insert_all(&self, items: &[(Key, Vec<f32>)]) -> std::io::Result<()> {
        let mut map = self.map.lock().expect("cache lock");
        let mut batch = Vec::new();
        for (k, v) in items {
            debug_assert_eq!(v.len(), self.dim);
            if map.insert(*k, v.clone()).is_none() {
                batch.extend(record(k, v));
            }
        }
        drop(map);
        if let Some(disk) = &self.disk
            && !batch.is_empty()
        {
            disk.lock().expect("cache file lock").locked(|f| f.write_all(&batch))?;
        }
        Ok(())
    }
}

/// Replaces the file at `path` with one holding only `live`'s records (the lock is held).
fn rewrite(path: &Path, dim: usize, live: &HashMap<Key, Vec<f32>>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut bytes = header(dim);
    for (k, v) in live {
        bytes.extend(record(k, v));
    }
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The user cache folder for vectors: `$XDG_CACHE_HOME/toolmux` or `~/.cache/toolmux`.
pub fn default_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("toolmux"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_reopen_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        let k = c.key("hello");
        c.insert_all(&[(k, vec![1.0, 2.0, 3.0])]).unwrap();
        let path = c.path().unwrap().to_path_buf();
        drop(c);
        // A crash mid-record leaves a partial one behind.
        OpenOptions::new().append(true).open(&path).unwrap().write_all(&[7u8; 10]).unwrap();
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        assert_eq!(c.get(&k), Some(vec![1.0, 2.0, 3.0]));
        let k2 = c.key("world");
        c.insert_all(&[(k2, vec![4.0, 5.0, 6.0])]).unwrap();
        drop(c);
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&k2), Some(vec![4.0, 5.0, 6.0]));
        // Another model never sees these vectors.
        let other = VectorCache::open(Some(dir.path()), "m@2", 3).unwrap();
        assert!(other.get(&other.key("hello")).is_none());
    }

    #[test]
    fn a_corrupt_record_is_skipped_and_counted_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        let keys: Vec<Key> = ["a", "b", "c"].iter().map(|t| c.key(t)).collect();
        for (i, k) in keys.iter().enumerate() {
            c.insert_all(&[(*k, vec![i as f32; 3])]).unwrap();
        }
        let path = c.path().unwrap().to_path_buf();
        drop(c);
        // Flip one byte inside the second record's vector.
        let mut bytes = std::fs::read(&path).unwrap();
        let rec = 4 + 32 + 12 + 4;
        bytes[HEADER + rec + 4 + 32 + 1] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        assert_eq!(c.corrupt, 1);
        assert_eq!(c.get(&keys[0]), Some(vec![0.0; 3]));
        assert_eq!(c.get(&keys[1]), None, "never a vector that fails its checksum");
        assert_eq!(c.get(&keys[2]), Some(vec![2.0; 3]));
    }

    /// Not a test of its own: a writer that `two_processes_appending_at_once_lose_nothing` runs
    /// in a child process (`--ignored --exact`), so it is ignored in a plain run.
    #[test]
    #[ignore = "a child process of two_processes_appending_at_once_lose_nothing"]
    fn writer_process() {
        let dir = std::env::var_os("TOOLMUX_CACHE_DIR").expect("run by two_processes_appending_at_once_lose_nothing");
        let who = std::env::var("TOOLMUX_CACHE_WRITER").expect("TOOLMUX_CACHE_WRITER names the writer");
        let c = VectorCache::open(Some(Path::new(&dir)), "m@1", 64).unwrap();
        for i in 0..200 {
            let text = format!("{who}-{i}");
            c.insert_all(&[(c.key(&text), vec![i as f32; 64])]).unwrap();
        }
    }

    #[test]
    fn two_processes_appending_at_once_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let writers: Vec<_> = ["a", "b"]
            .iter()
            .map(|who| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args(["--ignored", "--exact", "embed::cache::tests::writer_process", "--test-threads", "1"])
                    .env("TOOLMUX_CACHE_DIR", dir.path())
                    .env("TOOLMUX_CACHE_WRITER", who)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut w in writers {
            assert!(w.wait().unwrap().success());
        }
        let c = VectorCache::open(Some(dir.path()), "m@1", 64).unwrap();
        assert_eq!(c.corrupt, 0);
        assert_eq!(c.len(), 400, "every record of both writers");
        for who in ["a", "b"] {
            for i in [0, 99, 199] {
                assert_eq!(c.get(&c.key(&format!("{who}-{i}"))), Some(vec![i as f32; 64]), "{who}-{i}");
            }
        }
    }

    #[test]
    fn mostly_dead_files_are_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        let k = c.key("x");
        let path = c.path().unwrap().to_path_buf();
        drop(c);
        // The same key written many times (as processes racing on one text would).
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        for _ in 0..10 {
            f.write_all(&record(&k, &[1.0, 2.0, 3.0])).unwrap();
        }
        drop(f);
        let before = std::fs::metadata(&path).unwrap().len();
        let c = VectorCache::open(Some(dir.path()), "m@1", 3).unwrap();
        assert_eq!(c.get(&k), Some(vec![1.0, 2.0, 3.0]));
        let after = std::fs::metadata(&path).unwrap().len();
        assert_eq!(after as usize, HEADER + record(&k, &[0.0; 3]).len(), "compacted from {before} bytes");
    }
}
