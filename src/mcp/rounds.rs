//! Input rounds across protocol revisions: a backend that needs the client's input in the middle
//! of `tools/call` (sampling, elicitation, roots), whichever revision each side speaks.
//!
//! | client \ backend | 2025-11-25 (asks with a request) | 2026-07-28 (answers input-required) |
//! |---|---|---|
//! | 2025-11-25 (session) | the request is relayed to the client (`relay`) | [`fulfil`] asks the client, then the call is retried with its answers |
//! | 2026-07-28 (no session) | the call is parked here; the client gets an input-required result whose `requestState` names it, and its retry resumes it | the result reaches the client unchanged; its retry goes to the backend as it is |
//!
//! A parked call is the backend request still in flight, waiting on the client's answers. It is
//! kept for at most the backend's timeout, only for the caller that started it, and at most
//! [`MAX_PARKED`] at once; a call takes at most [`MAX_ROUNDS`] rounds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ErrorCode, GetPromptRequestParams, InputRequest,
    InputRequests, InputResponses, ReadResourceRequestParams, RequestId,
};
use rmcp::service::{Peer, RoleServer};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::relay::{self, Ask, CallGuard, Relayed};
use crate::session::Caller;
use crate::upstream::{Answer, Backend, CallError, Link};

/// Rounds of input one call may take (the SDKs' own default cap).
pub const MAX_ROUNDS: u32 = 10;
/// Calls parked at once, over all callers.
pub const MAX_PARKED: usize = 1024;
/// Prefix of the request states the gateway issues, to tell them from a backend's own.
const STATE_PREFIX: &str = "toolmux-round:";

pub type CallFuture = BoxFuture<'static, Result<Answer<CallToolResult>, CallError>>;

/// A forwarded `tools/call` and everything that routes its traffic, owned so that it can wait
/// across the client's requests.
pub struct PendingCall {
    pub backend: Arc<Backend>,
    /// The connection it travels on (the client's own session, or the shared one).
    pub link: Link,
    /// Its place under the session's `server.max_calls_per_session`.
    pub permit: Option<tokio::sync::OwnedSemaphorePermit>,
    pub caller: Caller,
    /// The forwarded request, to retry with a 2026-07-28 backend's input requests answered.
    pub params: CallToolRequestParams,
    /// What the calling client declared it can do (sampling, elicitation, roots).
    pub client: Option<ClientCapabilities>,
    pub call: CallFuture,
    pub guard: Arc<CallGuard>,
    pub relayed: mpsc::Receiver<Relayed>,
    /// Backend requests for the client (set for clients without a session).
    pub asks: Option<mpsc::UnboundedReceiver<Ask>>,
    /// Asks handed to the client in the last input-required result, by key.
    pub waiting: BTreeMap<String, Ask>,
    /// Cancels the backend request (client cancellation, expiry).
    pub ct: CancellationToken,
    pub rounds: u32,
    /// When the call was first forwarded (its metrics' latency).
    pub started: std::time::Instant,
    /// The client's trace context, passed on to the backend.
    pub trace: crate::telemetry::Trace,
    /// The `[[limits]]` windows its result's tokens count against.
    pub admitted: crate::limits::Admitted,
}

impl PendingCall {
    /// Starts (or restarts, with answers) the backend request.
    pub fn start(&mut self) {
        let (backend, link, params, guard, ct) =
            (self.backend.clone(), self.link.clone(), self.params.clone(), self.guard.clone(), self.ct.clone());
        let (client, trace) = (self.client.clone(), self.trace.clone());
        self.call = Box::pin(async move {
            backend.call_tool(&link, params, client, &trace, &ct, |id, token| guard.sent(id, token)).await
        });
    }

