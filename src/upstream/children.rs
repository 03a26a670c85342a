//! Stdio backends run in process groups of their own, so that ending a backend ends what it
//! started too (a server that runs its work in a subprocess, or a shell wrapper's children).
//!
//! Every group a gateway starts is registered in its [`Groups`] until its child is gone; a stop
//! ends every group still registered: SIGTERM, then SIGKILL for what is left after a short wait.
//! A group is ended the same way when its connection closes during normal running (rmcp kills
//! the leader; [`Group`]'s drop signals the rest). The registry is the gateway's, not the
//! process's: several gateways in one process (tests) never end each other's children.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
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
