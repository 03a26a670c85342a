//! Round trips over a fixture of each host's format: read, plan, write, and load the written
//! configuration as the gateway would, with the values a user fills in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::*;
use crate::config::Transport;
use crate::config::{Config, Transport as T};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts").join(rel)
}

/// A temporary folder with the configuration an import writes: new, or (`merge`) merged into a
/// small existing one.
fn target(merge: bool) -> (tempfile::TempDir, PathBuf, write::Target) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolmux.toml");
    let target = if merge {
        std::fs::write(&config, "[server]\nmode = \"optimizer\"\n").unwrap();
        write::Target::Into(config.clone())
    } else {
        write::Target::New(config.clone())
    };
    (dir, config, target)
}

/// Every literal secret in the fixtures: none may be written into a configuration.
const SECRETS: [&str; 8] = [
    "ghp_fixture0000000000000000000000000000",
    "fixture-key-123",
    "sk-fixture-0000",
    "ntn_fixture000000",
    "fixture-memory-token",
    "figd_fixture",
    "ctx7-fixture",
    "fixture-key-123",
];

/// Imports `files` into a new configuration in a temporary folder, fills in what the report
/// asks for with `fill`, and loads it as `toolmux serve` would.
fn round_trip(files: &[&str], fill: &[(&str, &str)]) -> (Config, plan::Plan, String, tempfile::TempDir) {
    let paths: Vec<PathBuf> = files.iter().map(|f| fixture(f)).collect();
    let dirs = Dirs::from_env().unwrap();
    let (found, failed) = read_all(&paths, &dirs);
    assert!(failed.is_empty(), "{failed:?}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toolmux.toml");
    let target = write::Target::New(out.clone());
    let plan = write::plan_for(&found, &target).unwrap();
    let (text, written) = write::write(&plan, &target, false).unwrap();
    for secret in SECRETS {
        assert!(!text.contains(secret), "a secret was written into the configuration:\n{text}");
    }
    if let Some(env) = written.unwrap().env_file {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&env).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let mut more = String::new();
        for (var, value) in fill {
            more.push_str(&crate::config::envfile::line(var, value).unwrap());
        }
        let mut f = std::fs::OpenOptions::new().append(true).open(&env).unwrap();
        std::io::Write::write_all(&mut f, more.as_bytes()).unwrap();
    }
    let config = Config::load(&out).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (config, plan, text, dir)
}

fn backend<'c>(c: &'c Config, name: &str) -> &'c T {
    &c.backends.iter().find(|b| b.name == name).unwrap_or_else(|| panic!("no backend {name}")).transport
}

fn stdio(t: &T) -> (&str, &[String], &BTreeMap<String, String>) {
    let T::Stdio { command, args, env, .. } = t else { panic!("not stdio: {t:?}") };
    (command, args, env)
}

fn http(t: &T) -> (&str, &BTreeMap<String, String>) {
    let T::Http { url, headers, .. } = t else { panic!("not HTTP: {t:?}") };
    (url, headers)
}

#[test]
fn claude_desktop() {
    let (c, plan, text, _dir) = round_trip(&["claude-desktop/claude_desktop_config.json"], &[]);
    let (command, args, env) = stdio(backend(&c, "github"));
    assert_eq!((command, args.len()), ("npx", 2));
    assert_eq!(env["GITHUB_PERSONAL_ACCESS_TOKEN"], SECRETS[0]);
    assert!(text.contains("GITHUB_PERSONAL_ACCESS_TOKEN = \"${GITHUB_PERSONAL_ACCESS_TOKEN}\""), "{text}");
    let (_, args, _) = stdio(backend(&c, "local-files"));
    assert_eq!(args[2], "/Users/me/Documents");
    assert!(plan.backends.iter().any(|b| b.backend == "local-files" && b.server.notes[0].contains("named")));
    // Not a secret: stays where it was.
    assert!(text.contains("LOG_LEVEL = \"info\""), "{text}");
    assert_eq!(stdio(backend(&c, "linear")).1[2], "https://mcp.linear.app/sse");
}

