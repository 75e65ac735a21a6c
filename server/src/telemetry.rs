//! Logs and traces, set up in one place. Logs: `tracing` with `RUST_LOG` filtering, plain or
//! JSON lines on stderr. Traces: OpenTelemetry spans exported over OTLP, gRPC or HTTP/protobuf,
//! configured by the standard `OTEL_*` variables and off unless an OTLP endpoint is set. Also
//! the W3C `traceparent` conversions the session and Publish need, and the trace ids a log
//! line written about a span carries.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use thiserror::Error;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The instrumentation scope of every span the sidecar makes.
pub const TRACER: &str = "window-sidecar";

/// The OTLP variables that choose how spans leave, signal-specific first: the exporter spec
/// lets `OTEL_EXPORTER_OTLP_TRACES_*` override `OTEL_EXPORTER_OTLP_*`.
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT";
const TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";

/// The spec's default export timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How spans are sent to the OTLP endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC, the default: the sidecar's protocol before it spoke HTTP, which the spec
    /// allows an SDK to keep as its default for compatibility.
    Grpc,
    /// OTLP/HTTP with protobuf bodies, `POST …/v1/traces`.
    HttpProtobuf,
}

/// Where and how spans are exported, worked out once at start from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceExport {
    pub protocol: Protocol,
    /// A request's deadline, retries included (`OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`, ms).
    pub timeout: Duration,
}

/// An OTLP setting the sidecar cannot honour: it refuses to start rather than lose its spans.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TelemetryError {
    #[error("{variable}={value:?} is not an OTLP protocol; use grpc or http/protobuf")]
    UnknownProtocol {
        variable: &'static str,
        value: String,
    },
    #[error("{variable}=http/json is not supported; use grpc or http/protobuf")]
    JsonProtocol { variable: &'static str },
    #[error(
        "{variable} is an https endpoint, and OTLP/HTTP is exported without TLS; use an http:// endpoint (a collector on the node or in the cluster)"
    )]
    HttpsEndpoint { variable: &'static str },
}

