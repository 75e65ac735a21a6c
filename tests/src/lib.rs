//! End-to-end helpers: the sidecar started in-process on `127.0.0.1:0` against a real
//! `redis-server`, and a small client over the generated gRPC stubs.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Status, Streaming};
use window_sidecar::config::Config;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};

pub use window_sidecar_harness::*;

/// How long a test waits for one message before failing.
pub const STEP: Duration = Duration::from_secs(10);

/// A sidecar running in this process.
pub struct Sidecar {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Sidecar {
    /// Starts a sidecar on a free port against `redis_url`, with extra flags.
    pub async fn start(redis_url: &str, flags: &[&str]) -> Self {
        let mut args = vec![
            "window-sidecar",
            "--redis-url",
            redis_url,
            "--listen",
            "127.0.0.1:0",
        ];
        // Short timers keep the tests quick; tests that need others pass their own.
        args.extend(["--promote-interval", "100ms", "--shutdown-grace", "2s"]);
        args.extend_from_slice(flags);
        let config = Config::try_parse_from(args).expect("valid flags");
        if std::env::var_os("RUST_LOG").is_some() {
            window_sidecar::telemetry::init_logs(config.log_format);
        }
        config.validate().expect("valid configuration");
        let listener = window_sidecar::server::Listener::bind(&config.listen)
            .await
            .expect("bind");
        let addr = listener.tcp_addr().expect("a TCP listener");
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            window_sidecar::server::run(config, listener, stop, false)
                .await
                .expect("sidecar runs");
        });
        Self {
            addr,
            shutdown,
            task,
        }
    }

    /// A gRPC client connected to this sidecar.
    pub async fn client(&self) -> WindowServiceClient<Channel> {
        WindowServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to the sidecar")
    }

    /// Begins the graceful shutdown (as SIGTERM does) without waiting for it.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Shuts down gracefully and waits until the sidecar has stopped.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the sidecar stops in time")
            .expect("the sidecar task did not panic");
    }
}

/// `GET path` on a local HTTP endpoint: the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}

/// The value of one sample in a Prometheus text exposition (`name{labels}` exactly as written,
/// labels in the order the sidecar writes them), or 0 when absent.
pub fn sample(exposition: &str, series: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// An `open` for a stream subscription.
pub fn stream_open(key: &str, group: &str, consumer: &str, count: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::Stream(proto::StreamSource {
            key: key.into(),
            group: group.into(),
            consumer: consumer.into(),
            ..Default::default()
        })),
        count,
        block: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    }
}

/// A queued command.
pub fn command(slot: u64, name: &str, args: &[&str]) -> proto::QueuedCommand {
    proto::QueuedCommand {
        slot,
        name: name.into(),
        args: args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect(),
    }
}

/// An outcome without a delay.
pub fn outcome(slot: u64, kind: OutcomeKind) -> proto::Outcome {
    proto::Outcome {
        slot,
        kind: kind as i32,
        ..Default::default()
    }
}

/// A retry_after outcome.
pub fn retry_after(slot: u64, delay: Duration) -> proto::Outcome {
    proto::Outcome {
        slot,
        kind: OutcomeKind::RetryAfter as i32,
        delay: Some(prost_types::Duration::try_from(delay).expect("delay")),
        ..Default::default()
    }
}

/// One open Subscribe stream.
pub struct Subscription {
    tx: Option<mpsc::Sender<proto::SubscribeRequest>>,
    rx: Streaming<proto::SubscribeResponse>,
    /// Messages received while looking for another kind, in order.
    buffered: VecDeque<Kind>,
}

