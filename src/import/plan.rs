//! From what the hosts hold to what toolmux will run: backend names (valid, unique, the host's own
//! where it can be), literal secrets in env and headers moved to `${VAR}` references with their
//! values set aside for the env file, and every caveat said.

use std::collections::{BTreeMap, BTreeSet};

use super::{Found, Server, Skipped, Transport, plain_header, secret_env, secret_value, var_name};

/// What an import will write.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    pub backends: Vec<Planned>,
    /// Values for the env file, by variable name (never printed).
    pub env: BTreeMap<String, String>,
    /// Variables the user must fill in, with what each is.
    pub asks: BTreeMap<String, String>,
    /// Entries not carried: where from, and why.
    pub skipped: Vec<(String, Skipped)>,
    /// Variables the hosts' entries take from the environment, which toolmux's must then set
    /// (or the env file).
    pub from_env: BTreeSet<String>,
    /// Whether a secret-looking value stayed in the configuration itself (an argument or a URL):
    /// then the file is written readable by its owner only.
    pub secret_in_config: bool,
}

#[derive(Debug, Clone)]
pub struct Planned {
    /// The backend's name in toolmux.
    pub backend: String,
    /// `Cursor (/home/me/.cursor/mcp.json)`.
    pub from: String,
    pub server: Server,
}

/// Plans an import of `found` into a configuration that already has backends `taken` and env
/// variables `vars` (both empty for a new file).
pub fn plan(found: &[Found], taken: &BTreeSet<String>, vars: &BTreeMap<String, String>) -> Plan {
    let mut p = Plan::default();
    let mut names: BTreeSet<String> = taken.clone();
    let mut known = vars.clone();
    // What each planned backend was as the host wrote it (before its secrets moved).
    let mut originals: Vec<(Transport, usize)> = Vec::new();
    for f in found {
        let from = format!("{} ({})", f.source(), f.path.display());
        for s in &f.skipped {
            p.skipped.push((from.clone(), s.clone()));
        }
        for original in &f.servers {
            let label = match &original.project {
                Some(project) => format!("{} (project {project})", original.name),
                None => original.name.clone(),
            };
            if let Some(same) = originals.iter().find(|(t, _)| *t == original.transport).map(|(_, i)| &p.backends[*i]) {
                p.skipped.push((
                    from.clone(),
                    Skipped::new(&label, format!("the same server as backend `{}` from {}", same.backend, same.from)),
                ));
                continue;
            }
            if let Some(bad) = bad_variable(original) {
                p.skipped.push((
                    from.clone(),
                    Skipped::new(
                        &label,
                        format!(
                            "it uses `${{{}}}`, and `{}` is not a variable name (letters, digits, `_`)",
                            bad.escape_default(),
                            bad.escape_default()
                        ),
                    ),
                ));
                continue;
            }
            let wanted = backend_name(&original.name);
            if taken.contains(&wanted) {
                p.skipped.push((
                    from.clone(),
                    Skipped::new(
                        &label,
                        format!("a backend `{wanted}` is in the configuration already; it was left as it is"),
                    ),
                ));
                continue;
            }
            let mut backend = wanted.clone();
            let mut n = 2;
            while names.contains(&backend) {
                backend = format!("{wanted}-{n}");
                n += 1;
            }
            names.insert(backend.clone());
            let mut server = original.clone();
            if backend != server.name {
                server.notes.push(format!("named `{backend}` (backend names are [a-z0-9_-]+ and unique)"));
            }
            move_secrets(&backend, &mut server, &mut known, &mut p);
            for (var, value) in &server.defaults {
                if !known.contains_key(var) {
                    known.insert(var.clone(), value.clone());
                    p.env.insert(var.clone(), value.clone());
                }
            }
            for (var, what) in &server.asks {
                if !known.contains_key(var) {
                    p.asks.insert(var.clone(), what.clone());
                }
            }
            for var in references(&server.transport) {
                if !known.contains_key(&var) && !p.asks.contains_key(&var) {
                    p.from_env.insert(var);
                }
            }
            originals.push((original.transport.clone(), p.backends.len()));
            p.backends.push(Planned { backend, from: from.clone(), server });
        }
    }
    p
}

