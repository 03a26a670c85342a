//! A stdio backend's child: started in a process group of its own, its stderr read and its end
//! recorded, so that a failure is told in words a user acts on ("`server` exited with code 1;
//! its last lines on stderr: …") rather than as the broken pipe the transport saw.
//!
//! The child's stderr is read line by line: each line goes to toolmux's log (at info, with the
//! backend's name; secrets scrubbed) and the last few are kept. Its exit status is recorded by a
//! process-wrap wrapper on whatever waits for it (rmcp reaps the child when the connection ends).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap, CommandWrapper, KillOnDrop, ProcessGroup};
use rmcp::transport::TokioChildProcess;
use tokio::io::AsyncReadExt;
use tokio::process::ChildStderr;
use tokio::sync::watch;

use super::words::Told;

/// Lines of stderr kept for the words.
const TAIL_LINES: usize = 5;
/// A stderr line longer than this is cut in the tail and in the log (a child can print anything).
const MAX_LINE: usize = 300;
/// How long a failure waits for the child's exit status and last lines before it is told.
const SETTLE: Duration = Duration::from_secs(2);

/// Starts `cmd` for backend `backend` in a process group of its own (what it starts ends with
/// it, see `children`), its stderr read into the returned story (logged at debug only when
/// `quiet`). A command that cannot be started is told in words.
pub fn start(
    backend: &str,
    command: &str,
    cmd: tokio::process::Command,
    quiet: bool,
) -> anyhow::Result<(TokioChildProcess, Arc<ChildStory>)> {
    let story = ChildStory::new(command, quiet);
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop).wrap(story.recorder());
    let (transport, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::Error::new(Told(start_failed(command, &e))))?;
    if let Some(stderr) = stderr {
        story.read(backend, stderr);
    }
    Ok((transport, story))
}

/// One child's last stderr lines and its exit status, once known.
#[derive(Debug)]
pub struct ChildStory {
    command: String,
    tail: Mutex<VecDeque<String>>,
    /// Some once the child was reaped.
    status: watch::Sender<Option<ExitStatus>>,
    /// Set once stderr reached its end (the child and everything it started closed it).
    stderr_closed: watch::Sender<bool>,
    /// toolmux signalled the child before it was known to have exited.
    stopped_by_us: AtomicBool,
    /// Lines are logged at debug only: the backend is failing the same way again, and its
    /// words already say what the child said last.
    quiet: bool,
}

impl ChildStory {
    fn new(command: &str, quiet: bool) -> Arc<Self> {
        Arc::new(Self {
            command: command.to_string(),
            tail: Mutex::new(VecDeque::new()),
            status: watch::Sender::new(None),
            stderr_closed: watch::Sender::new(false),
            stopped_by_us: AtomicBool::new(false),
            quiet,
        })
    }

    /// A process-wrap wrapper that records the child's exit status here.
    fn recorder(self: &Arc<Self>) -> Recorder {
        Recorder(self.clone())
    }

