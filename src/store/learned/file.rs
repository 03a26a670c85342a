//! What the learning store keeps: the learning file (`[optimizer] learning_file`, read back by
//! [`Learned::open`], written whole by [`Learned::save`]) and the adapter's record, which the
//! replicas' store holds too ([`Fitted::to_record`]). A matrix is kept with its SHA-256 and
//! served only if it matches; a file that cannot be used is set aside, never a reason not to
//! start.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Entry, Learned, MAX_PAIRS, MAX_TOOLS, SIZE_SAMPLES};
use crate::catalog::ToolKey;
use crate::store::adapter::{Adapter, Judged};

/// One label as kept for the adapter: a request vector at one signed byte per dimension.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Pair {
    pub(super) backend: String,
    pub(super) tool: String,
    pub(super) who: u64,
    #[serde(with = "hex_i8")]
    pub(super) vector: Vec<i8>,
}

/// What one fit of the query adapter decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The adapter to serve, if it passed the guard.
    pub adapter: Option<Adapter>,
    pub judged: Judged,
    /// Labels recorded when the fit began.
    pub labels: u64,
}

impl Fitted {
    /// As the replicas' store keeps it (JSON, the matrix with its digest), numbered `version`.
    pub fn to_record(&self, version: u64) -> String {
        let record = Record {
            version,
            labels: self.labels,
            judged: self.judged.clone(),
            adapter: self.adapter.as_ref().map(|a| MatrixRecord { dim: a.dim, sha256: digest(&a.w), w: a.w.clone() }),
        };
        serde_json::to_string(&record).expect("a record serialises")
    }

    /// A record read back, with its version; why not, if it does not verify for `dim`.
    pub fn from_record(json: &str, dim: usize) -> Result<(Self, u64), String> {
        let r: Record = serde_json::from_str(json).map_err(|e| format!("it is not an adapter record: {e}"))?;
        let adapter = r.adapter.map(|m| m.verified(dim)).transpose()?;
        Ok((Self { adapter, judged: r.judged, labels: r.labels }, r.version))
    }
}

/// A fit as written to the learning file or the replicas' store.
#[derive(Serialize, Deserialize)]
struct Record {
    version: u64,
    labels: u64,
    judged: Judged,
    adapter: Option<MatrixRecord>,
}

/// A matrix with the digest it must match when read back.
#[derive(Serialize, Deserialize)]
struct MatrixRecord {
    dim: usize,
    #[serde(with = "hex_f32")]
    w: Vec<f32>,
    /// SHA-256 of `w`'s little-endian bytes, hex.
    sha256: String,
}

impl MatrixRecord {
    fn verified(self, dim: usize) -> Result<Adapter, String> {
        let adapter = Adapter { dim: self.dim, w: self.w };
        if self.dim != dim {
            return Err("it was fitted for another model".into());
        }
        if digest(&adapter.w) != self.sha256 {
            return Err("its digest does not match its matrix".into());
        }
        if !adapter.is_finite() {
            return Err("its matrix is not whole and finite".into());
        }
        Ok(adapter)
    }
}

#[derive(Serialize, Deserialize)]
struct File {
    dim: usize,
    total: u64,
    #[serde(default)]
    salt: u64,
    tools: Vec<(String, String, Entry)>,
    /// Recent result sizes in tokens, by tool.
    #[serde(default)]
    sizes: Vec<(String, String, Vec<u32>)>,
    #[serde(default)]
    pairs: Vec<Pair>,
    /// The last fit of the query adapter (served or not).
    #[serde(default)]
    adapter: Option<String>,
}

/// SHA-256 of a matrix's little-endian bytes, hex.
pub fn digest(w: &[f32]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    w.iter().for_each(|x| h.update(x.to_le_bytes()));
    base16ct::lower::encode_string(&h.finalize())
}

mod hex_i8 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[i8], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = v.iter().map(|&b| b as u8).collect();
        s.serialize_str(&base16ct::lower::encode_string(&bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i8>, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = base16ct::lower::decode_vec(text).map_err(serde::de::Error::custom)?;
        Ok(bytes.into_iter().map(|b| b as i8).collect())
    }
}

