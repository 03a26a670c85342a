//! Reading a trail back: `toolmux audit verify` walks the chain through the files given (oldest
//! first) and names the first line that was changed, removed or inserted; `toolmux audit
//! summary` counts the actions by day, principal and backend.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::chain::{self, GENESIS};

/// A chain that holds.
#[derive(Debug, PartialEq)]
pub struct Verified {
    pub files: usize,
    pub lines: u64,
    /// The first line's `seq` (1 when the trail is whole from its start).
    pub first_seq: Option<u64>,
    /// The last line's hash: compare it with the `/status` `audit.head` kept elsewhere.
    pub head: Option<String>,
}

/// Where the chain breaks, and how.
#[derive(Debug, PartialEq)]
pub struct Broken {
    pub file: PathBuf,
    /// From 1.
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}: {}", self.file.display(), self.line, self.what)
    }
}

/// The files given in the order they were written: a trail's file last, after its rotated files
/// (`FILE.<stamp>` sorts by time), however the shell listed them.
pub fn in_order(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut v = files.to_vec();
    v.sort_by(|a, b| {
        let (a, b) = (a.to_string_lossy(), b.to_string_lossy());
        match (b.starts_with(&format!("{a}.")), a.starts_with(&format!("{b}."))) {
            (true, _) => std::cmp::Ordering::Greater,
            (_, true) => std::cmp::Ordering::Less,
            _ => a.cmp(&b),
        }
    });
    v
}

/// Walks the chain through `files` in the order given, with `key` if the trail is keyed.
pub fn verify(files: &[PathBuf], key: Option<&[u8]>) -> anyhow::Result<Result<Verified, Broken>> {
    let mut last: Option<(u64, String)> = None;
    let mut first_seq = None;
    let mut lines = 0;
    for path in files {
        let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            let broken = |what: String| Ok(Err(Broken { file: path.clone(), line: i + 1, what }));
            if line.trim().is_empty() {
                return broken("an empty line where a line of the trail should be (a line was removed)".into());
            }
            let Some((body, hash)) = chain::unseal(&line) else {
                return broken("not a sealed line of the trail (it was changed)".into());
            };
            if chain::digest(body.as_bytes(), key) != hash {
                let keyed =
                    if key.is_none() { " (or the trail is keyed: give --config with its audit.key)" } else { "" };
                return broken(format!("changed: its hash does not match its text{keyed}"));
            }
            let fields: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let (Some(seq), Some(prev)) = (fields["seq"].as_u64(), fields["prev"].as_str()) else {
                return broken("changed: it has no `seq` or `prev`".into());
            };
            match &last {
                None if prev != GENESIS && seq == 1 => {
                    return broken("changed: the first line chains to something".into());
                }
                None => first_seq = Some(seq),
                Some((last_seq, last_hash)) if prev != last_hash => {
                    let what = if seq > last_seq + 1 {
                        format!(
                            "{} line(s) before it were removed (seq {last_seq} is followed by {seq})",
                            seq - last_seq - 1
                        )
                    } else if seq <= *last_seq {
                        format!("inserted: seq {seq} does not follow {last_seq}")
                    } else {
                        "the line before it was inserted or replaced: it does not chain to it".into()
                    };
                    return broken(what);
                }
                Some((last_seq, _)) if seq != last_seq + 1 => {
                    return broken(format!("changed: seq {seq} does not follow {last_seq}"));
                }
                Some(_) => {}
            }
            last = Some((seq, hash.to_string()));
            lines += 1;
        }
    }
    Ok(Ok(Verified { files: files.len(), lines, first_seq, head: last.map(|(_, h)| h) }))
}

/// One day's actions by one principal on one backend (`-` for actions that name none).
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Row {
    pub actions: u64,
    pub calls: u64,
    pub searches: u64,
    /// Denied by policy or limited.
    pub refused: u64,
    /// Allowed, ended `is_error` or `error`.
    pub errors: u64,
    pub result_tokens: u64,
    pub definition_tokens: u64,
    pub saved_tokens: u64,
}

/// Counts the actions in `files` by (day, principal, backend).
pub fn summarise(files: &[PathBuf]) -> anyhow::Result<BTreeMap<(String, String, String), Row>> {
    let mut rows: BTreeMap<(String, String, String), Row> = BTreeMap::new();
    for path in files {
        for fields in read(path)? {
            let s = |k: &str| fields[k].as_str().unwrap_or("-").to_string();
            let day = fields["time"].as_str().map_or_else(|| "-".into(), |t| t.chars().take(10).collect());
            let row = rows.entry((day, s("principal"), s("backend"))).or_default();
            let action = fields["action"].as_str().unwrap_or_default();
            row.actions += 1;
            row.calls += u64::from(matches!(action, "tools/call" | "call_tool"));
            row.searches += u64::from(action == "find_tool");
            row.refused += u64::from(matches!(fields["decision"].as_str(), Some("denied" | "limited" | "refused")));
            row.errors += u64::from(matches!(fields["status"].as_str(), Some("is_error" | "error")));
            let n = |k: &str| fields[k].as_u64().unwrap_or(0);
            row.result_tokens += n("result_tokens");
            row.definition_tokens += n("definition_tokens");
            row.saved_tokens += n("saved_tokens");
        }
    }
    Ok(rows)
}