#[test]
fn claude_code_project_and_user_files() {
    let (c, plan, text, _dir) =
        round_trip(&["claude-code/.mcp.json", "claude-code/.claude.json"], &[("SENTRY_TOKEN", "from-user")]);
    assert_eq!(plan.from_env, BTreeSet::from(["SENTRY_TOKEN".to_string()]));
    let (url, headers) = http(backend(&c, "sentry"));
    assert_eq!(url, "https://mcp.sentry.dev/mcp");
    assert_eq!(headers["Authorization"], "Bearer from-user");
    // `${VAR:-default}`: the default is the env file's value, the environment still wins.
    assert_eq!(stdio(backend(&c, "postgres")).2["DATABASE_URI"], "postgresql://localhost/dev");
    assert!(text.contains("transport = \"sse\""), "{text}");
    assert_eq!(http(backend(&c, "legacy-events")).1["X-API-Key"], "fixture-key-123");
    assert_eq!(stdio(backend(&c, "time")).0, "uvx");
    // A project's server, with its secret moved and its project said.
    assert_eq!(stdio(backend(&c, "stripe")).2["STRIPE_SECRET_KEY"], "sk-fixture-0000");
    assert!(text.contains("# (the project /home/me/src/shop)"), "{text}");
}

#[test]
fn cursor_headers_keep_their_scheme() {
    let (c, _, text, _dir) = round_trip(&["cursor/.cursor/mcp.json"], &[]);
    let (_, headers) = http(backend(&c, "notion"));
    assert_eq!(headers["Authorization"], "Bearer ntn_fixture000000");
    assert!(text.contains("Authorization = \"Bearer ${NOTION_TOKEN}\""), "{text}");
    // Not a credential: left as written.
    assert!(text.contains("Accept = \"application/json\""), "{text}");
    assert_eq!(stdio(backend(&c, "puppeteer")).2["PUPPETEER_LAUNCH_OPTIONS"], "{\"headless\": true}");
}

#[test]
fn vscode_inputs_env_files_and_variables() {
    let (c, plan, text, _dir) = round_trip(&["vscode/.vscode/mcp.json"], &[("GITHUB_TOKEN", "typed-in")]);
    assert!(plan.asks["GITHUB_TOKEN"].contains("GitHub Personal Access Token"), "{:?}", plan.asks);
    assert_eq!(http(backend(&c, "github")).1["Authorization"], "Bearer typed-in");
    let (_, _, env) = stdio(backend(&c, "memory"));
    let workspace = fixture("vscode");
    assert_eq!(env["MEMORY_FILE_PATH"], format!("{}/memory.json", workspace.display()));
    // The envFile's values came along; its secret went to the env file.
    assert_eq!(env["MEMORY_API_TOKEN"], "fixture-memory-token");
    assert_eq!(env["DEBUG"], "1");
    assert_eq!(env["HOME_DIR"], std::env::var("HOME").unwrap());
    assert!(plan.skipped.iter().any(|(_, s)| s.name == "weird" && s.reason.contains("websocket")));
    assert!(text.contains("envFile"), "the envFile caveat is written down: {text}");
}

#[test]
fn windsurf_gemini_codex_cline() {
    let (c, plan, text, _dir) = round_trip(
        &[
            "windsurf/mcp_config.json",
            "gemini/.gemini/settings.json",
            "codex/.codex/config.toml",
            "cline/cline_mcp_settings.json",
        ],
        &[("ATLASSIAN_TOKEN", "a"), ("MY_API_KEY", "m"), ("LINEAR_API_KEY", "l")],
    );
    // Windsurf: serverUrl; a disabled entry and a deny-list said, not carried.
    assert_eq!(http(backend(&c, "figma")).1["X-Figma-Token"], "figd_fixture");
    assert!(plan.skipped.iter().any(|(_, s)| s.name == "old" && s.reason.contains("disabled")));
    assert!(text.contains("`disabledTools` was not carried"), "{text}");
    // Gemini: httpUrl is streamable HTTP, url is SSE, $VAR is a reference, includeTools a filter.
    assert_eq!(http(backend(&c, "atlassian")).1["Authorization"], "Bearer a");
    assert!(text.contains("name = \"events\"\nurl = \"http://localhost:8080/sse\"\ntransport = \"sse\""), "{text}");
    assert!(c.aggregation.per_backend["atlassian"].filter.as_ref().unwrap().contains(&"jira_search".to_string()));
    assert_eq!(stdio(backend(&c, "py")).2["API_KEY"], "m");
    // Codex: the bearer variable, a literal header, a timeout, an allow-list; a disabled server.
    let (_, headers) = http(backend(&c, "linear"));
    assert_eq!((headers["Authorization"].as_str(), headers["X-Team"].as_str()), ("Bearer l", "core"));
    let ctx = c.backends.iter().find(|b| b.name == "context7").unwrap();
    assert_eq!(ctx.timeout, std::time::Duration::from_secs(90));
    assert_eq!(stdio(&ctx.transport).2["CONTEXT7_API_KEY"], "ctx7-fixture");
    assert!(plan.skipped.iter().any(|(_, s)| s.name == "off"));
    // Cline: a secret in the arguments cannot move, so it is said and the file kept private.
    assert!(plan.secret_in_config);
    assert!(text.contains("an argument looks like a secret"), "{text}");
    assert!(text.contains("its URL looks like it carries a secret"), "{text}");
}

