//! Stdio backends run in process groups of their own, so that ending a backend ends what it
//! started too (a server that runs its work in a subprocess, or a shell wrapper's children).
//!
//! Every group started here is registered until its child is gone; shutdown ends every group
//! still registered: SIGTERM, then SIGKILL for what is left after a short wait. A group is ended
//! the same way when its connection closes during normal running (rmcp kills the leader;
//! [`Group`]'s drop signals the rest).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Process groups started and not yet ended.
static GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// A registered process group; dropping it signals the group to end.
#[derive(Debug)]
pub struct Group(i32);

impl Group {
    /// Registers the group led by the child `pid` (spawned with `ProcessGroup::leader()`).
    pub fn register(pid: u32) -> Option<Group> {
        let pgid = i32::try_from(pid).ok()?;
        GROUPS.lock().expect("groups lock").insert(pgid);
        Some(Group(pgid))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        GROUPS.lock().expect("groups lock").remove(&self.0);
        signal(self.0, Signal::SIGTERM);
    }
}

fn signal(pgid: i32, sig: Signal) -> bool {
    killpg(Pid::from_raw(pgid), sig).is_ok()
}

/// Whether any process of the group is still alive.
fn alive(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None).is_ok()
}

/// Ends every registered group: SIGTERM, up to `grace` for them to exit, then SIGKILL.
pub async fn terminate_all(grace: Duration) {
    let groups: Vec<i32> = GROUPS.lock().expect("groups lock").iter().copied().collect();
    let live: Vec<i32> = groups.into_iter().filter(|&g| signal(g, Signal::SIGTERM)).collect();
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
pub fn kill_all_now() {
    let groups: Vec<i32> = GROUPS.lock().expect("groups lock").iter().copied().collect();
    kill_all_now_of(&groups);
}

fn kill_all_now_of(groups: &[i32]) {
    for &g in groups {
        if alive(g) {
            signal(g, Signal::SIGKILL);
        }
    }
}
