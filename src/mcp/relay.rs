//! Traffic a backend starts during a client's call, carried to that client and back: sampling
//! and elicitation requests, progress and log notifications; and resource updates, carried to
//! the sessions that subscribed.
//!
//! A forwarded call registers itself ([`Hub::begin_call`]) for as long as it runs. Its progress
//! token is replaced by a gateway-unique one, so two sessions using the same token never see
//! each other's progress; notifications with that token go back under the client's own token.
//! A backend request (sampling, elicitation) or log line during calls goes to the most recent
//! call still running on that backend: one connection per backend carries no other link
//! between a backend request and the call that caused it.

#![expect(deprecated, reason = "sampling and logging are relayed as the backends use them")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    LoggingMessageNotificationParam, NumberOrString, ProgressNotificationParam, ProgressToken,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{Peer, RoleServer};
use tokio::sync::mpsc;

use crate::upstream::Relay;

struct Call {
    id: u64,
    peer: Peer<RoleServer>,
    /// Notifications for the client, sent by the call's own request task (so that rmcp puts
    /// them on that request's response stream).
    tx: mpsc::UnboundedSender<Relayed>,
}

/// A notification to pass to the client of a call.
#[derive(Debug)]
pub enum Relayed {
    Progress(ProgressNotificationParam),
    Log(LoggingMessageNotificationParam),
}

impl Relayed {
    /// Sends it to the client, from the caller's task.
    pub async fn send(self, peer: &Peer<RoleServer>) {
        let _ = match self {
            Relayed::Progress(p) => peer.notify_progress(p).await,
            Relayed::Log(l) => peer.notify_logging_message(l).await,
        };
    }
}

#[derive(Default)]
pub struct Hub {
    next: AtomicU64,
    /// Calls running, by backend, oldest first.
    calls: Mutex<HashMap<String, Vec<Call>>>,
    /// Gateway progress token → (the call's channel, the client's own token).
    progress: Mutex<HashMap<String, (mpsc::UnboundedSender<Relayed>, ProgressToken)>>,
    /// Resource URI → sessions subscribed to it.
    subscriptions: Mutex<HashMap<String, Vec<Peer<RoleServer>>>>,
}

/// Unregisters a call when it ends, however it ends.
pub struct CallGuard {
    hub: Arc<Hub>,
    backend: String,
    id: u64,
    /// The backend-side progress token routed to this call.
    token: Mutex<Option<String>>,
    client_token: Option<ProgressToken>,
    tx: mpsc::UnboundedSender<Relayed>,
}

impl CallGuard {
    /// Routes progress the backend reports under `backend_token` to this call's client, if the
    /// client asked for progress.
    pub fn route_progress(&self, backend_token: &ProgressToken) {
        let Some(original) = self.client_token.clone() else { return };
        let key = token_key(backend_token);
        self.hub.progress.lock().expect("relay lock").insert(key.clone(), (self.tx.clone(), original));
        *self.token.lock().expect("relay lock") = Some(key);
    }
}

fn token_key(t: &ProgressToken) -> String {
    match &t.0 {
        NumberOrString::String(s) => s.to_string(),
        NumberOrString::Number(n) => n.to_string(),
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(calls) = self.hub.calls.lock().expect("relay lock").get_mut(&self.backend) {
            calls.retain(|c| c.id != self.id);
        }
        if let Some(t) = self.token.lock().expect("relay lock").take() {
            self.hub.progress.lock().expect("relay lock").remove(&t);
        }
    }
}