pub(super) mod hex_f32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        s.serialize_str(&base16ct::lower::encode_string(&bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = base16ct::lower::decode_vec(text).map_err(serde::de::Error::custom)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl Learned {
    /// Reads what an earlier run learned from `path`. A missing file is a fresh start; vectors
    /// of another dimension, from another model, are dropped; a file that cannot be read or
    /// parsed, or holds a vector that is not finite, is logged, moved aside (`<file>.bad-<time>`)
    /// and started afresh: ranking hints never stop the gateway.
    pub fn open(enabled: bool, dim: usize, path: Option<PathBuf>) -> Self {
        let me = Self::new(enabled, dim, path);
        let Some(p) = &me.path else { return me };
        let file = match std::fs::read(p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return me,
            Err(e) => Err(format!("it cannot be read: {e}")),
            Ok(bytes) => match serde_json::from_slice::<File>(&bytes) {
                Err(e) => Err(format!("it is not a learned-ranking file: {e}")),
                Ok(f) if f.tools.iter().any(|(_, _, e)| !e.is_finite()) => {
                    Err("it holds a vector that is not finite".into())
                }
                Ok(f) => Ok(f),
            },
        };
        let file = match file {
            Ok(f) => f,
            Err(why) => {
                let aside = set_aside(p);
                tracing::warn!(file = %p.display(), aside = ?aside, why, "optimizer.learning_file set aside: find_tool learns afresh");
                return me;
            }
        };
        if file.dim != dim {
            tracing::warn!(file = file.dim, model = dim, "learned ranking from another model: starting afresh");
            return me;
        }
        let mut tools = me.tools.write().expect("learned lock");
        for (backend, tool, entry) in file.tools.into_iter().take(MAX_TOOLS) {
            if entry.sum.len() == dim {
                tools.insert(ToolKey { backend: backend.into(), tool: tool.into() }, entry);
            }
        }
        drop(tools);
        if file.salt != 0 {
            *me.salt.write().expect("learned lock") = file.salt;
        }
        let mut sizes = me.sizes.write().expect("learned lock");
        for (backend, tool, seen) in file.sizes.into_iter().take(MAX_TOOLS) {
            let recent = seen.into_iter().rev().take(SIZE_SAMPLES).rev().collect();
            sizes.insert(ToolKey { backend: backend.into(), tool: tool.into() }, recent);
        }
        drop(sizes);
        let mut pairs: VecDeque<Pair> = file.pairs.into_iter().filter(|p| p.vector.len() == dim).collect();
        pairs.drain(..pairs.len().saturating_sub(MAX_PAIRS));
        *me.pairs.write().expect("learned lock") = pairs;
        if let Some(record) = file.adapter {
            match Fitted::from_record(&record, dim) {
                Ok((fitted, version)) => me.install(fitted, version),
                Err(why) => {
                    // Kept for a look; the labels still count, and the next fit starts afresh.
                    let aside = copy_aside(p);
                    tracing::warn!(file = %p.display(), aside = ?aside, why, "the query adapter in optimizer.learning_file was not used");
                }
            }
        }
        me.total.store(file.total, Ordering::Relaxed);
        me
    }

    /// Writes the learned vectors to their file if they changed since the last save.
    pub fn save(&self) -> anyhow::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let file = {
            let tools = self.tools.read().expect("learned lock");
            File {
                dim: self.dim,
                total: self.total(),
                salt: *self.salt.read().expect("learned lock"),
                tools: tools.iter().map(|(k, e)| (k.backend.to_string(), k.tool.to_string(), e.clone())).collect(),
                sizes: (self.sizes.read().expect("learned lock").iter())
                    .map(|(k, s)| (k.backend.to_string(), k.tool.to_string(), s.iter().copied().collect()))
                    .collect(),
                pairs: self.pairs.read().expect("learned lock").iter().cloned().collect(),
                adapter: self.last_fit().map(|(judged, labels)| {
                    let fitted = Fitted { adapter: self.served().map(|a| (*a).clone()), judged, labels };
                    fitted.to_record(self.version().unwrap_or(0))
                }),
            }
        };
        crate::store::write_whole(path, &serde_json::to_vec(&file)?)
    }
}

/// Where a file not (wholly) used is kept for a look: `<file>.bad-<time>`.
fn aside(path: &std::path::Path) -> PathBuf {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".bad-{secs}"));
    PathBuf::from(aside)
}

/// Copies a file whose part was not used beside itself; where it went, if it could.
fn copy_aside(path: &std::path::Path) -> Option<PathBuf> {
    let to = aside(path);
    std::fs::copy(path, &to).ok().map(|_| to)
}

/// Moves an unusable file out of the way; where it went, if it could.
fn set_aside(path: &std::path::Path) -> Option<PathBuf> {
    let to = aside(path);
    std::fs::rename(path, &to).ok().map(|_| to)
}
