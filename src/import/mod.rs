//! `toolmux import`: the MCP servers a user already has in an agent host's config, carried into a
//! toolmux configuration; and `toolmux connect`: the one entry that puts toolmux in their place.
//!
//! Reading ([`formats`]) turns each host's entries into [`Server`]s with toolmux's `${VAR}`
//! references; planning ([`plan`]) names the backends and moves literal secrets out of env and
//! headers into an env file; writing ([`write`]) renders a commented TOML file or merges into one.
//! Nothing read from a host file is printed but names and paths.

pub mod command;
pub mod connect;
mod files;
pub mod formats;
pub mod plan;
pub mod registry;
pub mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The agent hosts whose MCP server lists toolmux reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Host {
    ClaudeDesktop,
    ClaudeCode,
    Cursor,
    Vscode,
    Windsurf,
    Gemini,
    Codex,
    Cline,
    Goose,
}

impl Host {
    pub const ALL: [Host; 9] = [
        Host::ClaudeDesktop,
        Host::ClaudeCode,
        Host::Cursor,
        Host::Vscode,
        Host::Windsurf,
        Host::Gemini,
        Host::Codex,
        Host::Cline,
        Host::Goose,
    ];

    /// The name a person knows it by.
    pub fn title(self) -> &'static str {
        match self {
            Host::ClaudeDesktop => "Claude Desktop",
            Host::ClaudeCode => "Claude Code",
            Host::Cursor => "Cursor",
            Host::Vscode => "VS Code",
            Host::Windsurf => "Windsurf",
            Host::Gemini => "Gemini CLI",
            Host::Codex => "Codex CLI",
            Host::Cline => "Cline",
            Host::Goose => "Goose",
        }
    }

    /// The name on the command line (`toolmux connect claude-desktop`).
    pub fn arg(self) -> &'static str {
        match self {
            Host::ClaudeDesktop => "claude-desktop",
            Host::ClaudeCode => "claude-code",
            Host::Cursor => "cursor",
            Host::Vscode => "vscode",
            Host::Windsurf => "windsurf",
            Host::Gemini => "gemini",
            Host::Codex => "codex",
            Host::Cline => "cline",
            Host::Goose => "goose",
        }
    }

    /// Which host a file belongs to, from its name and folder; `None` when nothing says.
    pub fn of_path(path: &Path) -> Option<Host> {
        let name = path.file_name()?.to_str()?;
        let parent = path.parent().and_then(Path::file_name).and_then(|p| p.to_str()).unwrap_or("");
        let full = path.to_string_lossy().replace('\\', "/");
        Some(match name {
            "claude_desktop_config.json" => Host::ClaudeDesktop,
            ".mcp.json" | ".claude.json" => Host::ClaudeCode,
            "mcp_config.json" if full.contains("windsurf") => Host::Windsurf,
            "cline_mcp_settings.json" => Host::Cline,
            "config.toml" if parent == ".codex" => Host::Codex,
            "config.yaml" if parent == "goose" => Host::Goose,
            "settings.json" if parent == ".gemini" => Host::Gemini,
            "mcp.json" if parent == ".cursor" => Host::Cursor,
            "mcp.json" | "settings.json" if parent == ".vscode" || parent == "User" => Host::Vscode,
            _ => return None,
        })
    }

    /// Where this host keeps its MCP servers on this OS: the user's file first, then the current
    /// folder's project file where the host has one.
    pub fn usual_places(self, dirs: &Dirs) -> Vec<PathBuf> {
        let mut places = self.user_places(dirs);
        places.extend(self.project_places(dirs));
        places
    }

    /// The user's own files of this host.
    fn user_places(self, dirs: &Dirs) -> Vec<PathBuf> {
        let home = &dirs.home;
        let app = &dirs.app_data;
        let code_user = app.join("Code").join("User");
        match self {
            Host::ClaudeDesktop => vec![app.join("Claude").join("claude_desktop_config.json")],
            Host::ClaudeCode => vec![home.join(".claude.json")],
            Host::Cursor => vec![home.join(".cursor").join("mcp.json")],
            Host::Vscode => vec![code_user.join("mcp.json")],
            Host::Windsurf => vec![home.join(".codeium").join("windsurf").join("mcp_config.json")],
            Host::Gemini => vec![home.join(".gemini").join("settings.json")],
            Host::Codex => vec![dirs.codex_home.join("config.toml")],
            Host::Cline => vec![
                code_user
                    .join("globalStorage")
                    .join("saoudrizwan.claude-dev")
                    .join("settings")
                    .join("cline_mcp_settings.json"),
            ],
            Host::Goose if cfg!(windows) => {
                vec![app.join("Block").join("goose").join("config").join("config.yaml")]
            }
            Host::Goose => vec![dirs.config.join("goose").join("config.yaml")],
        }
    }

    /// The current folder's project file of this host, which came with the project: whoever can
    /// commit to it wrote it, so its servers are carried only once the user confirms them (as
    /// the hosts themselves ask). In the home folder these are the user's own files.
    pub fn project_places(self, dirs: &Dirs) -> Vec<PathBuf> {
        if dirs.cwd == dirs.home {
            return Vec::new();
        }
        let cwd = &dirs.cwd;
        match self {
            Host::ClaudeCode => vec![cwd.join(".mcp.json")],
            Host::Cursor => vec![cwd.join(".cursor").join("mcp.json")],
            Host::Vscode => vec![cwd.join(".vscode").join("mcp.json")],
            Host::Gemini => vec![cwd.join(".gemini").join("settings.json")],
            _ => Vec::new(),
        }
    }
}