/// A variable a server refers to whose name no environment or env file can hold (a newline or
/// an `=` in it would also start a line of its own in the env file).
fn bad_variable(server: &Server) -> Option<String> {
    let mut names = server.defaults.keys().chain(server.asks.keys()).cloned().chain(references(&server.transport));
    names.find(|v| !crate::config::envfile::is_name(v))
}

/// The `${VAR}` names in a server's env and headers (the caller placeholders left out).
fn references(t: &Transport) -> Vec<String> {
    let values: Vec<&String> = match t {
        Transport::Stdio { env, .. } => env.values().collect(),
        Transport::Http { headers, .. } => headers.values().collect(),
    };
    let mut out = Vec::new();
    for v in values {
        let mut rest = v.as_str();
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else { break };
            let var = &after[..end];
            if !var.starts_with("client.") {
                out.push(var.to_string());
            }
            rest = &after[end + 1..];
        }
    }
    out
}

/// A host's server name as a backend name: `GitHub Enterprise` → `github-enterprise`.
pub fn backend_name(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '-',
        })
        .collect();
    let parts: Vec<&str> = mapped.split('-').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() { "server".into() } else { parts.join("-") }
}

/// Literal secrets in env and headers become `${VAR}` references; secret-looking arguments and
/// URLs, which toolmux does not expand, are said.
fn move_secrets(backend: &str, server: &mut Server, known: &mut BTreeMap<String, String>, p: &mut Plan) {
    let mut notes = Vec::new();
    match &mut server.transport {
        Transport::Stdio { command, args, env, cwd } => {
            for (k, v) in env.iter_mut() {
                if !v.contains("${") && secret_env(k, v) {
                    let var = claim(known, p, &var_name(k), &format!("{}_{}", var_name(backend), var_name(k)), v);
                    *v = format!("${{{var}}}");
                }
            }
            if (0..args.len()).any(|i| secret_arg(args, i)) {
                p.secret_in_config = true;
                notes.push(
                    "an argument looks like a secret; it stays in the configuration as written (toolmux passes args \
                     unexpanded): move it to `env` if the server reads one"
                        .to_string(),
                );
            }
            let unexpanded = std::iter::once(&*command).chain(args.iter()).chain(cwd.iter()).any(|s| s.contains("${"));
            if unexpanded {
                notes.push("its command, args or cwd use ${VAR}, which toolmux expands only in env and headers".into());
            }
        }
        Transport::Http { url, headers, .. } => {
            for (h, v) in headers.iter_mut() {
                if v.contains("${") || plain_header(h) {
                    continue;
                }
                let scheme = v.split_once(' ').filter(|(s, rest)| {
                    ["bearer", "basic", "token"].contains(&s.to_ascii_lowercase().as_str()) && !rest.is_empty()
                });
                let stem = var_name(backend);
                *v = match scheme {
                    Some((scheme, secret)) => {
                        let var = claim(known, p, &format!("{stem}_TOKEN"), &format!("{stem}_TOKEN"), secret);
                        format!("{scheme} ${{{var}}}")
                    }
                    None => {
                        let name = format!("{stem}_{}", var_name(h));
                        let var = claim(known, p, &name, &name, v);
                        format!("${{{var}}}")
                    }
                };
            }
            if secret_url(url) {
                p.secret_in_config = true;
                notes.push("its URL looks like it carries a secret; it stays in the configuration as written".into());
            }
            if url.contains("${") {
                notes.push("its URL uses ${VAR}, which toolmux expands only in env and headers".into());
            }
        }
    }
    server.notes.extend(notes);
}

/// A variable for `value`: `wanted` if free or already holding this value, else `fallback`, else
/// `fallback` numbered.
fn claim(known: &mut BTreeMap<String, String>, p: &mut Plan, wanted: &str, fallback: &str, value: &str) -> String {
    let mut n = 1;
    let mut var = wanted.to_string();
    loop {
        match known.get(&var) {
            Some(v) if v == value => return var,
            None => break,
            Some(_) if var == wanted && wanted != fallback => var = fallback.to_string(),
            Some(_) => {
                n += 1;
                var = format!("{fallback}_{n}");
            }
        }
    }
    known.insert(var.clone(), value.to_string());
    p.env.insert(var.clone(), value.to_string());
    var
}