fn read(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Entry;
    use crate::audit::file::Trail;
    use crate::config::AuditConfig;

    /// A trail of `n` lines in a new folder, rotated every `max_bytes`.
    fn trail(n: usize, max_bytes: u64, key: Option<&str>) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let cfg = AuditConfig {
            file: Some(path.clone()),
            max_bytes,
            key: key.map(|k| crate::config::AuditKey(k.as_bytes().to_vec())),
            ..AuditConfig::default()
        };
        let mut t = Trail::open(&cfg).unwrap();
        for i in 0..n {
            let mut e = Entry::new("tools/call", if i % 2 == 0 { "alice" } else { "bob" }, "allowed");
            e.backend = Some("github".into());
            e.result_tokens = Some(10);
            t.append(&e).unwrap();
        }
        let mut files = super::super::file::rotated(&path).unwrap();
        files.push(path);
        (dir, files)
    }

    fn edit(path: &Path, f: impl FnOnce(&mut Vec<String>)) {
        let mut lines: Vec<String> = std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect();
        f(&mut lines);
        std::fs::write(path, lines.join("\n") + "\n").unwrap();
    }

    #[test]
    fn an_untouched_trail_verifies_across_rotations_and_restarts() {
        let (dir, files) = trail(30, 4096, None);
        assert!(files.len() >= 3, "rotated by size: {files:?}");
        let v = verify(&files, None).unwrap().unwrap();
        assert_eq!((v.lines, v.first_seq), (30, Some(1)));
        // A new writer (a restart) carries the chain on.
        let cfg = AuditConfig { file: files.last().cloned(), ..AuditConfig::default() };
        let mut t = Trail::open(&cfg).unwrap();
        assert_eq!(Some(t.head()), v.head.as_deref());
        t.append(&Entry::new("config/reload", "operator", "allowed")).unwrap();
        assert_eq!(verify(&files, None).unwrap().unwrap().lines, 31);
        // Given in any order, the files are put in the order they were written.
        let mut shuffled = files.clone();
        shuffled.reverse();
        assert_eq!(in_order(&shuffled), files);
        drop(dir);
    }

    #[test]
    fn an_edited_a_removed_and_an_inserted_line_are_each_found() {
        let (_d, files) = trail(10, 1 << 20, None);
        let path = &files[0];
        let clean = std::fs::read_to_string(path).unwrap();
        let reset = || std::fs::write(path, &clean).unwrap();

        edit(path, |l| l[3] = l[3].replace("\"allowed\"", "\"denied\""));
        let b = verify(&files, None).unwrap().unwrap_err();
        assert_eq!(b.line, 4);
        assert!(b.what.starts_with("changed"), "{b}");
        reset();

        edit(path, |l| {
            l.remove(5);
        });
        let b = verify(&files, None).unwrap().unwrap_err();
        assert_eq!(b.line, 6);
        assert!(b.what.contains("1 line(s) before it were removed"), "{b}");
        reset();

        edit(path, |l| {
            let copy = l[2].clone();
            l.insert(7, copy);
        });
        let b = verify(&files, None).unwrap().unwrap_err();
        assert_eq!(b.line, 8);
        assert!(b.what.starts_with("inserted"), "{b}");
        reset();

        // The last line removed leaves a chain that holds, but shorter: its head differs from
        // the one the gateway reported (which is why `/status` shows it).
        let whole = verify(&files, None).unwrap().unwrap();
        edit(path, |l| {
            l.pop();
        });
        let short = verify(&files, None).unwrap().unwrap();
        assert_eq!(short.lines, 9);
        assert_ne!(short.head, whole.head);
    }

    #[test]
    fn a_keyed_trail_needs_its_key() {
        let key = "k".repeat(32);
        let (_d, files) = trail(3, 1 << 20, Some(&key));
        assert_eq!(verify(&files, Some(key.as_bytes())).unwrap().unwrap().lines, 3);
        let b = verify(&files, None).unwrap().unwrap_err();
        assert!(b.what.contains("keyed"), "{b}");
        assert!(verify(&files, Some(b"another key of thirty-two chars..")).unwrap().is_err());
    }

    #[test]
    fn the_summary_counts_by_day_principal_and_backend() {
        let (_d, files) = trail(5, 1 << 20, None);
        let rows = summarise(&files).unwrap();
        let by: Vec<(&str, u64, u64)> =
            rows.iter().map(|((_, p, _), r)| (p.as_str(), r.calls, r.result_tokens)).collect();
        assert_eq!(by, [("alice", 3, 30), ("bob", 2, 20)]);
        assert!(rows.keys().all(|(day, _, b)| day.len() == 10 && b == "github"));
    }
}