impl Hub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Registers a call from `peer` to `backend`. The receiver yields the notifications to send
    /// to the client while the call runs; progress goes back under `client_token`, once
    /// [`CallGuard::route_progress`] names the token the backend will use.
    pub fn begin_call(
        self: &Arc<Self>,
        backend: &str,
        peer: Peer<RoleServer>,
        client_token: Option<ProgressToken>,
    ) -> (CallGuard, mpsc::UnboundedReceiver<Relayed>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.calls.lock().expect("relay lock").entry(backend.to_string()).or_default().push(Call {
            id,
            peer,
            tx: tx.clone(),
        });
        let guard = CallGuard {
            hub: self.clone(),
            backend: backend.to_string(),
            id,
            token: Mutex::new(None),
            client_token,
            tx,
        };
        (guard, rx)
    }

    fn caller(&self, backend: &str) -> Option<Peer<RoleServer>> {
        self.calls.lock().expect("relay lock").get(backend).and_then(|c| c.last()).map(|c| c.peer.clone())
    }

    fn caller_channel(&self, backend: &str) -> Option<mpsc::UnboundedSender<Relayed>> {
        self.calls.lock().expect("relay lock").get(backend).and_then(|c| c.last()).map(|c| c.tx.clone())
    }

    pub fn subscribe(&self, uri: &str, peer: Peer<RoleServer>) {
        let mut subs = self.subscriptions.lock().expect("relay lock");
        let list = subs.entry(uri.to_string()).or_default();
        list.retain(|p| !p.is_transport_closed());
        list.push(peer);
    }

    /// Drops `peer`'s subscription; true if no session is subscribed to `uri` any more.
    pub fn unsubscribe(&self, uri: &str, peer: &Peer<RoleServer>) -> bool {
        let mut subs = self.subscriptions.lock().expect("relay lock");
        let Some(list) = subs.get_mut(uri) else { return true };
        if let Some(i) = list.iter().position(|p| same_peer(p, peer)) {
            list.remove(i);
        }
        list.retain(|p| !p.is_transport_closed());
        let empty = list.is_empty();
        if empty {
            subs.remove(uri);
        }
        empty
    }
}

/// Peers have no identity of their own; two handles are the same session if they share the
/// client's initialize parameters object.
fn same_peer(a: &Peer<RoleServer>, b: &Peer<RoleServer>) -> bool {
    match (a.peer_info(), b.peer_info()) {
        (Some(x), Some(y)) => Arc::ptr_eq(&x, &y),
        _ => false,
    }
}

fn no_caller(what: &str, backend: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("backend `{backend}` sent {what} outside any client call; nothing to relay it to"),
        None,
    )
}

impl Relay for Hub {
    fn create_message(
        &self,
        backend: &str,
        params: CreateMessageRequestParams,
    ) -> BoxFuture<'static, Result<CreateMessageResult, ErrorData>> {
        let peer = self.caller(backend);
        let backend = backend.to_string();
        Box::pin(async move {
            let peer = peer.ok_or_else(|| no_caller("sampling/createMessage", &backend))?;
            peer.create_message(params).await.map_err(service_error)
        })
    }

    fn create_elicitation(
        &self,
        backend: &str,
        params: ElicitRequestParams,
    ) -> BoxFuture<'static, Result<ElicitResult, ErrorData>> {
        let peer = self.caller(backend);
        let backend = backend.to_string();
        Box::pin(async move {
            let peer = peer.ok_or_else(|| no_caller("elicitation/create", &backend))?;
            peer.create_elicitation(params).await.map_err(service_error)
        })
    }

    fn progress(&self, _backend: &str, mut params: ProgressNotificationParam) {
        let key = token_key(&params.progress_token);
        let Some((tx, original)) = self.progress.lock().expect("relay lock").get(&key).cloned() else {
            return;
        };
        params.progress_token = original;
        let _ = tx.send(Relayed::Progress(params));
    }

    fn logging(&self, backend: &str, params: LoggingMessageNotificationParam) {
        match self.caller_channel(backend) {
            Some(tx) => {
                let _ = tx.send(Relayed::Log(params));
            }
            None => tracing::debug!(backend, "log message outside any call dropped"),
        }
    }

    fn resource_updated(&self, _backend: &str, uri: &str) {
        let peers = self.subscriptions.lock().expect("relay lock").get(uri).cloned().unwrap_or_default();
        for peer in peers {
            let params = ResourceUpdatedNotificationParam::new(uri.to_string());
            tokio::spawn(async move {
                let _ = peer.notify_resource_updated(params).await;
            });
        }
    }
}

fn service_error(e: rmcp::ServiceError) -> ErrorData {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
    }
}
