//! The spans the binary exports and the log lines that name them: a publish continues its
//! producer's trace, a read span is a root linked to the producers' contexts, a flush span is a
//! child of its read linked to the producers' and the client's, with the flush's figures and an
//! error status when it failed. Over OTLP/gRPC and OTLP/HTTP to in-process receivers, each
//! context linked once; the JSON log lines of a read, its flush and a failed flush carry their
//! spans' ids.

use std::collections::HashMap;

use fred::prelude::*;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::telemetry::{
    CLIENT, PRODUCER, ack_with, answer_reads, json_lines, open_orders, publish_traced,
    start_http_receiver, start_receiver, traced_env, traced_with,
};
use window_sidecar_harness::{RedisServer, SidecarProcess, connect_client, free_port};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone()?.value)
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(AnyValue::IntValue(v)) => v,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

/// The sidecar binary with OTLP export to `otlp` and JSON logs; stderr lines are collected.
fn traced(redis: &str, listen: &str, otlp: &str) -> SidecarProcess {
    traced_with(redis, listen, otlp, &[], "info")
}

/// The `trace_id` and `span_id` of the log line with this message (exactly one).
fn logged_ids(lines: &[serde_json::Value], message: &str) -> (String, String) {
    let found: Vec<_> = lines.iter().filter(|l| l["message"] == message).collect();
    assert_eq!(found.len(), 1, "{message:?} in {lines:#?}");
    let id = |key: &str| {
        found[0][key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} on {}", found[0]))
            .to_owned()
    };
    (id("trace_id"), id("span_id"))
}

/// A run traced over OTLP/gRPC: a producer with its own trace context publishes an order,
/// another entry is written with none; the first read's side effect succeeds (acked with the
/// client's context), the second's fails (WRONGTYPE). The sidecar has stopped: every span was
/// exported and every line logged.
struct TracedRun {
    spans: Vec<Span>,
    /// The one delivery of each read, in order.
    deliveries: Vec<proto::Delivery>,
    /// OTLP/HTTP requests the receiver got (none expected).
    http_requests: Vec<(String, String)>,
    sidecar: SidecarProcess,
    _redis: RedisServer,
}

impl TracedRun {
    async fn run() -> TracedRun {
        let (receiver, otlp) = start_receiver().await;
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        let _: () = inspect
            .set("a-string", "x", None, None, false)
            .await
            .unwrap();
        let listen = format!("127.0.0.1:{}", free_port());
        let mut sidecar = traced(&redis.url(), &listen, &otlp);
        let mut client = connect_client(&listen).await;

        publish_traced(&mut client, 1).await;
        // Another entry is written without any context, straight to Redis.
        let _: String = inspect
            .xadd("orders", false, None, "*", vec![("plain", "1")])
            .await
            .unwrap();

        let (tx, requests) = open_orders(1).await;
        let mut stream = client.subscribe(requests).await.unwrap().into_inner();
        let (reads, reports) = answer_reads(&tx, &mut stream, 2, |read, answered, _| {
            let slot = read.deliveries[0].slot;
            // The first read's side effect succeeds, the second's fails (WRONGTYPE).
            if answered == 0 {
                let client_context = proto::TraceContext {
                    traceparent: CLIENT.into(),
                    tracestate: String::new(),
                };
                ack_with(
                    slot,
                    "INCR",
                    vec!["ok-counter".into()],
                    Some(client_context),
                )
            } else {
                ack_with(slot, "LPUSH", vec!["a-string".into(), "v".into()], None)
            }
        })
        .await;
        assert!(reports[0].ok);
        assert!(!reports[1].ok);
        drop(tx);
        drop(stream);
        sidecar.terminate();

        let spans = receiver.spans.lock().unwrap().clone();
        let http_requests = receiver.http_requests.lock().unwrap().clone();
        TracedRun {
            spans,
            deliveries: reads.iter().map(|r| r.deliveries[0].clone()).collect(),
            http_requests,
            sidecar,
            _redis: redis,
        }
    }

    fn named(&self, name: &str) -> Vec<&Span> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    /// The span `name` of read `read_id`.
    fn of_read(&self, name: &str, read_id: i64) -> &Span {
        self.named(name)
            .into_iter()
            .find(|s| int(s, "window.read_id") == read_id)
            .unwrap_or_else(|| panic!("no {name} of read {read_id} in {:#?}", self.spans))
    }

    /// The publish span's id (there is one).
    fn publish_span(&self) -> String {
        let publish = self.named("window.publish");
        assert_eq!(publish.len(), 1, "{:#?}", self.spans);
        hex(&publish[0].span_id)
    }
}

// Multi-threaded: the in-process receiver must keep answering while the test thread waits for
// the sidecar to exit (it exports its last spans on the way out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_continues_the_producers_trace() {
    let run = TracedRun::run().await;
    let publish = run.named("window.publish");
    assert_eq!(publish.len(), 1, "{:#?}", run.spans);
    assert_eq!(hex(&publish[0].trace_id), &PRODUCER[3..35]);
    assert_eq!(hex(&publish[0].parent_span_id), &PRODUCER[36..52]);
}