impl TraceExport {
    /// The export the process environment asks for; `None` when traces are off.
    pub fn from_env() -> Result<Option<Self>, TelemetryError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The export the variables `var` returns ask for: off unless an endpoint is set, or when
    /// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. An empty variable is unset, as
    /// the spec says.
    pub fn from_lookup(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TelemetryError> {
        let var = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        let endpoint = [TRACES_ENDPOINT, ENDPOINT]
            .into_iter()
            .find_map(|name| Some((name, var(name)?)));
        let Some((endpoint_var, endpoint)) = endpoint.filter(|_| !disabled) else {
            return Ok(None);
        };
        let protocol = match [TRACES_PROTOCOL, PROTOCOL]
            .into_iter()
            .find_map(|name| Some((name, var(name)?)))
        {
            None => Protocol::Grpc,
            Some((variable, value)) => match value.to_ascii_lowercase().as_str() {
                "grpc" => Protocol::Grpc,
                "http/protobuf" => Protocol::HttpProtobuf,
                "http/json" => return Err(TelemetryError::JsonProtocol { variable }),
                _ => return Err(TelemetryError::UnknownProtocol { variable, value }),
            },
        };
        let https = endpoint
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
        if protocol == Protocol::HttpProtobuf && https {
            return Err(TelemetryError::HttpsEndpoint {
                variable: endpoint_var,
            });
        }
        // Like the exporter itself, a timeout that is not a number of milliseconds is ignored.
        let timeout = [TRACES_TIMEOUT, TIMEOUT]
            .into_iter()
            .find_map(|name| var(name)?.parse().ok())
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        Ok(Some(Self { protocol, timeout }))
    }
}

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

/// Installs the log subscriber (`RUST_LOG` wins over `info`) and, when traces are exported,
/// the global tracer provider. Called on the runtime the exporter's requests run on.
pub fn init(format: LogFormat, traces: Option<TraceExport>) -> Telemetry {
    init_logs(format);
    Telemetry {
        provider: traces.and_then(init_traces),
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

/// The OTLP/HTTP client: hyper, each request run on the sidecar's runtime. The batch processor
/// exports from a thread of its own, without a runtime, where hyper's connections and timers
/// cannot run (they would panic and stop that thread, and every span after it would be lost).
#[derive(Debug)]
struct RuntimeHttpClient {
    client: HyperClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for RuntimeHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

fn init_traces(export: TraceExport) -> Option<SdkTracerProvider> {
    // The exporter reads the other OTEL_EXPORTER_OTLP_* variables (endpoint, headers,
    // compression) itself; for http/protobuf it appends /v1/traces to the generic endpoint and
    // takes the signal-specific one as it is. The resource reads OTEL_SERVICE_NAME and
    // OTEL_RESOURCE_ATTRIBUTES; the batch processor reads OTEL_BSP_*.
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match export.protocol {
        Protocol::Grpc => builder.with_tonic().build(),
        Protocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(export.timeout)
            .with_http_client(RuntimeHttpClient {
                client: HyperClient::with_default_connector(export.timeout, None),
                runtime: tokio::runtime::Handle::current(),
            })
            .build(),
    };
    let exporter = match exporter {
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
    let protocol = match export.protocol {
        Protocol::Grpc => "grpc",
        Protocol::HttpProtobuf => "http/protobuf",
    };
    tracing::info!(protocol, "exporting traces over OTLP");
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

    fn export(vars: &[(&str, &str)]) -> Result<Option<TraceExport>, TelemetryError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TraceExport::from_lookup(|name| vars.get(name).cloned())
    }

    fn protocol(vars: &[(&str, &str)]) -> Protocol {
        export(vars).unwrap().unwrap().protocol
    }

    const AT: (&str, &str) = (ENDPOINT, "http://collector:4318");

    #[test]
    fn traces_are_off_without_an_endpoint_or_when_disabled() {
        assert_eq!(export(&[]), Ok(None));
        assert_eq!(export(&[(ENDPOINT, " ")]), Ok(None));
        assert_eq!(export(&[AT, ("OTEL_SDK_DISABLED", "true")]), Ok(None));
        assert_eq!(export(&[AT, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        // Without an endpoint the protocol is not looked at.
        assert_eq!(export(&[(PROTOCOL, "carrier-pigeon")]), Ok(None));
        assert!(
            export(&[(TRACES_ENDPOINT, "http://collector:4318/v1/traces")])
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn the_protocol_is_grpc_unless_a_variable_says_otherwise() {
        assert_eq!(protocol(&[AT]), Protocol::Grpc);
        assert_eq!(protocol(&[AT, (PROTOCOL, "")]), Protocol::Grpc);
        assert_eq!(protocol(&[AT, (PROTOCOL, "grpc")]), Protocol::Grpc);
        assert_eq!(
            protocol(&[AT, (PROTOCOL, "http/protobuf")]),
            Protocol::HttpProtobuf
        );
        assert_eq!(
            protocol(&[AT, (PROTOCOL, " HTTP/Protobuf ")]),
            Protocol::HttpProtobuf
        );
    }

    #[test]
    fn the_traces_protocol_wins_over_the_generic_one() {
        let both = [AT, (PROTOCOL, "grpc"), (TRACES_PROTOCOL, "http/protobuf")];
        assert_eq!(protocol(&both), Protocol::HttpProtobuf);
        let both = [AT, (PROTOCOL, "http/protobuf"), (TRACES_PROTOCOL, "grpc")];
        assert_eq!(protocol(&both), Protocol::Grpc);
    }

    #[test]
    fn an_unknown_or_unsupported_protocol_is_refused_with_its_variable() {
        let err = export(&[AT, (TRACES_PROTOCOL, "http/xml")]).unwrap_err();
        assert_eq!(
            err,
            TelemetryError::UnknownProtocol {
                variable: TRACES_PROTOCOL,
                value: "http/xml".into()
            }
        );
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=\"http/xml\"")
        );
        assert_eq!(
            export(&[AT, (PROTOCOL, "http/json")]),
            Err(TelemetryError::JsonProtocol { variable: PROTOCOL })
        );
    }

    #[test]
    fn an_https_endpoint_is_refused_for_http_only() {
        let https = (ENDPOINT, "HTTPS://collector:4318");
        assert_eq!(
            export(&[https, (PROTOCOL, "http/protobuf")]),
            Err(TelemetryError::HttpsEndpoint { variable: ENDPOINT })
        );
        // gRPC keeps its own handling of an https endpoint.
        assert_eq!(protocol(&[https]), Protocol::Grpc);
    }

    #[test]
    fn the_traces_timeout_wins_and_a_malformed_one_is_ignored() {
        let timeout = |vars: &[(&str, &str)]| export(vars).unwrap().unwrap().timeout;
        assert_eq!(timeout(&[AT]), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout(&[AT, (TIMEOUT, "2500")]),
            Duration::from_millis(2500)
        );
        assert_eq!(
            timeout(&[AT, (TIMEOUT, "2500"), (TRACES_TIMEOUT, "700")]),
            Duration::from_millis(700)
        );
        assert_eq!(timeout(&[AT, (TIMEOUT, "soon")]), DEFAULT_TIMEOUT);
    }

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
