//! What a forwarded request comes back with: an answer, or why there is none.

use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{CreateTaskResult, InputRequiredResult};

use super::{exchange, oauth};

/// What a backend answered a request that may need input from the client.
#[derive(Debug, Clone)]
pub enum Answer<T> {
    Complete(T),
    /// The backend (2026-07-28) needs the client's answers to these requests; the client's
    /// retry carries them with the request state.
    InputRequired(InputRequiredResult),
    /// The backend runs the tool call as a task (SEP-2663): the client follows it with
    /// `tasks/get`. Only a tool call is answered this way.
    Task(CreateTaskResult),
}

/// Why a forwarded request did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("backend `{backend}` is not connected; it is being retried")]
    NotConnected { backend: String },
    /// `idle_stop`: the backend was stopped while unused, and starting it for this call failed.
    /// Why is logged and in `/status` for the operator, never sent to the client.
    #[error(
        "backend `{backend}` was stopped while unused and could not be started again; try again shortly, or tell the operator (toolmux status says why)"
    )]
    WakeFailed { backend: String },
    #[error("backend `{backend}` did not answer within {}", humantime::format_duration(*after))]
    Timeout { backend: String, after: Duration },
    /// What went wrong is logged (secrets in URLs redacted), never sent to the client. An
    /// answer over the transport's cap on one message (16 MiB over HTTP) ends the connection
    /// too, and rmcp says no more than that.
    #[error(
        "backend `{backend}` lost its connection during the call (an answer over 16 MiB ends it too); try again shortly, or ask for less"
    )]
    ConnectionLost { backend: String },
    #[error("the call was cancelled by the client")]
    Cancelled,
    #[error(
        "backend `{backend}` already runs {max} instances, one per client session (backends[].max_instances); try again when another session ends"
    )]
    AtCapacity { backend: String, max: usize },
    /// What went wrong is logged (secrets in URLs redacted), never sent to the client.
    #[error("backend `{backend}` could not open a session for this client; try again shortly")]
    SessionFailed { backend: String },
    /// `server.max_sessionless_principals` principals without a session hold backend sessions
    /// of their own, and every one of them is in use.
    #[error(
        "backend sessions are held for {max} callers without a session, all in use (server.max_sessionless_principals); try again shortly, or initialize a session to get backend sessions of your own"
    )]
    PrincipalsBusy { max: usize },
    /// `auth = "token_exchange"`: no token of the backend's own could be had for the caller.
    #[error("backend `{backend}` takes a token exchanged for yours, and the exchange failed: {why}")]
    Exchange { backend: String, why: exchange::ExchangeError },
    /// The backend answered with a JSON-RPC error.
    #[error("backend `{backend}` returned an error: {}", error.message)]
    Remote { backend: String, error: ErrorData },
    /// `auth = "oauth"`: the backend wants a login (none yet, revoked, or more scope).
    #[error("backend `{}` {}", .0.backend, .0)]
    NeedsLogin(oauth::NeedsLogin),
}
