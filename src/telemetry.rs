//! W3C trace context and toolmux's own spans (the `otlp` feature).
//!
//! With the feature, a client request's span (`mcp_request`) takes the client's `traceparent` as
//! its parent, and a forwarded request carries toolmux's own span as the backend's parent, so one
//! trace runs client → toolmux → backend. Without it, the client's context is passed to the
//! backend unchanged and toolmux's spans are only logged.

use rmcp::service::{RequestContext, RoleServer};

#[cfg(feature = "otlp")]
use crate::upstream::Trace;

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
