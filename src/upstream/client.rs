//! The gateway's side of each backend connection: an rmcp client handler that turns the
//! backend's list-change notifications into a re-list, and hands everything else the backend
//! sends to a [`Relay`].

use std::sync::Arc;

use rmcp::ClientHandler;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RoleClient};
use tokio::sync::Notify;

/// Where backend-initiated traffic goes (the session layer implements it).
pub trait Relay: Send + Sync + 'static {
    /// A backend resource changed (`notifications/resources/updated`).
    fn resource_updated(&self, _backend: &str, _uri: &str) {}
}

/// A relay that drops everything.
pub struct NoRelay;
impl Relay for NoRelay {}

pub struct UpstreamClient {
    backend: String,
    relist: Arc<Notify>,
    relay: Arc<dyn Relay>,
}

impl UpstreamClient {
    pub fn new(backend: String, relist: Arc<Notify>, relay: Arc<dyn Relay>) -> Self {
        Self { backend, relist, relay }
    }
}

impl ClientHandler for UpstreamClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("toolmux", env!("CARGO_PKG_VERSION")))
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(backend = %self.backend, "backend tools changed");
        self.relist.notify_one();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist.notify_one();
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist.notify_one();
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.resource_updated(&self.backend, &params.uri);
    }
}
