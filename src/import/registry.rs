//! `toolmux import --registry`: servers from the MCP registry (API v0.1, `server.json`) as
//! backends. A package becomes the command line that runs it (npm through `npx`, PyPI through
//! `uvx`, OCI images through `docker run`), a remote becomes its URL with its headers; every
//! value the user supplies (environment variables, headers, arguments the server leaves open)
//! becomes a `${VAR}` reference listed in the env file to fill in. What cannot be carried is said.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::{Found, Server, Skipped, Transport, var_name};

/// The official registry.
pub const DEFAULT_URL: &str = "https://registry.modelcontextprotocol.io";
/// How long a registry may take to answer one request.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read from a registry.
const MAX_ANSWER: usize = 4 << 20;

/// Reads each of `names` (`io.github.owner/server`) from the registry at `base`: one [`Found`]
/// holding every server that could be carried, and the names that could not be read, with why.
pub async fn read(base: &str, names: &[String]) -> (Vec<Found>, Vec<(PathBuf, String)>) {
    let base = base.trim_end_matches('/');
    let mut found =
        Found { host: None, path: PathBuf::from(base), servers: Vec::new(), skipped: Vec::new(), project: false };
    let mut failed = Vec::new();
    for name in names {
        let url = format!("{base}/v0.1/servers/{}/versions/latest", encode(name));
        match fetch(&url).await.and_then(|v| carry(name, &v)) {
            Ok(Carried::Server(s)) => found.servers.push(*s),
            Ok(Carried::Not(why)) => found.skipped.push(Skipped::new(name, why)),
            Err(why) => failed.push((PathBuf::from(format!("{base} {name}")), why)),
        }
    }
    let any = !found.servers.is_empty() || !found.skipped.is_empty();
    (if any { vec![found] } else { Vec::new() }, failed)
}

/// A server name as one path segment (`/` and anything unusual percent-encoded).
fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn fetch(url: &str) -> Result<Value, String> {
    let client = reqwest::Client::builder().timeout(TIMEOUT).build().map_err(|e| e.to_string())?;
    let answer = client.get(url).header("accept", "application/json").send().await.map_err(|e| {
        // reqwest's own words are "error sending request": the cause is in its sources.
        let mut why = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            why = format!("{why}: {s}");
            source = s.source();
        }
        format!("the registry could not be reached ({why})")
    })?;
    let status = answer.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err("the registry has no server of that name (names look like io.github.owner/server)".into());
    }
    if !status.is_success() {
        return Err(format!("the registry answered {status}"));
    }
    let body = answer.bytes().await.map_err(|e| format!("the registry's answer broke off: {e}"))?;
    if body.len() > MAX_ANSWER {
        return Err(format!("the registry's answer is larger than {} MiB", MAX_ANSWER >> 20));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the registry's answer is not JSON: {e}"))
}

/// What became of one registry entry.
#[derive(Debug)]
pub enum Carried {
    Server(Box<Server>),
    /// Nothing toolmux can run or reach, and why.
    Not(String),
}

/// One registry answer (`{"server": {…server.json…}, "_meta": …}`, or a bare `server.json`) for
/// `name` as a server: its first package toolmux can run over stdio, else its first remote.
pub fn carry(name: &str, answer: &Value) -> Result<Carried, String> {
    let server = answer.get("server").unwrap_or(answer);
    if !server.is_object() {
        return Err("the registry's answer holds no server".into());
    }
    let mut passed_over = Vec::new();
    for p in server.get("packages").and_then(Value::as_array).into_iter().flatten() {
        match package(name, p) {
            Ok(s) => return Ok(Carried::Server(Box::new(with_notes(s, server, &passed_over)))),
            Err(why) => passed_over.push(why),
        }
    }
    for r in server.get("remotes").and_then(Value::as_array).into_iter().flatten() {
        match remote(name, r) {
            Ok(s) => return Ok(Carried::Server(Box::new(with_notes(s, server, &passed_over)))),
            Err(why) => passed_over.push(why),
        }
    }
    Ok(Carried::Not(if passed_over.is_empty() {
        "it lists no package and no remote".into()
    } else {
        passed_over.join("; ")
    }))
}