#[test]
fn a_server_in_two_hosts_is_imported_once_and_names_stay_unique() {
    let dirs = Dirs::from_env().unwrap();
    let one = fixture("claude-desktop/claude_desktop_config.json");
    let (found, _) = read_all(&[one.clone(), one], &dirs);
    let plan = plan::plan(&found, &BTreeSet::new(), &BTreeMap::new());
    assert_eq!(plan.backends.len(), 3, "{:?}", plan.backends.iter().map(|b| &b.backend).collect::<Vec<_>>());
    let same: Vec<_> = plan.skipped.iter().filter(|(_, s)| s.reason.contains("the same server")).collect();
    assert_eq!(same.len(), 3, "{same:?}");
    // The same name with another command: numbered.
    let mut other = read_all(&[fixture("cursor/.cursor/mcp.json")], &dirs).0;
    other[0].servers[1].name = "github".into();
    let mut all = found;
    all.extend(other);
    let plan = plan::plan(&all, &BTreeSet::new(), &BTreeMap::new());
    assert!(plan.backends.iter().any(|b| b.backend == "github-2"), "{:?}", plan.backends);
}

#[test]
fn merging_into_a_configuration_keeps_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mine.toml");
    let before = "# my gateway\n[server]\nmode = \"passthrough\"\n\n[[backends]]\nname = \"linear\"\nurl = \"http://127.0.0.1:9/mcp\"\n";
    std::fs::write(&config, before).unwrap();
    let dirs = Dirs::from_env().unwrap();
    let (found, _) = read_all(&[fixture("claude-desktop/claude_desktop_config.json")], &dirs);
    let target = write::Target::Into(config.clone());
    let plan = write::plan_for(&found, &target).unwrap();
    assert!(plan.skipped.iter().any(|(_, s)| s.name == "linear" && s.reason.contains("already")));
    let (_, written) = write::write(&plan, &target, false).unwrap();
    let written = written.unwrap();
    assert_eq!(std::fs::read_to_string(written.backup.unwrap()).unwrap(), before);
    let after = std::fs::read_to_string(&config).unwrap();
    assert!(after.contains("# my gateway\n[server]\nmode = \"passthrough\""), "{after}");
    assert!(after.starts_with("# Secrets moved here"), "{after}");
    let c = Config::load(&config).unwrap();
    let names: Vec<&str> = c.backends.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["linear", "local-files", "github"]);
    let Transport::Stdio { env, .. } = &c.backends[2].transport else { panic!() };
    assert_eq!(env["GITHUB_PERSONAL_ACCESS_TOKEN"], SECRETS[0]);
    // A second merge finds its own variables and adds no duplicate.
    let plan = write::plan_for(&found, &target).unwrap();
    assert!(plan.backends.is_empty());
}

