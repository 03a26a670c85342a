//! Stdio backends run in process groups of their own, so that ending a backend ends what it
//! started too (a server that runs its work in a subprocess, or a shell wrapper's children).
//!
//! Every group a gateway starts is registered in its [`Groups`] until its child is gone; a stop
//! ends every group still registered: SIGTERM, then SIGKILL for what is left after a short wait.
//! A group is ended the same way when its connection closes during normal running (rmcp kills
//! the leader; [`Group`]'s drop signals the rest). The registry is the gateway's, not the
//! process's: several gateways in one process (tests) never end each other's children.
//!
//! A gateway killed outright (SIGKILL, the OOM killer) runs none of that. For this the `toolmux`
//! binary starts a [`reaper`]: a small child process of its own that is told every group as it
//! is registered and ended, and ends the groups still registered when its input closes, which
//! the kernel does when the gateway dies, however it dies.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// One gateway's process groups, started and not yet ended.
#[derive(Debug, Clone, Default)]
pub struct Groups(Arc<Mutex<BTreeSet<i32>>>);

/// A registered process group; dropping it signals the group to end.
#[derive(Debug)]
pub struct Group {
    pgid: i32,
    groups: Groups,
}

impl Groups {
    /// Registers the group led by the child `pid` (spawned with `ProcessGroup::leader()`).
    pub fn register(&self, pid: u32) -> Option<Group> {
        let pgid = i32::try_from(pid).ok()?;
        self.0.lock().expect("groups lock").insert(pgid);
        tell_reaper('+', pgid);
        Some(Group { pgid, groups: self.clone() })
    }

    fn all(&self) -> Vec<i32> {
        self.0.lock().expect("groups lock").iter().copied().collect()
    }

    /// Ends every registered group: SIGTERM, up to `grace` for them to exit, then SIGKILL.
    pub async fn terminate_all(&self, grace: Duration) {
        let live: Vec<i32> = self.all().into_iter().filter(|&g| signal(g, Signal::SIGTERM)).collect();
        if live.is_empty() {
            return;
        }
        tracing::debug!(groups = live.len(), "ending stdio backends' process groups");
        let deadline = tokio::time::Instant::now() + grace;
        // Polled: a group has no handle to wait on once its leader is reaped.
        while live.iter().any(|&g| alive(g)) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        kill_all_now_of(&live);
    }

    /// SIGKILL to every registered group at once (a second signal: no waiting).
    pub fn kill_all_now(&self) {
        kill_all_now_of(&self.all());
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.groups.0.lock().expect("groups lock").remove(&self.pgid);
        signal(self.pgid, Signal::SIGTERM);
        tell_reaper('-', self.pgid);
    }
}

fn signal(pgid: i32, sig: Signal) -> bool {
    killpg(Pid::from_raw(pgid), sig).is_ok()
}

/// Whether any process of the group is still alive.
fn alive(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None).is_ok()
}

fn kill_all_now_of(groups: &[i32]) {
    for &g in groups {
        if alive(g) {
            signal(g, Signal::SIGKILL);
        }
    }
}

/// How long the reaper waits after SIGTERM before SIGKILL (as a stop does).
const REAPER_GRACE: Duration = Duration::from_secs(2);

/// The reaper's input, when this process started one ([`start_reaper`]).
static REAPER: OnceLock<Mutex<std::process::ChildStdin>> = OnceLock::new();

/// Starts the reaper: `program reap` (the `toolmux` binary itself), in a process group of its own
/// so a terminal's Ctrl-C reaches the gateway and not it. Called once, by the binary.
pub fn start_reaper(program: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut child = std::process::Command::new(program)
        .arg("reap")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let input = child.stdin.take().ok_or_else(|| std::io::Error::other("the reaper has no input"))?;
    let _ = REAPER.set(Mutex::new(input));
    // Not waited for: it outlives this process by design (dropping the handle leaves it running).
    drop(child);
    Ok(())
}

fn tell_reaper(op: char, pgid: i32) {
    if let Some(input) = REAPER.get() {
        let mut input = input.lock().expect("reaper lock");
        let _ = writeln!(input, "{op}{pgid}");
    }
}

/// The reaper's body (`toolmux reap`): reads `+pgid` / `-pgid` lines until its input closes,
/// then ends the groups still registered: SIGTERM, up to [`REAPER_GRACE`], SIGKILL.
pub fn reap(input: impl std::io::BufRead) {
    let mut live = BTreeSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        if let Some(Ok(pgid)) = line.strip_prefix('+').map(str::parse::<i32>) {
            live.insert(pgid);
        } else if let Some(Ok(pgid)) = line.strip_prefix('-').map(str::parse::<i32>) {
            live.remove(&pgid);
        }
    }
    let live: Vec<i32> = live.into_iter().filter(|&g| signal(g, Signal::SIGTERM)).collect();
    let deadline = std::time::Instant::now() + REAPER_GRACE;
    while live.iter().any(|&g| alive(g)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_all_now_of(&live);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reaper_ends_only_the_groups_still_registered() {
        use std::os::unix::process::CommandExt;
        let start = || std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let (mut ended, mut kept) = (start(), start());
        let (a, b) = (ended.id() as i32, kept.id() as i32);
        // Each in its own group before reaping: under qemu-user (scripts/test-arm64.sh) spawn can
        // return before the child has made its group, and a signal to a group not yet made is
        // lost (the test then waited out the `sleep` and failed).
        for pid in [a, b] {
            let pid = Pid::from_raw(pid);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while nix::unistd::getpgid(Some(pid)) != Ok(pid) && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
        // `b` was registered and then ended by the gateway itself: the reaper leaves it alone.
        reap(std::io::Cursor::new(format!("+{a}\n+{b}\n-{b}\nnoise\né1\n")));
        assert!(ended.wait().unwrap().code().is_none(), "the registered group was signalled");
        assert!(kept.try_wait().unwrap().is_none(), "an unregistered group is not touched");
        let _ = kept.kill();
        let _ = kept.wait();
    }
}