fn with_notes(mut s: Server, server: &Value, passed_over: &[String]) -> Server {
    if let Some(v) = server.get("version").and_then(Value::as_str) {
        s.notes.push(format!("version {v} in the registry"));
    }
    s.notes.extend(passed_over.iter().map(|w| format!("passed over: {w}")));
    s
}

/// A backend name from a registry name: its last part (`io.github.acme/weather` → `weather`).
fn short(name: &str) -> &str {
    name.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or(name)
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn package(name: &str, p: &Value) -> Result<Server, String> {
    let kind = text(p, "registryType").unwrap_or("?");
    let id = text(p, "identifier").ok_or_else(|| format!("a {kind} package without an identifier"))?;
    let transport = p.get("transport").and_then(|t| text(t, "type")).unwrap_or("stdio");
    if transport != "stdio" {
        return Err(format!("the {kind} package {id} serves {transport} itself: start it and import its URL instead"));
    }
    let version = text(p, "version");
    let mut s = Server::new(short(name), None);
    let (command, mut args) = match kind {
        "npm" => ("npx".to_string(), vec!["-y".to_string(), version.map_or(id.to_string(), |v| format!("{id}@{v}"))]),
        "pypi" => ("uvx".to_string(), vec![version.map_or(id.to_string(), |v| format!("{id}=={v}"))]),
        "oci" => {
            s.notes.push("runs in a container: needs Docker (or another `docker`-compatible command)".into());
            ("docker".to_string(), vec!["run".into(), "-i".into(), "--rm".into()])
        }
        other => return Err(format!("the {other} package {id}, which toolmux does not know how to run")),
    };
    let command = text(p, "runtimeHint").map_or(command, str::to_string);
    let mut env = BTreeMap::new();
    for e in p.get("environmentVariables").and_then(Value::as_array).into_iter().flatten() {
        let Some(var) = text(e, "name") else { continue };
        env.insert(var.to_string(), supplied(&mut s, e, var, Fill::Expanded));
    }
    let runtime = arguments(&mut s, p.get("runtimeArguments"), &mut env);
    if kind == "oci" {
        // The container sees only what it is handed: each variable by name, from toolmux's env.
        for var in env.keys().filter(|v| !runtime.windows(2).any(|w| w[1] == **v)) {
            args.extend(["-e".to_string(), var.clone()]);
        }
    }
    args.extend(runtime);
    if kind == "oci" {
        // The registry wants the tag in the identifier (`ghcr.io/o/p:1.2.0`); an older entry may
        // give it as the version.
        let tagged = id.rsplit('/').next().is_some_and(|last| last.contains(':') || last.contains('@'));
        args.push(match version {
            Some(v) if !tagged => format!("{id}:{v}"),
            _ => id.to_string(),
        });
    }
    args.extend(arguments(&mut s, p.get("packageArguments"), &mut env));
    s.transport = Transport::Stdio { command, args, env, cwd: None };
    Ok(s)
}

/// Where a value the user supplies goes: env and headers expand `${VAR}`; arguments and URLs
/// do not, so there it is a `<VAR>` for the user to replace, and a note says so.
#[derive(Clone, Copy, PartialEq)]
enum Fill {
    Expanded,
    Literal,
}

/// A value the server asks for (an environment variable, a header, an argument): its fixed value
/// when the entry gives one without placeholders, else a reference the user fills in (`${VAR}`,
/// listed in the env file, its default written there when it has one; or `<VAR>`, see [`Fill`]).
fn supplied(s: &mut Server, entry: &Value, var_hint: &str, into: Fill) -> String {
    let description = text(entry, "description").unwrap_or("");
    let secret = entry.get("isSecret").and_then(Value::as_bool).unwrap_or(false);
    let ask = |s: &mut Server, var: String, what: &str, default: Option<&str>| -> String {
        match into {
            Fill::Expanded => {
                match default {
                    Some(d) => s.defaults.insert(var.clone(), d.to_string()),
                    None => s.asks.insert(var.clone(), what.trim().to_string()),
                };
                format!("${{{var}}}")
            }
            Fill::Literal => {
                s.notes.push(format!("replace <{var}> in its command line: {}", what.trim()));
                format!("<{var}>")
            }
        }
    };
    if let Some(value) = text(entry, "value") {
        if !value.contains('{') {
            return value.to_string();
        }
        // `Bearer {token}`: each placeholder a variable of its own.
        let mut out = String::new();
        let mut rest = value;
        while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            let Some(end) = rest[start..].find('}') else { break };
            let inner = &rest[start + 1..start + end];
            let variable = entry.get("variables").and_then(|v| v.get(inner));
            let what = variable.and_then(|v| text(v, "description")).unwrap_or(description);
            let default = variable.and_then(|v| text(v, "default"));
            // `{token}` names nothing outside this server: its variable carries the server's name.
            let var = var_name(&format!("{}_{inner}", s.name));
            out.push_str(&ask(s, var, what, default));
            rest = &rest[start + end + 1..];
        }
        out.push_str(rest);
        return out;
    }
    let default = text(entry, "default").filter(|_| !secret);
    let what = if secret { format!("{description} (secret)") } else { description.to_string() };
    let var = match into {
        Fill::Expanded => var_name(var_hint),
        Fill::Literal => var_name(&format!("{}_{var_hint}", s.name)),
    };
    ask(s, var, &what, default)
}

