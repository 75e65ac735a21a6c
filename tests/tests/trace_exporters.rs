//! Where spans go, as the OpenTelemetry variables say: over gRPC or HTTP, the traces variables
//! winning over the generic ones; printed on stdout (`console`), nowhere (`none`) or to each
//! exporter of a list; sampled as `OTEL_TRACES_SAMPLER` says. A protocol or an exporter the
//! sidecar does not have is a configuration error, rather than a sidecar that looks traced and
//! exports nothing.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use window_sidecar::proto;
use window_sidecar_harness::telemetry::{
    CLIENT, OTLP_VARIABLES, PRODUCER, Receiver, ack_with, answer_reads, open_orders,
    publish_traced, start_http_receiver, start_receiver, traced_env,
};
use window_sidecar_harness::{RedisServer, SidecarProcess, connect_client, free_port, sidecar_bin};

/// The traces variables win over the generic ones, and a signal-specific endpoint is used as
/// it is: `…_TRACES_PROTOCOL=http/protobuf` over `…_PROTOCOL=grpc` posts to the traces
/// endpoint's own path, and `…_TRACES_PROTOCOL=grpc` over `…_PROTOCOL=http/protobuf` exports
/// over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traces_protocol_and_endpoint_win_over_the_generic_ones() {
    let (http, http_otlp) = start_http_receiver().await;
    let (grpc, grpc_otlp) = start_receiver().await;
    let redis = RedisServer::start();
    let traces_endpoint = format!("{http_otlp}/collector/traces");
    let runs: [&[(&str, &str)]; 2] = [
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &grpc_otlp),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces_endpoint),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &http_otlp),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &grpc_otlp),
        ],
    ];
    for (run, otlp) in runs.iter().enumerate() {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut sidecar = traced_env(&redis.url(), &listen, otlp, &[], "info");
        let mut client = connect_client(&listen).await;
        publish_traced(&mut client, 1).await;
        sidecar.terminate();
        let (to, other) = if run == 0 {
            (&http, &grpc)
        } else {
            (&grpc, &http)
        };
        let published = |r: &Receiver| {
            r.spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.name == "window.publish")
                .count()
        };
        assert_eq!(published(to), 1, "run {run}");
        assert_eq!(published(other), 0, "run {run}");
        to.spans.lock().unwrap().clear();
    }
    let paths: Vec<String> = http
        .http_requests
        .lock()
        .unwrap()
        .iter()
        .map(|(path, _)| path.clone())
        .collect();
    assert!(!paths.is_empty());
    assert!(paths.iter().all(|p| p == "/collector/traces"), "{paths:?}");
}

/// A protocol the sidecar cannot speak is a configuration error (exit 64) naming the variable,
/// for `--check-config` and at start alike, before anything is connected.
#[test]
fn an_unknown_otlp_protocol_is_a_configuration_error() {
    for (variable, value, expected) in [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "http/xml",
            "OTEL_EXPORTER_OTLP_PROTOCOL=\"http/xml\" is not an OTLP protocol",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "http/json",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json is not supported",
        ),
    ] {
        for check in [true, false] {
            let mut command = Command::new(sidecar_bin());
            for name in OTLP_VARIABLES {
                command.env_remove(name);
            }
            if check {
                command.arg("--check-config");
            }
            let output = command
                .args(["--redis-url", "redis://127.0.0.1:1"])
                .args(["--listen", &format!("127.0.0.1:{}", free_port())])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
                .env(variable, value)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(64), "{stderr}");
            assert!(stderr.contains(expected), "{stderr}");
        }
    }
}

/// One span as the console exporter prints it on stdout.
#[derive(Debug, Default)]
struct PrintedSpan {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// Each attribute's value as printed (`I64(1)`, `String(Owned("orders"))`).
    attributes: HashMap<String, String>,
    /// The (trace id, span id) of each link.
    links: Vec<(String, String)>,
}