/// A read span is a root linked to the producer's context; the first delivery carries the
/// producer's (publish span's) context, the second, which came with none, its read span's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_spans_link_the_producer_and_deliveries_carry_a_context() {
    let run = TracedRun::run().await;
    let producer_trace = &PRODUCER[3..35];
    let publish_span = run.publish_span();
    let first_trace = run.deliveries[0]
        .trace
        .as_ref()
        .unwrap()
        .traceparent
        .clone();
    assert_eq!(
        first_trace,
        format!("00-{producer_trace}-{publish_span}-01")
    );
    let reads = run.named("window.read");
    assert_eq!(reads.len(), 2, "{:#?}", run.spans);
    let by_read: HashMap<i64, &Span> = reads
        .iter()
        .map(|s| (int(s, "window.read_id"), *s))
        .collect();
    let read1 = by_read[&1];
    let read2 = by_read[&2];
    assert!(read1.parent_span_id.is_empty(), "a read span is a root");
    assert_eq!(read1.links.len(), 1);
    assert_eq!(hex(&read1.links[0].trace_id), producer_trace);
    assert_eq!(hex(&read1.links[0].span_id), publish_span);
    assert!(read2.links.is_empty(), "no producer context, still a trace");
    let second_trace = &run.deliveries[1].trace.as_ref().unwrap().traceparent;
    assert_eq!(
        second_trace,
        &format!("00-{}-{}-01", hex(&read2.trace_id), hex(&read2.span_id))
    );
}

/// One flush span per read, a child of its read span, linked to producer and client, with the
/// flush's figures; a failed flush's span has an error status. Over gRPC unless a variable
/// says otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_spans_are_children_of_their_read_linked_to_producer_and_client() {
    let run = TracedRun::run().await;
    let producer_trace = &PRODUCER[3..35];
    let publish_span = run.publish_span();
    let read1 = run.of_read("window.read", 1);
    let flushes = run.named("window.flush");
    assert_eq!(flushes.len(), 2, "{:#?}", run.spans);
    let flush1 = run.of_read("window.flush", 1);
    assert_eq!(flush1.trace_id, read1.trace_id);
    assert_eq!(flush1.parent_span_id, read1.span_id);
    let links: Vec<(String, String)> = flush1
        .links
        .iter()
        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
        .collect();
    assert!(
        links.contains(&(producer_trace.to_owned(), publish_span)),
        "{links:?}"
    );
    assert!(
        links.contains(&(CLIENT[3..35].to_owned(), CLIENT[36..52].to_owned())),
        "{links:?}"
    );
    for (key, value) in [
        ("window.deliveries", 1),
        ("window.segments.kept", 1),
        ("window.segments.dropped", 0),
        ("window.commands", 1),
        ("window.settles", 1),
        ("window.outcomes.ack", 1),
        ("window.outcomes.drop", 0),
        ("window.outcomes.dead_letter", 0),
    ] {
        assert_eq!(int(flush1, key), value, "{key}");
    }
    assert!(
        matches!(attr(flush1, "window.subscription"), Some(AnyValue::StringValue(s)) if s == "orders")
    );
    assert!(matches!(attr(flush1, "window.form"), Some(AnyValue::StringValue(s)) if s == "stream"));
    assert!(
        matches!(attr(flush1, "window.mode"), Some(AnyValue::StringValue(s)) if s == "pipeline")
    );
    assert_ne!(
        flush1.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    let flush2 = run.of_read("window.flush", 2);
    let status = flush2.status.as_ref().unwrap();
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(status.message.contains("WRONGTYPE"), "{}", status.message);
    assert!(
        run.http_requests.is_empty(),
        "gRPC unless a variable says otherwise"
    );
}

/// Every log line is JSON; the subscription's open, failed flush and close are there, and the
/// failed flush's line names its span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_json_and_the_failed_flushs_line_names_its_span() {
    let run = TracedRun::run().await;
    let flush2 = run.of_read("window.flush", 2);
    assert_eq!(
        logged_ids(&json_lines(&run.sidecar), "flush failed"),
        (hex(&flush2.trace_id), hex(&flush2.span_id))
    );
    let lines = run.sidecar.lines();
    assert!(!lines.is_empty());
    let mut messages = Vec::new();
    for line in &lines {
        let json: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        messages.push(json["message"].as_str().unwrap_or_default().to_owned());
    }
    for expected in [
        "subscription opened",
        "flush failed",
        "subscription closed",
        "window-sidecar stopped",
    ] {
        assert!(
            messages.iter().any(|m| m == expected),
            "no {expected:?} in {messages:?}"
        );
    }
}

