//! Logs and traces, set up in one place. Logs: `tracing` with `RUST_LOG` filtering, plain or
//! JSON lines on stderr. Traces: OpenTelemetry spans exported over OTLP (gRPC or
//! HTTP/protobuf) or printed on stdout, configured by the standard `OTEL_*` variables as the
//! SDK environment-variable specification defines them, and off unless one asks for them. Also
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
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
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
/// The SDK's general variables: which exporters, all of it off, which spans are sampled.
const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";

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

/// How spans are sent over OTLP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpExport {
    pub protocol: Protocol,
    /// A request's deadline, retries included (`OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`, ms).
    pub timeout: Duration,
}

/// Which root spans are recorded (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`); a span
/// with a parent follows its parent's decision when `parent_based`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub parent_based: bool,
    /// The share of root spans recorded: 1 for `always_on`, 0 for `always_off`.
    pub ratio: f64,
}

impl Default for Sampling {
    /// The spec's default, `parentbased_always_on`.
    fn default() -> Self {
        Self {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

impl Sampling {
    fn sampler(self) -> Sampler {
        let root = if self.ratio >= 1.0 {
            Sampler::AlwaysOn
        } else if self.ratio <= 0.0 {
            Sampler::AlwaysOff
        } else {
            Sampler::TraceIdRatioBased(self.ratio)
        };
        if self.parent_based {
            Sampler::ParentBased(Box::new(root))
        } else {
            root
        }
    }
}

/// Where spans go, worked out once at start from the environment: over OTLP, on stdout, or
/// both.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceExport {
    /// Over OTLP: `OTEL_TRACES_EXPORTER` names `otlp`, or is unset and an endpoint is set.
    pub otlp: Option<OtlpExport>,
    /// Printed on stdout, one block per span: `OTEL_TRACES_EXPORTER` names `console`.
    pub console: bool,
    pub sampling: Sampling,
    /// What a variable said that the sidecar ignored, logged as a warning once logs are up.
    pub warnings: Vec<String>,
}

/// An `OTEL_*` setting the sidecar cannot honour: it refuses to start rather than lose its
/// spans.
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
    #[error(
        "OTEL_TRACES_EXPORTER={value:?}: {exporter:?} is not a trace exporter of the sidecar; use otlp, console or none, or a comma-separated list of otlp and console"
    )]
    UnknownExporter { value: String, exporter: String },
    #[error(
        "OTEL_TRACES_EXPORTER={value:?} names none with other exporters; use none alone to turn traces off"
    )]
    NoneWithOthers { value: String },
}

/// The exporters `OTEL_TRACES_EXPORTER` names: a comma-separated list, matched without regard
/// to case; `None` when it names none (empty is unset).
fn exporters(value: &str) -> Result<Option<(bool, bool)>, TelemetryError> {
    let (mut otlp, mut console, mut none) = (false, false, false);
    let mut named = false;
    for exporter in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        named = true;
        match exporter.to_ascii_lowercase().as_str() {
            "otlp" => otlp = true,
            "console" => console = true,
            "none" => none = true,
            _ => {
                return Err(TelemetryError::UnknownExporter {
                    value: value.to_owned(),
                    exporter: exporter.to_owned(),
                });
            }
        }
    }
    if none && (otlp || console) {
        return Err(TelemetryError::NoneWithOthers {
            value: value.to_owned(),
        });
    }
    Ok(named.then_some((otlp, console)))
}

/// `OTEL_TRACES_SAMPLER` and its argument, as the spec reads them: an unknown sampler is
/// warned about and the default taken, a ratio that is not a number in [0, 1] too (1).
fn sampling(sampler: Option<String>, arg: Option<String>, warnings: &mut Vec<String>) -> Sampling {
    let Some(sampler) = sampler else {
        return Sampling::default();
    };
    let mut ratio = || match arg.as_deref().map(str::parse::<f64>) {
        None => 1.0,
        Some(Ok(ratio)) if (0.0..=1.0).contains(&ratio) => ratio,
        Some(_) => {
            warnings.push(format!(
                "{SAMPLER_ARG}={:?} is not a probability between 0 and 1; sampling with 1",
                arg.as_deref().unwrap_or_default()
            ));
            1.0
        }
    };
    let (parent_based, ratio) = match sampler.to_ascii_lowercase().as_str() {
        "always_on" => (false, 1.0),
        "always_off" => (false, 0.0),
        "traceidratio" => (false, ratio()),
        "parentbased_always_on" => (true, 1.0),
        "parentbased_always_off" => (true, 0.0),
        "parentbased_traceidratio" => (true, ratio()),
        _ => {
            warnings.push(format!(
                "{SAMPLER}={sampler:?} is not a sampler of the sidecar (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio); sampling with parentbased_always_on"
            ));
            return Sampling::default();
        }
    };
    Sampling {
        parent_based,
        ratio,
    }
}

