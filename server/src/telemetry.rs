//! Logs and traces, set up in one place. Logs: `tracing` with `RUST_LOG` filtering, plain or
//! JSON lines on stderr. Traces: OpenTelemetry spans exported over OTLP/gRPC, configured by the
//! standard `OTEL_*` variables and off unless an OTLP endpoint is set. Also the W3C
//! `traceparent` conversions the session and Publish need, and the trace ids a log line
//! written about a span carries.

use std::collections::HashMap;
use std::io::IsTerminal;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The instrumentation scope of every span the sidecar makes.
pub const TRACER: &str = "window-sidecar";

/// Keeps the trace exporter alive; dropping it flushes the spans still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing_enabled(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the log subscriber (`RUST_LOG` wins over `info`) and, when an OTLP endpoint is
/// configured, the global tracer provider.
pub fn init(format: LogFormat) -> Telemetry {
    init_logs(format);
    Telemetry {
        provider: init_traces(),
    }
}

/// Installs the log subscriber only.
pub fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second init (tests start several sidecars in one process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

fn init_traces() -> Option<SdkTracerProvider> {
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    let endpoint =
        env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if disabled || !endpoint {
        return None;
    }
    // The exporter reads OTEL_EXPORTER_OTLP_*; the resource reads OTEL_SERVICE_NAME and
    // OTEL_RESOURCE_ATTRIBUTES; the batch processor reads OTEL_BSP_*.
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(exporter) => exporter,
        Err(err) => {
            tracing::error!(error = %err, "OTLP trace exporter could not be built; traces are off");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !env_set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name(TRACER);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing::info!("exporting traces over OTLP");
    Some(provider)
}

/// The ids a log line about a span carries (`trace_id`, `span_id`, lowercase hex as in
/// `traceparent`), so that logs and traces can be joined; nothing when there is no span.
#[derive(Debug, Default)]
pub struct LogIds {
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
}

impl LogIds {
    pub fn of(context: Option<&SpanContext>) -> Self {
        match context.filter(|c| c.is_valid()) {
            Some(c) => Self {
                trace_id: Some(c.trace_id().to_string()),
                span_id: Some(c.span_id().to_string()),
            },
            None => Self::default(),
        }
    }
}

/// The span context a W3C `traceparent` (and `tracestate`) describes, if valid.
pub fn parse_traceparent(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// The W3C `traceparent` of a span context, if valid.
pub fn format_traceparent(context: &SpanContext) -> Option<String> {
    context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ids_are_those_of_a_valid_span_only() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let ids = LogIds::of(parse_traceparent(tp, None).as_ref());
        assert_eq!(
            ids.trace_id.as_deref(),
            Some("0af7651916cd43dd8448eb211c80319c")
        );
        assert_eq!(ids.span_id.as_deref(), Some("b7ad6b7169203331"));
        let none = LogIds::of(None);
        assert!(none.trace_id.is_none() && none.span_id.is_none());
    }

    #[test]
    fn traceparents_round_trip() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let context = parse_traceparent(tp, None).unwrap();
        assert_eq!(format_traceparent(&context).unwrap(), tp);
        assert!(parse_traceparent("garbage", None).is_none());
        assert!(
            parse_traceparent(
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                None
            )
            .is_none()
        );
    }
}
