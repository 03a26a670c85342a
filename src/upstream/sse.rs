//! The 2024-11-05 HTTP+SSE transport, as a client (`transport = "sse"`): rmcp 3 has none.
//!
//! One GET opens the event stream; its first `endpoint` event names the URL to POST messages to
//! (the server's session lives in that URL); every later `message` event is a JSON-RPC message
//! for toolmux. A message is sent as one POST, answered 202 (its reply comes on the stream).
//! The session lives as long as the stream: when it ends, [`Transport::receive`] ends, the
//! connection is dropped, and the backend's supervisor connects afresh with its backoff, as for
//! any backend whose connection fails (a new stream, a new session, a new initialize).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::identity::CallerHeaders;

/// How long the stream may take to name its endpoint.
const ENDPOINT_WAIT: Duration = Duration::from_secs(10);
/// Messages the stream may hold for toolmux before it stops reading (the server then waits).
const QUEUE: usize = 64;
/// The largest message accepted from the stream.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("{0}")]
    Http(String),
    #[error("the server answered {status} to a message: {body}")]
    Refused { status: u16, body: String },
}

/// Requests to one server: its fixed headers, and the caller's filled in on each request.
#[derive(Clone)]
struct Sender {
    client: reqwest::Client,
    headers: HashMap<HeaderName, HeaderValue>,
    caller: Option<CallerHeaders>,
}

impl Sender {
    fn headers(&self) -> http::HeaderMap {
        let all = match &self.caller {
            Some(c) => c.fill(self.headers.clone()),
            None => self.headers.clone(),
        };
        all.into_iter().collect()
    }
}

/// A connected legacy SSE session.
pub struct SseTransport {
    sender: Sender,
    endpoint: reqwest::Url,
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
    stop: CancellationToken,
}

impl SseTransport {
    /// Opens the event stream at `url` and waits for the endpoint it names.
    pub async fn connect(
        client: reqwest::Client,
        url: &str,
        headers: HashMap<HeaderName, HeaderValue>,
        caller: Option<CallerHeaders>,
    ) -> Result<Self, SseError> {
        let sender = Sender { client, headers, caller };
        let base = reqwest::Url::parse(url).map_err(|e| SseError::Http(format!("not a URL: {e}")))?;
        let response = sender
            .client
            .get(base.clone())
            .headers(sender.headers())
            .header(http::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| SseError::Http(crate::redact::urls(&e.to_string())))?;
        let status = response.status();
        if !status.is_success() {
            return Err(SseError::Http(format!("the event stream was answered {status}")));
        }
        let is_stream = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_stream {
            return Err(SseError::Http(
                "the URL did not answer with an event stream (is it a streamable HTTP server? then leave out transport = \"sse\")".into(),
            ));
        }
        let mut events = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
        let endpoint = tokio::time::timeout(ENDPOINT_WAIT, async {
            while let Some(event) = events.next().await {
                let event = event.map_err(|e| SseError::Http(format!("the event stream: {e}")))?;
                if event.event.as_deref() == Some("endpoint") {
                    let data = event.data.unwrap_or_default();
                    return base
                        .join(data.trim())
                        .map_err(|e| SseError::Http(format!("the endpoint event is not a URL: {e}")));
                }
            }
            Err(SseError::Http("the event stream ended before naming its endpoint".into()))
        })
        .await
        .map_err(|_| SseError::Http(format!("no endpoint event within {}s", ENDPOINT_WAIT.as_secs())))??;
        // Messages go where the stream came from, never to another origin.
        if endpoint.origin() != base.origin() {
            return Err(SseError::Http("the endpoint event names another origin; refused".into()));
        }
        let (tx, incoming) = mpsc::channel(QUEUE);
        let stop = CancellationToken::new();
        let reading = stop.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = events.next() => next,
                    _ = reading.cancelled() => return,
                };
                let event = match next {
                    Some(Ok(e)) => e,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "a legacy SSE stream failed");
                        return;
                    }
                    None => return,
                };
                if !matches!(event.event.as_deref(), None | Some("message")) {
                    continue;
                }
                let Some(data) = event.data.filter(|d| d.len() <= MAX_MESSAGE) else { continue };
                match serde_json::from_str::<RxJsonRpcMessage<RoleClient>>(&data) {
                    Ok(message) => {
                        if tx.send(message).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "a legacy SSE server sent a message that is not JSON-RPC; skipped")
                    }
                }
            }
        });
        Ok(Self { sender, endpoint, incoming, stop })
    }
}

impl Transport<RoleClient> for SseTransport {
    type Error = SseError;

    fn name() -> Cow<'static, str> {
        "legacy-sse".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), SseError>> + Send + 'static {
        let sender = self.sender.clone();
        let endpoint = self.endpoint.clone();
        async move {
            let response = sender
                .client
                .post(endpoint)
                .headers(sender.headers())
                .json(&item)
                .send()
                .await
                .map_err(|e| SseError::Http(crate::redact::urls(&e.to_string())))?;
            let status = response.status();
            if status.is_success() {
                return Ok(());
            }
            let body = response.text().await.unwrap_or_default();
            Err(SseError::Refused { status: status.as_u16(), body: body.chars().take(200).collect() })
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), SseError> {
        self.stop.cancel();
        Ok(())
    }
}

impl Drop for SseTransport {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
