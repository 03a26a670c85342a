//! The connection one request travels on, and a request on it the backend has not answered.

use std::sync::Arc;

use rmcp::model::{CancelledNotificationParam, RequestId};
use rmcp::service::{Peer, RoleClient};

use super::{ClientUpstreams, InUse, session};

/// A request the backend is still working on. Dropped before it was answered or cancelled (the
/// future awaiting it given up: a parked call that expired, a client that went away), it sends
/// the backend `notifications/cancelled`, so that abandoned work ends there too.
pub(super) struct Outstanding {
    pub(super) peer: Arc<Peer<RoleClient>>,
    /// `None` once answered or cancelled.
    pub(super) id: Option<RequestId>,
}

impl Outstanding {
    pub(super) fn answered(&mut self) {
        self.id = None;
    }

    pub(super) async fn cancel(&mut self, reason: &str) {
        if let Some(id) = self.id.take() {
            let _ = self.peer.notify_cancelled(CancelledNotificationParam::new(Some(id), Some(reason.into()))).await;
        }
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = "abandoned at the gateway: its client went away or did not answer in time";
            let _ = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), Some(reason.into()))).await;
        });
    }
}

/// The connection one request travels on: the gateway's shared one, or a client's own session.
#[derive(Clone)]
pub struct Link {
    pub(super) peer: Arc<Peer<RoleClient>>,
    /// Unique in the process; what the backend sends back is keyed by it.
    pub conn: u64,
    pub(super) own: Option<Arc<session::Conn>>,
    /// A session-less principal's set of backend sessions, kept open while the request that
    /// travels on it runs ([`PrincipalUpstreams`]).
    pub(super) owner: Option<Arc<ClientUpstreams>>,
}

impl Link {
    pub(super) fn own(conn: &Arc<session::Conn>) -> Self {
        Self { peer: conn.peer.clone(), conn: conn.id, own: Some(conn.clone()), owner: None }
    }

    /// Whether this is a client's own upstream session.
    pub fn is_own(&self) -> bool {
        self.own.is_some()
    }

    /// Keeps a client's own session from going idle while a request uses it.
    pub fn using(&self) -> Option<InUse> {
        self.own.as_ref().map(|c| c.using())
    }
}