/// The folders the usual places are under, for this OS and user.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub home: PathBuf,
    /// Per-user application data: `~/Library/Application Support` (macOS), `%APPDATA%`
    /// (Windows), `$XDG_CONFIG_HOME` or `~/.config` (elsewhere).
    pub app_data: PathBuf,
    /// `~/.config` (or `$XDG_CONFIG_HOME`) on macOS and Linux, `%APPDATA%` on Windows.
    pub config: PathBuf,
    /// `$CODEX_HOME` or `~/.codex`.
    pub codex_home: PathBuf,
    pub cwd: PathBuf,
}

impl Dirs {
    /// From the environment: `HOME` (`USERPROFILE` on Windows), `APPDATA`, `XDG_CONFIG_HOME`,
    /// `CODEX_HOME`.
    pub fn from_env() -> Result<Self, String> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = var("HOME").or_else(|| var("USERPROFILE")).ok_or("neither HOME nor USERPROFILE is set")?;
        let xdg = var("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
        let (app_data, config) = if cfg!(target_os = "macos") {
            (home.join("Library").join("Application Support"), xdg)
        } else if cfg!(windows) {
            let appdata = var("APPDATA").unwrap_or_else(|| home.join("AppData").join("Roaming"));
            (appdata.clone(), appdata)
        } else {
            (xdg.clone(), xdg)
        };
        let codex_home = var("CODEX_HOME").unwrap_or_else(|| home.join(".codex"));
        let cwd = std::env::current_dir().map_err(|e| format!("the current folder: {e}"))?;
        Ok(Self { home, app_data, config, codex_home, cwd })
    }
}

impl Found {
    /// Where its servers came from, as a person knows it.
    pub fn source(&self) -> &'static str {
        self.host.map_or("the MCP registry", Host::title)
    }
}

/// What one host file holds.
#[derive(Debug)]
pub struct Found {
    /// The host whose file it is; `None` for servers read from the MCP registry.
    pub host: Option<Host>,
    pub path: PathBuf,
    pub servers: Vec<Server>,
    /// Entries that cannot be carried, with why.
    pub skipped: Vec<Skipped>,
    /// A project folder's file found by looking (see [`Host::project_places`]), not named by
    /// the user: its servers wait for [`confirm_project_files`].
    pub project: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

impl Skipped {
    pub fn new(name: &str, reason: impl Into<String>) -> Self {
        Self { name: name.to_string(), reason: reason.into() }
    }
}

/// A value VS Code asks the user for (`inputs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub description: String,
    pub password: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    /// Streamable HTTP, or the 2024-11-05 HTTP+SSE transport (`sse`).
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        sse: bool,
    },
}

