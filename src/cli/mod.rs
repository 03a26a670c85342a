//! The `toolmux` command: parse arguments, load the config, run, map errors to exit codes
//! (0 ok, 1 runtime failure, 2 bad configuration or missing model).
//!
//! It lives in the library, and `src/main.rs` only calls [`main`]: a binary crate compiles its
//! own copy of every generic and async function it reaches (rmcp's service loop, tokio's task
//! harness, the gateway's futures' drop glue), which the library has already compiled; an
//! optimised build shares none of them. Here they compile once (docs/performance.md, "A first
//! start").

mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::app::{App, Options};
use crate::config::{Config, ConfigError};
use crate::embed::files::FilesError;
use serve::{Reload, announce, config_reads, exit_on_second_signal, serve_until_signal, stop_signal, stop_signals};

#[derive(Parser)]
#[command(
    name = "toolmux",
    version,
    about = "An MCP gateway: many MCP servers behind one endpoint, with on-host tool search"
)]
struct Cli {
    /// Log level or filter (overrides RUST_LOG), e.g. info, debug, toolmux=trace.
    #[arg(long, global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        #[arg(long)]
        config: PathBuf,
        /// Serve one client over stdin/stdout instead of HTTP.
        #[arg(long)]
        stdio: bool,
        /// Reload the configuration whenever the file changes (SIGHUP reloads it too).
        #[arg(long, conflicts_with = "stdio")]
        watch: bool,
    },
    /// Show a running gateway's backends, catalog, sessions and last reload (`GET /status`).
    Status {
        /// The gateway's base URL.
        #[arg(long, default_value = "http://127.0.0.1:4483")]
        url: String,
        /// Print the JSON as served instead of a table.
        #[arg(long)]
        json: bool,
        /// Bearer token, when the gateway requires one.
        #[arg(long, env = "TOOLMUX_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// The audit trail (`[audit]`): check its chain, or count what it records.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Validate a configuration file: exit 0, or 2 with every problem named by key and line.
    CheckConfig { file: PathBuf },
    /// The tool ledger (`[health] tool_ledger`): tool versions held back by `freeze_tools`.
    Tools {
        #[command(subcommand)]
        action: ToolsAction,
    },
    /// Start the backends, build the index, print the tools find_tool would return, and exit.
    Find {
        #[arg(long)]
        config: PathBuf,
        query: String,
        /// Keywords for the keyword arm.
        #[arg(long = "keyword")]
        keywords: Vec<String>,
    },
    /// Run the gateway in front of the built-in demo backends.
    Demo {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:4483")]
        listen: String,
        #[arg(long, default_value = "optimizer")]
        mode: String,
    },
    /// Serve one built-in demo backend (for tests and trying things out).
    Backend {
        name: String,
        /// Listen for streamable HTTP here (port 0 picks one; the address is printed).
        #[arg(long, conflicts_with = "stdio")]
        listen: Option<String>,
        #[arg(long)]
        stdio: bool,
        /// Answer every tools/list this many milliseconds late (a slow server, for tests).
        #[arg(long, default_value_t = 0)]
        list_delay_ms: u64,
    },
    /// Measure find_tool's ranking over a catalog and queries (see docs/search.md).
    Eval {
        #[arg(long)]
        tools: PathBuf,
        #[arg(long)]
        queries: PathBuf,
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Write every query's ranking here, one JSON object a line.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Model folder (defaults as for optimizer.model_dir).
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Which text to index per tool.
        #[arg(long, value_enum, default_value = "full")]
        text_form: crate::eval::TextForm,
        /// The encoder's arithmetic, as `optimizer.precision`: auto (the gateway's default), f32 or int8.
        #[arg(long, default_value = "auto", value_parser = parse_precision)]
        precision: crate::config::Precision,
    },
    /// How often find_tool's match verdict is right: answerable, no-fit and translated queries.
    EvalVerdict {
        /// A folder with tools.jsonl and queries.dev.jsonl; give two or more.
        #[arg(long = "set", required = true)]
        sets: Vec<PathBuf>,
        /// Translated queries (JSON Lines with `query` and `lang`), asked of the metatool catalog.
        #[arg(long)]
        multilingual: Option<PathBuf>,
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Keys the replay's adapter fits (which requests the guard holds back, the order it
        /// fits in); another key shows how much the figures owe to it.
        #[arg(long, default_value_t = crate::eval::SALT)]
        salt: u64,
    },
    /// What learning from use does to find_tool's ranking: each set's dev queries replayed as
    /// traffic, half teaching and half ranked (docs/search.md).
    EvalLearning {
        /// A folder with tools.jsonl and queries.dev.jsonl; give two or more.
        #[arg(long = "set", required = true)]
        sets: Vec<PathBuf>,
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Keys the adapter's fits, as for eval-verdict. Given more than once (`--salt 1 --salt
        /// 11`), each key is replayed and the adapter's rows are printed key by key, with the mean.
        #[arg(long, default_values_t = [crate::eval::SALT])]
        salt: Vec<u64>,
    },
    /// Bring the MCP servers an agent host already runs (Claude Desktop, Claude Code, Cursor,
    /// VS Code, Windsurf, Gemini CLI, Codex CLI, Cline) into a toolmux configuration. Secrets in
    /// env and headers go to an env file readable by you only (docs/clients.md).
    Import {
        /// Host config files to read; with none, every host's usual places on this machine.
        /// With --registry: the registry names of the servers to add (io.github.owner/server).
        paths: Vec<PathBuf>,
        /// Read the servers named from the MCP registry (API v0.1) instead of host files: the
        /// official registry, or the one at URL.
        #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = crate::import::registry::DEFAULT_URL)]
        registry: Option<String>,
        /// The configuration to write; it must not exist yet.
        #[arg(long, default_value = "toolmux.toml")]
        out: PathBuf,
        /// Merge into this configuration instead (the file as it was is kept as FILE.bak).
        #[arg(long, conflicts_with = "out")]
        into: Option<PathBuf>,
        /// Print the TOML that would be written, and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the backends that would be written as JSON (secrets as ${VAR}), and write nothing.
        #[arg(long, conflicts_with = "dry_run")]
        json: bool,
        /// Carry the servers of the current folder's project files (`.mcp.json`, `.cursor/`,
        /// `.vscode/`, `.gemini/`) without asking; read them first: whoever can commit to the
        /// project wrote them, and their commands run on this machine.
        #[arg(long)]
        trust_project: bool,
    },
    /// The entry that puts toolmux in an agent host's config in place of the servers imported
    /// from it: printed, or merged into the host's file with --write (undone with --undo).
    Connect {
        #[arg(value_enum)]
        host: crate::import::Host,
        /// The toolmux configuration the host starts (stdio), and whose backends replace the
        /// host's own entries on --write.
        #[arg(long, required_unless_present_any = ["url", "undo"])]
        config: Option<PathBuf>,
        /// Connect to a running gateway at this URL instead of starting one over stdio.
        #[arg(long)]
        url: Option<String>,
        /// With --url: the environment variable holding the gateway's bearer token.
        #[arg(long, requires = "url")]
        token_env: Option<String>,
        /// The toolmux program the host starts (default: this one).
        #[arg(long)]
        command: Option<String>,
        /// Merge the entry into the host's config file (the file as it was is kept beside it).
        #[arg(long)]
        write: bool,
        /// Put the host's config file back as it was before the first --write.
        #[arg(long, conflicts_with = "write")]
        undo: bool,
        /// The host's config file (default: the user's file in the host's usual place).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Log in to an OAuth-protected backend (`auth = "oauth"`): opens the browser on its
    /// authorization server and keeps the grant for the gateway (docs/clients.md#oauth).
    Login {
        /// The backend's name in the configuration.
        backend: String,
        #[arg(long)]
        config: PathBuf,
        /// Print the URL to open instead of opening a browser (over SSH, in a container).
        #[arg(long)]
        no_browser: bool,
        /// How long to wait for the browser to come back.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Internal: ends the stdio backends' process groups a gateway leaves when it is killed
    /// (started by `serve`; reads the groups on stdin).
    #[command(hide = true)]
    Reap,
    /// Compare fusion variants across evaluation sets by cross-validation (docs/search.md).
    EvalStudy {
        /// A folder with tools.jsonl and queries.dev.jsonl; give two or more.
        #[arg(long = "set", required = true)]
        sets: Vec<PathBuf>,
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Only the families whose label contains this text, e.g. "two vectors".
        #[arg(long)]
        family: Option<String>,
        /// The encoder's arithmetic, as `optimizer.precision`: auto (the gateway's default), f32 or int8.
        #[arg(long, default_value = "auto", value_parser = parse_precision)]
        precision: crate::config::Precision,
    },
}

#[derive(Subcommand)]
enum AuditAction {
    /// Walk the chain through the trail's files (the current one and the rotated ones, in any
    /// order) and name the first line changed, removed or inserted: exit 0, or 1.
    Verify {
        files: Vec<PathBuf>,
        /// The gateway's configuration, for `audit.key` when the chain is keyed.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Count the actions by day, principal and backend: calls, searches, refusals, errors, and
    /// the tokens of results, of tool definitions served, and saved.
    Summary {
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ToolsAction {
    /// List the tool versions held back (and prompts', resources' and templates'), waiting to be
    /// accepted.
    Held {
        #[arg(long)]
        config: PathBuf,
    },
    /// Accept held versions (all, one backend's, or one tool); a running gateway serves them
    /// after its next reload (SIGHUP).
    Accept {
        #[arg(long)]
        config: PathBuf,
        /// Only this backend's.
        #[arg(long)]
        backend: Option<String>,
        /// Only this tool (the backend's own name for it), or this prompt, resource or template
        /// as `tools held` lists it (e.g. "(prompt) summarize"); needs --backend.
        #[arg(long, requires = "backend")]
        tool: Option<String>,
    },
}

/// The replicas' session store (`[sessions] store = "redis"`), which holds their shared ledger;
/// `None` without one.
fn shared_store(file: &std::path::Path) -> anyhow::Result<Option<Arc<crate::session::shared::SharedSessions>>> {
    let c = Config::load(file)?;
    let crate::config::SessionStore::Redis(redis) = &c.sessions.store else { return Ok(None) };
    Ok(Some(crate::session::shared::SharedSessions::new(redis, c.server.limits.session_idle_timeout)?))
}

async fn shared_ledger(file: &std::path::Path) -> anyhow::Result<Option<crate::catalog::ledger::Ledger>> {
    let Some(store) = shared_store(file)? else { return Ok(None) };
    let (accepted, held) = store.ledger_fields().await.map_err(|e| anyhow::anyhow!("the session store: {}", e.0))?;
    Ok(Some(crate::catalog::ledger::Ledger::from_fields(&accepted, &held)))
}

/// Accepts held versions in the replicas' shared ledger; none without one.
async fn accept_shared(
    file: &std::path::Path,
    backend: Option<&str>,
    tool: Option<&str>,
) -> anyhow::Result<Vec<(String, String)>> {
    let Some(store) = shared_store(file)? else { return Ok(Vec::new()) };
    store.accept_held(backend, tool).await.map_err(|e| anyhow::anyhow!("the session store: {}", e.0))
}

/// The ledger file a configuration names, or an error saying which key to set.
fn ledger_path(file: &std::path::Path) -> anyhow::Result<PathBuf> {
    let c = Config::load(file)?;
    c.health
        .tool_ledger
        .ok_or_else(|| anyhow::anyhow!("{}: health.tool_ledger is not set: no tool ledger to read", file.display()))
}

/// The command line's entry point: what `toolmux` does with its arguments.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Reap = cli.command {
        crate::upstream::children::reap(std::io::stdin().lock());
        return ExitCode::SUCCESS;
    }
    if matches!(cli.command, Command::Serve { .. }) {
        // Only `serve` runs stdio backends (the demo's are in-process). Without a reaper the
        // gateway runs as before; only a SIGKILL would leave children behind.
        if let Err(err) = std::env::current_exe().and_then(|exe| crate::upstream::children::start_reaper(&exe)) {
            eprintln!("toolmux: no reaper for stdio backends (a killed gateway may leave them running): {err}");
        }
    }
    let _traces = crate::telemetry::logging::init(cli.log_level.as_deref());
    if matches!(cli.command, Command::Serve { .. } | Command::Demo { .. }) {
        crate::descriptors::raise();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(err) => {
            let code = if err.downcast_ref::<ConfigError>().is_some() || err.downcast_ref::<FilesError>().is_some() {
                2
            } else {
                1
            };
            eprintln!("toolmux: {err:#}");
            ExitCode::from(code)
        }
    }
}

fn parse_precision(s: &str) -> Result<crate::config::Precision, String> {
    match s {
        "auto" => Ok(crate::config::Precision::default()),
        "f32" => Ok(crate::config::Precision::F32),
        "int8" => Ok(crate::config::Precision::int8()),
        other => Err(format!("`{other}` is not auto, f32 or int8")),
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Status { url, json, token } => {
            let url = format!("{}/status", url.trim_end_matches('/').trim_end_matches("/mcp"));
            let mut req = reqwest::Client::new().get(&url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let response = req.send().await.map_err(|e| anyhow::anyhow!("cannot reach {url}: {e}"))?;
            let code = response.status();
            let body = response.text().await?;
            if !code.is_success() {
                anyhow::bail!("{url} answered {code}: {}", body.trim());
            }
            let status: serde_json::Value = serde_json::from_str(&body)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", crate::mcp::status::table(&status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools { action: ToolsAction::Held { config } } => {
            let mut held = crate::store::integrity::held_in_file(&ledger_path(&config)?)?;
            // With replicas, what any of them holds.
            if let Some(shared) = shared_ledger(&config).await? {
                for entry in crate::store::integrity::Held::all(&shared) {
                    let key = |h: &crate::store::integrity::Held| (h.backend.clone(), h.tool.clone(), h.digest.clone());
                    if !held.iter().any(|h| key(h) == key(&entry)) {
                        held.push(entry);
                    }
                }
            }
            if held.is_empty() {
                println!("no tool versions held back");
            }
            for h in held {
                println!("{}\t{}\tsha256:{}", h.backend, h.tool, h.digest);
                for f in h.flags {
                    println!("\tflagged {}: \u{201c}{}\u{201d}", f.reason, f.matched);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools { action: ToolsAction::Accept { config, backend, tool } } => {
            let path = ledger_path(&config)?;
            let mut accepted = crate::store::integrity::accept_in_file(&path, backend.as_deref(), tool.as_deref())?;
            // With replicas, the shared ledger decides for all of them.
            for shared in accept_shared(&config, backend.as_deref(), tool.as_deref()).await? {
                if !accepted.contains(&shared) {
                    accepted.push(shared);
                }
            }
            if accepted.is_empty() {
                println!("nothing held back matched; nothing accepted");
            } else {
                for (b, t) in &accepted {
                    println!("accepted {b}/{t}");
                }
                println!("a running gateway serves them after its next reload (SIGHUP)");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { paths, registry, out, into, dry_run, json, trust_project } => {
            let from = match registry {
                Some(url) => crate::import::command::From::Registry(url),
                None => crate::import::command::From::Hosts { trust_project },
            };
            crate::import::command::import(paths, from, out, into, dry_run, json).await
        }
        Command::Connect { host, config, url, token_env, command, write, undo, file } => {
            crate::import::command::connect(host, config, url, token_env, command, write, undo, file)
        }
        Command::Login { backend, config, no_browser, timeout } => {
            let c = Config::load(&config)?;
            let b = c.backends.iter().find(|b| b.name == backend).ok_or_else(|| {
                let names: Vec<&str> = c.backends.iter().map(|b| b.name.as_str()).collect();
                anyhow::anyhow!("no backend `{backend}` in {} (it has: {})", config.display(), names.join(", "))
            })?;
            let (Some(client), crate::config::Transport::Http { url, .. }) = (&b.oauth, &b.transport) else {
                anyhow::bail!(
                    "backend `{backend}` is not an OAuth backend; set auth = \"oauth\" on it in {}",
                    config.display()
                );
            };
            let browser =
                if no_browser { crate::upstream::oauth::Browser::Print } else { crate::upstream::oauth::Browser::Open };
            let file = crate::upstream::oauth::login(&backend, url, client, browser, timeout).await?;
            println!("logged in to `{backend}`; the grant is in {} (readable by you only)", file.display());
            println!("a running gateway uses it on its next connection attempt to the backend (within 30 s)");
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit { action: AuditAction::Verify { files, config } } => {
            crate::audit::command::verify(&files, config.as_deref())
        }
        Command::Audit { action: AuditAction::Summary { files, json } } => crate::audit::command::summary(&files, json),
        Command::CheckConfig { file } => {
            let c = Config::load(&file)?;
            println!("{}: ok ({} backends, {:?} mode)", file.display(), c.backends.len(), c.server.mode);
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { config: file, stdio, watch } => {
            let config = Config::load(&file)?;
            crate::upstream::oauth::set_config_file(&file);
            if stdio {
                let stop = tokio_util::sync::CancellationToken::new();
                let on_signal = stop.clone();
                let watch_signals = move |children| {
                    tokio::spawn(async move {
                        if stop_signal().await.is_ok() {
                            on_signal.cancel();
                            exit_on_second_signal(children).await;
                        }
                    });
                };
                let reads = config_reads(Some(Reload { file, watch }))?;
                crate::app::serve_stdio(config, stop, watch_signals, reads).await?;
                return Ok(ExitCode::SUCCESS);
            }
            let path = config.server.path.clone();
            let console = config.server.console;
            let grace = config.server.shutdown_grace;
            let stop = stop_signals()?;
            let app = App::start(config, Options::default()).await?;
            let addr = app.addr.expect("serving HTTP");
            let mut lines = vec![format!("toolmux listening on http://{addr}{path}")];
            if console {
                lines.push(format!("console at http://{addr}{}", crate::console::PATH));
            }
            announce(&lines);
            serve_until_signal(app, grace, Some(Reload { file, watch }), stop).await
        }
        Command::Find { config, query, keywords } => {
            let config = Config::load(&config)?;
            let app = App::start(config, Options { http: false, ..Options::default() }).await?;
            if !app.ready(Duration::from_secs(60)).await {
                anyhow::bail!("backends did not all answer within 60 s");
            }
            let out = crate::app::find(&app, &query, keywords).await;
            println!("{}", serde_json::to_string_pretty(&out)?);
            app.shutdown().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { listen, mode } => {
            let stop = stop_signals()?;
            let app = crate::app::demo(&listen, &mode).await?;
            let addr = app.addr.expect("serving HTTP");
            // Announced once the tools are indexed: a client connecting at once finds them all.
            if !app.ready(Duration::from_secs(60)).await {
                tracing::warn!("the demo backends did not all answer within 60 s");
            }
            announce(&[
                format!(
                    "toolmux demo: {} backends, {} tools; connect an MCP client to http://{addr}/mcp",
                    app.gateway.upstream.backends().len(),
                    app.gateway.store.current().catalog.len()
                ),
                format!("console at http://{addr}{}", crate::console::PATH),
            ]);
            serve_until_signal(app, crate::config::DEFAULT_SHUTDOWN_GRACE, None, stop).await
        }
        Command::Backend { name, listen, stdio, list_delay_ms } => {
            let mut backend = crate::demo::backend(&name)
                .ok_or_else(|| anyhow::anyhow!("no demo backend `{name}`; try github, slack, echo or testkit"))?;
            backend.list_delay = Duration::from_millis(list_delay_ms);
            if stdio || listen.is_none() {
                crate::demo::serve_stdio(backend).await?;
            } else {
                let listener = tokio::net::TcpListener::bind(listen.as_deref().unwrap_or("127.0.0.1:0")).await?;
                println!("http://{}/mcp", listener.local_addr()?);
                crate::demo::serve_http(backend, listener, tokio_util::sync::CancellationToken::new()).await?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::EvalVerdict { sets, multilingual, model_dir, salt } => {
            crate::eval::verdict::run(&sets, multilingual.as_deref(), model_dir.as_deref(), salt).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reap => Ok(ExitCode::SUCCESS),
        Command::EvalLearning { sets, model_dir, salt } => {
            crate::eval::learning::run(&sets, model_dir.as_deref(), &salt).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::EvalStudy { sets, model_dir, family, precision } => {
            crate::eval::study::run(&sets, model_dir.as_deref(), family.as_deref(), precision).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { tools, queries, k, out, model_dir, text_form, precision } => {
            let e =
                crate::eval::evaluate(&tools, &queries, k, out.as_deref(), model_dir.as_deref(), text_form, precision)
                    .await?;
            crate::eval::print(&e);
            Ok(ExitCode::SUCCESS)
        }
    }
}