    /// Whether the client declared the capability `ask` needs; if not, the backend is told so
    /// with -32021 rather than the client being asked for what it never offered.
    pub fn refuse_undeclared(&self, ask: Ask) -> Option<Ask> {
        let caps = self.client.clone().unwrap_or_default();
        let (declared, what) = match &ask.request {
            InputRequest::CreateMessage(_) => (caps.sampling.is_some(), "sampling"),
            InputRequest::Elicitation(_) => (caps.elicitation.is_some(), "elicitation"),
            InputRequest::ListRoots(_) => (caps.roots.is_some(), "roots"),
            _ => (false, "this kind of input"),
        };
        if declared {
            return Some(ask);
        }
        let message = format!("the client did not declare the `{what}` capability");
        let _ = ask.reply.send(Err(ErrorData::new(ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY, message, None)));
        None
    }
}

impl PendingCall {
    /// Gives the call up: the backend is told (`notifications/cancelled`) before the requests it
    /// is waiting on are refused, so it hears why its work ends rather than a bare error.
    pub async fn abandon(mut self) {
        self.ct.cancel();
        let _ = (&mut self.call).await;
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        // A call given up (expired, or its client went away) is cancelled at the backend.
        self.ct.cancel();
    }
}

/// Calls waiting for a session-less client's answers, by the request state handed to it.
#[derive(Default)]
pub struct Parked {
    calls: Mutex<HashMap<String, PendingCall>>,
}

impl Parked {
    /// Parks `call` until its client retries, for at most `ttl`; returns the request state that
    /// names it, or `None` when [`MAX_PARKED`] calls are already waiting.
    pub fn park(self: &Arc<Self>, call: PendingCall, ttl: Duration) -> Option<String> {
        let token = format!("{STATE_PREFIX}{:032x}", rand::random::<u128>());
        {
            let mut calls = self.calls.lock().expect("parked lock");
            if calls.len() >= MAX_PARKED {
                return None;
            }
            calls.insert(token.clone(), call);
        }
        let parked = Arc::downgrade(self);
        let key = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            let expired = parked.upgrade().and_then(|p| p.calls.lock().expect("parked lock").remove(&key));
            if let Some(call) = expired {
                call.abandon().await;
            }
        });
        Some(token)
    }

    /// The call parked under `state`, if it is one of ours and `caller` started it. A state
    /// presented by anyone else is left where it is.
    pub fn take(&self, state: &str, caller: &Caller) -> Option<PendingCall> {
        let mut calls = self.calls.lock().expect("parked lock");
        if calls.get(state).is_some_and(|c| &c.caller == caller) { calls.remove(state) } else { None }
    }

    /// Whether `state` is a request state the gateway issued (live or not).
    pub fn is_ours(state: &str) -> bool {
        state.starts_with(STATE_PREFIX)
    }

    pub fn len(&self) -> usize {
        self.calls.lock().expect("parked lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A request that can be repeated with the client's answers to a backend's input requests.
pub trait Retry {
    /// The same request, carrying `responses` and the backend's `state`.
    fn answered(self, responses: InputResponses, state: Option<String>) -> Self;
}

macro_rules! retry {
    ($($t:ty),*) => {$(
        impl Retry for $t {
            fn answered(mut self, responses: InputResponses, state: Option<String>) -> Self {
                self.input_responses = Some(responses);
                self.request_state = state;
                self
            }
        }
    )*};
}

retry!(CallToolRequestParams, ReadResourceRequestParams, GetPromptRequestParams);

/// Answers a 2026-07-28 backend's input requests by asking a session client, each on the
/// response stream of the client's request `client_request`.
pub async fn fulfil(
    peer: &Peer<RoleServer>,
    client_request: &RequestId,
    requests: InputRequests,
) -> Result<InputResponses, ErrorData> {
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let answer = relay::ask(peer, client_request.clone(), relay::server_request(request)?).await?;
        let value = serde_json::to_value(answer).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        responses.insert(key, value);
    }
    Ok(responses)
}

/// Gives the parked call's waiting asks the client's answers; an ask the client did not answer
/// fails at the backend with an error saying so.
pub fn answer_asks(call: &mut PendingCall, mut responses: InputResponses) {
    for (key, ask) in std::mem::take(&mut call.waiting) {
        let reply = match responses.remove(&key) {
            Some(v) => Ok(v),
            None => {
                Err(ErrorData::invalid_params(format!("the client sent no answer for input request `{key}`"), None))
            }
        };
        let _ = ask.reply.send(reply);
    }
}
