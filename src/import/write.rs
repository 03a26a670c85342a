//! Writing a [`Plan`]: a commented toolmux.toml (or blocks appended to an existing one, after a
//! backup), and the env file with the secrets, created readable by its owner only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::plan::Plan;
use super::{Transport, files, plan};
use crate::config::envfile;

/// Where an import goes.
pub enum Target {
    /// A new file (refused if it exists).
    New(PathBuf),
    /// Merged into an existing configuration.
    Into(PathBuf),
}

/// What was written, for the report.
#[derive(Debug)]
pub struct Written {
    pub config: PathBuf,
    pub env_file: Option<PathBuf>,
    /// A copy of the configuration as it was before a merge.
    pub backup: Option<PathBuf>,
}

/// The configuration's backends and env variables as they are, for a merge.
pub fn existing(target: &Target) -> anyhow::Result<(BTreeSet<String>, BTreeMap<String, String>)> {
    let Target::Into(path) = target else { return Ok(Default::default()) };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: toml::Table = toml::from_str(&text).with_context(|| format!("{} is not TOML", path.display()))?;
    let names = doc
        .get("backends")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("name").and_then(toml::Value::as_str).map(str::to_string))
        .collect();
    let vars = match env_file_of(path, &doc) {
        Some(env) if env.exists() => envfile::read(&env).map_err(anyhow::Error::msg)?,
        _ => BTreeMap::new(),
    };
    Ok((names, vars))
}

/// The env file a configuration names, resolved beside it.
fn env_file_of(config: &Path, doc: &toml::Table) -> Option<PathBuf> {
    let name = doc.get("env_file").and_then(toml::Value::as_str)?;
    Some(folder(config).join(name))
}

