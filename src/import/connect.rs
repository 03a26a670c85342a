//! `toolmux connect HOST`: the one entry that puts toolmux in an agent host's config in place of the
//! servers it imported. Printed by default; `--write` merges it into the host's file (comments and
//! order kept, the file as it was saved beside it), and `--undo` puts that copy back.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::plan::backend_name;
use super::{Host, files};

/// How the host reaches toolmux.
#[derive(Debug, Clone)]
pub enum Via {
    /// The host starts `toolmux serve --stdio --config CONFIG` itself.
    Stdio { command: String, config: String },
    /// The host connects to a running gateway; with a token variable when it needs one.
    Http { url: String, token_var: Option<String> },
}

/// The name the entry goes under in the host's list.
pub const ENTRY: &str = "toolmux";
/// The VS Code input that asks for the gateway's token.
const VSCODE_INPUT: &str = "toolmux-token";

/// The entry as the host's own format, a whole file that holds only it.
pub fn snippet(host: Host, via: &Via) -> anyhow::Result<String> {
    match host {
        Host::Codex => Ok(codex_table(via)),
        Host::Goose => Ok(goose(via)),
        _ => {
            let (key, entry) = json_entry(host, via)?;
            let mut root = serde_json::Map::new();
            let mut servers = serde_json::Map::new();
            servers.insert(ENTRY.into(), entry);
            root.insert(key.into(), Value::Object(servers));
            if let (Host::Vscode, Via::Http { token_var: Some(_), .. }) = (host, via) {
                root.insert("inputs".into(), json!([vscode_input()]));
            }
            Ok(serde_json::to_string_pretty(&Value::Object(root))? + "\n")
        }
    }
}

/// The key a JSON host lists servers under, and toolmux's entry there.
fn json_entry(host: Host, via: &Via) -> anyhow::Result<(&'static str, Value)> {
    let key = if host == Host::Vscode { "servers" } else { "mcpServers" };
    let entry = match via {
        Via::Stdio { command, config } => {
            let args = json!(["serve", "--stdio", "--config", config]);
            match host {
                Host::ClaudeCode | Host::Vscode => json!({ "type": "stdio", "command": command, "args": args }),
                _ => json!({ "command": command, "args": args }),
            }
        }
        Via::Http { url, token_var } => {
            let token = |reference: String| {
                token_var.as_ref().map(|_| json!({ "Authorization": format!("Bearer {reference}") }))
            };
            let var = token_var.clone().unwrap_or_default();
            let (mut e, headers) = match host {
                Host::ClaudeDesktop => bail!(
                    "Claude Desktop's file takes only servers it starts itself: connect it over stdio (leave out --url)"
                ),
                Host::ClaudeCode => (json!({ "type": "http", "url": url }), token(format!("${{{var}}}"))),
                Host::Vscode => (json!({ "type": "http", "url": url }), token(format!("${{input:{VSCODE_INPUT}}}"))),
                Host::Cursor => (json!({ "url": url }), token(format!("${{env:{var}}}"))),
                Host::Windsurf => (json!({ "serverUrl": url }), token(format!("${{env:{var}}}"))),
                Host::Gemini => (json!({ "httpUrl": url }), token(format!("${{{var}}}"))),
                Host::Cline => (
                    json!({ "type": "streamableHttp", "url": url }),
                    // Cline expands no variables: the token is written where the user puts it.
                    token("<the token of $".to_string() + &var + ">"),
                ),
                Host::Codex | Host::Goose => unreachable!("not JSON hosts"),
            };
            if let Some(h) = headers {
                e["headers"] = h;
            }
            e
        }
    };
    Ok((key, entry))
}

fn vscode_input() -> Value {
    json!({ "type": "promptString", "id": VSCODE_INPUT, "description": "toolmux gateway token", "password": true })
}

fn codex_table(via: &Via) -> String {
    let q = super::write::quote;
    match via {
        Via::Stdio { command, config } => format!(
            "[mcp_servers.{ENTRY}]\ncommand = {}\nargs = [\"serve\", \"--stdio\", \"--config\", {}]\n",
            q(command),
            q(config)
        ),
        Via::Http { url, token_var } => {
            let mut t = format!("[mcp_servers.{ENTRY}]\nurl = {}\n", q(url));
            if let Some(var) = token_var {
                t.push_str(&format!("bearer_token_env_var = {}\n", q(var)));
            }
            t
        }
    }
}

fn goose(via: &Via) -> String {
    let q = |s: &str| Value::from(s).to_string();
    match via {
        Via::Stdio { command, config } => format!(
            "extensions:\n  {ENTRY}:\n    name: {ENTRY}\n    type: stdio\n    enabled: true\n    cmd: {}\n    args: [\"serve\", \"--stdio\", \"--config\", {}]\n    timeout: 300\n",
            q(command),
            q(config)
        ),
        Via::Http { url, token_var } => {
            let mut t = format!(
                "extensions:\n  {ENTRY}:\n    name: {ENTRY}\n    type: streamable_http\n    enabled: true\n    uri: {}\n    timeout: 300\n",
                q(url)
            );
            if let Some(var) = token_var {
                t.push_str(&format!("    headers:\n      Authorization: \"Bearer <the token of ${var}>\"\n"));
            }
            t
        }
    }
}

/// The copy of a host file as it was before toolmux's first `--write`; empty when there was no
/// file (`--undo` then removes the one written).
pub fn backup_of(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".before-toolmux");
    PathBuf::from(name)
}

/// What `--write` did.
#[derive(Debug)]
pub struct Wrote {
    pub file: PathBuf,
    pub backup: PathBuf,
    /// The host's entries taken out, now served through toolmux.
    pub removed: Vec<String>,
    /// The host's entries left in place (not imported).
    pub kept: Vec<String>,
}

