//! The repository stands on its own: a user who clones it has nothing beside it, so no tracked
//! file a test, bench, example or script reads may point outside it. Docs may mention paths
//! freely; everything else is checked.

use std::path::{Path, PathBuf};

/// Files git tracks, or (outside a checkout) every file below the root but build output.
fn project_files(root: &Path) -> Vec<PathBuf> {
    let listed = std::process::Command::new("git").args(["ls-files", "-z"]).current_dir(root).output();
    if let Ok(out) = listed
        && out.status.success()
        && !out.stdout.is_empty()
    {
        return out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            .collect();
    }
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    stack.push(path);
                }
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn no_file_outside_docs_reaches_beyond_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Built from parts so that this file does not name it.
    let sibling = ["..", "shared"].join("/");
    let mut offenders = Vec::new();
    for path in project_files(root) {
        let rel = path.strip_prefix(root).unwrap_or(&path);
        if rel.starts_with("docs") {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else { continue };
        if bytes.windows(sibling.len()).any(|w| w == sibling.as_bytes()) {
            offenders.push(rel.display().to_string());
        }
    }
    assert!(offenders.is_empty(), "these files need a folder beside the clone that users do not have: {offenders:?}");
}