/// One server as a host configures it, its values in toolmux's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// As the host names it.
    pub name: String,
    /// The project it belongs to (Claude Code's per-project servers).
    pub project: Option<String>,
    pub transport: Transport,
    /// A per-call deadline the host sets.
    pub timeout: Option<Duration>,
    /// The tools the host allows, when it names them.
    pub only_tools: Option<Vec<String>>,
    /// Carried with a caveat the user should read.
    pub notes: Vec<String>,
    /// `${VAR}` values the host's own config supplies (`${VAR:-default}`): written to the env file.
    pub defaults: BTreeMap<String, String>,
    /// Variables the user must fill in (VS Code's prompted inputs), with what they are.
    pub asks: BTreeMap<String, String>,
    inputs: BTreeMap<String, Input>,
    workspace: Option<PathBuf>,
    /// `$VAR` without braces is a reference too (Gemini CLI).
    bare_vars: bool,
}

impl Server {
    fn new(name: &str, project: Option<&str>) -> Self {
        Self {
            name: name.to_string(),
            project: project.map(str::to_string),
            transport: Transport::Stdio { command: String::new(), args: Vec::new(), env: BTreeMap::new(), cwd: None },
            timeout: None,
            only_tools: None,
            notes: Vec::new(),
            defaults: BTreeMap::new(),
            asks: BTreeMap::new(),
            inputs: BTreeMap::new(),
            workspace: None,
            bare_vars: false,
        }
    }

    /// A host's value with its references in toolmux's form (`${VAR}`).
    fn value(&mut self, text: &str) -> String {
        if self.bare_vars {
            let braced = braced(text);
            return self.value_braced(&braced);
        }
        self.value_braced(text)
    }

    fn value_braced(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            let inner = &after[..end];
            rest = &after[end + 1..];
            if let Some(var) = inner.strip_prefix("env:") {
                out.push_str(&format!("${{{var}}}"));
            } else if let Some(id) = inner.strip_prefix("input:") {
                let var = var_name(id);
                let what = match self.inputs.get(id) {
                    Some(i) if !i.description.is_empty() => format!("VS Code input `{id}`: {}", i.description),
                    _ => format!("VS Code input `{id}`"),
                };
                self.asks.insert(var.clone(), what);
                out.push_str(&format!("${{{var}}}"));
            } else if inner == "workspaceFolder" && self.workspace.is_some() {
                out.push_str(&self.workspace.as_deref().unwrap_or(Path::new("")).to_string_lossy());
            } else if inner == "userHome" {
                let home = Dirs::from_env().map(|d| d.home.to_string_lossy().into_owned()).unwrap_or_default();
                out.push_str(&home);
            } else if inner == "pathSeparator" || inner == "/" {
                out.push(std::path::MAIN_SEPARATOR);
            } else if let Some((var, default)) = inner.split_once(":-") {
                self.defaults.insert(var.to_string(), default.to_string());
                out.push_str(&format!("${{{var}}}"));
            } else {
                out.push_str(&format!("${{{inner}}}"));
            }
        }
        out.push_str(rest);
        out
    }
}

/// `$VAR` written as `${VAR}`; `${...}` and a lone `$` stay as they are.
fn braced(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let starts_name = text[i + 1..].starts_with(|n: char| n.is_ascii_alphabetic() || n == '_');
        if c != '$' || !starts_name {
            out.push(c);
            continue;
        }
        let name: String = text[i + 1..].chars().take_while(|n| n.is_ascii_alphanumeric() || *n == '_').collect();
        for _ in 0..name.len() {
            chars.next();
        }
        out.push_str(&format!("${{{name}}}"));
    }
    out
}

/// `text` with each control character written as its escape (`\n`, `\u{1b}`): what a host file
/// says, made safe to put in a comment line or print to a terminal.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().collect() } else { c.to_string() }).collect()
}

/// An environment variable's name for an id or a header: `github-token` → `GITHUB_TOKEN`.
pub fn var_name(id: &str) -> String {
    let mut out: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect::<String>()
        .split('_')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("_");
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "V_");
    }
    out
}