    /// Reads `stderr` to its end: each line logged for `backend` and the last ones kept.
    fn read(self: &Arc<Self>, backend: &str, mut stderr: ChildStderr) {
        let story = self.clone();
        let backend = backend.to_string();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut line = Vec::new();
            loop {
                let n = match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    if b == b'\n' {
                        story.line(&backend, &line);
                        line.clear();
                    } else if line.len() < MAX_LINE * 4 {
                        line.push(b);
                    }
                }
            }
            if !line.is_empty() {
                story.line(&backend, &line);
            }
            story.stderr_closed.send_replace(true);
        });
    }

    fn line(&self, backend: &str, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim_end_matches('\r');
        let text = match text.char_indices().nth(MAX_LINE) {
            Some((at, _)) => format!("{}…", &text[..at]),
            None => text.to_string(),
        };
        let text = crate::redact::urls(&crate::scrub::Scrubber::built_in().scrub(&text).0);
        if self.quiet {
            tracing::debug!(backend, line = %text, "backend stderr");
        } else {
            tracing::info!(backend, line = %text, "backend stderr");
        }
        if text.trim().is_empty() {
            return;
        }
        let mut tail = self.tail.lock().expect("stderr tail");
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(text);
    }

    /// The first status recorded stands.
    fn ended(&self, status: ExitStatus) {
        self.status.send_if_modified(|s| {
            let first = s.is_none();
            if first {
                *s = Some(status);
            }
            first
        });
    }

    /// The last lines the child wrote on stderr.
    pub fn tail(&self) -> Vec<String> {
        self.tail.lock().expect("stderr tail").iter().cloned().collect()
    }

    /// The exit status, waiting up to a moment for it and for the child's last lines.
    pub async fn settle(&self) -> Option<ExitStatus> {
        let mut closed = self.stderr_closed.subscribe();
        let mut status = self.status.subscribe();
        let _ = tokio::time::timeout(SETTLE, async {
            let _ = status.wait_for(Option::is_some).await;
            let _ = closed.wait_for(|c| *c).await;
        })
        .await;
        *self.status.borrow()
    }

    /// A child that did not answer in `time`, in words, with what it said last.
    pub fn no_answer(&self, time: Duration) -> String {
        format!(
            "`{}` did not answer within {} (is it an MCP server speaking on stdout?); {}",
            self.command,
            humantime::format_duration(time),
            said(&self.tail())
        )
    }

    /// How a child that ended on its own ended, in words; `None` if it is still running or
    /// toolmux stopped it (a connection it dropped).
    pub async fn ended_alone(&self) -> Option<String> {
        let status = self.settle().await?;
        (!self.stopped_by_us.load(Ordering::Acquire)).then(|| self.describe(status))
    }

    /// How the child ended, in words, with what it said last; `None` if it is still running.
    pub async fn words(&self) -> Option<String> {
        let status = self.settle().await?;
        Some(self.describe(status))
    }

    fn describe(&self, status: ExitStatus) -> String {
        let ended = if self.stopped_by_us.load(Ordering::Acquire) && status.code().is_none() {
            format!("`{}` did not answer as an MCP server and was stopped", self.command)
        } else {
            format!("`{}` {}", self.command, exit_words(status))
        };
        format!("{ended}; {}", said(&self.tail()))
    }
}

/// What the child said last, for the words.
fn said(tail: &[String]) -> String {
    match tail {
        [] => "it wrote nothing on stderr".to_string(),
        lines => format!(
            "its last lines on stderr: {}",
            lines.iter().map(|l| format!("“{l}”")).collect::<Vec<_>>().join(" ")
        ),
    }
}

fn exit_words(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = nix::sys::signal::Signal::try_from(signal).map(|s| s.as_str()).unwrap_or("unknown");
            return format!("was ended by signal {signal} ({name})");
        }
    }
    match status.code() {
        Some(code) => format!("exited with code {code}"),
        None => "ended".to_string(),
    }
}

/// Words for a child that could not be started at all.
fn start_failed(command: &str, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => {
            format!("`{command}` was not found: is it installed and on PATH? (or give its full path in `command`)")
        }
        io::ErrorKind::PermissionDenied => {
            format!("`{command}` could not be run: permission denied (is it executable?)")
        }
        _ => format!("`{command}` could not be started: {e}"),
    }
}

/// Records the exit status of the child it wraps in a [`ChildStory`].
#[derive(Debug)]
pub struct Recorder(Arc<ChildStory>);

impl CommandWrapper for Recorder {
    fn wrap_child(&mut self, child: Box<dyn ChildWrapper>, _core: &CommandWrap) -> io::Result<Box<dyn ChildWrapper>> {
        Ok(Box::new(Recorded { inner: child, story: self.0.clone() }))
    }
}

#[derive(Debug)]
struct Recorded {
    inner: Box<dyn ChildWrapper>,
    story: Arc<ChildStory>,
}

impl Recorded {
    fn record(&self, status: ExitStatus) {
        self.story.ended(status);
    }
}

impl ChildWrapper for Recorded {
    fn inner(&self) -> &dyn ChildWrapper {
        self.inner.as_ref()
    }

    fn inner_mut(&mut self) -> &mut dyn ChildWrapper {
        self.inner.as_mut()
    }

    fn into_inner(self: Box<Self>) -> Box<dyn ChildWrapper> {
        self.inner
    }

    /// A child that already exited keeps the status it exited with; the rest of its group is
    /// still signalled.
    fn start_kill(&mut self) -> io::Result<()> {
        match self.inner.try_wait() {
            Ok(Some(status)) => self.record(status),
            _ => self.story.stopped_by_us.store(true, Ordering::Release),
        }
        match self.inner.start_kill() {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            other => other,
        }
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.inner.try_wait()?;
        if let Some(s) = status {
            self.record(s);
        }
        Ok(status)
    }

    fn wait(&mut self) -> Pin<Box<dyn Future<Output = io::Result<ExitStatus>> + Send + '_>> {
        let story = self.story.clone();
        let waiting = self.inner.wait();
        Box::pin(async move {
            let status = waiting.await?;
            story.ended(status);
            Ok(status)
        })
    }
}