/// Merges the entry into `file`, taking out the entries `imported` (backend names) covers.
pub fn write(host: Host, via: &Via, file: &Path, imported: &BTreeSet<String>) -> anyhow::Result<Wrote> {
    if host == Host::Goose {
        bail!(
            "Goose keeps its extensions in YAML, which toolmux does not edit: run `goose configure` (Add Extension), \
             or paste the entry `toolmux connect goose` prints into {}",
            file.display()
        );
    }
    let before = match std::fs::read_to_string(file) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    let (after, removed, kept) = match host {
        Host::Codex => merge_toml(before.as_deref().unwrap_or(""), via, imported)?,
        _ => merge_json(host, before.as_deref().unwrap_or("{}"), via, imported)?,
    };
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let backup = backup_of(file);
    // The first write keeps the original; later ones leave it be, so --undo always goes back to
    // the file as it was before toolmux. The copy holds what the host file held (its servers'
    // tokens, often), so it is never readable by more people than the original was.
    if !backup.exists() {
        let mode = files::mode_of(file).unwrap_or(files::PRIVATE);
        files::create_new(&backup, before.as_deref().unwrap_or("").as_bytes(), mode)
            .with_context(|| format!("saving {} as {}", file.display(), backup.display()))?;
    }
    std::fs::write(file, after).with_context(|| format!("writing {}", file.display()))?;
    Ok(Wrote { file: file.to_path_buf(), backup, removed, kept })
}

/// Puts the file back as it was before toolmux's first `--write`.
pub fn undo(file: &Path) -> anyhow::Result<String> {
    let backup = backup_of(file);
    let saved =
        std::fs::read(&backup).with_context(|| format!("nothing to undo: {} is not there", backup.display()))?;
    if saved.is_empty() {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", file.display())),
        }
        std::fs::remove_file(&backup)?;
        return Ok(format!("removed {} (there was none before toolmux)", file.display()));
    }
    std::fs::write(file, &saved).with_context(|| format!("restoring {}", file.display()))?;
    std::fs::remove_file(&backup).with_context(|| format!("removing {}", backup.display()))?;
    Ok(format!("restored {} as it was before toolmux", file.display()))
}

fn merge_json(
    host: Host,
    text: &str,
    via: &Via,
    imported: &BTreeSet<String>,
) -> anyhow::Result<(String, Vec<String>, Vec<String>)> {
    use jsonc_parser::cst::CstRootNode;
    let (key, entry) = json_entry(host, via)?;
    let options =
        jsonc_parser::ParseOptions { allow_comments: true, allow_trailing_commas: true, ..Default::default() };
    let root = CstRootNode::parse(text, &options).map_err(|e| anyhow::anyhow!("not JSON: {e}"))?;
    let object = root.object_value_or_set();
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    let mut lists = vec![object.object_value_or_set(key)];
    // Claude Code's per-project servers are in the same file.
    if host == Host::ClaudeCode
        && let Some(projects) = object.object_value("projects")
    {
        for p in projects.properties() {
            if let Some(o) = p.value().and_then(|v| v.as_object()).and_then(|o| o.object_value(key)) {
                lists.push(o);
            }
        }
    }
    for list in &lists {
        for prop in list.properties() {
            let Some(name) = prop.name().and_then(|n| n.decoded_value().ok()) else { continue };
            if name == ENTRY {
                prop.remove();
            } else if imported.contains(&backend_name(&name)) {
                removed.push(name);
                prop.remove();
            } else {
                kept.push(name);
            }
        }
    }
    lists[0].append(ENTRY, to_input(&entry));
    if let (Host::Vscode, Via::Http { token_var: Some(_), .. }) = (host, via) {
        let inputs = object.array_value_or_set("inputs");
        let present = inputs.elements().iter().any(|e| {
            e.as_object()
                .and_then(|o| o.get("id"))
                .and_then(|p| p.value())
                .and_then(|v| v.as_string_lit())
                .and_then(|s| s.decoded_value().ok())
                .is_some_and(|id| id == VSCODE_INPUT)
        });
        if !present {
            inputs.append(to_input(&vscode_input()));
        }
    }
    Ok((root.to_string(), removed, kept))
}

/// A JSON value as the CST's input.
fn to_input(v: &Value) -> jsonc_parser::cst::CstInputValue {
    use jsonc_parser::cst::CstInputValue as I;
    match v {
        Value::Null => I::Null,
        Value::Bool(b) => I::Bool(*b),
        Value::Number(n) => I::Number(n.to_string()),
        Value::String(s) => I::String(s.clone()),
        Value::Array(a) => I::Array(a.iter().map(to_input).collect()),
        Value::Object(o) => I::Object(o.iter().map(|(k, v)| (k.clone(), to_input(v))).collect()),
    }
}

fn merge_toml(
    text: &str,
    via: &Via,
    imported: &BTreeSet<String>,
) -> anyhow::Result<(String, Vec<String>, Vec<String>)> {
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| anyhow::anyhow!("not TOML: {e}"))?;
    let servers = doc
        .entry("mcp_servers")
        .or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        })
        .as_table_mut()
        .context("`mcp_servers` is not a table")?;
    let names: Vec<String> = servers.iter().map(|(k, _)| k.to_string()).collect();
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for name in names {
        if name == ENTRY {
            servers.remove(&name);
        } else if imported.contains(&backend_name(&name)) {
            servers.remove(&name);
            removed.push(name);
        } else {
            kept.push(name);
        }
    }
    let entry: toml_edit::DocumentMut = codex_table(via).parse().expect("the entry is TOML");
    let table = entry["mcp_servers"][ENTRY].clone();
    servers.insert(ENTRY, table);
    Ok((doc.to_string(), removed, kept))
}