/// Reads the files given, or, with none, every host's usual places that exist. Returns what was
/// found, and per file that could not be read, why.
pub fn read_all(paths: &[PathBuf], dirs: &Dirs) -> (Vec<Found>, Vec<(PathBuf, String)>) {
    let mut found = Vec::new();
    let mut failed = Vec::new();
    let mut candidates: Vec<(PathBuf, Option<Host>)> = Vec::new();
    if paths.is_empty() {
        for host in Host::ALL {
            for p in host.usual_places(dirs) {
                if p.is_file() && !candidates.iter().any(|(c, _)| *c == p) {
                    candidates.push((p, Some(host)));
                }
            }
        }
    } else {
        candidates = paths.iter().map(|p| (p.clone(), Host::of_path(p))).collect();
    }
    for (path, host) in candidates {
        // A file nothing names is read as the most common shape, `mcpServers`.
        match formats::read(&path, host.unwrap_or(Host::ClaudeCode)) {
            Ok(mut f) => {
                if host.is_none() {
                    f.host = Some(guess_host(&f));
                }
                f.project = paths.is_empty() && f.host.is_some_and(|h| h.project_places(dirs).contains(&f.path));
                found.push(f);
            }
            Err(why) => failed.push((path, why)),
        }
    }
    (found, failed)
}

/// Keeps the servers of each project file that `confirm` accepts; the others are not carried,
/// and the report says how to carry them.
pub fn confirm_project_files(found: &mut [Found], mut confirm: impl FnMut(&Found) -> bool) {
    for f in found.iter_mut().filter(|f| f.project && !f.servers.is_empty()) {
        if confirm(f) {
            continue;
        }
        let why = "in a project's file, which whoever can commit to the project wrote: carried only once you \
                   confirm it (asked when run in a terminal), or with --trust-project after reading the file";
        let held = std::mem::take(&mut f.servers);
        f.skipped.extend(held.iter().map(|s| Skipped::new(&s.name, why)));
    }
}

/// A file named by the user that no host's place matches: labelled by its shape.
fn guess_host(f: &Found) -> Host {
    if f.path.extension().is_some_and(|e| e == "toml") { Host::Codex } else { Host::ClaudeCode }
}

/// Whether an env variable's name or value says it holds a credential.
pub fn secret_env(name: &str, value: &str) -> bool {
    const WORDS: [&str; 18] = [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "PASS",
        "PWD",
        "CRED",
        "CREDS",
        "APIKEY",
        "KEY",
        "CREDENTIAL",
        "CREDENTIALS",
        "AUTH",
        "PAT",
        "COOKIE",
        "DSN",
        "SESSION",
    ];
    let upper = name.to_ascii_uppercase();
    // `PWD` alone is the shell's working folder, not a password.
    let named = (upper != "PWD" && upper.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| WORDS.contains(&w)))
        || upper.contains("API_KEY")
        || upper.contains("ACCESS_KEY")
        || upper.contains("PRIVATE_KEY")
        || upper.contains("CONNECTION_STRING")
        || upper.ends_with("DATABASE_URL");
    named || secret_value(value)
}

/// Whether a value looks like a credential whatever its name: a known token prefix, or a URL
/// with a password in it.
pub fn secret_value(value: &str) -> bool {
    const PREFIXES: [&str; 13] = [
        "ghp_",
        "gho_",
        "ghs_",
        "ghu_",
        "github_pat_",
        "glpat-",
        "sk-",
        "xoxb-",
        "xoxp-",
        "lin_api_",
        "ntn_",
        "AKIA",
        "sntrys_",
    ];
    PREFIXES.iter().any(|p| value.starts_with(p))
        || value
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .is_some_and(|auth| auth.rsplit_once('@').is_some_and(|(user, _)| user.contains(':')))
}

/// Headers that carry no credential (everything else is treated as one).
pub fn plain_header(name: &str) -> bool {
    const PLAIN: [&str; 7] =
        ["accept", "content-type", "user-agent", "mcp-protocol-version", "accept-language", "x-request-id", "origin"];
    PLAIN.contains(&name.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests;
