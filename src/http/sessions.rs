//! rmcp's session manager, with every session's life reported to the gateway's
//! [`Registry`]: a session is claimed for the caller of its `initialize` (new, or replayed from
//! the shared store) before rmcp runs it, and ended when rmcp closes it, whatever closed it
//! (`DELETE`, the idle timeout, the sweep for sessions ended on another replica). The handler
//! finds the session's id on its `initialize` ([`SessionKey`]) and binds its handle to it.

use std::sync::Arc;

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, GetExtensions, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{EventStore, RestoreOutcome, ServerSseMessage, SessionId};

use crate::session::Caller;
use crate::session::registry::Registry;
use crate::session::shared::{SessionKey, SharedSessions};

pub struct Sessions {
    inner: LocalSessionManager,
    registry: Arc<Registry>,
    shared: Option<Arc<SharedSessions>>,
}

impl Sessions {
    pub fn new(inner: LocalSessionManager, registry: Arc<Registry>, shared: Option<Arc<SharedSessions>>) -> Self {
        Self { inner, registry, shared }
    }

    /// Whether rmcp holds the session `id` here.
    pub async fn holds(&self, id: &str) -> bool {
        self.inner.sessions.read().await.contains_key(id)
    }

    /// Sessions rmcp holds here.
    pub async fn count(&self) -> usize {
        self.inner.sessions.read().await.len()
    }

    /// The ids of the sessions rmcp holds here.
    pub async fn ids(&self) -> Vec<String> {
        self.inner.sessions.read().await.keys().map(|id| id.to_string()).collect()
    }
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    fn create_session(&self) -> impl Future<Output = Result<(SessionId, Self::Transport), Self::Error>> + Send {
        self.inner.create_session()
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        if let ClientJsonRpcMessage::Request(r) = &mut message
            && let Some(parts) = r.request.extensions_mut().get_mut::<http::request::Parts>()
        {
            let principal = parts.extensions.get::<Caller>().map_or(crate::config::ANONYMOUS, |c| &c.principal);
            if self.registry.claim(id, principal).is_err() {
                // Ids are random UUIDs: only a replay by someone else could get here.
                tracing::warn!(%principal, "an initialize for a session held by another principal was refused");
                return Err(LocalSessionManagerError::SessionNotFound(id.clone()));
            }
            parts.extensions.insert(SessionKey(Arc::from(id.as_ref())));
        }
        self.inner.initialize_session(id, message).await
    }

    fn has_session(&self, id: &SessionId) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.inner.has_session(id)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        if self.registry.end(id)
            && let Some(shared) = &self.shared
        {
            shared.ended_here(id);
        }
        self.inner.close_session(id).await
    }

    fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.inner.create_stream(id, message)
    }

    fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.accept_message(id, message)
    }

    fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.inner.create_standalone_stream(id)
    }

    fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.inner.resume(id, last_event_id)
    }

    fn restore_session(
        &self,
        id: SessionId,
    ) -> impl Future<Output = Result<RestoreOutcome<Self::Transport>, Self::Error>> + Send {
        self.inner.restore_session(id)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}
