//! The gateway's side of each backend connection: an rmcp client handler that turns the
//! backend's list-change notifications into a re-list, and hands everything else the backend
//! initiates (sampling and elicitation requests, progress, logging, resource updates) to a
//! [`Relay`], which knows which client session it belongs to.
//!
//! A backend request that arrived on the response stream of one of our calls (streamable HTTP,
//! SEP-2260) is handed over with that call's request id, so the relay can route it exactly;
//! requests from stdio backends, or from an HTTP backend's standalone stream, come without one.

#![expect(deprecated, reason = "sampling and logging are relayed as the backends use them")]

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::ClientHandler;
use rmcp::ErrorData;
use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, Implementation, LoggingMessageNotificationParam, ProgressNotificationParam, RequestId,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext, RoleClient};
use tokio::sync::Notify;

/// Where backend-initiated traffic goes (the MCP layer implements it).
pub trait Relay: Send + Sync + 'static {
    /// `sampling/createMessage` from `backend`, to be answered by the client whose call caused it.
    /// `origin` is the id of our call whose response stream carried the request, if known.
    fn create_message(
        &self,
        backend: &str,
        origin: Option<RequestId>,
        params: CreateMessageRequestParams,
    ) -> BoxFuture<'_, Result<CreateMessageResult, ErrorData>>;
    /// `elicitation/create` from `backend`, likewise.
    fn create_elicitation(
        &self,
        backend: &str,
        origin: Option<RequestId>,
        params: ElicitRequestParams,
    ) -> BoxFuture<'_, Result<ElicitResult, ErrorData>>;
    fn progress(&self, backend: &str, params: ProgressNotificationParam);
    fn logging(&self, backend: &str, params: LoggingMessageNotificationParam);
    /// A backend resource changed (`notifications/resources/updated`).
    fn resource_updated(&self, backend: &str, uri: &str);
}

/// A relay that answers requests with an error and drops notifications.
pub struct NoRelay;

impl Relay for NoRelay {
    fn create_message(
        &self,
        _: &str,
        _: Option<RequestId>,
        _: CreateMessageRequestParams,
    ) -> BoxFuture<'_, Result<CreateMessageResult, ErrorData>> {
        Box::pin(async { Err(ErrorData::internal_error("no client to relay sampling to", None)) })
    }
    fn create_elicitation(
        &self,
        _: &str,
        _: Option<RequestId>,
        _: ElicitRequestParams,
    ) -> BoxFuture<'_, Result<ElicitResult, ErrorData>> {
        Box::pin(async { Err(ErrorData::internal_error("no client to relay elicitation to", None)) })
    }
    fn progress(&self, _: &str, _: ProgressNotificationParam) {}
    fn logging(&self, _: &str, _: LoggingMessageNotificationParam) {}
    fn resource_updated(&self, _: &str, _: &str) {}
}

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
        // Sampling and elicitation are relayed to the client session that made the call.
        let caps = ClientCapabilities::builder().enable_sampling().enable_elicitation().build();
        ClientConfig::new(caps, Implementation::new("toolmux", env!("CARGO_PKG_VERSION")))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.relay.create_message(&self.backend, origin(&context), params).await
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.relay.create_elicitation(&self.backend, origin(&context), params).await
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.relay.progress(&self.backend, params);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.logging(&self.backend, params);
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
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.resource_updated(&self.backend, &params.uri);
    }
}

/// The id of our outbound request on whose response stream a backend request arrived.
fn origin(context: &RequestContext<RoleClient>) -> Option<RequestId> {
    match context.extensions.get::<InboundStreamOrigin>()? {
        InboundStreamOrigin::OutboundRequest(id) => Some(id.clone()),
        InboundStreamOrigin::Unassociated => None,
    }
}
