//! Where toolmux's events go: stderr, filtered and coloured for a terminal, and with the `otlp`
//! feature spans and audit lines to an OTLP endpoint named in the environment.

pub use traces::Guard;

/// The log filter when none is given. rmcp's transport worker logs, at error, each failure toolmux
/// then reports itself in words (`upstream::words`): that copy is left out.
const DEFAULT_LOG_FILTER: &str = "warn,toolmux=info,rmcp::transport::worker=off";

/// toolmux's own events at info and its dependencies' at warn, unless `--log-level` or
/// `RUST_LOG` says otherwise; colour only when stderr is a terminal. With the `otlp` feature and
/// an OTLP endpoint in the environment, spans are exported too (flushed when the guard drops).
pub fn init(level: Option<&str>) -> Option<Guard> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = match level {
        Some(l) => EnvFilter::new(l),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER)),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let (export, guard) = traces::layer();
    tracing_subscriber::registry().with(filter).with(fmt).with(export).init();
    guard
}

#[cfg(feature = "otlp")]
mod traces {
    use opentelemetry::trace::TracerProvider as _;

    /// Flushes and stops the exporters when dropped.
    pub struct Guard(opentelemetry_sdk::trace::SdkTracerProvider, Option<opentelemetry_sdk::logs::SdkLoggerProvider>);

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.shutdown();
            if let Some(logs) = &self.1 {
                let _ = logs.shutdown();
            }
        }
    }

    /// Audit lines as OpenTelemetry log records (sent when `audit.otlp` asks): the line as the
    /// body, its action, principal and decision as attributes.
    fn audit_logs(resource: opentelemetry_sdk::Resource) -> Option<opentelemetry_sdk::logs::SdkLoggerProvider> {
        use opentelemetry::logs::{LogRecord as _, Logger as _, LoggerProvider as _, Severity};
        let exporter = match opentelemetry_otlp::LogExporter::builder().with_http().build() {
            Ok(e) => e,
            Err(err) => {
                eprintln!("toolmux: OTLP log export off: {err}");
                return None;
            }
        };
        let provider = opentelemetry_sdk::logs::SdkLoggerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let logger = provider.logger("toolmux.audit");
        crate::audit::export_to(Box::new(move |line, entry| {
            let mut record = logger.create_log_record();
            record.set_event_name("toolmux.audit");
            record.set_severity_number(Severity::Info);
            record.set_body(line.to_string().into());
            record.add_attribute("action", entry.action);
            record.add_attribute("principal", entry.principal.clone());
            record.add_attribute("decision", entry.decision);
            if let Some(trace) = &entry.trace_id {
                record.add_attribute("trace_id", trace.clone());
            }
            logger.emit(record);
        }));
        Some(provider)
    }

    /// An OTLP/HTTP span exporter when an endpoint is configured in the environment.
    pub fn layer<S>() -> (Option<impl tracing_subscriber::Layer<S>>, Option<Guard>)
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
            .iter()
            .any(|k| std::env::var_os(k).is_some());
        if !configured {
            return (None, None);
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder().with_http().build() {
            Ok(e) => e,
            Err(err) => {
                eprintln!("toolmux: OTLP export off: {err}");
                return (None, None);
            }
        };
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("toolmux").build();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("toolmux"));
        (Some(layer), Some(Guard(provider, audit_logs(resource))))
    }
}

#[cfg(not(feature = "otlp"))]
mod traces {
    pub struct Guard;

    /// Without the `otlp` feature, nothing is exported.
    pub fn layer() -> (Option<tracing_subscriber::layer::Identity>, Option<Guard>) {
        (None, None)
    }
}
