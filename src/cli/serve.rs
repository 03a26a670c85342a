//! `serve` and `demo` until a stop signal: reloads on SIGHUP and `--watch`, a graceful stop,
//! and a second signal that ends the stdio backends at once.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::app::App;
use crate::config::Config;

/// Where a served configuration comes from, for reloads.
pub(super) struct Reload {
    pub(super) file: PathBuf,
    /// Also reload when the file's contents change (checked every [`WATCH_EVERY`]).
    pub(super) watch: bool,
}

/// How often `serve --watch` reads the config file. Polled rather than watched through inotify:
/// editors that replace the file and mounted config maps that swap a symlink are seen too.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Serves until `stop` (the stop signals, installed before the app started), however early it
/// comes: a signal while backends are still starting stops cleanly too.
pub(super) async fn serve_until_signal(
    app: App,
    grace: Duration,
    reload: Option<Reload>,
    mut stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> anyhow::Result<ExitCode> {
    // SIGHUP is taken from here on, before the gateway is ready (it may say so on /status
    // before this task sees it): a reload asked for meanwhile waits for the loop below, where
    // SIGHUP's default action would have ended the process.
    let mut reads = config_reads(reload)?;
    tokio::select! {
        ready = app.ready(Duration::from_secs(60)) => if !ready {
            tracing::warn!("not every backend answered within 60 s; serving the ones that did");
        },
        _ = &mut stop => {
            tracing::info!("stopping before every backend was ready");
            app.stop(Duration::ZERO).await;
            return Ok(ExitCode::SUCCESS);
        }
    }
    let clashes = app.clashes();
    if !clashes.is_empty() {
        for c in &clashes {
            eprintln!("toolmux: configuration error: {c}");
        }
        app.shutdown().await;
        return Ok(ExitCode::from(2));
    }
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(next) = reads.recv() => app.apply_reload(next).await,
        }
    }
    tracing::info!(
        "stopping: no new sessions; running requests have up to {} to finish",
        humantime::format_duration(grace)
    );
    tokio::spawn(exit_on_second_signal(app.gateway.upstream.children()));
    app.stop(grace).await;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Reads the configuration file on SIGHUP and, with `--watch`, whenever its contents change;
/// each read (a parsed configuration, or why it is not one) is sent to the serving loop. Without
/// a file, a SIGHUP is logged and ignored rather than ending the process.
pub(super) fn config_reads(
    reload: Option<Reload>,
) -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<anyhow::Result<Config>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut seen = reload.as_ref().and_then(|r| std::fs::read(&r.file).ok());
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                h = hup.recv() => { if h.is_none() { return } true }
                _ = tick.tick(), if reload.as_ref().is_some_and(|r| r.watch) => false,
            };
            let Some(r) = &reload else {
                tracing::info!("SIGHUP ignored: this gateway has no configuration file");
                continue;
            };
            let now = std::fs::read(&r.file).ok();
            if !forced && now == seen {
                continue;
            }
            seen = now;
            if tx.send(Config::load(&r.file).map_err(anyhow::Error::from)).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// Waits for SIGTERM (service managers, container runtimes) or SIGINT (Ctrl-C).
pub(super) async fn stop_signal() -> std::io::Result<()> {
    stop_signals()?.await;
    Ok(())
}

/// Prints what a starting gateway announces (its URLs). A closed stdout (a supervisor or a
/// script that read the first line and went away) must not stop a gateway that is serving:
/// `println!` would panic there, so write errors are ignored.
pub(super) fn announce(lines: &[String]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = lines.iter().try_for_each(|l| writeln!(out, "{l}")).and_then(|()| out.flush());
}

/// A stop signal (SIGTERM or SIGINT) from now on: the handlers are installed before this
/// returns, so a signal that comes before the future is first polled (while backends start)
/// still stops the process cleanly instead of killing it.
pub(super) fn stop_signals() -> std::io::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }))
}

/// A second stop signal during a graceful stop: end the stdio backends and exit now.
pub(super) async fn exit_on_second_signal(children: crate::upstream::children::Groups) {
    if stop_signal().await.is_ok() {
        eprintln!("toolmux: second signal; exiting without waiting for running calls");
        children.kill_all_now();
        std::process::exit(130);
    }
}