/// The spans printed on stdout: the lines that are not JSON log lines (those go to stderr), in
/// the exporter's layout, a block per span (`Span #0`, then `\tName : …` and the rest), and
/// the resource's `key=value` lines.
fn printed_spans(lines: &[String]) -> (Vec<PrintedSpan>, Vec<String>) {
    let mut spans: Vec<PrintedSpan> = Vec::new();
    let mut resource = Vec::new();
    let mut section = "";
    let mut link_trace = None;
    for line in lines.iter().filter(|l| !l.starts_with('{')) {
        let trimmed = line.trim();
        if trimmed == "Resource" || trimmed == "Spans" {
            section = trimmed;
            continue;
        }
        if trimmed.starts_with("Span #") {
            spans.push(PrintedSpan::default());
            section = "span";
            continue;
        }
        let Some(span) = spans.last_mut().filter(|_| section != "Resource") else {
            if let Some(kv) = trimmed.strip_prefix("->") {
                resource.push(kv.trim().to_owned());
            }
            continue;
        };
        let field = |prefix: &str| {
            trimmed
                .strip_prefix(prefix)
                .and_then(|rest| rest.trim_start().strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        if trimmed == "Attributes:" {
            section = "attributes";
        } else if trimmed == "Links:" || trimmed.starts_with("Link #") {
            section = "links";
        } else if trimmed == "Events:" {
            section = "events";
        } else if let Some(kv) = trimmed.strip_prefix("->") {
            if section == "attributes" {
                let (key, value) = kv.split_once(':').expect("key: value");
                span.attributes
                    .insert(key.trim().to_owned(), value.trim().to_owned());
            }
        } else if section == "links" {
            if let Some(trace) = field("TraceId") {
                link_trace = Some(trace);
            } else if let Some(id) = field("SpanId") {
                span.links
                    .push((link_trace.take().expect("a link's trace id"), id));
            }
        } else if let Some(name) = field("Name").filter(|_| section == "span") {
            // The instrumentation scope's name is quoted, the span's is not.
            if !name.starts_with('"') {
                span.name = name;
            }
        } else if let Some(id) = field("TraceId") {
            span.trace_id = id;
        } else if let Some(id) = field("SpanId") {
            span.span_id = id;
        } else if let Some(id) = field("ParentSpanId") {
            span.parent_span_id = id;
        }
    }
    (spans, resource)
}

/// Publishes one order with the producer's context, reads it and acks it with one command
/// and the client's context; returns once its flush was reported.
async fn flush_one_order(listen: &str) {
    let mut client = connect_client(listen).await;
    publish_traced(&mut client, 1).await;
    let (tx, requests) = open_orders(1).await;
    let mut stream = client.subscribe(requests).await.unwrap().into_inner();
    let (_, reports) = answer_reads(&tx, &mut stream, 1, |read, _, _| {
        let client_context = proto::TraceContext {
            traceparent: CLIENT.into(),
            tracestate: String::new(),
        };
        let slot = read.deliveries[0].slot;
        ack_with(slot, "INCR", vec!["counter".into()], Some(client_context))
    })
    .await;
    assert!(reports[0].ok);
}

/// Waits until the lines of `sidecar` (which has stopped) contain `text`, or 5 s passed: its
/// output is read by threads of its own that may lag its exit.
async fn settle_output(sidecar: &SidecarProcess, text: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let lines = sidecar.lines();
        if lines.iter().any(|l| l.contains(text)) || std::time::Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `OTEL_TRACES_EXPORTER=console` prints every span on stdout, and nothing goes over OTLP even
/// though an endpoint is set: the flush span with each attribute docs/reference/runtime.md
/// names, a child of its read span in the same trace, linked to the producer's and the
/// client's contexts; the resource carries `OTEL_SERVICE_NAME`, and the log says where spans
/// go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_prints_the_flush_span_with_its_attributes() {
    let (receiver, otlp) = start_receiver().await;
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(
        &redis.url(),
        &listen,
        &[
            ("OTEL_TRACES_EXPORTER", "console"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
        ],
        &[],
        "info",
    );
    flush_one_order(&listen).await;
    sidecar.terminate();
    let lines = settle_output(&sidecar, "window.flush").await;

    let (spans, resource) = printed_spans(&lines);
    let named =
        |name: &str| -> Vec<&PrintedSpan> { spans.iter().filter(|s| s.name == name).collect() };
    let flushes = named("window.flush");
    assert_eq!(flushes.len(), 1, "{spans:#?}\n{}", lines.join("\n"));
    let flush = flushes[0];
    let read = named("window.read");
    assert_eq!(read.len(), 1, "{spans:#?}");
    let publish = named("window.publish");
    assert_eq!(publish.len(), 1, "{spans:#?}");
    assert_eq!(flush.trace_id, read[0].trace_id);
    assert_eq!(flush.parent_span_id, read[0].span_id);
    assert_eq!(publish[0].trace_id, &PRODUCER[3..35]);
    assert_eq!(
        flush.links,
        vec![
            (PRODUCER[3..35].to_owned(), publish[0].span_id.clone()),
            (CLIENT[3..35].to_owned(), CLIENT[36..52].to_owned()),
        ]
    );
    // Every attribute docs/reference/runtime.md (Traces) lists for window.flush, with this
    // flush's values.
    for (key, value) in [
        ("window.subscription", "\"orders\""),
        ("window.group", "\"g\""),
        ("window.consumer", "\"c\""),
        ("window.form", "\"stream\""),
        ("window.mode", "\"pipeline\""),
        ("window.read_id", "I64(1)"),
        ("window.deliveries", "I64(1)"),
        ("window.segments.kept", "I64(1)"),
        ("window.segments.dropped", "I64(0)"),
        ("window.commands", "I64(1)"),
        ("window.settles", "I64(1)"),
        ("window.abandoned", "I64(0)"),
        ("window.outcomes.ack", "I64(1)"),
        ("window.outcomes.drop", "I64(0)"),
        ("window.outcomes.retry", "I64(0)"),
        ("window.outcomes.retry_after", "I64(0)"),
        ("window.outcomes.dead_letter", "I64(0)"),
        ("window.failed", "I64(0)"),
        ("window.settle_failed", "Bool(false)"),
    ] {
        let printed = flush
            .attributes
            .get(key)
            .unwrap_or_else(|| panic!("no {key} on the flush span: {:#?}", flush.attributes));
        if value.starts_with('"') {
            assert!(
                printed.starts_with("String(") && printed.contains(value),
                "{key} is {printed}"
            );
        } else {
            assert_eq!(printed, value, "{key}");
        }
    }
    assert!(
        resource
            .iter()
            .any(|kv| kv.starts_with("service.name=") && kv.contains("\"window-sidecar-test\"")),
        "{resource:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("printing traces on stdout")),
        "the log says where spans go"
    );
    assert!(
        receiver.spans.lock().unwrap().is_empty(),
        "console alone sends nothing over OTLP"
    );
}

/// `OTEL_TRACES_EXPORTER=none` exports nothing while `OTEL_EXPORTER_OTLP_ENDPOINT` points at a
/// receiver, and prints nothing; `otlp,console` at the same receiver does both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_exports_nothing_and_a_list_exports_to_each() {
    let (receiver, otlp) = start_receiver().await;
    let redis = RedisServer::start();
    for exporter in ["none", "otlp,console"] {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut sidecar = traced_env(
            &redis.url(),
            &listen,
            &[
                ("OTEL_TRACES_EXPORTER", exporter),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
            ],
            &[],
            "info",
        );
        flush_one_order(&listen).await;
        sidecar.terminate();
        let exported: Vec<String> = receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if exporter == "none" {
            let lines = settle_output(&sidecar, "window-sidecar stopped").await;
            assert!(exported.is_empty(), "none exported {exported:?}");
            let (printed, _) = printed_spans(&lines);
            assert!(printed.is_empty(), "none printed {printed:#?}");
            assert!(
                !lines
                    .iter()
                    .any(|l| l.contains("traces over OTLP") || l.contains("on stdout")),
                "{}",
                lines.join("\n")
            );
        } else {
            let lines = settle_output(&sidecar, "window.flush").await;
            for name in ["window.publish", "window.read", "window.flush"] {
                assert!(
                    exported.iter().any(|n| n == name),
                    "no {name} in {exported:?}"
                );
            }
            let (printed, _) = printed_spans(&lines);
            assert!(
                printed.iter().any(|s| s.name == "window.flush"),
                "{printed:#?}"
            );
        }
    }
}

/// An exporter the sidecar does not have is a configuration error (exit 64) naming
/// `OTEL_TRACES_EXPORTER`, for `--check-config` and at start alike, rather than a sidecar that
/// looks traced and exports nothing.
#[test]
fn an_unknown_traces_exporter_is_a_configuration_error() {
    for value in ["zipkin", "console,logging"] {
        for check in [true, false] {
            let mut command = Command::new(sidecar_bin());
            for name in OTLP_VARIABLES {
                command.env_remove(name);
            }
            if check {
                command.arg("--check-config");
            }
            let output = command
                .args(["--redis-url", "redis://127.0.0.1:1"])
                .args(["--listen", &format!("127.0.0.1:{}", free_port())])
                .env("OTEL_TRACES_EXPORTER", value)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(64), "{stderr}");
            assert!(
                stderr.contains(&format!("OTEL_TRACES_EXPORTER={value:?}"))
                    && stderr.contains("use otlp, console or none"),
                "{stderr}"
            );
        }
    }
}

/// `OTEL_TRACES_SAMPLER` reaches the spans: `always_off` records none (nothing printed while the
/// delivery still flushes), and a sampler the sidecar does not know is logged as a warning
/// naming the variable, with the default sampler (every span printed) in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampler_variable_chooses_what_is_recorded() {
    let redis = RedisServer::start();
    for sampler in ["always_off", "sometimes"] {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut sidecar = traced_env(
            &redis.url(),
            &listen,
            &[
                ("OTEL_TRACES_EXPORTER", "console"),
                ("OTEL_TRACES_SAMPLER", sampler),
            ],
            &[],
            "info",
        );
        flush_one_order(&listen).await;
        sidecar.terminate();
        let awaited = if sampler == "always_off" {
            "window-sidecar stopped"
        } else {
            "window.flush"
        };
        let lines = settle_output(&sidecar, awaited).await;
        let (printed, _) = printed_spans(&lines);
        let warned: Vec<serde_json::Value> = lines
            .iter()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|l: &serde_json::Value| l["level"] == "WARN")
            .collect();
        if sampler == "always_off" {
            assert!(printed.is_empty(), "always_off printed {printed:#?}");
            assert!(warned.is_empty(), "{warned:#?}");
        } else {
            for name in ["window.publish", "window.read", "window.flush"] {
                assert!(printed.iter().any(|s| s.name == name), "no {name}");
            }
            assert!(
                warned.iter().any(|l| l["message"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("OTEL_TRACES_SAMPLER=\"sometimes\" is not a sampler")),
                "{warned:#?}"
            );
        }
    }
}
