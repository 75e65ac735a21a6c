//! Traces and logs of the real binary: spans exported over OTLP/gRPC and OTLP/HTTP to
//! in-process receivers, the variables that choose between them, and JSON log lines carrying
//! the ids of the spans they are about.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::metadata::MetadataValue;
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::subscribe_response::Kind as Response;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::{
    Launch, RedisServer, SidecarProcess, connect_client, free_port, ok_body, sidecar_bin,
};

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-b9c7c989f97918e1-01";

/// An OTLP trace receiver that keeps every span it is sent, and for OTLP/HTTP the path and
/// content type of each request.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    http_requests: Arc<Mutex<Vec<(String, String)>>>,
}

impl Receiver {
    fn keep(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }

    /// OTLP/HTTP with protobuf bodies: `POST` of an `ExportTraceServiceRequest` at any path
    /// (the test says which path the sidecar must use).
    async fn http_export(
        &self,
        method: axum::http::Method,
        uri: axum::http::Uri,
        headers: axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> (
        axum::http::StatusCode,
        [(&'static str, &'static str); 1],
        Vec<u8>,
    ) {
        use prost::Message;
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        self.http_requests
            .lock()
            .unwrap()
            .push((uri.path().to_owned(), content_type));
        let protobuf = [("content-type", "application/x-protobuf")];
        if method != axum::http::Method::POST {
            return (axum::http::StatusCode::METHOD_NOT_ALLOWED, protobuf, vec![]);
        }
        match ExportTraceServiceRequest::decode(body) {
            Ok(request) => self.keep(request),
            Err(_) => return (axum::http::StatusCode::BAD_REQUEST, protobuf, vec![]),
        }
        let response = ExportTraceServiceResponse {
            partial_success: None,
        };
        (
            axum::http::StatusCode::OK,
            protobuf,
            response.encode_to_vec(),
        )
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

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

/// The OTLP and SDK variables a test sets itself: none may come from the environment it runs
/// in.
const OTLP_VARIABLES: [&str; 8] = [
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
];

/// The sidecar binary with OTLP export to `otlp` and JSON logs; stderr lines are collected.
fn traced(redis: &str, listen: &str, otlp: &str) -> SidecarProcess {
    traced_with(redis, listen, otlp, &[], "info")
}

/// With extra flags and a log filter; stdout is collected with stderr.
fn traced_with(redis: &str, listen: &str, otlp: &str, extra: &[&str], log: &str) -> SidecarProcess {
    let otlp = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)];
    traced_env(redis, listen, &otlp, extra, log)
}

/// With the OTLP variables `otlp` (and no others).
fn traced_env(
    redis: &str,
    listen: &str,
    otlp: &[(&str, &str)],
    extra: &[&str],
    log: &str,
) -> SidecarProcess {
    let mut launch = Launch::new();
    for name in OTLP_VARIABLES {
        launch = launch.env_remove(name);
    }
    launch = launch
        .args([
            "--redis-url",
            redis,
            "--listen",
            listen,
            "--log-format",
            "json",
        ])
        .args(extra);
    for (name, value) in otlp {
        launch = launch.env(name, value);
    }
    launch
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_SERVICE_NAME", "window-sidecar-test")
        .env("RUST_LOG", log)
        .env("WINDOW_REDIS_TIMEOUT", "2s")
        .capture_stdout()
        .start()
}

/// An OTLP/HTTP receiver on a free port; returns it and its endpoint URL.
async fn start_http_receiver() -> (Receiver, String) {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let collector = receiver.clone();
    let app = axum::Router::new().fallback(move |method, uri, headers, body| {
        let collector = collector.clone();
        async move { collector.http_export(method, uri, headers, body).await }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (receiver, format!("http://{addr}"))
}

/// The JSON log lines of a run.
fn json_lines(sidecar: &SidecarProcess) -> Vec<serde_json::Value> {
    sidecar
        .lines()
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
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

/// An OTLP/gRPC receiver on a free port; returns it and its endpoint URL.
async fn start_receiver() -> (Receiver, String) {
    let receiver = Receiver::default();
    let otlp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp_addr = otlp.local_addr().unwrap();
    let collector = receiver.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector))
            .serve_with_incoming(TcpListenerStream::new(otlp))
            .await
    });
    (receiver, format!("http://{otlp_addr}"))
}

