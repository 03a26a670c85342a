//! Vectors on disk, keyed by sha256(model id, revision, text), so a restart with an unchanged
//! catalog runs the model on nothing.
//!
//! One append-only file per model: records of a 32-byte key and `dim` little-endian f32s. A torn
//! last record (a crash mid-write) is ignored on load. Lookups are in memory after the first load.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

pub type Key = [u8; 32];

pub struct VectorCache {
    dim: usize,
    model_id: String,
    map: Mutex<HashMap<Key, Vec<f32>>>,
    /// `None` when the cache is memory-only (no folder could be used).
    file: Option<Mutex<BufWriter<File>>>,
    path: Option<PathBuf>,
}

impl VectorCache {
    /// Opens (creating) the cache file for `model_id` under `dir`; memory-only if `dir` is `None`.
    pub fn open(dir: Option<&Path>, model_id: &str, dim: usize) -> std::io::Result<Self> {
        let mut map = HashMap::new();
        let (file, path) = match dir {
            None => (None, None),
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let tag = super::files::hex(&Sha256::digest(model_id.as_bytes())[..8]);
                let path = dir.join(format!("vectors-{tag}-{dim}.bin"));
                if let Ok(mut f) = File::open(&path) {
                    let mut bytes = Vec::new();
                    f.read_to_end(&mut bytes)?;
                    let rec = 32 + dim * 4;
                    for r in bytes.chunks_exact(rec) {
                        let key: Key = r[..32].try_into().expect("32-byte key");
                        let v = r[32..]
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                            .collect();
                        map.insert(key, v);
                    }
                    if bytes.len() % rec != 0 {
                        // Drop the torn tail so later appends stay aligned.
                        let keep = (bytes.len() / rec * rec) as u64;
                        OpenOptions::new().write(true).open(&path)?.set_len(keep)?;
                    }
                }
                let f = OpenOptions::new().create(true).append(true).open(&path)?;
                (Some(Mutex::new(BufWriter::new(f))), Some(path))
            }
        };
        Ok(Self { dim, model_id: model_id.to_string(), map: Mutex::new(map), file, path })
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

    /// Stores new vectors in memory and appends them to the file (flushed before returning).
    pub fn insert_all(&self, items: &[(Key, Vec<f32>)]) -> std::io::Result<()> {
        let mut map = self.map.lock().expect("cache lock");
        let mut fresh = Vec::new();
        for (k, v) in items {
            debug_assert_eq!(v.len(), self.dim);
            if map.insert(*k, v.clone()).is_none() {
                fresh.push((k, v));
            }
        }
        drop(map);
        if let Some(file) = &self.file {
            let mut w = file.lock().expect("cache file lock");
            for (k, v) in fresh {
                w.write_all(k)?;
                for x in v {
                    w.write_all(&x.to_le_bytes())?;
                }
            }
            w.flush()?;
        }
        Ok(())
    }
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
}