/// `runtimeArguments` or `packageArguments` as command-line words. A container's `-e NAME=…`
/// becomes `-e NAME` with NAME in `env`, where toolmux expands references.
fn arguments(s: &mut Server, list: Option<&Value>, env: &mut BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for a in list.and_then(Value::as_array).into_iter().flatten() {
        let named = text(a, "type") == Some("named");
        let flag = text(a, "name");
        let hint = text(a, "valueHint").or(flag).unwrap_or("value");
        let required = a.get("isRequired").and_then(Value::as_bool).unwrap_or(false);
        let (value, default) = (text(a, "value"), text(a, "default"));
        if value.is_none() && default.is_none() && !required {
            continue;
        }
        if let (true, Some(flag @ ("-e" | "--env")), Some((var, rest))) =
            (named, flag, value.and_then(|v| v.split_once('=')))
        {
            let mut entry = a.clone();
            entry["value"] = rest.into();
            env.insert(var.to_string(), supplied(s, &entry, var, Fill::Expanded));
            out.extend([flag.to_string(), var.to_string()]);
            continue;
        }
        let value = match (value, default) {
            (None, Some(d)) => d.to_string(),
            _ => supplied(s, a, hint, Fill::Literal),
        };
        match (named, flag) {
            (true, Some(flag)) => out.extend([flag.to_string(), value]),
            _ => out.push(value),
        }
    }
    out
}

fn remote(name: &str, r: &Value) -> Result<Server, String> {
    let kind = text(r, "type").unwrap_or("streamable-http");
    let url = text(r, "url").ok_or("a remote without a URL")?;
    let sse = match kind {
        "streamable-http" => false,
        "sse" => true,
        other => return Err(format!("a {other} remote, which toolmux does not speak")),
    };
    if url.contains('{') {
        // `https://{tenant}.example.com/mcp`: toolmux expands no URL, and a URL with a hole
        // would not load.
        return Err(format!("a {kind} remote whose URL needs values of yours ({url}): add it by hand"));
    }
    let mut s = Server::new(short(name), None);
    let url = url.to_string();
    let mut headers = BTreeMap::new();
    for h in r.get("headers").and_then(Value::as_array).into_iter().flatten() {
        let Some(header) = text(h, "name") else { continue };
        headers.insert(header.to_string(), supplied(&mut s, h, header, Fill::Expanded));
    }
    if headers.is_empty() {
        s.notes.push(
            "no credentials in the registry: if it asks for a login, set auth = \"oauth\" on it and run toolmux login"
                .into(),
        );
    }
    s.transport = Transport::Http { url, headers, sse };
    Ok(s)
}