/// Sends the open of a subscription to `orders` (group `g`, consumer `c`, `count` per read)
/// on a new request stream; returns the stream's sender and what to subscribe with.
async fn open_orders(
    count: u32,
) -> (
    mpsc::Sender<proto::SubscribeRequest>,
    ReceiverStream<proto::SubscribeRequest>,
) {
    let (tx, rx) = mpsc::channel(8);
    let open = proto::Open {
        source: Some(proto::open::Source::Stream(proto::StreamSource {
            key: "orders".into(),
            group: "g".into(),
            consumer: "c".into(),
            ..Default::default()
        })),
        count,
        ..Default::default()
    };
    tx.send(proto::SubscribeRequest {
        kind: Some(Request::Open(open)),
    })
    .await
    .unwrap();
    (tx, ReceiverStream::new(rx))
}

/// Answers each read with `answer(read, reads answered, flush reports)` until `flushes` flush
/// reports came; returns the reads and the reports.
async fn answer_reads(
    tx: &mpsc::Sender<proto::SubscribeRequest>,
    stream: &mut tonic::Streaming<proto::SubscribeResponse>,
    flushes: usize,
    mut answer: impl FnMut(&proto::Read, usize, usize) -> proto::Batch,
) -> (Vec<proto::Read>, Vec<proto::FlushReport>) {
    let mut reads = Vec::new();
    let mut reports = Vec::new();
    while reports.len() < flushes {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("a message in time")
            .unwrap()
            .expect("the stream is open");
        match message.kind {
            Some(Response::Read(read)) => {
                let batch = answer(&read, reads.len(), reports.len());
                tx.send(proto::SubscribeRequest {
                    kind: Some(Request::Batch(batch)),
                })
                .await
                .unwrap();
                reads.push(read);
            }
            Some(Response::Flush(report)) => reports.push(report),
            _ => {}
        }
    }
    (reads, reports)
}

