//! The agent hosts' MCP server lists, read into [`Server`]s: the `mcpServers` JSON of most hosts,
//! VS Code's `servers` and `inputs`, and Codex CLI's `[mcp_servers.*]` TOML.
//!
//! Each host's own references are turned into toolmux's: `${VAR}` (Claude Code, Codex's
//! `bearer_token_env_var`) stays as it is, VS Code's `${env:VAR}` becomes `${VAR}`, a default
//! (`${VAR:-x}`) becomes a value for the env file, and a prompted VS Code input becomes a variable
//! the user fills in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{Found, Host, Input, Server, Skipped, Transport};

/// Reads one host file. `host` is what the file's name and place say it belongs to.
pub fn read(path: &Path, host: Host) -> Result<Found, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut found =
        Found { host: Some(host), path: path.to_path_buf(), servers: Vec::new(), skipped: Vec::new(), project: false };
    if host == Host::Goose || path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        return Err(format!(
            "{}: Goose keeps its extensions in YAML, which import does not read; add them as [[backends]] \
             by hand (docs/clients.md shows the keys)",
            path.display()
        ));
    }
    if host == Host::Codex || path.extension().is_some_and(|e| e == "toml") {
        codex(&text, &mut found).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(found);
    }
    let json = parse_jsonc(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Value::Object(root) = json else {
        return Err(format!("{}: not a JSON object", path.display()));
    };
    let workspace = workspace_of(path);
    let mut any = false;
    if let Some(Value::Object(servers)) = root.get("mcpServers") {
        any = true;
        mcp_servers(servers, None, host, &mut found);
    }
    // Claude Code's ~/.claude.json: servers of one project ("local" scope) under its path.
    if let Some(Value::Object(projects)) = root.get("projects") {
        for (project, entry) in projects {
            if let Some(Value::Object(servers)) = entry.get("mcpServers") {
                any = true;
                mcp_servers(servers, Some(project), host, &mut found);
            }
        }
    }
    // VS Code: `servers` in mcp.json, or `mcp.servers` in settings.json (older releases).
    let vscode = match (root.get("servers"), root.get("mcp").and_then(|m| m.get("servers")), root.get("mcp.servers")) {
        (Some(Value::Object(s)), _, _) => Some((s, root.get("inputs"))),
        (_, Some(Value::Object(s)), _) => Some((s, root.get("mcp").and_then(|m| m.get("inputs")))),
        (_, _, Some(Value::Object(s))) => Some((s, root.get("mcp.inputs"))),
        _ => None,
    };
    if let Some((servers, inputs)) = vscode {
        any = true;
        let inputs = vscode_inputs(inputs);
        vscode_servers(servers, &inputs, workspace.as_deref(), &mut found);
    }
    if !any {
        return Err(format!(
            "{}: no MCP servers here (looked for `mcpServers`, `servers`, `mcp.servers` and `projects.*.mcpServers`)",
            path.display()
        ));
    }
    Ok(found)
}