impl TraceExport {
    /// The export the process environment asks for; `None` when traces are off.
    pub fn from_env() -> Result<Option<Self>, TelemetryError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The export the variables `var` returns ask for. `OTEL_TRACES_EXPORTER` names the
    /// exporters (`otlp`, `console`, or `none`); unset, spans go over OTLP when an endpoint is
    /// set and nowhere otherwise. `OTEL_SDK_DISABLED=true` turns everything off. An empty
    /// variable is unset, as the spec says; an exporter or OTLP protocol the sidecar does not
    /// have is an error, even while traces are off.
    pub fn from_lookup(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TelemetryError> {
        let var = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut warnings = Vec::new();
        let named = match var(TRACES_EXPORTER) {
            Some(value) => exporters(&value)?,
            None => None,
        };
        let disabled = match var(SDK_DISABLED) {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(v) => {
                warnings.push(format!(
                    "{SDK_DISABLED}={v:?} is neither true nor false; taken as false"
                ));
                false
            }
        };
        let endpoint = [TRACES_ENDPOINT, ENDPOINT]
            .into_iter()
            .find_map(|name| Some((name, var(name)?)));
        let (otlp, console) = named.unwrap_or((endpoint.is_some(), false));
        if disabled || !(otlp || console) {
            return Ok(None);
        }
        let otlp = if otlp {
            Some(OtlpExport::from_vars(&var, endpoint)?)
        } else {
            None
        };
        let sampling = sampling(var(SAMPLER), var(SAMPLER_ARG), &mut warnings);
        Ok(Some(Self {
            otlp,
            console,
            sampling,
            warnings,
        }))
    }
}

impl OtlpExport {
    /// The protocol and timeout; `endpoint` is the one set, with its variable, if any (the
    /// exporter's default, `localhost` at the protocol's port, otherwise).
    fn from_vars(
        var: &impl Fn(&str) -> Option<String>,
        endpoint: Option<(&'static str, String)>,
    ) -> Result<Self, TelemetryError> {
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
        if let Some((endpoint_var, endpoint)) = endpoint {
            let https = endpoint
                .get(..8)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
            if protocol == Protocol::HttpProtobuf && https {
                return Err(TelemetryError::HttpsEndpoint {
                    variable: endpoint_var,
                });
            }
        }
        // Like the exporter itself, a timeout that is not a number of milliseconds is ignored.
        let timeout = [TRACES_TIMEOUT, TIMEOUT]
            .into_iter()
            .find_map(|name| var(name)?.parse().ok())
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        Ok(Self { protocol, timeout })
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
    for warning in &export.warnings {
        tracing::warn!("{warning}");
    }
    let mut builder = SdkTracerProvider::builder().with_sampler(export.sampling.sampler());
    let mut exporting = false;
    if let Some(otlp) = &export.otlp {
        match otlp_exporter(otlp) {
            Ok(exporter) => {
                builder = builder.with_batch_exporter(exporter);
                exporting = true;
                let protocol = match otlp.protocol {
                    Protocol::Grpc => "grpc",
                    Protocol::HttpProtobuf => "http/protobuf",
                };
                tracing::info!(protocol, "exporting traces over OTLP");
            }
            Err(err) => {
                tracing::error!(error = %err, "OTLP trace exporter could not be built; no spans go over OTLP");
            }
        }
    }
    if export.console {
        // Batched like OTLP, from the processor's own thread: a slow reader of stdout holds
        // up that thread, never a flush (it drops spans past OTEL_BSP_MAX_QUEUE_SIZE).
        builder = builder.with_batch_exporter(opentelemetry_stdout::SpanExporter::default());
        exporting = true;
        tracing::info!("printing traces on stdout (OTEL_TRACES_EXPORTER=console)");
    }
    if !exporting {
        tracing::error!("no trace exporter could be built; traces are off");
        return None;
    }
    // The resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the batch
    // processors read OTEL_BSP_*.
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !env_set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name(TRACER);
    }
    let provider = builder.with_resource(resource.build()).build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Some(provider)
}

/// The OTLP exporter. It reads the other OTEL_EXPORTER_OTLP_* variables (endpoint, headers,
/// compression) itself; for http/protobuf it appends /v1/traces to the generic endpoint and
/// takes the signal-specific one as it is.
fn otlp_exporter(
    export: &OtlpExport,
) -> Result<opentelemetry_otlp::SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    match export.protocol {
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
    }
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
        export(vars).unwrap().unwrap().otlp.unwrap().protocol
    }

