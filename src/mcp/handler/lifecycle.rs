//! A session's life beyond one request: its logging level, its record in the shared store, and
//! its rebuild on a replica that did not hold it.

use rmcp::model::SubscribeRequestParams;
use rmcp::service::{RequestContext, RoleServer};

use super::{GatewayHandler, session_key};
use crate::session::SessionHandle;
use crate::session::shared::{Change, Record, SessionKey};

impl GatewayHandler {
    #[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
    pub(super) async fn apply_level(&self, session: &SessionHandle, level: rmcp::model::LoggingLevel) {
        session.level.set(level);
        if let Some(upstreams) = session.upstreams() {
            let backends: Vec<_> = self.advertisable_backends().collect();
            upstreams.set_level(level, &backends).await;
        }
    }

    /// Records a change to this session in the shared store, when sessions are shared.
    pub(super) async fn record(&self, context: &RequestContext<RoleServer>, change: Change) {
        let Some(shared) = self.gw.shared_sessions() else { return };
        if let Some(SessionKey(id)) = session_key(context) {
            shared.change(id, change).await;
        }
    }

    /// Records this session's own backend session to `backend` in the shared store, sealed,
    /// when it is new or its id changed (the backend refused a taken-over one, say).
    pub(super) async fn record_upstream(&self, context: &RequestContext<RoleServer>, backend: &str) {
        let Some(shared) = self.gw.shared_sessions() else { return };
        let Some(SessionKey(id)) = session_key(context) else { return };
        let Some(upstreams) = self.session.get().and_then(|s| s.upstreams()) else { return };
        // Most calls find the id recorded already: only a new one is sealed and written.
        let now = upstreams.session_id(backend).await;
        let before = self.upstreams_recorded.lock().expect("recorded lock").insert(backend.to_string(), now.clone());
        if before.is_some_and(|before| before == now) {
            return;
        }
        let stored = upstreams.stored(backend).await;
        let sealed = stored.map_or_else(|| "-".to_string(), |s| shared.seal(id, backend, &s));
        shared.change(id, Change::Upstream(backend.to_string(), sealed)).await;
    }

    /// A session rebuilt from the store on this replica: its logging level and resource
    /// subscriptions come back, and its own backend sessions are offered for taking over (with
    /// `sessions.secret`; else they open afresh on first use).
    pub(super) async fn resume(&self, session: &SessionHandle, record: &Record, context: &RequestContext<RoleServer>) {
        if let (Some(shared), Some(SessionKey(id)), Some(upstreams)) =
            (self.gw.shared_sessions(), session_key(context), session.upstreams())
        {
            for (backend, sealed) in &record.upstreams {
                if let Some(stored) = shared.unseal(id, backend, sealed) {
                    self.upstreams_recorded
                        .lock()
                        .expect("recorded lock")
                        .insert(backend.clone(), Some(stored.id.clone()));
                    upstreams.adopt(backend, stored);
                }
            }
        }
        if let Some(level) = record.level.as_deref().and_then(level_from_name) {
            self.apply_level(session, level).await;
        }
        for uri in &record.subscriptions {
            let request = SubscribeRequestParams::new(uri.clone());
            if let Err(e) = self.subscribe_to(request, &session.caller(), context).await {
                tracing::info!(%uri, error = %e.message, "a stored subscription could not be renewed");
            }
        }
    }
}

/// A logging level's wire name (`"warning"`).
#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
pub(super) fn level_name(level: rmcp::model::LoggingLevel) -> Option<String> {
    serde_json::to_value(level).ok()?.as_str().map(str::to_owned)
}

#[expect(deprecated, reason = "logging/setLevel is how 2025-11-25 clients choose what they hear")]
fn level_from_name(name: &str) -> Option<rmcp::model::LoggingLevel> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}