/// JSON with comments and trailing commas, as VS Code and others allow.
pub fn parse_jsonc(text: &str) -> Result<Value, String> {
    let options =
        jsonc_parser::ParseOptions { allow_comments: true, allow_trailing_commas: true, ..Default::default() };
    match jsonc_parser::parse_to_serde_value(text, &options) {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err("the file is empty".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// The folder a workspace file (`.vscode/mcp.json`, `.cursor/mcp.json`) belongs to.
fn workspace_of(path: &Path) -> Option<PathBuf> {
    let parent = path.parent()?;
    let dir = parent.file_name()?.to_str()?;
    matches!(dir, ".vscode" | ".cursor" | ".gemini").then(|| parent.parent().map(Path::to_path_buf)).flatten()
}

fn mcp_servers(servers: &Map<String, Value>, project: Option<&str>, host: Host, found: &mut Found) {
    for (name, entry) in servers {
        let label = match project {
            Some(p) => format!("{name} (project {p})"),
            None => name.clone(),
        };
        let Value::Object(e) = entry else {
            found.skipped.push(Skipped::new(&label, "not a JSON object"));
            continue;
        };
        if e.get("disabled").and_then(Value::as_bool) == Some(true)
            || e.get("enabled").and_then(Value::as_bool) == Some(false)
        {
            found.skipped.push(Skipped::new(&label, "disabled in the host"));
            continue;
        }
        let mut server = Server::new(name, project);
        server.bare_vars = host == Host::Gemini;
        let kind = e.get("type").or_else(|| e.get("transport")).and_then(Value::as_str).map(str::to_ascii_lowercase);
        let http_url = e.get("httpUrl").and_then(Value::as_str);
        let url = e.get("url").or_else(|| e.get("serverUrl")).and_then(Value::as_str);
        let result = match (e.get("command").and_then(Value::as_str), http_url, url) {
            (Some(command), _, _) => stdio(&mut server, command, e, None),
            (None, Some(url), _) => http(&mut server, url, e, false),
            (None, None, Some(url)) => {
                let sse = match kind.as_deref() {
                    Some("sse") => true,
                    Some(_) => false,
                    // Gemini CLI: `url` is SSE, `httpUrl` streamable HTTP.
                    None => host == Host::Gemini,
                };
                http(&mut server, url, e, sse)
            }
            (None, None, None) => Err("neither `command` nor a URL (`url`, `serverUrl`, `httpUrl`)".into()),
        };
        if let Err(why) = result {
            found.skipped.push(Skipped::new(&label, why));
            continue;
        }
        tool_filters(&mut server, e);
        found.servers.push(server);
    }
}

fn vscode_servers(
    servers: &Map<String, Value>,
    inputs: &BTreeMap<String, Input>,
    workspace: Option<&Path>,
    found: &mut Found,
) {
    for (name, entry) in servers {
        let Value::Object(e) = entry else {
            found.skipped.push(Skipped::new(name, "not a JSON object"));
            continue;
        };
        let mut server = Server::new(name, None);
        server.inputs = inputs.clone();
        server.workspace = workspace.map(Path::to_path_buf);
        let kind = e.get("type").and_then(Value::as_str).unwrap_or("");
        let result = match (e.get("command").and_then(Value::as_str), e.get("url").and_then(Value::as_str)) {
            (Some(command), _) if kind.is_empty() || kind == "stdio" => {
                let env_file = e.get("envFile").and_then(Value::as_str);
                stdio(&mut server, command, e, env_file)
            }
            (_, Some(url)) if kind.is_empty() || kind == "http" || kind == "sse" => {
                http(&mut server, url, e, kind == "sse")
            }
            _ => Err(format!("type `{kind}` with neither a `command` nor a `url` it can use")),
        };
        if let Err(why) = result {
            found.skipped.push(Skipped::new(name, why));
            continue;
        }
        found.servers.push(server);
    }
}

/// VS Code's `inputs`: values it asks the user for, by id.
fn vscode_inputs(inputs: Option<&Value>) -> BTreeMap<String, Input> {
    let mut out = BTreeMap::new();
    for i in inputs.and_then(Value::as_array).into_iter().flatten() {
        if let Some(id) = i.get("id").and_then(Value::as_str) {
            let description = i.get("description").and_then(Value::as_str).unwrap_or("").to_string();
            let password = i.get("password").and_then(Value::as_bool).unwrap_or(false);
            out.insert(id.to_string(), Input { description, password });
        }
    }
    out
}

fn stdio(server: &mut Server, command: &str, e: &Map<String, Value>, env_file: Option<&str>) -> Result<(), String> {
    let args = match e.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or("`args` holds a value that is not a string"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`args` is not a list".into()),
    };
    let command = server.value(command);
    let args = args.iter().map(|a| server.value(a)).collect();
    let mut env = BTreeMap::new();
    if let Some(file) = env_file {
        let file = server.value(file);
        match std::fs::read_to_string(&file) {
            Ok(text) => match crate::config::envfile::parse(&text) {
                Ok(vars) => {
                    for (k, v) in vars {
                        env.insert(k, v);
                    }
                    server.notes.push(format!(
                        "the values of its envFile ({file}) were copied; later edits there are not followed"
                    ));
                }
                Err((line, why)) => return Err(format!("its envFile {file} line {line}: {why}")),
            },
            Err(err) => return Err(format!("its envFile {file} cannot be read: {err}")),
        }
    }
    for (k, v) in strings(e.get("env"), "env")? {
        let v = server.value(&v);
        env.insert(k, v);
    }
    let cwd = e.get("cwd").and_then(Value::as_str).map(|c| server.value(c));
    server.transport = Transport::Stdio { command, args, env, cwd };
    Ok(())
}

fn http(server: &mut Server, url: &str, e: &Map<String, Value>, sse: bool) -> Result<(), String> {
    let url = server.value(url);
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("`{}` is not an http(s) URL", crate::redact::urls(&url)));
    }
    let mut headers = BTreeMap::new();
    for (k, v) in strings(e.get("headers"), "headers")? {
        headers.insert(k, server.value(&v));
    }
    server.transport = Transport::Http { url, headers, sse };
    Ok(())
}

/// A JSON object of strings (`env`, `headers`).
fn strings(v: Option<&Value>, key: &str) -> Result<BTreeMap<String, String>, String> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(n) => Ok((k.clone(), n.to_string())),
                Value::Bool(b) => Ok((k.clone(), b.to_string())),
                _ => Err(format!("`{key}.{k}` is not a string")),
            })
            .collect(),
        Some(_) => Err(format!("`{key}` is not an object")),
    }
}