/// A run exporting over OTLP/HTTP (the protocol variable says http/protobuf, the generic
/// endpoint given) with debug logs: four entries of one Publish with the producer's context,
/// read at once and acked with one client context. The sidecar has stopped.
struct HttpRun {
    spans: Vec<Span>,
    requests: Vec<(String, String)>,
    sidecar: SidecarProcess,
    _redis: RedisServer,
}

impl HttpRun {
    async fn run() -> HttpRun {
        let (receiver, otlp) = start_http_receiver().await;
        let redis = RedisServer::start();
        let listen = format!("127.0.0.1:{}", free_port());
        let mut sidecar = traced_env(
            &redis.url(),
            &listen,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ],
            &[],
            "info,window_sidecar=debug",
        );
        let mut client = connect_client(&listen).await;
        publish_traced(&mut client, 4).await;

        let (tx, requests) = open_orders(4).await;
        let mut stream = client.subscribe(requests).await.unwrap().into_inner();
        let (_, reports) = answer_reads(&tx, &mut stream, 1, |read, _, _| {
            assert_eq!(read.deliveries.len(), 4, "one read of the four entries");
            let slots = read.deliveries.iter().map(|d| d.slot);
            proto::Batch {
                commands: slots
                    .clone()
                    .map(|slot| proto::QueuedCommand {
                        slot,
                        name: "INCR".into(),
                        args: vec!["counter".into()],
                    })
                    .collect(),
                outcomes: slots
                    .map(|slot| proto::Outcome {
                        slot,
                        kind: OutcomeKind::Ack as i32,
                        trace: Some(proto::TraceContext {
                            traceparent: CLIENT.into(),
                            tracestate: String::new(),
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }
        })
        .await;
        assert!(reports[0].ok);
        drop(tx);
        drop(stream);
        sidecar.terminate();

        let requests = receiver.http_requests.lock().unwrap().clone();
        let spans = receiver.spans.lock().unwrap().clone();
        HttpRun {
            spans,
            requests,
            sidecar,
            _redis: redis,
        }
    }

    /// The one span `name`.
    fn one(&self, name: &str) -> &Span {
        let named: Vec<&Span> = self.spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(named.len(), 1, "{:#?}", self.spans);
        named[0]
    }
}

/// Over OTLP/HTTP when the protocol variable says http/protobuf, at the generic endpoint with
/// `/v1/traces` appended, protobuf bodies; the start-up line says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_over_http_when_the_protocol_says_http_protobuf() {
    let run = HttpRun::run().await;
    assert!(!run.requests.is_empty(), "spans were exported over HTTP");
    for (path, content_type) in &run.requests {
        assert_eq!(path, "/v1/traces");
        assert_eq!(content_type, "application/x-protobuf");
    }
    let lines = json_lines(&run.sidecar);
    let started = lines
        .iter()
        .find(|l| l["message"] == "exporting traces over OTLP")
        .expect("the export is logged");
    assert_eq!(started["protocol"], "http/protobuf");
}

/// Four entries of one Publish, acked with one client context: the read and flush spans link
/// each context once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_and_flush_spans_link_each_context_once() {
    let run = HttpRun::run().await;
    let producer = (PRODUCER[3..35].to_owned(), PRODUCER[36..52].to_owned());
    let client_context = (CLIENT[3..35].to_owned(), CLIENT[36..52].to_owned());
    let publish = run.one("window.publish");
    assert_eq!(hex(&publish.trace_id), producer.0);
    let publish_span = (producer.0, hex(&publish.span_id));
    let links = |span: &Span| -> Vec<(String, String)> {
        span.links
            .iter()
            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
            .collect()
    };

    let read = run.one("window.read");
    assert_eq!(int(read, "window.deliveries"), 4);
    assert_eq!(links(read), vec![publish_span.clone()]);
    let flush = run.one("window.flush");
    assert_eq!(flush.parent_span_id, read.span_id);
    assert_eq!(links(flush), vec![publish_span, client_context]);
    for (key, value) in [
        ("window.read_id", 1),
        ("window.deliveries", 4),
        ("window.segments.kept", 4),
        ("window.commands", 4),
        ("window.settles", 4),
        ("window.outcomes.ack", 4),
        ("window.failed", 0),
    ] {
        assert_eq!(int(flush, key), value, "{key}");
    }
    assert!(
        matches!(attr(flush, "window.subscription"), Some(AnyValue::StringValue(s)) if s == "orders")
    );
}

/// The debug lines about the read and the flush carry their spans' ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_lines_of_a_read_and_its_flush_carry_their_spans_ids() {
    let run = HttpRun::run().await;
    let read = run.one("window.read");
    let flush = run.one("window.flush");
    let lines = json_lines(&run.sidecar);
    assert_eq!(
        logged_ids(&lines, "read"),
        (hex(&read.trace_id), hex(&read.span_id))
    );
    assert_eq!(
        logged_ids(&lines, "flushed"),
        (hex(&flush.trace_id), hex(&flush.span_id))
    );
}