impl Subscription {
    /// Opens the stream and sends `first`; does not wait for an answer.
    pub async fn start(
        client: &mut WindowServiceClient<Channel>,
        first: proto::subscribe_request::Kind,
    ) -> Result<Self, Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(proto::SubscribeRequest { kind: Some(first) })
            .await
            .expect("queue the first message");
        let response = client.subscribe(ReceiverStream::new(rx)).await?;
        Ok(Self {
            tx: Some(tx),
            rx: response.into_inner(),
            buffered: VecDeque::new(),
        })
    }

    /// Opens a subscription and waits for `opened`.
    pub async fn open(
        client: &mut WindowServiceClient<Channel>,
        open: proto::Open,
    ) -> Result<(Self, proto::Opened), Status> {
        let mut sub = Self::start(client, proto::subscribe_request::Kind::Open(open)).await?;
        match sub.next().await? {
            Some(Kind::Opened(opened)) => Ok((sub, opened)),
            other => panic!("expected opened, got {other:?}"),
        }
    }

    /// The next message; `Ok(None)` when the stream ended cleanly.
    pub async fn next(&mut self) -> Result<Option<Kind>, Status> {
        if let Some(kind) = self.buffered.pop_front() {
            return Ok(Some(kind));
        }
        self.receive().await
    }

    async fn receive(&mut self) -> Result<Option<Kind>, Status> {
        match tokio::time::timeout(STEP, self.rx.message()).await {
            Ok(Ok(Some(message))) => Ok(message.kind),
            Ok(Ok(None)) => Ok(None),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no message from the sidecar within {STEP:?}"),
        }
    }

    /// The next message of one kind; messages of other kinds stay queued in order. Reads and
    /// flush reports race by design (the sidecar reads ahead while a flush is under way).
    async fn next_of<T>(
        &mut self,
        what: &str,
        pick: fn(&Kind) -> bool,
        unwrap: fn(Kind) -> Option<T>,
    ) -> T {
        if let Some(index) = self.buffered.iter().position(pick) {
            let kind = self.buffered.remove(index).expect("index from position");
            return unwrap(kind).expect("picked kind");
        }
        loop {
            match self.receive().await {
                Ok(Some(kind)) if pick(&kind) => return unwrap(kind).expect("picked kind"),
                Ok(Some(kind)) => self.buffered.push_back(kind),
                other => panic!(
                    "expected {what}, got {other:?} (buffered: {:?})",
                    self.buffered
                ),
            }
        }
    }

    /// The next read.
    pub async fn read(&mut self) -> proto::Read {
        self.next_of(
            "a read",
            |k| matches!(k, Kind::Read(_)),
            |k| match k {
                Kind::Read(read) => Some(read),
                _ => None,
            },
        )
        .await
    }

    /// The next flush report.
    pub async fn flush(&mut self) -> proto::FlushReport {
        self.next_of(
            "a flush report",
            |k| matches!(k, Kind::Flush(_)),
            |k| match k {
                Kind::Flush(report) => Some(report),
                _ => None,
            },
        )
        .await
    }

    /// The next rejections.
    pub async fn rejections(&mut self) -> Vec<proto::Rejection> {
        self.next_of(
            "rejections",
            |k| matches!(k, Kind::Rejections(_)),
            |k| match k {
                Kind::Rejections(r) => Some(r.rejections),
                _ => None,
            },
        )
        .await
    }

    /// Waits for the stream to end with an error status.
    pub async fn status(&mut self) -> Status {
        loop {
            match self.next().await {
                Err(status) => return status,
                Ok(None) => panic!("the stream ended without a status"),
                Ok(Some(_)) => {}
            }
        }
    }

    /// Sends commands and outcomes in one message.
    pub async fn send(&self, commands: Vec<proto::QueuedCommand>, outcomes: Vec<proto::Outcome>) {
        self.send_kind(proto::subscribe_request::Kind::Batch(proto::Batch {
            commands,
            outcomes,
            acks: vec![],
            ..Default::default()
        }))
        .await;
    }

    /// Sends any message.
    pub async fn send_kind(&self, kind: proto::subscribe_request::Kind) {
        self.tx
            .as_ref()
            .expect("stream still open")
            .send(proto::SubscribeRequest { kind: Some(kind) })
            .await
            .expect("send to the sidecar");
    }

    /// Closes the client's half of the stream (a clean goodbye).
    pub fn close(&mut self) {
        self.tx = None;
    }
}

/// Publishes entries with the given fields through the sidecar; returns their ids.
pub async fn publish(
    client: &mut WindowServiceClient<Channel>,
    stream: &str,
    entries: Vec<Vec<(&str, String)>>,
) -> Vec<String> {
    let entries = entries
        .into_iter()
        .map(|fields| proto::PublishEntry {
            fields: fields
                .into_iter()
                .map(|(name, value)| proto::Field {
                    name: Bytes::copy_from_slice(name.as_bytes()),
                    value: Bytes::from(value),
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    client
        .publish(proto::PublishRequest {
            stream: stream.into(),
            entries,
            ..Default::default()
        })
        .await
        .expect("publish")
        .into_inner()
        .ids
}

/// `n` entries with a field `n` = 0..n.
pub fn numbered(n: usize) -> Vec<Vec<(&'static str, String)>> {
    (0..n).map(|i| vec![("n", i.to_string())]).collect()
}

/// The value of field `name` in a delivery.
pub fn field(delivery: &proto::Delivery, name: &str) -> String {
    delivery
        .fields
        .iter()
        .find(|f| f.name.as_ref() == name.as_bytes())
        .map(|f| String::from_utf8_lossy(&f.value).into_owned())
        .unwrap_or_else(|| panic!("delivery {} has no field {name}", delivery.entry_id))
}
