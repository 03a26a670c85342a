//! Taking over a backend session another replica opened (`[sessions]` with a `secret`).
//!
//! rmcp's client always starts a session with the initialize handshake. [`OwnSessionClient`] is
//! the HTTP client under one per-client upstream session: it adds the caller's headers to every
//! request ([`super::identity`]), and given a stored session (its id and
//! the backend's initialize answer), it answers the handshake itself, with the stored answer
//! and id, so that every later request carries the stored id to the backend. A backend that no
//! longer knows the id answers 404, and rmcp's client starts a fresh session (its
//! `reinit_on_expired_session`), whose handshake then goes to the backend: the session is
//! resumed where the backend accepts the stored id and re-initialised where it does not.
//!
//! It also records the id the backend gives, for the store, and leaves the backend session open
//! when the gateway stops with sessions shared ([`Adoption::keep`]): another replica takes it over.
//!
//! And it tells when the session's standalone stream (the GET rmcp opens after the handshake)
//! has been answered ([`Adoption::standalone_settled`]): a backend may send a request that is
//! tied to no call (sampling, elicitation) only on that stream, and one whose stream is not open
//! yet drops it (the TypeScript SDK's servers do). A new session's first request waits for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ClientRequest, InitializeResult, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde::{Deserialize, Serialize};
use sse_stream::{Error as SseError, Sse};

use super::identity::CallerHeaders;

/// A backend session as the store keeps it (sealed: see `session::shared`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredUpstream {
    /// The backend's `Mcp-Session-Id`.
    pub id: String,
    /// Its answer to the initialize that opened the session.
    pub init: InitializeResult,
}

/// One upstream session's adoption state, shared by its client and the code that opened it.
#[derive(Debug, Default)]
pub struct Adoption {
    /// A stored session to take over instead of the next handshake (taken by it).
    pending: Mutex<Option<StoredUpstream>>,
    /// Whether the handshake was answered from the store (its `initialized` is not sent again).
    adopted: AtomicBool,
    /// The id the backend gave (or the adopted one).
    session: Mutex<Option<String>>,
    /// Set when the gateway stops with sessions shared: the backend session is not ended.
    keep: Arc<AtomicBool>,
    /// Set once the backend has answered the standalone stream's first GET (opened, or refused:
    /// a backend without one).
    standalone: tokio::sync::watch::Sender<bool>,
}

impl Adoption {
    /// `keep` is the gateway's "leave backend sessions to other replicas" flag.
    pub fn new(pending: Option<StoredUpstream>, keep: Arc<AtomicBool>) -> Arc<Self> {
        Arc::new(Self { pending: Mutex::new(pending), keep, ..Self::default() })
    }

    /// The backend's session id now, once the handshake is done.
    pub fn session(&self) -> Option<String> {
        self.session.lock().expect("adoption lock").clone()
    }

    /// Whether the handshake was answered from the store.
    pub fn adopted(&self) -> bool {
        self.adopted.load(Ordering::Acquire)
    }

    /// Waits, at most `within`, until the backend has answered the standalone stream's GET.
    /// False if it had not by then.
    pub async fn standalone_settled(&self, within: std::time::Duration) -> bool {
        let mut settled = self.standalone.subscribe();
        tokio::time::timeout(within, settled.wait_for(|s| *s)).await.is_ok_and(|r| r.is_ok())
    }
}

/// `reqwest::Client`, as rmcp's client uses it, with the caller's headers filled in on every
/// request and the handshake answered from the store when there is a stored session to take over.
/// The gateway's own connections use it too, with no caller and nothing to take over.
#[derive(Clone)]
pub struct OwnSessionClient {
    pub inner: reqwest::Client,
    pub adoption: Arc<Adoption>,
    pub caller: CallerHeaders,
    /// `auth = "oauth"`: told when the backend wants more scope than the grant holds.
    pub grant: Option<Arc<dyn WantsScope>>,
}

/// What hears a backend's refusal for want of scope: the backend's OAuth grant
/// ([`super::oauth::Grant`]), so that the next login asks for it. A trait here, so that this
/// client, which the grant's own client wraps, does not depend on the grant back.
pub trait WantsScope: Send + Sync {
    /// `challenge`: the refusal's `WWW-Authenticate`.
    fn wants(&self, challenge: &str);
}

impl OwnSessionClient {
    /// For the gateway's own connection to a backend: no caller's headers, nothing adopted.
    pub fn gateways(inner: reqwest::Client) -> Self {
        let caller = CallerHeaders::new(Default::default(), Vec::new(), None);
        Self { inner, adoption: Adoption::new(None, Arc::new(AtomicBool::new(false))), caller, grant: None }
    }
}

impl StreamableHttpClient for OwnSessionClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits).await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let initialize = match &message {
            ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_)) => {
                Some(r.id.clone())
            }
            _ => None,
        };
        if let Some(id) = initialize.clone() {
            let stored = self.adoption.pending.lock().expect("adoption lock").take();
            if let Some(stored) = stored {
                self.adoption.adopted.store(true, Ordering::Release);
                *self.adoption.session.lock().expect("adoption lock") = Some(stored.id.clone());
                let answer =
                    ServerJsonRpcMessage::response(rmcp::model::ServerResult::InitializeResult(stored.init), id);
                return Ok(StreamableHttpPostResponse::Json(answer, Some(stored.id)));
            }
            // A real handshake (a fresh session, or one after the stored id was refused).
            self.adoption.adopted.store(false, Ordering::Release);
        }
        let is_initialized = matches!(
            &message,
            ClientJsonRpcMessage::Notification(n) if matches!(n.notification, ClientNotification::InitializedNotification(_))
        );
        if is_initialized && self.adoption.adopted() {
            // The backend heard it when the session began.
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let custom_headers = self.caller.fill(custom_headers);
        let response = self
            .inner
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await;
        if let (Err(StreamableHttpError::InsufficientScope(e)), Some(grant)) = (&response, &self.grant) {
            grant.wants(&e.www_authenticate_header);
        }
        let response = response?;
        if initialize.is_some() {
            let given = match &response {
                StreamableHttpPostResponse::Json(_, id) | StreamableHttpPostResponse::Sse(_, id) => id.clone(),
                _ => None,
            };
            *self.adoption.session.lock().expect("adoption lock") = given;
        }
        Ok(response)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        if self.adoption.keep.load(Ordering::Acquire) {
            return Ok(());
        }
        // A backend that is already gone has ended the session itself: nothing to report but a
        // debug line (rmcp logs a failed DELETE as an error).
        if let Err(e) = self.inner.delete_session(uri, session_id, auth_header, self.caller.fill(custom_headers)).await
        {
            tracing::debug!(error = %crate::redact::urls(&e.to_string()), "a backend session's DELETE was not answered");
        }
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        // Without Last-Event-ID: the standalone stream's GET (a resumption carries one).
        let standalone = last_event_id.is_none();
        let stream =
            self.inner.get_stream(uri, session_id, last_event_id, auth_header, self.caller.fill(custom_headers)).await;
        if standalone {
            self.adoption.standalone.send_replace(true);
        }
        stream
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let standalone = last_event_id.is_none();
        let stream = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                self.caller.fill(custom_headers),
                max_sse_event_size,
            )
            .await;
        if standalone {
            self.adoption.standalone.send_replace(true);
        }
        stream
    }
}