/// One command and the ack of the delivery in `slot`, with the client's context if any.
fn ack_with(
    slot: u64,
    name: &str,
    args: Vec<bytes::Bytes>,
    trace: Option<proto::TraceContext>,
) -> proto::Batch {
    proto::Batch {
        commands: vec![proto::QueuedCommand {
            slot,
            name: name.into(),
            args,
        }],
        outcomes: vec![proto::Outcome {
            slot,
            kind: OutcomeKind::Ack as i32,
            trace,
            ..Default::default()
        }],
        acks: vec![],
        ..Default::default()
    }
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

const REDIS_PASSWORD: &str = "rEdis-pw-8c41e7-SECRET";
const WRONG_PASSWORD: &str = "wr0ng-pw-55d0a2-SECRET";
const TOKEN: &str = "t0ken-3f9b21-SECRET";
const WRONG_TOKEN: &str = "wr0ng-t0ken-a7e6c4-SECRET";

/// Everything a run made visible, searched for each secret.
fn assert_no_secret(what: &str, text: &str) {
    for secret in [REDIS_PASSWORD, WRONG_PASSWORD, TOKEN, WRONG_TOKEN] {
        // Percent-encoded or not, the secrets are plain ASCII letters, digits and dashes.
        assert!(
            !text.contains(secret),
            "{what} contains the secret {secret:?}:\n{}",
            text.lines()
                .filter(|l| l.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Sends `Bearer <token>` with every request.
#[derive(Clone)]
struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

type WithToken = WindowServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// A channel to the sidecar at `listen`, once it accepts connections.
async fn channel_to(listen: &str) -> tonic::transport::Channel {
    loop {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{listen}"))
            .unwrap()
            .connect()
            .await
        {
            return channel;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn with_token(channel: tonic::transport::Channel, token: &str) -> WithToken {
    let bearer: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    WindowServiceClient::with_interceptor(channel, Bearer(bearer))
}

fn one_order() -> proto::PublishRequest {
    proto::PublishRequest {
        stream: "orders".into(),
        entries: vec![proto::PublishEntry {
            payload: "{}".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Kills Redis, publishes (refused), restarts it and publishes until the sidecar reconnected;
/// returns what the refused publish was told.
async fn bounce_redis(redis: &mut RedisServer, client: &mut WithToken) -> String {
    redis.kill();
    let down = client.publish(one_order()).await.unwrap_err();
    redis.restart();
    let mut published = false;
    for _ in 0..100 {
        if client.publish(one_order()).await.is_ok() {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published, "the sidecar did not reconnect");
    format!("{down:?}")
}

/// A run that used every credential, at the most verbose log level, with failures that put
/// connection details into errors: a wrong token, a flush failure, Redis restarting. No secret
/// may appear in its logs, traces, metrics, admin view or the errors clients get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_tokens_never_appear_in_logs_traces_metrics_or_errors() {
    let (receiver, otlp) = start_receiver().await;
    let mut redis = RedisServer::start_with_password(REDIS_PASSWORD);
    let dir = secrets_dir("run");
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();

    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let url = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}", redis.port());
    let token_path = token_file.to_str().unwrap();
    let mut sidecar = traced_with(
        &url,
        &listen,
        &otlp,
        &[
            "--auth-token-file",
            token_path,
            "--metrics-listen",
            &metrics,
        ],
        "debug",
    );
    let channel = channel_to(&listen).await;
    let mut client = with_token(channel.clone(), TOKEN);
    let mut intruder = with_token(channel, WRONG_TOKEN);
    let mut statuses = Vec::new();

    let refused = intruder.publish(one_order()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    statuses.push(format!("{refused:?}"));
    for _ in 0..3 {
        client.publish(one_order()).await.unwrap();
    }
    let inspect = redis.client_with_auth(None, REDIS_PASSWORD).await;
    let _: () = inspect
        .set("a-string", "x", None, None, false)
        .await
        .unwrap();

    let (tx, requests) = open_orders(1).await;
    let mut stream = client.subscribe(requests).await.unwrap().into_inner();
    let (_, reports) = answer_reads(&tx, &mut stream, 2, |read, _, reports| {
        let slot = read.deliveries[0].slot;
        // The second read's side effect fails (WRONGTYPE): an error in a report.
        if reports == 0 {
            ack_with(slot, "INCR", vec!["n".into()], None)
        } else {
            ack_with(slot, "LPUSH", vec!["a-string".into(), "v".into()], None)
        }
    })
    .await;
    statuses.extend(reports.iter().map(|report| format!("{report:?}")));

    // Redis goes away and comes back: connection errors are logged and reported.
    statuses.push(bounce_redis(&mut redis, &mut client).await);
    let metrics_body = ok_body(&metrics, "/metrics").await;
    assert!(metrics_body.contains("window_"), "{metrics_body}");
    let admin_body = ok_body(&metrics, "/subscriptions").await;
    drop(tx);
    drop(stream);
    sidecar.terminate();

    let lines = sidecar.lines().join("\n");
    assert!(
        lines.len() > 10_000,
        "a debug run logs a lot: {} bytes",
        lines.len()
    );
    assert_no_secret("the sidecar's output", &lines);
    assert_no_secret("/metrics", &metrics_body);
    assert_no_secret("/subscriptions", &admin_body);
    assert_no_secret("what clients were told", &statuses.join("\n"));
    let spans = format!("{:?}", receiver.spans.lock().unwrap());
    assert!(spans.contains("window.flush"), "spans were exported");
    assert_no_secret("the exported spans", &spans);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of this test process for the files that hold secrets.
fn secrets_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "window-sidecar-secrets-{}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A sidecar given the wrong Redis password, at the most verbose log level: its refusal must
/// not echo what it was given, in its output or its spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_redis_password_is_refused_without_being_echoed() {
    let (receiver, otlp) = start_receiver().await;
    let redis = RedisServer::start_with_password(REDIS_PASSWORD);
    let dir = secrets_dir("wrong-password");
    let wrong_password_file = dir.join("wrong-password");
    std::fs::write(&wrong_password_file, WRONG_PASSWORD).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut wrong = traced_with(
        &format!("redis://127.0.0.1:{}", redis.port()),
        &listen,
        &otlp,
        &[
            "--redis-password-file",
            wrong_password_file.to_str().unwrap(),
        ],
        "debug",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !wrong.lines().iter().any(|l| {
        l.contains("WRONGPASS")
            || l.contains("invalid username-password")
            || l.contains("NOT_SERVING")
            || l.contains("does not answer")
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the wrong password was never refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wrong.terminate();
    assert_no_secret("the second sidecar's output", &wrong.lines().join("\n"));
    assert_no_secret(
        "the exported spans",
        &format!("{:?}", receiver.spans.lock().unwrap()),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The configuration check echoes URLs in its errors: redacted.
#[test]
fn the_configuration_check_redacts_the_password_of_a_url() {
    let check = Command::new(sidecar_bin())
        .args([
            "--check-config",
            "--redis-url",
            &format!("http://user:{REDIS_PASSWORD}@host"),
        ])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(64));
    assert_no_secret(
        "--check-config's output",
        &String::from_utf8_lossy(&check.stderr),
    );
    assert_no_secret(
        "--check-config's output",
        &String::from_utf8_lossy(&check.stdout),
    );
}

/// Publishes `entries` entries in one call with the producer's context.
async fn publish_traced(
    client: &mut WindowServiceClient<tonic::transport::Channel>,
    entries: usize,
) {
    let mut publish = tonic::Request::new(proto::PublishRequest {
        stream: "orders".into(),
        entries: vec![
            proto::PublishEntry {
                payload: "{}".into(),
                ..Default::default()
            };
            entries
        ],
        ..Default::default()
    });
    publish
        .metadata_mut()
        .insert("traceparent", MetadataValue::from_static(PRODUCER));
    client.publish(publish).await.unwrap();
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

/// The closing log line says what the close flushed and what it left pending, as
/// `docs/reference/runtime.md` (Shutdown) promises: a read with one delivery acked and one
/// still out when SIGTERM's grace runs out is flushed at the close (the ack), and the other
/// stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closing_log_line_says_what_was_flushed_and_left_pending() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(
        &redis.url(),
        &listen,
        &[],
        &["--shutdown-grace", "300ms"],
        "info",
    );
    let mut client = connect_client(&listen).await;
    window_sidecar_harness::publish(&mut client, "closing", window_sidecar_harness::numbered(2))
        .await;
    let (mut sub, _) = window_sidecar_harness::Subscription::open(
        &mut client,
        window_sidecar_harness::stream_open("closing", "g", "c", 2),
    )
    .await
    .unwrap();
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 2);
    sub.send(
        vec![],
        vec![window_sidecar_harness::outcome(
            read.deliveries[0].slot,
            OutcomeKind::Ack,
        )],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    sidecar.terminate();

    let closed: Vec<_> = json_lines(&sidecar)
        .into_iter()
        .filter(|l| l["message"] == "subscription closed")
        .collect();
    assert_eq!(closed.len(), 1, "{closed:#?}");
    let line = &closed[0];
    assert_eq!(line["flushed_at_close"], 1, "{line}");
    assert_eq!(line["left_pending"], 1, "{line}");
    for field in [
        "reads",
        "deliveries",
        "flushes",
        "failed_flushes",
        "outcomes",
    ] {
        assert!(!line[field].is_null(), "no {field} in {line}");
    }
    let pending = window_sidecar_harness::pending(&redis.client().await, "closing", "g").await;
    assert_eq!(pending, 1, "the delivery without an outcome stays pending");
}

/// The sidecar says once, at start, which server it reached and whether it has `XACKDEL`: the
/// line an operator compares with the README's table of supported servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_and_what_it_offers_are_logged_once_at_start() {
    let redis = RedisServer::start();
    let info: String = redis
        .client()
        .await
        .info(Some(fred::types::InfoKind::Server))
        .await
        .unwrap();
    let product = window_sidecar_harness::info_field(&info, "server_name").unwrap_or("redis");
    let version = window_sidecar_harness::info_field(&info, &format!("{product}_version"))
        .unwrap()
        .to_owned();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(&redis.url(), &listen, &[], &[], "info");
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("\"redis server\"")).unwrap();
    assert_eq!(line["product"], product, "{line}");
    assert_eq!(line["version"], version.as_str(), "{line}");
    // Redis 8.2 and Valkey 9.2 have XACKDEL; the releases before them do not.
    let major_minor: Vec<u32> = version
        .split('.')
        .take(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let has = match product {
        "valkey" => major_minor >= vec![9, 2],
        _ => major_minor >= vec![8, 2],
    };
    assert_eq!(line["xackdel"], has, "{line}");
    sidecar.terminate();
    let again = sidecar
        .logged_lines()
        .iter()
        .filter(|l| l.contains("\"redis server\""))
        .count();
    assert_eq!(again, 0, "logged once");
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