/// Gemini CLI's `includeTools` is an allow-list toolmux has too; the deny-lists (`excludeTools`,
/// Windsurf's `disabledTools`) are not, and are said.
fn tool_filters(server: &mut Server, e: &Map<String, Value>) {
    if let Some(tools) = e.get("includeTools").and_then(Value::as_array) {
        server.only_tools = Some(tools.iter().filter_map(Value::as_str).map(str::to_string).collect());
    }
    for key in ["excludeTools", "disabledTools"] {
        if e.get(key).and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            server.notes.push(format!(
                "its `{key}` was not carried (toolmux filters by an allow-list only); add a [[policy]] deny rule"
            ));
        }
    }
}

/// Codex CLI's `~/.codex/config.toml`: `[mcp_servers.NAME]` tables.
fn codex(text: &str, found: &mut Found) -> Result<(), String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| format!("not TOML: {}", e.message()))?;
    let Some(toml::Value::Table(servers)) = doc.get("mcp_servers") else {
        return Err("no MCP servers here (looked for [mcp_servers.*])".into());
    };
    for (name, entry) in servers {
        let Some(e) = entry.as_table() else {
            found.skipped.push(Skipped::new(name, "not a table"));
            continue;
        };
        if e.get("enabled").and_then(toml::Value::as_bool) == Some(false) {
            found.skipped.push(Skipped::new(name, "disabled in the host (enabled = false)"));
            continue;
        }
        // The same shapes as JSON, so one reader serves both.
        let json: Map<String, Value> = match serde_json::to_value(e) {
            Ok(Value::Object(m)) => m,
            _ => {
                found.skipped.push(Skipped::new(name, "not a table"));
                continue;
            }
        };
        let mut server = Server::new(name, None);
        let result = match (json.get("command").and_then(Value::as_str), json.get("url").and_then(Value::as_str)) {
            (Some(command), _) => stdio(&mut server, command, &json, None),
            (None, Some(url)) => {
                let mut headers = strings(json.get("http_headers"), "http_headers").unwrap_or_default();
                for (h, var) in strings(json.get("env_http_headers"), "env_http_headers").unwrap_or_default() {
                    headers.insert(h, format!("${{{var}}}"));
                }
                if let Some(var) = json.get("bearer_token_env_var").and_then(Value::as_str) {
                    headers.insert("Authorization".into(), format!("Bearer ${{{var}}}"));
                }
                let mut e = json.clone();
                e.insert("headers".into(), serde_json::to_value(headers).unwrap_or_default());
                http(&mut server, url, &e, false)
            }
            (None, None) => Err("neither `command` nor `url`".into()),
        };
        if let Err(why) = result {
            found.skipped.push(Skipped::new(name, why));
            continue;
        }
        if let Some(secs) = json.get("tool_timeout_sec").and_then(Value::as_f64).filter(|s| *s > 0.0) {
            server.timeout = Some(std::time::Duration::from_secs_f64(secs));
        }
        if let Some(tools) = json.get("enabled_tools").and_then(Value::as_array) {
            server.only_tools = Some(tools.iter().filter_map(Value::as_str).map(str::to_string).collect());
        }
        if json.get("disabled_tools").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            server.notes.push(
                "its `disabled_tools` was not carried (toolmux filters by an allow-list only); add a [[policy]] deny rule"
                    .into(),
            );
        }
        if json.get("env_vars").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            server.notes.push(
                "its `env_vars` pass-through was not carried: toolmux's children inherit the gateway's environment"
                    .into(),
            );
        }
        found.servers.push(server);
    }
    Ok(())
}
