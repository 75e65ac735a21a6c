//! What the tests of the binary's traces and logs share: OTLP receivers over gRPC and HTTP that
//! keep every span they are sent ([`Receiver`]), the binary launched with JSON logs and exactly
//! the OpenTelemetry variables a test gives ([`traced_env`]), its log lines as JSON, and a
//! subscription answered read by read, with the producer's and the client's trace contexts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::metadata::MetadataValue;
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::subscribe_response::Kind as Response;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};

use crate::{Launch, SidecarProcess};

/// The trace context (`traceparent`) a producer publishes with.
pub const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// The trace context a client acks with: the producer's trace, a span of the client's.
pub const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-b9c7c989f97918e1-01";

/// An OTLP trace receiver that keeps every span it is sent, and for OTLP/HTTP the path and
/// content type of each request.
#[derive(Clone, Default)]
pub struct Receiver {
    pub spans: Arc<Mutex<Vec<Span>>>,
    pub http_requests: Arc<Mutex<Vec<(String, String)>>>,
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

/// The OTLP and SDK variables a test sets itself: none may come from the environment it runs
/// in.
pub const OTLP_VARIABLES: [&str; 8] = [
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
];

/// With extra flags and a log filter; stdout is collected with stderr.
pub fn traced_with(
    redis: &str,
    listen: &str,
    otlp: &str,
    extra: &[&str],
    log: &str,
) -> SidecarProcess {
    let otlp = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)];
    traced_env(redis, listen, &otlp, extra, log)
}

/// With the OTLP variables `otlp` (and no others).
pub fn traced_env(
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
pub async fn start_http_receiver() -> (Receiver, String) {
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
pub fn json_lines(sidecar: &SidecarProcess) -> Vec<serde_json::Value> {
    sidecar
        .lines()
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// An OTLP/gRPC receiver on a free port; returns it and its endpoint URL.
pub async fn start_receiver() -> (Receiver, String) {
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
pub async fn open_orders(
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
pub async fn answer_reads(
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
pub fn ack_with(
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

/// Publishes `entries` entries in one call with the producer's context.
pub async fn publish_traced(
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