    /// Whether spans go over OTLP and whether they are printed.
    fn exporters(vars: &[(&str, &str)]) -> (bool, bool) {
        let export = export(vars).unwrap().unwrap();
        (export.otlp.is_some(), export.console)
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
    fn the_traces_exporter_names_the_exporters() {
        const EXPORTER: &str = "OTEL_TRACES_EXPORTER";
        // Unset: over OTLP when an endpoint is set (above), nowhere otherwise.
        assert_eq!(exporters(&[AT, (EXPORTER, "")]), (true, false));
        assert_eq!(exporters(&[AT, (EXPORTER, "otlp")]), (true, false));
        // console alone prints, whatever endpoint is set.
        assert_eq!(exporters(&[(EXPORTER, "console")]), (false, true));
        assert_eq!(exporters(&[AT, (EXPORTER, " Console ")]), (false, true));
        assert_eq!(exporters(&[(EXPORTER, "console,otlp")]), (true, true));
        assert_eq!(exporters(&[AT, (EXPORTER, "otlp, console,")]), (true, true));
        // otlp without an endpoint uses the exporter's default (localhost).
        assert_eq!(exporters(&[(EXPORTER, "otlp")]), (true, false));
        assert_eq!(export(&[AT, (EXPORTER, "NONE")]), Ok(None));
        assert_eq!(
            export(&[(EXPORTER, "console"), ("OTEL_SDK_DISABLED", "TRUE")]),
            Ok(None)
        );
    }

    #[test]
    fn an_unknown_traces_exporter_is_refused_with_its_variable() {
        const EXPORTER: &str = "OTEL_TRACES_EXPORTER";
        for value in ["zipkin", "otlp,logging", "stdout"] {
            let err = export(&[AT, (EXPORTER, value)]).unwrap_err();
            assert!(
                matches!(&err, TelemetryError::UnknownExporter { value: v, .. } if v == value),
                "{err:?}"
            );
            let message = err.to_string();
            assert!(message.starts_with("OTEL_TRACES_EXPORTER="), "{message}");
            assert!(message.contains("otlp, console or none"), "{message}");
        }
        // Refused even while traces are off: a typo is found before it matters.
        assert!(export(&[(EXPORTER, "consol"), ("OTEL_SDK_DISABLED", "true")]).is_err());
        assert_eq!(
            export(&[(EXPORTER, "none,console")]),
            Err(TelemetryError::NoneWithOthers {
                value: "none,console".into()
            })
        );
    }

    #[test]
    fn the_sampler_is_read_as_the_spec_says_and_an_unknown_one_warned_about() {
        let console = ("OTEL_TRACES_EXPORTER", "console");
        let sampled = |vars: &[(&str, &str)]| {
            let export = export(vars).unwrap().unwrap();
            (export.sampling, export.warnings)
        };
        let on = Sampling::default();
        assert_eq!(sampled(&[console]), (on, vec![]));
        let ratio = |parent_based, ratio| Sampling {
            parent_based,
            ratio,
        };
        for (sampler, arg, expected) in [
            ("always_on", None, ratio(false, 1.0)),
            ("ALWAYS_OFF", None, ratio(false, 0.0)),
            ("traceidratio", Some("0.25"), ratio(false, 0.25)),
            ("traceidratio", None, ratio(false, 1.0)),
            ("parentbased_always_off", None, ratio(true, 0.0)),
            ("parentbased_traceidratio", Some("0.5"), ratio(true, 0.5)),
        ] {
            let mut vars = vec![console, ("OTEL_TRACES_SAMPLER", sampler)];
            vars.extend(arg.map(|a| ("OTEL_TRACES_SAMPLER_ARG", a)));
            assert_eq!(sampled(&vars), (expected, vec![]), "{sampler} {arg:?}");
        }
        let (sampling, warnings) = sampled(&[console, ("OTEL_TRACES_SAMPLER", "sometimes")]);
        assert_eq!(sampling, on);
        assert!(
            warnings[0].starts_with("OTEL_TRACES_SAMPLER=\"sometimes\""),
            "{warnings:?}"
        );
        let (sampling, warnings) = sampled(&[
            console,
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ]);
        assert_eq!(sampling, ratio(false, 1.0));
        assert!(
            warnings[0].starts_with("OTEL_TRACES_SAMPLER_ARG=\"1.5\""),
            "{warnings:?}"
        );
        let (_, warnings) = sampled(&[console, ("OTEL_SDK_DISABLED", "yes")]);
        assert!(
            warnings[0].starts_with("OTEL_SDK_DISABLED=\"yes\""),
            "{warnings:?}"
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
        let timeout = |vars: &[(&str, &str)]| export(vars).unwrap().unwrap().otlp.unwrap().timeout;
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