/// Whether the `i`th argument is a secret: one by its look, one after a secret flag, or one
/// given inline (`--token=…`).
fn secret_arg(args: &[String], i: usize) -> bool {
    let a = &args[i];
    // `--token VALUE`; after `--token=VALUE` the next argument is one of its own.
    let after_flag = i > 0 && !args[i - 1].contains('=') && secret_flag(&args[i - 1]);
    let inline = a.split_once('=').is_some_and(|(k, v)| k.starts_with('-') && secret_flag(k) && !v.is_empty());
    secret_value(a) || after_flag || inline
}

/// Whether a URL carries a secret: a password, or a query value named like one.
fn secret_url(url: &str) -> bool {
    secret_value(url) || url.split_once('?').is_some_and(|(_, q)| query_secret(q))
}

/// What is printed of a secret that stays in the configuration (`--json`, `--dry-run`).
pub const NOT_SHOWN: &str = "<a secret, written to the file but not shown>";

impl Plan {
    /// The plan as it may be printed: the secrets that stay in the configuration (arguments,
    /// URLs) replaced by [`NOT_SHOWN`]; the rest are `${VAR}` references already.
    pub fn for_printing(&self) -> Plan {
        let mut p = self.clone();
        for b in &mut p.backends {
            match &mut b.server.transport {
                Transport::Stdio { args, .. } => {
                    let secret: Vec<bool> = (0..args.len()).map(|i| secret_arg(args, i)).collect();
                    for (a, secret) in args.iter_mut().zip(secret) {
                        if !secret {
                            continue;
                        }
                        // `--token=…` keeps its flag, so the line still reads.
                        *a = match a.split_once('=') {
                            Some((flag, _)) if flag.starts_with('-') => format!("{flag}={NOT_SHOWN}"),
                            _ => NOT_SHOWN.to_string(),
                        };
                    }
                }
                Transport::Http { url, .. } if secret_url(url) => *url = NOT_SHOWN.to_string(),
                Transport::Http { .. } => {}
            }
        }
        p
    }
}

/// `--token`, `--api-key`, `-p`… flags whose next argument (or `=` value) is a secret.
fn secret_flag(arg: &str) -> bool {
    let flag = arg.trim_start_matches('-').split('=').next().unwrap_or("").to_ascii_lowercase();
    arg.starts_with('-')
        && ["token", "api-key", "apikey", "api_key", "password", "secret", "access-token", "auth-token", "key"]
            .contains(&flag.as_str())
}

fn query_secret(query: &str) -> bool {
    query.split('&').any(|kv| {
        let k = kv.split('=').next().unwrap_or("").to_ascii_lowercase();
        ["key", "api_key", "apikey", "token", "access_token", "secret", "password", "sig"].contains(&k.as_str())
    })
}

/// The backends of a plan as JSON: what `toolmux import --json` prints (secrets as `${VAR}`, or
/// not shown where they stay in the configuration).
pub fn to_json(plan: &Plan) -> serde_json::Value {
    use serde_json::json;
    let plan = &plan.for_printing();
    let backends: Vec<_> = plan
        .backends
        .iter()
        .map(|b| {
            let mut v = match &b.server.transport {
                Transport::Stdio { command, args, env, cwd } => {
                    json!({ "transport": "stdio", "command": command, "args": args, "env": env, "cwd": cwd })
                }
                Transport::Http { url, headers, sse } => {
                    json!({ "transport": if *sse { "sse" } else { "http" }, "url": url, "headers": headers })
                }
            };
            v["name"] = json!(b.backend);
            v["host_name"] = json!(b.server.name);
            v["from"] = json!(b.from);
            v["notes"] = json!(b.server.notes);
            v
        })
        .collect();
    let skipped: Vec<_> =
        plan.skipped.iter().map(|(from, s)| json!({ "name": s.name, "from": from, "reason": s.reason })).collect();
    json!({
        "backends": backends,
        "secrets": plan.env.keys().collect::<Vec<_>>(),
        "fill_in": plan.asks,
        "from_environment": plan.from_env,
        "skipped": skipped,
    })
}
