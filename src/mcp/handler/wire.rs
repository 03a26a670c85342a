//! How each internal outcome reaches the wire: every kind of [`CallError`] maps to exactly one
//! JSON-RPC error or tool result here (no wildcard arm: a new kind must be given its form), and
//! every relayed result is marked complete.

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, CompleteResult, GetPromptResult, ReadResourceResult, ResultType};

use crate::config::Mode;
use crate::mcp::meta;
use crate::upstream::{Answer, CallError};

/// A relayed result marked `resultType: "complete"`, which the 2026-07-28 schema requires of
/// every result. A backend on an older revision sends none; rmcp strips the mark again for
/// clients that negotiated an older revision, so it is safe to set for everyone.
pub(super) trait Completed {
    fn completed(self) -> Self;
}

macro_rules! completed {
    ($($t:ty),*) => {$(
        impl Completed for $t {
            fn completed(mut self) -> Self {
                self.result_type.get_or_insert(ResultType::COMPLETE);
                self
            }
        }
    )*};
}

completed!(CallToolResult, ReadResourceResult, GetPromptResult, CompleteResult);

/// A relayed read's or prompt's answer as the client gets it: complete (marked so), the
/// backend's input round, or its error; a task is an error (only a tool call may be one).
pub(super) fn relayed<R: Completed, T: From<R> + From<rmcp::model::InputRequiredResult>>(
    answer: Result<Answer<R>, CallError>,
) -> Result<T, ErrorData> {
    match answer {
        Ok(Answer::Complete(r)) => Ok(r.completed().into()),
        Ok(Answer::InputRequired(r)) => Ok(r.into()),
        Ok(Answer::Task(_)) => Err(not_a_tool_call()),
        Err(e) => Err(wire_error(e)),
    }
}

/// A backend that answered a resource or prompt request with a task (only a tool call may).
fn not_a_tool_call() -> ErrorData {
    ErrorData::internal_error("the backend answered with a task, which only a tool call may be", None)
}

/// A failed forwarded tool call, as the client sees it.
pub(super) fn call_error(mode: Mode, e: CallError) -> Result<CallToolResult, ErrorData> {
    match e {
        // The backend's own JSON-RPC error: passthrough carries it as it is; in optimizer mode
        // the model gets its text as a tool error it can act on.
        CallError::Remote { error, backend } => match mode {
            Mode::Passthrough => Err(error),
            Mode::Optimizer => {
                Ok(meta::error_result(format!("backend `{backend}` rejected the call: {}", error.message)))
            }
        },
        CallError::Cancelled => Err(ErrorData::internal_error("the request was cancelled", None)),
        e @ (CallError::NotConnected { .. }
        | CallError::WakeFailed { .. }
        | CallError::Timeout { .. }
        | CallError::ConnectionLost { .. }
        | CallError::AtCapacity { .. }
        | CallError::SessionFailed { .. }
        | CallError::PrincipalsBusy { .. }
        | CallError::Exchange { .. }
        | CallError::NeedsLogin(_)) => Ok(meta::error_result(e.to_string())),
    }
}

/// A failed forwarded resource or prompt request. No wildcard arm: a new kind of failure must
/// be given its wire form here.
pub(super) fn wire_error(e: CallError) -> ErrorData {
    match e {
        // The backend's own JSON-RPC error, as it sent it.
        CallError::Remote { error, .. } => error,
        CallError::Cancelled => ErrorData::internal_error("the request was cancelled", None),
        // Each of these names the backend and nothing it said (see `CallError`).
        e @ (CallError::NotConnected { .. }
        | CallError::WakeFailed { .. }
        | CallError::Timeout { .. }
        | CallError::ConnectionLost { .. }
        | CallError::AtCapacity { .. }
        | CallError::SessionFailed { .. }
        | CallError::PrincipalsBusy { .. }
        | CallError::Exchange { .. }
        | CallError::NeedsLogin(_)) => ErrorData::internal_error(e.to_string(), None),
    }
}
