//! W3C trace context and toolmux's own spans (the `otlp` feature).
//!
//! With the feature, a client request's span (`mcp_request`) takes the client's `traceparent` as
//! its parent, and a forwarded request carries toolmux's own span as the backend's parent, so one
//! trace runs client → toolmux → backend. Without it, the client's context is passed to the
//! backend unchanged and toolmux's spans are only logged.

pub mod logging;

use rmcp::model::RequestMetaObject;
use rmcp::service::{RequestContext, RoleServer};

/// A client's W3C trace context (SEP-414), carried to the backend in the request's `_meta`.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub baggage: Option<String>,
}

impl Trace {
    /// The trace context of a client request: its `_meta`, else its HTTP headers.
    pub fn of(ctx: &rmcp::service::RequestContext<rmcp::service::RoleServer>) -> Self {
        let headers = ctx.extensions.get::<http::request::Parts>().map(|p| &p.headers);
        let header = |name: &str| headers.and_then(|h| h.get(name)).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Trace {
            traceparent: ctx.meta.get_traceparent().map(str::to_owned).or_else(|| header("traceparent")),
            tracestate: ctx.meta.get_tracestate().map(str::to_owned).or_else(|| header("tracestate")),
            baggage: ctx.meta.get_baggage().map(str::to_owned).or_else(|| header("baggage")),
        }
    }

    /// Puts the trace context in a forwarded request's `_meta`: toolmux's own span when it is
    /// exported (the `otlp` feature, [`current`]), else the client's as given.
    pub fn apply(&self, meta: &mut RequestMetaObject) {
        let (parent, state) = match current() {
            Some((parent, state)) => (Some(parent), state),
            None => (self.traceparent.clone(), self.tracestate.clone()),
        };
        if let Some(v) = parent {
            meta.set_traceparent(v);
        }
        if let Some(v) = state {
            meta.set_tracestate(v);
        }
        if let Some(v) = &self.baggage {
            meta.set_baggage(v.clone());
        }
    }
}

/// Makes the trace context of the client's request the parent of `span`.
#[cfg(feature = "otlp")]
pub fn adopt(span: &tracing::Span, request: &RequestContext<RoleServer>) {
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let trace = Trace::of(request);
    let Some(parent) = &trace.traceparent else { return };
    let mut carrier = std::collections::HashMap::new();
    carrier.insert("traceparent".to_string(), parent.clone());
    if let Some(state) = &trace.tracestate {
        carrier.insert("tracestate".to_string(), state.clone());
    }
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    // Fails only when the span is not recorded by an OpenTelemetry layer (no endpoint set).
    let _ = span.set_parent(cx);
}

/// Without the feature nothing is exported, so the request's context is not even read here.
#[cfg(not(feature = "otlp"))]
pub fn adopt(_span: &tracing::Span, _request: &RequestContext<RoleServer>) {}

/// The `traceparent` (and `tracestate`) of the current span, when it is exported.
#[cfg(feature = "otlp")]
pub fn current() -> Option<(String, Option<String>)> {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    let parent = carrier.remove("traceparent")?;
    Some((parent, carrier.remove("tracestate").filter(|s| !s.is_empty())))
}

#[cfg(not(feature = "otlp"))]
pub fn current() -> Option<(String, Option<String>)> {
    None
}
