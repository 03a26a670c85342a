//! The model's weights, read from its safetensors file one tensor at a time.
//!
//! Mapping the file (candle's `VarBuilder`) puts every page of it in the process's resident set
//! while the model loads, and each tensor was then copied twice more (into a tensor, then into
//! the vector the encoder keeps): loading took 220 MiB at peak for a model that then holds 93.
//! Here each tensor is read straight into the one vector that is kept (or quantised and
//! dropped), in slices, so the load's peak is what the encoder keeps plus one tensor
//! (docs/performance.md). The file was checked against its checksum before it is opened here.
//!
//! The format: eight bytes (little-endian header length), a JSON header naming each tensor's
//! dtype, shape and byte range, then the data. F32, F16 and BF16 tensors are read (as f32).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, bail, ensure};
use serde::Deserialize;

/// Headers larger than this are refused (the format's own reference reader allows 100 MB; a
/// BERT checkpoint's is a few KiB).
const MAX_HEADER: u64 = 100_000_000;
/// Bytes read at a time while converting a tensor.
const SLICE: usize = 1 << 20;

pub struct Checkpoint {
    path: PathBuf,
    file: Mutex<File>,
    /// Where the data begins: after the length and the header.
    data: u64,
    tensors: HashMap<String, Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

impl Checkpoint {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let mut file = File::open(path).with_context(|| format!("{}", path.display()))?;
        let len = file.metadata()?.len();
        let mut size = [0u8; 8];
        file.read_exact(&mut size).with_context(|| format!("{}: no safetensors header", path.display()))?;
        let size = u64::from_le_bytes(size);
        ensure!(size <= MAX_HEADER && 8 + size <= len, "{}: header of {size} bytes does not fit", path.display());
        let mut header = vec![0u8; size as usize];
        file.read_exact(&mut header)?;
        let mut fields: HashMap<String, serde_json::Value> =
            serde_json::from_slice(&header).with_context(|| format!("{}: header is not JSON", path.display()))?;
        fields.remove("__metadata__");
        let data = 8 + size;
        let mut tensors = HashMap::with_capacity(fields.len());
        for (name, field) in fields {
            let entry: Entry =
                serde_json::from_value(field).with_context(|| format!("{}: tensor `{name}`", path.display()))?;
            let [start, end] = entry.data_offsets;
            ensure!(start <= end && data + end <= len, "{}: tensor `{name}` lies outside the file", path.display());
            tensors.insert(name, entry);
        }
        Ok(Self { path: path.to_path_buf(), file: Mutex::new(file), data, tensors })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name`, which must have `shape`, as f32 in row-major order.
    pub fn get(&self, name: &str, shape: &[usize]) -> anyhow::Result<Vec<f32>> {
        let what = || format!("{}: tensor `{name}`", self.path.display());
        let Some(entry) = self.tensors.get(name) else { bail!("{}: no tensor `{name}`", self.path.display()) };
        ensure!(entry.shape == shape, "{} has shape {:?}, expected {shape:?}", what(), entry.shape);
        let width = match entry.dtype.as_str() {
            "F32" => 4,
            "F16" | "BF16" => 2,
            other => bail!("{} is {other}; F32, F16 or BF16 are read", what()),
        };
        let count: usize = shape.iter().product();
        let [start, end] = entry.data_offsets;
        ensure!(end - start == (count * width) as u64, "{}: {} bytes for {count} values", what(), end - start);
        let mut out = Vec::with_capacity(count);
        let mut file = self.file.lock().expect("checkpoint file lock");
        file.seek(SeekFrom::Start(self.data + start))?;
        let mut bytes = vec![0u8; SLICE.min(count * width)];
        while out.len() < count {
            let n = bytes.len().min((count - out.len()) * width);
            file.read_exact(&mut bytes[..n]).with_context(what)?;
            let chunk = &bytes[..n];
            match entry.dtype.as_str() {
                "F32" => out.extend(chunk.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
                "F16" => out.extend(chunk.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())),
                _ => out.extend(chunk.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())),
            }
        }
        Ok(out)
    }

    /// Names under `prefix` (`prefix.`), as `VarBuilder::pp` scopes them.
    pub fn at<'a>(&'a self, prefix: &str) -> Scope<'a> {
        Scope { checkpoint: self, prefix: prefix.to_string() }
    }
}

/// A name prefix in a [`Checkpoint`].
#[derive(Clone)]
pub struct Scope<'a> {
    checkpoint: &'a Checkpoint,
    prefix: String,
}

impl<'a> Scope<'a> {
    pub fn at(&self, name: &str) -> Scope<'a> {
        self.checkpoint.at(&self.name(name))
    }

    fn name(&self, name: &str) -> String {
        if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.checkpoint.contains(&self.name(name))
    }

    pub fn get(&self, name: &str, shape: &[usize]) -> anyhow::Result<Vec<f32>> {
        self.checkpoint.get(&self.name(name), shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of `tensors` (name, dtype, shape, little-endian bytes).
    fn write(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> tempfile::NamedTempFile {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let at = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, data.len()]}),
            );
        }
        let header = serde_json::to_vec(&header).unwrap();
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend(header);
        file.extend(data);
        let out = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(out.path(), file).unwrap();
        out
    }

    #[test]
    fn reads_each_dtype_as_f32_by_scoped_name() {
        let values = [1.5f32, -2.0, 0.25, 3.0, 0.0, -0.5];
        let f32s: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16s: Vec<u8> = values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        let bf16s: Vec<u8> = values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        let file = write(&[
            ("bert.a.weight", "F32", vec![2, 3], f32s),
            ("bert.b", "F16", vec![6], f16s),
            ("c", "BF16", vec![3, 2], bf16s),
        ]);
        let ck = Checkpoint::open(file.path()).unwrap();
        let bert = ck.at("bert");
        assert!(bert.contains("b") && !bert.contains("c") && ck.contains("c"));
        assert_eq!(bert.at("a").get("weight", &[2, 3]).unwrap(), values);
        assert_eq!(bert.get("b", &[6]).unwrap(), values);
        assert_eq!(ck.get("c", &[3, 2]).unwrap(), values);
    }

    #[test]
    fn bad_files_and_requests_say_what_is_wrong() {
        let file = write(&[("w", "F32", vec![2], vec![0; 8]), ("i", "I64", vec![1], vec![0; 8])]);
        let ck = Checkpoint::open(file.path()).unwrap();
        let err = |r: anyhow::Result<Vec<f32>>| format!("{:#}", r.unwrap_err());
        assert!(err(ck.get("w", &[3])).contains("`w` has shape [2], expected [3]"));
        assert!(err(ck.get("x", &[2])).contains("no tensor `x`"));
        assert!(err(ck.get("i", &[1])).contains("is I64"));
        // Offsets past the end of the file, a length past the end, not JSON.
        let short = write(&[("w", "F32", vec![4], vec![0; 8])]);
        let bytes = std::fs::read(short.path()).unwrap();
        let hdr = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8(bytes[8..8 + hdr].to_vec()).unwrap().replace("[0,8]", "[0,16]");
        let mut patched = (header.len() as u64).to_le_bytes().to_vec();
        patched.extend(header.as_bytes());
        patched.extend(&bytes[8 + hdr..]);
        std::fs::write(short.path(), &patched).unwrap();
        let open = |p: &Path| Checkpoint::open(p).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(open(short.path()).contains("lies outside the file"), "{}", open(short.path()));
        std::fs::write(short.path(), [255u8; 16]).unwrap();
        assert!(open(short.path()).contains("does not fit"));
        let mut not_json = 4u64.to_le_bytes().to_vec();
        not_json.extend(b"nope");
        std::fs::write(short.path(), not_json).unwrap();
        assert!(open(short.path()).contains("not JSON"));
    }
}
