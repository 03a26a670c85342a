//! The accept loop: HTTP/1 connections under three limits (`server.max_connections`,
//! `server.header_timeout`, and, in [`super::check_json_rpc`], `server.body_timeout`), so that
//! clients that open connections and trickle or never finish their requests cannot starve the
//! rest. At the connection cap the loop stops accepting, and new connections wait in the
//! kernel's backlog until one closes; a connection whose headers do not arrive in time is closed.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a connection may take to close once the gateway is cancelled (its calls have had
/// `server.shutdown_grace` already, see [`crate::app::App::stop`]).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` until `stop` is cancelled, then lets open requests finish.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
        };
        let (tcp, _) = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(err) => {
                    // Out of file descriptors, mostly: wait for some to close rather than spin.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        no_delay(&tcp);
        let service = TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection(TokioIo::new(tcp), service);
        let stop = stop.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(err) = r { tracing::debug!(%err, "connection ended with an error") }
                }
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// Sets TCP_NODELAY on an accepted connection. Without it, a streamed answer's last small write
/// waits for the client's delayed ACK: about 40 ms per request on a kept-alive connection.
fn no_delay(tcp: &tokio::net::TcpStream) {
    if let Err(err) = tcp.set_nodelay(true) {
        tracing::debug!(%err, "TCP_NODELAY not set");
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_delayed_acks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        super::no_delay(&stream);
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY on the server side of the connection");
    }
}
