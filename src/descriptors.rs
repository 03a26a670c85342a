//! The process's file descriptors: every connection, stream, stdio backend's pipes and Redis
//! link holds one or more. A shell or service manager often starts a process with a soft limit
//! of 1,024 and a far higher hard one; at start the gateway raises the soft limit to the hard
//! one (as Go's runtime and most servers do), logs the value in use, and `/status` shows it with
//! the count open now. A stdio backend is started with the limit the gateway was started with
//! (as Go's `os/exec` does): a program built on `select()` breaks past 1,024. What happens at
//! the limit is the accept loop's (`http::serve`).

use std::sync::OnceLock;

use serde::Serialize;

/// The soft limit the process was started with, when [`raise`] changed it.
static STARTED_WITH: OnceLock<u64> = OnceLock::new();

/// The limit now, for `/status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Descriptors {
    /// The soft limit in force: the most descriptors the process may hold.
    pub limit: Option<u64>,
    /// The hard limit, which the soft one may be raised to.
    pub hard: Option<u64>,
    /// The soft limit the process was started with, where the gateway raised it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_with: Option<u64>,
    /// Descriptors open now, where the OS lists them (Linux, macOS).
    pub open: Option<u64>,
}

/// Raises the soft descriptor limit to the hard one (or the OS's ceiling below it) and logs
/// what is in use. Called once at start by the commands that serve; never fails the start.
pub fn raise() -> Descriptors {
    #[cfg(unix)]
    {
        let before = rlimit::getrlimit(rlimit::Resource::NOFILE).ok();
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(now) => {
                if let Some((soft, _)) = before.filter(|(soft, _)| *soft < now) {
                    let _ = STARTED_WITH.set(soft);
                }
            }
            Err(err) => tracing::warn!(%err, "the descriptor limit could not be raised"),
        }
    }
    let now = current();
    match (now.limit, now.started_with) {
        (Some(limit), Some(from)) => tracing::info!(limit, raised_from = from, "file descriptors"),
        (Some(limit), None) => tracing::info!(limit, hard = now.hard, "file descriptors"),
        _ => {}
    }
    now
}

/// The limits in force and the descriptors open now.
pub fn current() -> Descriptors {
    #[cfg(unix)]
    let (limit, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((soft, hard)) => (Some(soft), Some(hard)),
        Err(_) => (None, None),
    };
    #[cfg(not(unix))]
    let (limit, hard) = (None, None);
    Descriptors { limit, hard, started_with: STARTED_WITH.get().copied(), open: open() }
}

/// How many descriptors are open, from the OS's per-process list.
fn open() -> Option<u64> {
    let list = if cfg!(target_os = "linux") {
        "/proc/self/fd"
    } else if cfg!(target_os = "macos") {
        "/dev/fd"
    } else {
        return None;
    };
    // The listing's own descriptor is counted too: one less.
    std::fs::read_dir(list).ok().map(|d| d.count().saturating_sub(1) as u64)
}

/// Starts `command`'s process with the soft limit the gateway was started with, where [`raise`]
/// raised it.
pub fn as_started(command: &mut tokio::process::Command) {
    #[cfg(unix)]
    if let Some(&soft) = STARTED_WITH.get() {
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: it makes two system calls (getrlimit, setrlimit)
        // and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
                rlimit::setrlimit(rlimit::Resource::NOFILE, soft.min(hard), hard)
            });
        }
    }
    #[cfg(not(unix))]
    let _ = command;
}
