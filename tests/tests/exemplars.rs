//! From a latency spike to its trace: the flush and read duration histograms carry exemplars
//! with the trace id of the flush (a read's span is the root of its flush's trace), written
//! when the scraper asks for OpenMetrics; the trace ids are those of spans the sidecar exported
//! to an in-process OTLP receiver.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::TcpListenerStream;
use window_sidecar_harness::*;

/// An OTLP/gRPC trace receiver that keeps every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Trace ids (lowercase hex) of the spans named `name` received so far.
    fn traces(&self, name: &str) -> BTreeSet<String> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.trace_id.iter().map(|b| format!("{b:02x}")).collect())
            .collect()
    }
}

async fn start_receiver() -> (Receiver, String) {
    let receiver = Receiver::default();
    let otlp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = otlp.local_addr().unwrap();
    let collector = receiver.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector))
            .serve_with_incoming(TcpListenerStream::new(otlp))
            .await
    });
    (receiver, format!("http://{addr}"))
}

/// `GET /metrics` with this `Accept` header (none: no header): (content type, body).
async fn scrape_with(metrics: &str, accept: Option<&str>) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(metrics).await.unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: {metrics}\r\n{accept}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (content_type, body.to_owned())
}

/// The trace ids of the exemplars on the buckets of `histogram`.
fn exemplar_traces(text: &str, histogram: &str) -> BTreeSet<String> {
    let bucket = format!("{histogram}_bucket{{");
    text.lines()
        .filter(|l| l.starts_with(&bucket))
        .filter_map(|l| l.split_once(" # {trace_id=\"")?.1.split_once('"'))
        .map(|(id, _)| id.to_owned())
        .collect()
}

/// How long to wait for a flush report (`report_for` returns at the end of the wait, when the
/// stream has been quiet that long).
const REPORT: Duration = Duration::from_secs(2);

const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_exemplars_are_the_trace_ids_of_exported_flushes() {
    let (receiver, otlp) = start_receiver().await;
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _sidecar = Launch::new()
        .args([
            "--redis-url",
            &redis.url(),
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics,
        ])
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .start();
    let mut client = connect_client(&listen).await;
    publish(&mut client, "orders", numbered(6)).await;
    let mut worker = Worker::open(&listen, stream_open("orders", "g", "c", 2)).await;
    let mut flushed = 0;
    while flushed < 3 {
        let read = worker.next_read().await;
        worker.ack(&read.deliveries).await;
        assert!(
            worker
                .report_for(read.read_id, REPORT)
                .await
                .is_some_and(|r| r.ok),
            "the flush of read {}",
            read.read_id
        );
        flushed += 1;
    }

    let (content_type, text) = scrape_with(&metrics, Some(PROMETHEUS_ACCEPT)).await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(text.ends_with("# EOF\n"));
    let flush_exemplars = exemplar_traces(&text, "window_sidecar_flush_duration_seconds");
    let read_exemplars = exemplar_traces(&text, "window_sidecar_read_duration_seconds");
    assert!(!flush_exemplars.is_empty(), "no flush exemplar in\n{text}");
    assert!(!read_exemplars.is_empty(), "no read exemplar in\n{text}");

    // Every exemplar names a trace whose flush span (and read span) the receiver got.
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let flushes = receiver.traces("window.flush");
        let reads = receiver.traces("window.read");
        let missing: Vec<_> = flush_exemplars
            .iter()
            .filter(|t| !flushes.contains(*t))
            .chain(read_exemplars.iter().filter(|t| !reads.contains(*t)))
            .collect();
        if missing.is_empty() {
            // A read's trace is its flush's: the read exemplars point at flushes too.
            assert!(read_exemplars.iter().all(|t| flushes.contains(t)));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "exemplar traces never exported: {missing:?} (flush traces {flushes:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A scraper that does not ask for OpenMetrics gets the same series without exemplars.
    let (_, plain) = scrape_with(&metrics, None).await;
    assert!(!plain.contains(" # {"), "{plain}");
    assert!(plain.contains("window_sidecar_flush_duration_seconds_bucket"));
    let (_, text_format) = scrape_with(&metrics, Some("text/plain;version=0.0.4")).await;
    assert!(!text_format.contains(" # {"));
    worker.close();
}

/// Without traces there is no trace id to give: no exemplar, whatever the scraper asks.
#[tokio::test]
async fn without_traces_there_are_no_exemplars() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _sidecar = Launch::new()
        .args([
            "--redis-url",
            &redis.url(),
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics,
        ])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .start();
    let mut client = connect_client(&listen).await;
    publish(&mut client, "orders", numbered(2)).await;
    let mut worker = Worker::open(&listen, stream_open("orders", "g", "c", 2)).await;
    let read = worker.next_read().await;
    worker.ack(&read.deliveries).await;
    assert!(worker.report_for(read.read_id, REPORT).await.is_some());
    let (_, text) = scrape_with(&metrics, Some(PROMETHEUS_ACCEPT)).await;
    assert!(text.contains("window_sidecar_flush_duration_seconds_count"));
    assert!(!text.contains(" # {"), "{text}");
    worker.close();
}
