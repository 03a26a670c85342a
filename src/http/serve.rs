//! The accept loop: HTTP/1 connections under three limits (`server.max_connections`,
//! `server.header_timeout`, and, in [`super::check_json_rpc`], `server.body_timeout`), so that
//! clients that open connections and trickle or never finish their requests cannot starve the
//! rest. At the connection cap the loop stops accepting, and new connections wait in the
//! kernel's backlog until one closes; a connection whose headers do not arrive in time is closed.
//!
//! At the process's descriptor limit (`descriptors`) `accept` fails while connections wait. The
//! loop keeps one descriptor in reserve for that moment: it lets it go, accepts the waiting
//! connection, answers it 503 with `Retry-After` and closes it, then takes the reserve back. So
//! a client past the limit is told at once instead of hanging in the backlog, the loop never
//! spins on a failing `accept`, and each refusal is counted (`connections_refused`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::{Connections, Reason};

/// How long a connection may take to close once the gateway is cancelled (its calls have had
/// `server.shutdown_grace` already, see [`crate::app::App::stop`]).
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long the loop waits before accepting again when the reserve could not be taken back
/// (every descriptor in use still): connections wait in the backlog meanwhile.
const FULL_PAUSE: Duration = Duration::from_millis(50);
/// At most one warning this often while descriptors run out, with the count refused meanwhile.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// Where the loop counts what it opens, cuts and refuses.
    pub counters: Connections,
}

/// Serves `router` on `listener` until `stop` is cancelled, then lets open requests finish.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let counters = limits.counters;
    let mut reserve = Reserve::take();
    let mut warned: Option<(Instant, u64)> = None;
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
        };
        let tcp = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(err) if out_of_descriptors(&err) => {
                    let refused = refuse_one(&listener, &mut reserve).await;
                    if refused {
                        counters.refused.get_or_create(&Reason { reason: "descriptors" }).inc();
                    } else {
                        tokio::time::sleep(FULL_PAUSE).await;
                    }
                    warn_at_limit(&mut warned, u64::from(refused));
                    continue;
                }
                Err(err) => {
                    // A connection that ended before it was accepted, mostly; a persistent error
                    // (no memory for buffers) must not spin the loop.
                    tracing::debug!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
        };
        no_delay(&tcp);
        let service = TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection(TokioIo::new(tcp), service);
        let stop = stop.clone();
        let counters = counters.clone();
        connections.spawn(async move {
            let _slot = slot;
            counters.open.inc();
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => match r {
                    Err(err) if err.is_timeout() => {
                        counters.cut.get_or_create(&Reason { reason: "header_timeout" }).inc();
                        tracing::debug!("a connection's request headers did not arrive in time (server.header_timeout)");
                    }
                    Err(err) => tracing::debug!(%err, "connection ended with an error"),
                    Ok(()) => {}
                },
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
                }
            }
            counters.open.dec();
        });
    }
    connections.close();
    connections.wait().await;
}

/// Whether `accept` failed for want of descriptors (the process's or the system's).
fn out_of_descriptors(err: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = err;
        false
    }
}

/// One descriptor kept open so that, at the limit, a waiting connection can still be accepted
/// and told why it is refused.
struct Reserve(Option<std::fs::File>);

impl Reserve {
    fn take() -> Self {
        let null = if cfg!(windows) { "NUL" } else { "/dev/null" };
        Reserve(std::fs::File::open(null).ok())
    }
}

/// What a connection refused at the descriptor limit reads.
const REFUSAL: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
    retry-after: 1\r\nconnection: close\r\ncontent-length: 80\r\n\r\n\
    toolmux: the gateway holds all the connections it can (file descriptors); retry\n";

/// Gives up the reserve to accept one waiting connection, answers it [`REFUSAL`] and closes it,
/// then takes the reserve back. False when there was no reserve or nothing could be accepted.
async fn refuse_one(listener: &TcpListener, reserve: &mut Reserve) -> bool {
    let Some(spare) = reserve.0.take() else {
        *reserve = Reserve::take();
        return false;
    };
    drop(spare);
    // The connection that could not be accepted is waiting: this does not block.
    let accepted = tokio::time::timeout(Duration::from_millis(10), listener.accept()).await;
    let refused = match accepted {
        Ok(Ok((tcp, _))) => {
            answer_and_close(tcp);
            true
        }
        _ => false,
    };
    *reserve = Reserve::take();
    refused
}

/// Writes the refusal without waiting (a fresh connection's send buffer has room for it), reads
/// what the client sent so far (so that closing sends FIN, not a reset that could discard the
/// answer), and closes.
fn answer_and_close(tcp: TcpStream) {
    let mut sink = [0u8; 4096];
    while matches!(tcp.try_read(&mut sink), Ok(n) if n > 0) {}
    let _ = tcp.try_write(REFUSAL.as_bytes());
    if let Ok(std) = tcp.into_std() {
        let _ = std.shutdown(std::net::Shutdown::Write);
    }
}

/// Logs the limit once per [`WARN_EVERY`], with what was refused since the last warning.
fn warn_at_limit(warned: &mut Option<(Instant, u64)>, refused: u64) {
    match warned {
        Some((at, n)) if at.elapsed() < WARN_EVERY => *n += refused,
        _ => {
            let since = warned.map_or(0, |(_, n)| n) + refused;
            let limit = crate::descriptors::current().limit;
            tracing::warn!(
                limit,
                refused = since,
                "out of file descriptors: new connections are answered 503 until some close; \
                 raise the limit (ulimit -n, LimitNOFILE=) or lower server.max_connections"
            );
            *warned = Some((Instant::now(), 0));
        }
    }
}

/// Sets TCP_NODELAY on an accepted connection. Without it, a streamed answer's last small write
/// waits for the client's delayed ACK: about 40 ms per request on a kept-alive connection.
fn no_delay(tcp: &TcpStream) {
    if let Err(err) = tcp.set_nodelay(true) {
        tracing::debug!(%err, "TCP_NODELAY not set");
    }
}

#[cfg(test)]
mod tests {
    /// The server side of a connection `serve` accepted has TCP_NODELAY set: found among this
    /// process's open descriptors (Linux's /proc) by its two addresses, and asked.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_delayed_acks() {
        use std::os::fd::FromRawFd;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        use super::*;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits =
            super::Limits { max_connections: 4, header_timeout: Duration::from_secs(5), counters: Default::default() };
        let stop = CancellationToken::new();
        let server = tokio::spawn(super::serve(listener, router, limits, stop.clone()));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        // An answer means the loop accepted the connection and set it up.
        client.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut answer = [0u8; 256];
        let n = client.read(&mut answer).await.unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
        let theirs = client.local_addr().unwrap();
        let server_side = std::fs::read_dir("/proc/self/fd").unwrap().find_map(|e| {
            let fd: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            // SAFETY: only asked for its addresses and one option, and never closed here
            // (ManuallyDrop); an fd another test closes meanwhile only makes the asking fail.
            let tcp = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
            (tcp.local_addr().ok()? == addr && tcp.peer_addr().ok()? == theirs).then(|| tcp.nodelay())
        });
        assert!(server_side.expect("the server's side of the connection is open").unwrap(), "TCP_NODELAY");
        stop.cancel();
        server.await.unwrap();
    }

    #[test]
    fn the_refusal_says_its_length_truly() {
        let (head, body) = super::REFUSAL.split_once("\r\n\r\n").unwrap();
        let length: usize = head.split("content-length: ").nth(1).unwrap().trim().parse().unwrap();
        assert_eq!(body.len(), length);
    }
}