#[test]
fn a_new_configuration_never_replaces_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toolmux.toml");
    std::fs::write(&out, "keep me").unwrap();
    let (found, _) = read_all(&[fixture("cursor/.cursor/mcp.json")], &Dirs::from_env().unwrap());
    let target = write::Target::New(out.clone());
    let plan = write::plan_for(&found, &target).unwrap();
    let err = write::write(&plan, &target, false).unwrap_err().to_string();
    assert!(err.contains("--into"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
}

#[test]
fn hosts_are_known_by_their_files() {
    let cases = [
        ("Claude/claude_desktop_config.json", Host::ClaudeDesktop),
        ("proj/.mcp.json", Host::ClaudeCode),
        ("h/.cursor/mcp.json", Host::Cursor),
        ("p/.vscode/mcp.json", Host::Vscode),
        ("Code/User/mcp.json", Host::Vscode),
        ("h/.codeium/windsurf/mcp_config.json", Host::Windsurf),
        ("h/.gemini/settings.json", Host::Gemini),
        ("h/.codex/config.toml", Host::Codex),
        ("x/settings/cline_mcp_settings.json", Host::Cline),
        ("h/.config/goose/config.yaml", Host::Goose),
    ];
    for (path, host) in cases {
        assert_eq!(Host::of_path(Path::new(path)), Some(host), "{path}");
    }
    assert_eq!(Host::of_path(Path::new("servers.json")), None);
}

#[test]
fn names_and_secrets() {
    assert_eq!(plan::backend_name("GitHub Enterprise"), "github-enterprise");
    assert_eq!(plan::backend_name("@scope/srv.v2"), "scope-srv-v2");
    assert_eq!(plan::backend_name("!!!"), "server");
    assert_eq!(var_name("github-token"), "GITHUB_TOKEN");
    assert_eq!(var_name("1st"), "V_1ST");
    assert!(secret_env("GITHUB_PERSONAL_ACCESS_TOKEN", "x"));
    assert!(secret_env("OPENAI_API_KEY", "x"));
    assert!(secret_env("ANYTHING", "ghp_abc"));
    assert!(secret_env("DB", "postgres://u:pw@db/x"));
    assert!(!secret_env("LOG_LEVEL", "info"));
    for name in ["DB_CRED", "AWS_CREDS", "MYSQL_PWD", "GPG_PASSPHRASE"] {
        assert!(secret_env(name, "x"), "{name}");
    }
    assert!(!secret_env("PWD", "/home/me"), "the shell's working folder");
    assert!(!secret_env("KEYBOARD_LAYOUT", "us"));
    assert!(!secret_value("https://example.com/mcp"));
}

mod connect_tests {
    use super::super::connect::{self, Via};
    use super::*;

    fn stdio_via() -> Via {
        Via::Stdio { command: "/opt/toolmux".into(), config: "/home/me/toolmux.toml".into() }
    }

    #[test]
    fn write_takes_out_the_imported_entries_keeps_comments_and_undoes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mcp.json");
        let before = std::fs::read_to_string(fixture("vscode/.vscode/mcp.json")).unwrap();
        std::fs::write(&file, &before).unwrap();
        let imported = BTreeSet::from(["github".to_string(), "memory".to_string()]);
        let via = Via::Http { url: "http://127.0.0.1:4483/mcp".into(), token_var: Some("TOOLMUX_TOKEN".into()) };
        let done = connect::write(Host::Vscode, &via, &file, &imported).unwrap();
        assert_eq!(done.removed, ["github", "memory"]);
        assert_eq!(done.kept, ["weird"]);
        let after = std::fs::read_to_string(&file).unwrap();
        assert!(after.contains("// Asked once by VS Code"), "{after}");
        let v = formats::parse_jsonc(&after).unwrap();
        assert_eq!(v["servers"]["toolmux"]["url"], "http://127.0.0.1:4483/mcp");
        assert_eq!(v["servers"]["toolmux"]["headers"]["Authorization"], "Bearer ${input:toolmux-token}");
        assert!(v["inputs"].as_array().unwrap().iter().any(|i| i["id"] == "toolmux-token"));
        assert!(v["servers"].get("github").is_none());
        // Again: one entry still, and the backup is still the original.
        connect::write(Host::Vscode, &via, &file, &imported).unwrap();
        let again = formats::parse_jsonc(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(again["servers"].as_object().unwrap().len(), 2);
        assert_eq!(again["inputs"].as_array().unwrap().len(), 2);
        connect::undo(&file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
        assert!(!connect::backup_of(&file).exists());
        assert!(connect::undo(&file).unwrap_err().to_string().contains("nothing to undo"));
    }

    /// The copy `--write` keeps holds the host's secrets: it is never readable by more people
    /// than the original, and with no original it is the owner's only.
    #[cfg(unix)]
    #[test]
    fn the_backup_is_no_more_readable_than_the_original() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o640, 0o644] {
            let file = dir.path().join(format!("mcp-{mode:o}.json"));
            std::fs::write(&file, r#"{"mcpServers": {"github": {"command": "gh", "env": {"T": "ghp_x"}}}}"#).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let done = connect::write(Host::Cursor, &stdio_via(), &file, &BTreeSet::new()).unwrap();
            let backup = std::fs::metadata(&done.backup).unwrap().permissions().mode() & 0o777;
            // The process's umask may narrow it further; it is never wider.
            assert_eq!(backup & !mode, 0, "the backup of a file with mode {mode:o} has mode {backup:o}");
            assert_eq!(backup & 0o600, 0o600, "its owner can still read and write it");
        }
        let fresh = dir.path().join("new").join("mcp.json");
        let done = connect::write(Host::Cursor, &stdio_via(), &fresh, &BTreeSet::new()).unwrap();
        assert_eq!(std::fs::metadata(&done.backup).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_file_that_was_not_there_is_gone_after_undo() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub").join("mcp.json");
        connect::write(Host::Cursor, &stdio_via(), &file, &BTreeSet::new()).unwrap();
        let v = formats::parse_jsonc(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(v["mcpServers"]["toolmux"]["args"][3], "/home/me/toolmux.toml");
        connect::undo(&file).unwrap();
        assert!(!file.exists());
    }

    #[test]
    fn codex_toml_keeps_its_other_settings() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let before = std::fs::read_to_string(fixture("codex/.codex/config.toml")).unwrap();
        std::fs::write(&file, &before).unwrap();
        let imported = BTreeSet::from(["context7".to_string(), "linear".to_string()]);
        let done = connect::write(Host::Codex, &stdio_via(), &file, &imported).unwrap();
        assert_eq!(done.kept, ["off"]);
        let after: toml::Table = toml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(after["model"].as_str(), Some("o4-mini"));
        let servers = after["mcp_servers"].as_table().unwrap();
        assert_eq!(servers.keys().collect::<Vec<_>>(), ["off", "toolmux"]);
        assert_eq!(servers["toolmux"]["command"].as_str(), Some("/opt/toolmux"));
        connect::undo(&file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    }

    #[test]
    fn every_snippet_reads_back_as_its_host_format() {
        for host in Host::ALL.into_iter().filter(|h| *h != Host::Goose) {
            let dir = tempfile::tempdir().unwrap();
            let name = host.usual_places(&Dirs::from_env().unwrap())[0].file_name().unwrap().to_owned();
            let file = dir.path().join(name);
            std::fs::write(&file, connect::snippet(host, &stdio_via()).unwrap()).unwrap();
            let found = formats::read(&file, host).unwrap();
            assert_eq!(found.servers.len(), 1, "{host:?}");
            let super::super::Transport::Stdio { command, args, .. } = &found.servers[0].transport else { panic!() };
            assert_eq!(command, "/opt/toolmux");
            assert_eq!(args, &["serve", "--stdio", "--config", "/home/me/toolmux.toml"]);
        }
        let err = connect::snippet(Host::ClaudeDesktop, &Via::Http { url: "http://x".into(), token_var: None });
        assert!(err.unwrap_err().to_string().contains("stdio"));
    }
}

/// Whatever a host file holds, what an import writes reads back as exactly that: names, notes,
/// projects and VS Code's input descriptions can hold newlines, quotes, brackets and `=`, and
/// none of it may add a key to the configuration or a variable to the env file (a server named
/// `x\n[[policy]]` once could). New files and merges alike; the seed is printed, and
/// `IMPORT_SEED=N` replays one.
mod arbitrary_text {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::import::Transport as Source;

    /// Pieces an attacker would reach for, and plain text around them.
    const PIECES: [&str; 24] = [
        "\n",
        "\r\n",
        "\r",
        "\"",
        "'",
        "\\",
        "#",
        "[[policy]]",
        "[server]",
        "=",
        "${",
        "}",
        "mode = \"passthrough\"",
        "EVIL=1",
        "\u{0}",
        "\u{1b}[2J",
        "\t",
        "\u{2028}",
        "é",
        "\u{202e}",
        "`",
        "{",
        "a b",
        "x",
    ];

    fn text(rng: &mut StdRng, nonempty: bool) -> String {
        let n = rng.random_range(usize::from(nonempty)..6);
        (0..n).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect()
    }

    /// Text a header value can carry (no control characters, which HTTP refuses).
    fn header_text(rng: &mut StdRng) -> String {
        text(rng, true).chars().filter(|c| !c.is_control() && *c != '$').collect::<String>() + "v"
    }

    fn server(rng: &mut StdRng, i: usize) -> Server {
        let project = rng.random_bool(0.3).then(|| text(rng, true));
        let mut s = Server::new(&format!("{}{i}", text(rng, false)), project.as_deref());
        s.transport = if rng.random_bool(0.5) {
            let env = (0..rng.random_range(0..4))
                .map(|k| {
                    (format!("TMXP_{}_{k}", if rng.random_bool(0.5) { "TOKEN" } else { "LEVEL" }), text(rng, true))
                })
                .map(|(k, v)| (k, v.replace("${", "$ {")))
                .collect();
            Source::Stdio {
                command: format!("cmd{}", text(rng, false)),
                args: (0..rng.random_range(0..3)).map(|_| text(rng, false)).collect(),
                env,
                cwd: rng.random_bool(0.3).then(|| text(rng, true)),
            }
        } else {
            let headers = (0..rng.random_range(0..3)).map(|k| (format!("X-Tmxp-{k}"), header_text(rng))).collect();
            Source::Http { url: format!("http://127.0.0.1:9/mcp{i}"), headers, sse: false }
        };
        for _ in 0..rng.random_range(0..3) {
            s.notes.push(text(rng, true));
        }
        if rng.random_bool(0.5) {
            s.asks.insert(format!("TMXP_ASK_{i}"), format!("VS Code input: {}", text(rng, true)));
        }
        if rng.random_bool(0.3) {
            s.only_tools = Some((0..2).map(|_| text(rng, true)).collect());
        }
        s
    }

    /// The configuration's keys, and each backend's, must be only those an import writes.
    fn assert_no_new_keys(text: &str, backends: usize) {
        let doc: toml::Table = toml::from_str(text).unwrap();
        for k in doc.keys() {
            assert!(
                ["env_file", "server", "backends", "aggregation"].contains(&k.as_str()),
                "a new key `{k}`:\n{text}"
            );
        }
        if let Some(server) = doc.get("server").and_then(toml::Value::as_table) {
            let keys: Vec<&str> = server.keys().map(String::as_str).collect();
            assert!(keys.iter().all(|k| ["listen", "mode"].contains(k)), "server keys {keys:?}:\n{text}");
        }
        let list = doc["backends"].as_array().unwrap();
        assert_eq!(list.len(), backends, "{text}");
        let allowed = ["name", "command", "args", "env", "cwd", "url", "transport", "headers", "timeout"];
        for b in list {
            for k in b.as_table().unwrap().keys() {
                assert!(allowed.contains(&k.as_str()), "a new backend key `{k}`:\n{text}");
            }
        }
    }

    fn check(seed: u64, merge: bool) {
        let mut rng = StdRng::seed_from_u64(seed);
        let servers: Vec<Server> = (0..rng.random_range(1..5)).map(|i| server(&mut rng, i)).collect();
        let found = vec![Found {
            host: Some(Host::Cursor),
            path: PathBuf::from(format!("/tmp/{}", text(&mut rng, true))),
            servers: servers.clone(),
            skipped: vec![Skipped::new(&text(&mut rng, true), text(&mut rng, true))],
            project: false,
        }];
        let (_dir, config, target) = target(merge);
        let plan = write::plan_for(&found, &target).unwrap();
        assert_eq!(plan.backends.len(), servers.len(), "seed {seed}: {:?}", plan.skipped);
        let (_, written) = write::write(&plan, &target, false).unwrap();
        let written = written.unwrap();
        let text = std::fs::read_to_string(&config).unwrap();
        assert_no_new_keys(&text, servers.len());
        if let Some(env) = &written.env_file {
            let vars = crate::config::envfile::read(env).unwrap();
            assert_eq!(
                vars.keys().collect::<Vec<_>>(),
                plan.env.keys().collect::<Vec<_>>(),
                "seed {seed}: the env file holds exactly the plan's variables"
            );
        }
        // Nothing the user must fill in is referred to here, so the file loads as it is.
        let loaded = Config::load(&config).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        assert_eq!(loaded.backends.len(), servers.len());
        for (planned, (got, original)) in plan.backends.iter().zip(loaded.backends.iter().zip(&servers)) {
            assert_eq!(got.name, planned.backend, "seed {seed}");
            match (&got.transport, &original.transport) {
                (T::Stdio { command, args, env, cwd, .. }, Source::Stdio { command: c, args: a, env: e, cwd: w }) => {
                    assert_eq!((command, args), (c, a), "seed {seed}");
                    assert_eq!(cwd.as_ref().map(|p| p.to_string_lossy().into_owned()), *w, "seed {seed}");
                    assert_eq!(env, e, "seed {seed}: env values read back unchanged");
                }
                (T::Http { url, headers, .. }, Source::Http { url: u, headers: h, .. }) => {
                    assert_eq!(url, u, "seed {seed}");
                    assert_eq!(headers, h, "seed {seed}: header values read back unchanged");
                }
                other => panic!("seed {seed}: transport changed: {other:?}"),
            }
        }
    }

    #[test]
    fn what_a_host_file_says_never_becomes_configuration() {
        let seed = std::env::var("IMPORT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
        println!("IMPORT_SEED={seed}");
        for i in 0..200 {
            let s = seed.wrapping_add(i);
            check(s, i % 2 == 1);
        }
    }

    /// A `${NAME:-default}` whose name could end a line of the env file is not carried.
    #[test]
    fn a_variable_name_that_could_start_a_line_is_refused() {
        let mut s = Server::new("srv", None);
        s.transport = Source::Stdio {
            command: "srv".into(),
            args: vec![],
            env: BTreeMap::from([("A".into(), "${X\nEVIL=1}".into())]),
            cwd: None,
        };
        s.defaults.insert("X\nEVIL=1".into(), "v".into());
        let found = vec![Found {
            host: Some(Host::Cursor),
            path: "/x".into(),
            servers: vec![s],
            skipped: vec![],
            project: false,
        }];
        let plan = plan::plan(&found, &BTreeSet::new(), &BTreeMap::new());
        assert!(plan.backends.is_empty());
        assert!(plan.skipped[0].1.reason.contains("not a variable name"), "{:?}", plan.skipped);
        assert!(plan.env.is_empty());
    }
}

/// A secret that stays in the configuration (an argument, a URL) is written to the file, which
/// is then readable by its owner only, new or merged, and never printed by `--json` or
/// `--dry-run`.
#[test]
fn secrets_left_in_the_file_are_written_privately_and_never_printed() {
    use crate::import::Transport as Source;
    let mut stdio = Server::new("cli", None);
    stdio.transport = Source::Stdio {
        command: "tool".into(),
        args: vec!["--token".into(), "s3cr3t-arg".into(), "--api-key=s3cr3t-inline".into(), "plain".into()],
        env: BTreeMap::new(),
        cwd: None,
    };
    let mut http = Server::new("remote", None);
    http.transport = Source::Http {
        url: "https://me:s3cr3t-pw@example.com/mcp?key=s3cr3t-q".into(),
        headers: BTreeMap::new(),
        sse: false,
    };
    let found = vec![Found {
        host: Some(Host::Cursor),
        path: "/x".into(),
        servers: vec![stdio, http],
        skipped: vec![],
        project: false,
    }];
    let secrets = ["s3cr3t-arg", "s3cr3t-inline", "s3cr3t-pw", "s3cr3t-q"];
    for merge in [false, true] {
        let (_dir, config, target) = target(merge);
        let plan = write::plan_for(&found, &target).unwrap();
        assert!(plan.secret_in_config);
        let json = plan::to_json(&plan).to_string();
        let (dry, _) = write::write(&plan, &target, true).unwrap();
        for s in secrets {
            assert!(!json.contains(s), "--json printed {s}: {json}");
            assert!(!dry.contains(s), "--dry-run printed {s}: {dry}");
        }
        assert!(json.contains("plain") && dry.contains("--api-key="), "{dry}");
        write::write(&plan, &target, false).unwrap();
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(secrets.iter().all(|s| text.contains(s)), "the file keeps what the host ran: {text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "merge {merge}");
        }
    }
}
