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
    ClientCapabilities, ClientConfig, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, Implementation, InputRequest, LoggingMessageNotificationParam,
    ProgressNotificationParam, RequestId, ResourceUpdatedNotificationParam,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext, RoleClient};
use serde_json::Value;
use tokio::sync::Notify;

/// Which connection backend traffic came on.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub backend: &'a str,
    /// The connection's number ([`super::Link::conn`]): ids the backend picks (request ids,
    /// progress tokens) are only unique on one connection.
    pub conn: u64,
}

/// Where backend-initiated traffic goes (the MCP layer implements it).
pub trait Relay: Send + Sync + 'static {
    /// A backend's request for input (`sampling/createMessage`, `elicitation/create`), to be
    /// answered by the client whose call caused it; the answer as JSON. `origin` is the id of our
    /// call whose response stream carried the request, if known.
    fn ask<'a>(
        &'a self,
        from: Source<'a>,
        origin: Option<RequestId>,
        request: InputRequest,
    ) -> BoxFuture<'a, Result<Value, ErrorData>>;
    fn progress(&self, from: Source<'_>, params: ProgressNotificationParam);
    fn logging(&self, from: Source<'_>, params: LoggingMessageNotificationParam);
    /// A backend resource changed (`notifications/resources/updated`).
    fn resource_updated(&self, from: Source<'_>, uri: &str);
}

/// A relay that answers requests with an error and drops notifications.
pub struct NoRelay;

impl Relay for NoRelay {
    fn ask<'a>(
        &'a self,
        _: Source<'a>,
        _: Option<RequestId>,
        request: InputRequest,
    ) -> BoxFuture<'a, Result<Value, ErrorData>> {
        let what = request_name(&request);
        Box::pin(async move { Err(ErrorData::internal_error(format!("no client to relay {what} to"), None)) })
    }
    fn progress(&self, _: Source<'_>, _: ProgressNotificationParam) {}
    fn logging(&self, _: Source<'_>, _: LoggingMessageNotificationParam) {}
    fn resource_updated(&self, _: Source<'_>, _: &str) {}
}

pub struct UpstreamClient {
    backend: String,
    /// This connection's number ([`super::Link::conn`]).
    pub conn: u64,
    /// Rung on a list change (the gateway's own connection only).
    relist: Option<Arc<Notify>>,
    relay: Arc<dyn Relay>,
    /// A stdio backend's process group: ended when this connection is dropped.
    pub(super) group: Option<super::children::Group>,
}

impl UpstreamClient {
    pub fn new(backend: String, conn: u64, relist: Option<Arc<Notify>>, relay: Arc<dyn Relay>) -> Self {
        Self { backend, conn, relist, relay, group: None }
    }

    fn relist(&self) {
        if let Some(r) = &self.relist {
            r.notify_one();
        }
    }

    fn from(&self) -> Source<'_> {
        Source { backend: &self.backend, conn: self.conn }
    }

    /// Relays a backend's request for input and reads the client's answer as the backend's type.
    async fn ask<T: serde::de::DeserializeOwned>(
        &self,
        context: &RequestContext<RoleClient>,
        request: InputRequest,
    ) -> Result<T, ErrorData> {
        let what = request_name(&request);
        let answer = self.relay.ask(self.from(), origin(context), request).await?;
        serde_json::from_value(answer.clone()).map_err(|_| {
            ErrorData::internal_error(format!("the client answered {what} with something else: {answer}"), None)
        })
    }
}

/// The method name of a request for input, for messages.
pub fn request_name(request: &InputRequest) -> &'static str {
    match request {
        InputRequest::CreateMessage(_) => "sampling/createMessage",
        InputRequest::Elicitation(_) => "elicitation/create",
        InputRequest::ListRoots(_) => "roots/list",
        _ => "a request",
    }
}

impl ClientHandler for UpstreamClient {
    fn get_info(&self) -> ClientConfig {
        // Sampling and elicitation are relayed to the client session that made the call; tasks
        // (SEP-2663) are relayed to the client that created them, or run to their end for one
        // that cannot follow a task. (A 2026-07-28 backend is told, with each tool call, what
        // the calling client itself declared: see `Backend::call_tool`.)
        let caps = ClientCapabilities::builder().enable_sampling().enable_elicitation().enable_tasks().build();
        ClientConfig::new(caps, Implementation::new("toolmux", env!("CARGO_PKG_VERSION")))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.ask(&context, InputRequest::CreateMessage(CreateMessageRequest::new(params))).await
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.ask(&context, InputRequest::Elicitation(ElicitRequest::new(params))).await
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.relay.progress(self.from(), params);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.logging(self.from(), params);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(backend = %self.backend, "backend tools changed");
        self.relist();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist();
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relist();
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.resource_updated(self.from(), &params.uri);
    }
}

/// The id of our outbound request on whose response stream a backend request arrived.
fn origin(context: &RequestContext<RoleClient>) -> Option<RequestId> {
    match context.extensions.get::<InboundStreamOrigin>()? {
        InboundStreamOrigin::OutboundRequest(id) => Some(id.clone()),
        InboundStreamOrigin::Unassociated => None,
    }
}