fn folder(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The env file that goes with a new configuration: `toolmux.toml` → `toolmux.env`.
fn env_file_for(config: &Path) -> PathBuf {
    config.with_extension("env")
}

/// Writes the plan; with `dry_run` only returns the TOML that would be written (or appended).
pub fn write(plan: &Plan, target: &Target, dry_run: bool) -> anyhow::Result<(String, Option<Written>)> {
    // What a dry run returns is printed: the secrets that stay in the file are not shown.
    let printed;
    let plan = if dry_run {
        printed = plan.for_printing();
        &printed
    } else {
        plan
    };
    let needs_env = !plan.env.is_empty() || !plan.asks.is_empty();
    match target {
        Target::New(path) => {
            if path.exists() && !dry_run {
                bail!(
                    "{} exists already; merge into it with --into {}, or name another file with --out",
                    path.display(),
                    path.display()
                );
            }
            let env_path = env_file_for(path);
            let env_name = needs_env.then(|| env_path.file_name().unwrap_or_default().to_string_lossy().into_owned());
            let text = new_config(plan, env_name.as_deref());
            check_toml(&text)?;
            if dry_run {
                return Ok((text, None));
            }
            if needs_env && env_path.exists() {
                bail!("{} exists already; move it away or name another file with --out", env_path.display());
            }
            if needs_env {
                append_env(&env_path, plan)?;
            }
            let mode = if plan.secret_in_config { files::PRIVATE } else { files::SHARED };
            files::create_new(path, text.as_bytes(), mode)?;
            Ok((text, Some(Written { config: path.clone(), env_file: needs_env.then_some(env_path), backup: None })))
        }
        Target::Into(path) => {
            let before = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let doc: toml::Table =
                toml::from_str(&before).with_context(|| format!("{} is not TOML", path.display()))?;
            let mut text = before.clone();
            let env_path = match env_file_of(path, &doc) {
                Some(p) => Some(p),
                None if needs_env => {
                    let p = env_file_for(path);
                    let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
                    // A top-level key must come before the first table: at the very top.
                    text = format!("# Secrets moved here by `toolmux import`.\nenv_file = {}\n\n{text}", quote(&name));
                    Some(p)
                }
                None => None,
            };
            if !text.ends_with('\n') {
                text.push('\n');
            }
            let added = blocks(plan);
            text.push_str(&added);
            check_toml(&text).with_context(|| {
                format!("merging into {} would not give valid TOML; nothing was written", path.display())
            })?;
            if dry_run {
                return Ok((added, None));
            }
            let backup = backup_path(path);
            std::fs::copy(path, &backup)
                .with_context(|| format!("backing up {} to {}", path.display(), backup.display()))?;
            if needs_env && let Some(env) = &env_path {
                append_env(env, plan)?;
            }
            // Private before the secret is in it.
            if plan.secret_in_config {
                files::make_private(path)?;
            }
            std::fs::write(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
            Ok((
                added,
                Some(Written { config: path.clone(), env_file: env_path.filter(|_| needs_env), backup: Some(backup) }),
            ))
        }
    }
}

/// `FILE.bak`, or `FILE.bak.2`… when that is taken: no backup overwrites another.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut n = 1;
    loop {
        let mut name = path.as_os_str().to_owned();
        name.push(if n == 1 { ".bak".to_string() } else { format!(".bak.{n}") });
        let candidate = PathBuf::from(name);
        if !candidate.exists() {
            return candidate;
        }
        n += 1;
    }
}

fn check_toml(text: &str) -> anyhow::Result<()> {
    toml::from_str::<toml::Table>(text).map(drop).map_err(|e| anyhow::anyhow!("{}", e.message()))
}

/// Adds the plan's variables to an env file, creating it readable by its owner only.
fn append_env(path: &Path, plan: &Plan) -> anyhow::Result<()> {
    use std::io::Write;
    let mut text = String::new();
    if !path.exists() {
        text.push_str("# Values of the ${VAR} references in the toolmux configuration beside this file.\n");
        text.push_str("# Readable by you only; toolmux refuses it otherwise. Never commit it.\n");
    }
    for (var, value) in &plan.env {
        text.push_str(&envfile::line(var, value).map_err(anyhow::Error::msg)?);
    }
    for (var, what) in &plan.asks {
        envfile::line(var, "").map_err(anyhow::Error::msg)?;
        comment(&mut text, &format!("Fill in, then uncomment: {what}"));
        let _ = writeln!(text, "# {var}=");
    }
    let mut options = std::fs::OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path).with_context(|| format!("opening {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = f.metadata()?.permissions().mode();
        if mode & 0o077 != 0 {
            bail!(
                "{} can be read by other users (mode {:o}); run `chmod 600 {}` and import again",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
    }
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    f.sync_all().with_context(|| format!("writing {}", path.display()))
}

fn new_config(plan: &Plan, env_file: Option<&str>) -> String {
    let mut t = String::new();
    t.push_str("# toolmux configuration, written by `toolmux import`.\n");
    t.push_str("#   check it:  toolmux check-config <this file>\n");
    t.push_str("#   run it:    toolmux serve --config <this file>          (HTTP on 127.0.0.1:4483)\n");
    t.push_str("#   or let an agent host start it: toolmux connect HOST --config <this file>\n");
    t.push_str("# Every key is described in docs/configuration.md.\n\n");
    if let Some(env) = env_file {
        t.push_str("# Secrets found in the hosts' files, as ${VAR} values (readable by you only).\n");
        let _ = writeln!(t, "env_file = {}\n", quote(env));
    }
    t.push_str("[server]\nlisten = \"127.0.0.1:4483\"\n");
    t.push_str("# optimizer: clients see find_tool and call_tool; passthrough: every tool, prefixed.\n");
    t.push_str("mode = \"optimizer\"\n");
    t.push_str(&blocks(plan));
    t
}

/// The `[[backends]]` (and `[[aggregation.tools]]`) blocks of a plan.
fn blocks(plan: &Plan) -> String {
    let mut t = String::new();
    for b in &plan.backends {
        let s = &b.server;
        t.push('\n');
        comment(&mut t, &format!("`{}` from {}", s.name, b.from));
        if let Some(project) = &s.project {
            comment(&mut t, &format!("(the project {project})"));
        }
        for note in &s.notes {
            comment(&mut t, &format!("note: {note}"));
        }
        let _ = writeln!(t, "[[backends]]\nname = {}", quote(&b.backend));
        match &s.transport {
            Transport::Stdio { command, args, env, cwd } => {
                let _ = writeln!(t, "command = {}", quote(command));
                if !args.is_empty() {
                    let _ = writeln!(t, "args = [{}]", args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(", "));
                }
                if !env.is_empty() {
                    let _ = writeln!(t, "env = {}", inline(env));
                }
                if let Some(cwd) = cwd {
                    let _ = writeln!(t, "cwd = {}", quote(cwd));
                }
            }
            Transport::Http { url, headers, sse } => {
                let _ = writeln!(t, "url = {}", quote(url));
                if *sse {
                    t.push_str("transport = \"sse\"   # the 2024-11-05 HTTP+SSE transport\n");
                }
                if !headers.is_empty() {
                    let _ = writeln!(t, "headers = {}", inline(headers));
                }
            }
        }
        if let Some(d) = s.timeout {
            let _ = writeln!(t, "timeout = {}", quote(&humantime::format_duration(d).to_string()));
        }
    }
    for b in plan.backends.iter().filter(|b| b.server.only_tools.is_some()) {
        let tools = b.server.only_tools.as_deref().unwrap_or_default();
        t.push('\n');
        comment(&mut t, &format!("The tools the host allowed `{}` to offer.", b.server.name));
        let _ = writeln!(
            t,
            "[[aggregation.tools]]\nbackend = {}\nfilter = [{}]",
            quote(&b.backend),
            tools.iter().map(|x| quote(x)).collect::<Vec<_>>().join(", ")
        );
    }
    t
}

/// One comment line of `text`, which may come from a host file: each control character (a
/// newline would end the comment and let the rest be read as TOML or as an env-file line; TOML
/// refuses the others in comments) is written as its escape, so the comment stays one line.
fn comment(t: &mut String, text: &str) {
    t.push_str("# ");
    t.push_str(&super::printable(text));
    t.push('\n');
}

/// A TOML basic string.
pub fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn inline(map: &BTreeMap<String, String>) -> String {
    let key = |k: &str| {
        if !k.is_empty() && k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-') {
            k.to_string()
        } else {
            quote(k)
        }
    };
    let pairs: Vec<String> = map.iter().map(|(k, v)| format!("{} = {}", key(k), quote(v))).collect();
    format!("{{ {} }}", pairs.join(", "))
}

/// The report printed after an import: names, paths and counts; never a value. What a host
/// file named is printed with its control characters escaped (see [`say`]).
pub fn report(found: &[super::Found], failed: &[(PathBuf, String)], plan: &Plan, written: Option<&Written>) -> String {
    let mut r = String::new();
    for f in found {
        let names: Vec<&str> = f.servers.iter().map(|s| s.name.as_str()).collect();
        say(
            &mut r,
            format_args!(
                "read {} ({}): {} server{}{}",
                f.source(),
                f.path.display(),
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) }
            ),
        );
    }
    for (path, why) in failed {
        say(&mut r, format_args!("could not read {}: {why}", path.display()));
    }
    if let Some(w) = written {
        let names: Vec<&str> = plan.backends.iter().map(|b| b.backend.as_str()).collect();
        say(
            &mut r,
            format_args!(
                "wrote {}: {} backend{} ({})",
                w.config.display(),
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            ),
        );
        if let Some(b) = &w.backup {
            say(&mut r, format_args!("  the file as it was is in {}", b.display()));
        }
        if let Some(env) = &w.env_file {
            let vars: Vec<&str> = plan.env.keys().map(String::as_str).collect();
            if !vars.is_empty() {
                say(&mut r, format_args!("wrote {} (readable by you only): {}", env.display(), vars.join(", ")));
            }
            if !plan.asks.is_empty() {
                say(&mut r, format_args!("fill in {} before starting:", env.display()));
                for (var, what) in &plan.asks {
                    say(&mut r, format_args!("  {var}: {what}"));
                }
            }
        }
        if !plan.from_env.is_empty() {
            let vars: Vec<&str> = plan.from_env.iter().map(String::as_str).collect();
            say(
                &mut r,
                format_args!(
                    "set in toolmux's environment (or its env file), as the hosts expected: {}",
                    vars.join(", ")
                ),
            );
        }
        if plan.secret_in_config {
            say(
                &mut r,
                format_args!("  a secret stayed in {} (see its notes); it is readable by you only", w.config.display()),
            );
        }
    }
    if !plan.skipped.is_empty() {
        say(&mut r, format_args!("not carried over:"));
        for (from, s) in &plan.skipped {
            say(&mut r, format_args!("  {} from {from}: {}", s.name, s.reason));
        }
    }
    let noted: Vec<_> = plan.backends.iter().filter(|b| !b.server.notes.is_empty()).collect();
    if !noted.is_empty() {
        say(&mut r, format_args!("read these notes (also in the file):"));
        for b in noted {
            for n in &b.server.notes {
                say(&mut r, format_args!("  {}: {n}", b.backend));
            }
        }
    }
    r
}

/// One line of the report: a name from a host file could hold a newline (a line of its own
/// making) or a terminal's escape sequence, so every control character is printed escaped.
fn say(r: &mut String, line: std::fmt::Arguments<'_>) {
    r.push_str(&super::printable(&line.to_string()));
    r.push('\n');
}

/// Re-exported for the command: plan against a target.
pub fn plan_for(found: &[super::Found], target: &Target) -> anyhow::Result<Plan> {
    let (names, vars) = existing(target)?;
    Ok(plan::plan(found, &names, &vars))
}
