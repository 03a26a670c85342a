//! The `import` and `connect` commands as the command line runs them: read, ask, plan, write,
//! and report on the terminal. The work itself is the rest of this module's.

use std::path::PathBuf;
use std::process::ExitCode;

/// Where `toolmux import` reads servers from.
pub enum From {
    /// Agent hosts' files; a project's servers only when confirmed (or `--trust-project`).
    Hosts { trust_project: bool },
    /// The MCP registry at this URL (`--registry [URL]`); a value that is no URL is a name.
    Registry(String),
}

/// `toolmux import`: reads the files given (or every host's usual places), asks before carrying a
/// project file's servers, and writes (or, `--dry-run` / `--json`, prints) the configuration. With
/// `--registry`, `paths` are the registry names of the servers to read instead.
pub async fn import(
    paths: Vec<PathBuf>,
    from: From,
    out: PathBuf,
    into: Option<PathBuf>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use super::write;
    let (found, failed, looked) = match from {
        From::Registry(url) => {
            let mut names: Vec<String> = paths.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            // `--registry io.github.acme/weather`: the flag took the first name for its URL.
            let base = if url.starts_with("http://") || url.starts_with("https://") {
                url
            } else {
                names.insert(0, url);
                super::registry::DEFAULT_URL.to_string()
            };
            if names.is_empty() {
                anyhow::bail!(
                    "name the servers to add, as the registry names them: toolmux import --registry io.github.owner/server"
                );
            }
            let (found, failed) = super::registry::read(&base, &names).await;
            (found, failed, None)
        }
        From::Hosts { trust_project } => {
            let dirs = super::Dirs::from_env().map_err(anyhow::Error::msg)?;
            let (mut found, failed) = super::read_all(&paths, &dirs);
            super::confirm_project_files(&mut found, |f| trust_project || confirm_project_file(f));
            (found, failed, paths.is_empty().then_some(dirs))
        }
    };
    if found.is_empty() {
        for (path, why) in &failed {
            eprintln!("could not read {}: {why}", path.display());
        }
        if let Some(dirs) = looked {
            eprintln!("no agent host's MCP servers found; looked in:");
            for host in super::Host::ALL {
                for p in host.usual_places(&dirs) {
                    eprintln!("  {:<15} {}", host.title(), p.display());
                }
            }
            eprintln!("name the file to read: toolmux import PATH");
        }
        return Ok(ExitCode::FAILURE);
    }
    let target = match into {
        Some(p) => write::Target::Into(p),
        None => write::Target::New(out),
    };
    let plan = write::plan_for(&found, &target)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&super::plan::to_json(&plan))?);
        return Ok(ExitCode::SUCCESS);
    }
    let (text, written) = write::write(&plan, &target, dry_run)?;
    if dry_run {
        print!("{text}");
    }
    print!("{}", write::report(&found, &failed, &plan, written.as_ref()));
    if let Some(w) = written {
        println!("next: toolmux check-config {}", w.config.display());
        println!(
            "      toolmux connect HOST --config {}   (prints the entry that replaces these servers)",
            w.config.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal whether a project file's servers may be carried; no terminal, no.
fn confirm_project_file(f: &super::Found) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return false;
    }
    let names: Vec<String> = f.servers.iter().map(|s| super::printable(&s.name).into_owned()).collect();
    eprint!(
        "{} is a project's file: whoever can commit to the project wrote it, and its servers' commands \
         would run on this machine.\nCarry {} ({})? [y/N] ",
        f.path.display(),
        if names.len() == 1 { "its server" } else { "its servers" },
        names.join(", ")
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes" | "Yes")
}

/// `toolmux connect HOST`: prints the entry that puts toolmux in the host's config, or merges it
/// (`--write`) in place of the servers the configuration imported, or puts the file back (`--undo`).
#[allow(clippy::too_many_arguments)]
pub fn connect(
    host: super::Host,
    config: Option<PathBuf>,
    url: Option<String>,
    token_env: Option<String>,
    command: Option<String>,
    write: bool,
    undo: bool,
    file: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use super::connect;
    let file = match file {
        Some(f) => f,
        None => {
            let dirs = super::Dirs::from_env().map_err(anyhow::Error::msg)?;
            host.usual_places(&dirs).into_iter().next().expect("every host has a place")
        }
    };
    if undo {
        println!("{}", connect::undo(&file)?);
        return Ok(ExitCode::SUCCESS);
    }
    let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let via = match url {
        Some(url) => connect::Via::Http { url, token_var: token_env },
        None => {
            let config = config.as_deref().expect("clap requires --config without --url");
            let command = match command {
                Some(c) => c,
                None => std::env::current_exe()?.to_string_lossy().into_owned(),
            };
            connect::Via::Stdio { command, config: absolute(config).to_string_lossy().into_owned() }
        }
    };
    if !write {
        print!("{}", connect::snippet(host, &via)?);
        return Ok(ExitCode::SUCCESS);
    }
    // Only the names: the host's environment may not set every variable the backends use.
    let imported = match &config {
        Some(c) => super::write::existing(&super::write::Target::Into(c.clone()))?.0,
        None => Default::default(),
    };
    let done = connect::write(host, &via, &file, &imported)?;
    println!("wrote the `{}` entry into {}", connect::ENTRY, done.file.display());
    if !done.removed.is_empty() {
        println!("  taken out (now served through toolmux): {}", done.removed.join(", "));
    }
    if !done.kept.is_empty() {
        println!("  left in place (not in the toolmux configuration): {}", done.kept.join(", "));
    }
    println!("  the file as it was: {} (toolmux connect {} --undo puts it back)", done.backup.display(), host.arg());
    println!("restart {} to use it", host.title());
    Ok(ExitCode::SUCCESS)
}
