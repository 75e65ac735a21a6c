//! The in-process consumers: the sidecar's Rust (tonic) client and the raw fred loop (the
//! redis-rs loop and the seed are in `redis_rs.rs` and `seed.rs`).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;
use window_sidecar::partition;
use window_sidecar::proto::subscribe_request;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, Mode};

use window_sidecar_harness::OpenExt;

use crate::workload::{
    self, CONSUMER, GROUP, KEY_FIELD, Keying, ORDER_PREFIX, Payload, STREAM, now_us,
};

/// What a consumer reports when every expected entry is acknowledged.
#[derive(Debug, Default)]
pub(crate) struct ClientOutcome {
    /// When the last acknowledgement's reply arrived.
    pub done_at: Option<Instant>,
    pub acked: u64,
    /// Reads that delivered entries.
    pub reads: u64,
    /// Round trips the consumer made itself (baselines; 0 for sidecar clients, whose round
    /// trips are the sidecar's).
    pub round_trips: u64,
    /// Latency samples in microseconds, one per entry.
    pub lat_us: Vec<u64>,
    /// Latency phases: each sample split where the entry reached the consumer. First its XADD
    /// to its read's arrival (Redis's read; through the sidecar, its hop to the client too),
    /// then that arrival to the reply that settled it (the client's answer, the flush and,
    /// through the sidecar, its report).
    pub to_consumer_us: Vec<u64>,
    pub to_settled_us: Vec<u64>,
    /// CPU seconds the consumer used, when it measured them itself (a separate process).
    pub cpu_s: Option<f64>,
    /// An ordered run: when the reply that settled the last entry without the hot key
    /// arrived (the hot-key variant's figure for the other keys).
    pub others_done_at: Option<Instant>,
    /// A retrying run: the deliveries it retried.
    pub retried: u64,
}

impl ClientOutcome {
    /// Latency samples of `n` entries settled `now`: from each entry's XADD (`sent`, the
    /// latency phase), else from the arrival of their read.
    pub(crate) fn sample(&mut self, now: u64, arrived: u64, sent: &[u64], n: usize, latency: bool) {
        if latency {
            self.lat_us
                .extend(sent.iter().map(|ts| now.saturating_sub(*ts)));
            self.to_consumer_us
                .extend(sent.iter().map(|ts| arrived.saturating_sub(*ts)));
            self.to_settled_us
                .extend(std::iter::repeat_n(now.saturating_sub(arrived), sent.len()));
        } else {
            self.lat_us
                .extend(std::iter::repeat_n(now.saturating_sub(arrived), n));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Through the sidecar

pub(crate) struct SidecarClient {
    client: WindowServiceClient<Channel>,
    count: u32,
    max_in_flight: u32,
    atomic: bool,
    stream: String,
    /// The side effect's one key, when not the payload's `count:<id mod 1000>`.
    counter: Option<Bytes>,
    /// Entries settled so far, for a watcher.
    progress: Option<Arc<AtomicU64>>,
    /// Ordered by the entries' key (in field `k`): the side effect is `RPUSH order:<key>
    /// <id>` instead of the `INCR`.
    ordered: Option<Keying>,
    /// Retries one delivery in 20 ([`workload::retried`]), each entry once, then acks it.
    retrying: bool,
    /// The consumer name it opens with: the bench's `c1`, or a replica's own name.
    consumer: String,
    /// A replica of a group reading a partitioned stream of this many partitions
    /// (`StreamSource.partitions`); 0: a plain stream.
    partitions: u32,
    /// Where the ids handed out are logged, in the order this process received them: one log
    /// shared by every replica's client, so that a key's deliveries across the group can be
    /// checked against its stream order.
    handed: Option<HandedOut>,
    /// An ordered side effect's list carries its partition's hash tag (`order:{<p>}:<key>`),
    /// so that on a cluster it shares the slot of the partition's stream.
    tagged: bool,
}

/// The ids handed out to a group's clients, in the order they arrived.
pub(crate) type HandedOut = Arc<Mutex<Vec<u64>>>;

/// A subscription whose consumer is done but which is still open: closed by
/// [`OpenStream::close`], so that a replica that finishes first does not leave the group
/// (handing its partitions to the others) while they still run.
pub(crate) struct OpenStream {
    tx: mpsc::Sender<proto::SubscribeRequest>,
    inbound: Streaming<proto::SubscribeResponse>,
}

impl OpenStream {
    /// Half-closes the request stream; waits (5 s at most) for the sidecar to end the
    /// response stream once it has closed the subscription.
    pub(crate) async fn close(self) {
        let Self { tx, mut inbound } = self;
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(_)) = inbound.message().await {}
        })
        .await;
    }
}

/// The harness's stream `open` for the bench's group and consumer: BLOCK 1 s, flush reports
/// carried in reads.
fn open_request(
    key: &str,
    count: u32,
    max_in_flight: u32,
    atomic: bool,
) -> proto::SubscribeRequest {
    let open = window_sidecar_harness::stream_open(key, GROUP, CONSUMER, count)
        .with_max_in_flight(max_in_flight);
    proto::SubscribeRequest {
        kind: Some(subscribe_request::Kind::Open(proto::Open {
            block: Some(window_sidecar_harness::duration(Duration::from_secs(1))),
            mode: if atomic { Mode::Atomic } else { Mode::Pipeline } as i32,
            reports_in_reads: true,
            ..open
        })),
    }
}

/// The same `open`, ordered by the raw field `k`.
fn ordered_open_request(
    key: &str,
    count: u32,
    max_in_flight: u32,
    atomic: bool,
) -> proto::SubscribeRequest {
    let mut request = open_request(key, count, max_in_flight, atomic);
    if let Some(subscribe_request::Kind::Open(open)) = &mut request.kind {
        open.ordering_key = Some(proto::OrderingKey {
            source: Some(proto::ordering_key::Source::Field(KEY_FIELD.into())),
        });
    }
    request
}

pub(crate) async fn connect_sidecar(
    addr: SocketAddr,
) -> Result<WindowServiceClient<Channel>, String> {
    WindowServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| format!("connect to the sidecar at {addr}: {e}"))
}

/// A client of a sidecar serving on the Unix socket at `path` (its authority is never looked up).
pub(crate) async fn connect_sidecar_unix(
    path: PathBuf,
) -> Result<WindowServiceClient<Channel>, String> {
    let channel = window_sidecar::grpc::connect_unix(&path)
        .await
        .map_err(|e| format!("connect to the sidecar at unix:{}: {e}", path.display()))?;
    Ok(WindowServiceClient::new(channel))
}

impl SidecarClient {
    pub(crate) async fn connect(
        addr: SocketAddr,
        count: u32,
        max_in_flight: u32,
        atomic: bool,
    ) -> Result<Self, String> {
        Ok(Self::over(
            connect_sidecar(addr).await?,
            count,
            max_in_flight,
            atomic,
        ))
    }

    /// A client on a channel already open (subscriptions multiplexed on one connection).
    pub(crate) fn over(
        client: WindowServiceClient<Channel>,
        count: u32,
        max_in_flight: u32,
        atomic: bool,
    ) -> Self {
        Self {
            client,
            count,
            max_in_flight,
            atomic,
            stream: STREAM.to_owned(),
            counter: None,
            progress: None,
            ordered: None,
            retrying: false,
            consumer: CONSUMER.to_owned(),
            partitions: 0,
            handed: None,
            tagged: false,
        }
    }

    /// A replica of the group reading the partitioned stream of `partitions` partitions as
    /// consumer `name`, logging the ids handed out into `handed`; with `tagged`, an ordered
    /// side effect's list carries its partition's hash tag.
    pub(crate) fn replica(
        self,
        partitions: u32,
        name: String,
        handed: HandedOut,
        tagged: bool,
    ) -> Self {
        Self {
            partitions,
            consumer: name,
            handed: Some(handed),
            tagged,
            ..self
        }
    }

    /// Retrying one delivery in 20 (the entries [`workload::retried`] picks, each once, on
    /// its first delivery) without its side effect, then acking it when it comes back.
    pub(crate) fn retrying(self) -> Self {
        Self {
            retrying: true,
            ..self
        }
    }

    /// Ordered by each entry's key, keyed as `keying` fills the stream.
    pub(crate) fn ordered(self, keying: Keying) -> Self {
        Self {
            ordered: Some(keying),
            ..self
        }
    }

    /// Consumes `stream` instead, with `INCR counter` as every entry's side effect, counting
    /// what is settled into `progress`.
    pub(crate) fn on_stream(
        self,
        stream: String,
        counter: String,
        progress: Arc<AtomicU64>,
    ) -> Self {
        Self {
            stream,
            counter: Some(Bytes::from(counter)),
            progress: Some(progress),
            ..self
        }
    }

    /// Opens the subscription and answers every read with one batch (an INCR and an ack per
    /// delivery), reading on while flushes are in flight, until flush reports have settled
    /// `expect` entries. With `latency`, samples run from each entry's XADD (`ts`) to the
    /// flush report; else from the read's arrival to it.
    pub(crate) async fn run(self, expect: u64, latency: bool) -> Result<ClientOutcome, String> {
        let (out, open) = self.run_open(expect, latency).await?;
        open.close().await;
        Ok(out)
    }

    /// The `open` this client sends: ordered by field `k` when it is ordered, under its
    /// consumer name, partitioned when it is a replica.
    fn open(&self) -> proto::SubscribeRequest {
        let open = if self.ordered.is_some() {
            ordered_open_request
        } else {
            open_request
        };
        let mut request = open(&self.stream, self.count, self.max_in_flight, self.atomic);
        if let Some(subscribe_request::Kind::Open(open)) = &mut request.kind
            && let Some(proto::open::Source::Stream(stream)) = &mut open.source
        {
            stream.consumer.clone_from(&self.consumer);
            stream.partitions = self.partitions;
        }
        request
    }

    /// [`SidecarClient::run`], leaving the subscription open once `expect` entries are
    /// settled: the caller closes it.
    pub(crate) async fn run_open(
        mut self,
        expect: u64,
        latency: bool,
    ) -> Result<(ClientOutcome, OpenStream), String> {
        let (tx, rx) = mpsc::channel::<proto::SubscribeRequest>(64);
        tx.send(self.open())
            .await
            .map_err(|_| "request stream closed")?;
        let mut inbound = self
            .client
            .subscribe(ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("Subscribe: {s}"))?
            .into_inner();
        let mut out = ClientOutcome::default();
        let mut reads = InFlight::new();
        let mut others = Others::new(self.ordered, expect);
        let mut acks = AckedOnce::new(self.retrying);
        let mut retried = HashSet::new();
        while out.acked < expect {
            let message = inbound
                .message()
                .await
                .map_err(|s| format!("subscription failed: {s}"))?
                .ok_or("the sidecar ended the subscription early")?;
            match message.kind {
                Some(Kind::Read(mut read)) => {
                    if let Some(report) = read.flushed.take() {
                        let settled = (&mut reads, &mut others, &mut acks);
                        flushed(&mut out, settled, &report, latency)?;
                        self.report_progress(&out);
                    }
                    let arrived = now_us();
                    let n = read.deliveries.len();
                    out.reads += 1;
                    let mut commands = Vec::with_capacity(n);
                    let mut slots = Vec::with_capacity(n);
                    let mut outcomes = Vec::new();
                    let mut ids = Vec::with_capacity(n);
                    let mut sent = Vec::with_capacity(if latency { n } else { 0 });
                    let mut others_in_read = 0;
                    for delivery in read.deliveries {
                        let payload = Payload::decode(payload_of(&delivery))?;
                        if self.retrying
                            && workload::retried(payload.id)
                            && retried.insert(payload.id)
                        {
                            outcomes.push(proto::Outcome {
                                slot: delivery.slot,
                                kind: proto::OutcomeKind::Retry as i32,
                                ..Default::default()
                            });
                            continue;
                        }
                        commands.push(self.side_effect(&delivery, &payload)?);
                        slots.push(delivery.slot);
                        ids.push(payload.id);
                        if latency {
                            sent.push(payload.ts);
                        }
                        others_in_read += u64::from(others.counts(payload.id));
                    }
                    if let Some(handed) = &self.handed {
                        handed
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .extend_from_slice(&ids);
                    }
                    reads.insert(
                        read.read_id,
                        Pending {
                            arrived,
                            sent,
                            ids,
                            others: others_in_read,
                        },
                    );
                    let batch = proto::Batch {
                        commands,
                        outcomes,
                        acks: slots,
                        ..Default::default()
                    };
                    tx.send(proto::SubscribeRequest {
                        kind: Some(subscribe_request::Kind::Batch(batch)),
                    })
                    .await
                    .map_err(|_| "the request stream closed")?;
                }
                Some(Kind::Flush(report)) => {
                    let settled = (&mut reads, &mut others, &mut acks);
                    flushed(&mut out, settled, &report, latency)?;
                    self.report_progress(&out);
                }
                Some(Kind::Rejections(rejections)) => {
                    return Err(format!("the sidecar refused: {:?}", rejections.rejections));
                }
                _ => {}
            }
        }
        out.done_at = Some(Instant::now());
        out.retried = retried.len() as u64;
        Ok((out, OpenStream { tx, inbound }))
    }
}

impl SidecarClient {
    fn report_progress(&self, out: &ClientOutcome) {
        if let Some(progress) = &self.progress {
            progress.store(out.acked, Ordering::Relaxed);
        }
    }

    /// A delivery's one side effect: `INCR` of its counter, or on an ordered subscription
    /// `RPUSH order:<key> <id>`, which records the order the key's entries ran in. The key is
    /// the delivery's own field, as a consumer would take it, built in one buffer; a tagged
    /// replica's list is `order:{<p>}:<key>`, `p` its key's partition as a producer computes it.
    fn side_effect(
        &self,
        delivery: &proto::Delivery,
        payload: &Payload,
    ) -> Result<proto::QueuedCommand, String> {
        let (name, args) = match (self.ordered, &self.counter) {
            (Some(_), _) => {
                let key = field(delivery, KEY_FIELD.as_bytes())
                    .ok_or("an ordered delivery without its key field")?;
                let mut list = BytesMut::with_capacity(ORDER_PREFIX.len() + key.len() + 8);
                list.put_slice(ORDER_PREFIX.as_bytes());
                if self.tagged {
                    let p = partition::of_key(key, self.partitions);
                    list.put_u8(b'{');
                    list.put_slice(itoa::Buffer::new().format(p).as_bytes());
                    list.put_slice(b"}:");
                }
                list.put_slice(key);
                let id = Bytes::copy_from_slice(itoa::Buffer::new().format(payload.id).as_bytes());
                ("RPUSH", vec![list.freeze(), id])
            }
            (None, Some(counter)) => ("INCR", vec![counter.clone()]),
            (None, None) => ("INCR", vec![Bytes::from(payload.counter_key())]),
        };
        Ok(proto::QueuedCommand {
            slot: delivery.slot,
            name: name.to_owned(),
            args,
        })
    }
}

/// The bench's JSON of a delivery: its payload, or, for an entry with more fields than
/// `_payload` (an ordered contender's key in `k`), which the sidecar delivers as raw fields,
/// its `_payload` field.
fn payload_of(delivery: &proto::Delivery) -> &[u8] {
    if !delivery.payload.is_empty() {
        return &delivery.payload;
    }
    field(delivery, b"_payload").unwrap_or_default()
}

/// A raw field of a delivery, by name.
fn field<'a>(delivery: &'a proto::Delivery, name: &[u8]) -> Option<&'a [u8]> {
    delivery
        .fields
        .iter()
        .find(|f| f.name.as_ref() == name)
        .map(|f| f.value.as_ref())
}

/// A read in flight: when it arrived, the ids of the entries it acks and their send times
/// (latency phase), and how many of them are not the hot key's.
struct Pending {
    arrived: u64,
    sent: Vec<u64>,
    ids: Vec<u64>,
    others: u64,
}

/// What the flush reports acknowledged. A retrying run counts its own acks (a retry settles
/// nothing when it keeps the entry in place, and a copy's XACK when it appends one) and checks
/// that no entry is acknowledged twice; the others count the reports' settles.
struct AckedOnce {
    ids: Option<HashSet<u64>>,
}

impl AckedOnce {
    fn new(retrying: bool) -> Self {
        Self {
            ids: retrying.then(HashSet::new),
        }
    }

    /// The entries a flush report settled: the read's acks, or the report's settles.
    fn settled(&mut self, read: Option<&Pending>, settles: u32) -> Result<u64, String> {
        let Some(ids) = &mut self.ids else {
            return Ok(u64::from(settles));
        };
        let acked = read.map_or(&[][..], |r| r.ids.as_slice());
        for id in acked {
            if !ids.insert(*id) {
                return Err(format!("entry {id} was acknowledged twice"));
            }
        }
        Ok(acked.len() as u64)
    }
}

type InFlight = HashMap<u64, Pending>;

/// The entries without the hot key: how many there are and how many were settled, so that
/// the moment the last of them was settled is known.
struct Others {
    keying: Option<Keying>,
    left: u64,
}

impl Others {
    fn new(keying: Option<Keying>, expect: u64) -> Self {
        Self {
            keying,
            left: keying.map_or(0, |k| k.others(expect)),
        }
    }

    /// Whether entry `id` is one of them.
    fn counts(&self, id: u64) -> bool {
        self.keying.is_some_and(|k| !k.is_hot(id))
    }

    /// `n` of them settled now; records when the last one was.
    fn settled(&mut self, n: u64, out: &mut ClientOutcome) {
        if n == 0 || self.left == 0 {
            return;
        }
        self.left = self.left.saturating_sub(n);
        if self.left == 0 {
            out.others_done_at = Some(Instant::now());
        }
    }
}

/// A flush report, alone or in the read that rode on its flush.
fn flushed(
    out: &mut ClientOutcome,
    (reads, others, acks): (&mut InFlight, &mut Others, &mut AckedOnce),
    report: &proto::FlushReport,
    latency: bool,
) -> Result<(), String> {
    if !report.ok {
        return Err(format!(
            "flush of read {} failed: {}",
            report.read_id, report.error
        ));
    }
    let read = reads.remove(&report.read_id);
    if let Some(read) = &read {
        out.sample(now_us(), read.arrived, &read.sent, read.ids.len(), latency);
        others.settled(read.others, out);
    }
    out.acked += acks.settled(read.as_ref(), report.settles)?;
    Ok(())
}

/// Opens `n` subscriptions on keys `idle:<i>` over one channel and keeps them open (idle)
/// until the returned handles are dropped.
pub(crate) async fn open_idle(addr: SocketAddr, n: usize) -> Result<Vec<impl Sized>, String> {
    let mut client = connect_sidecar(addr).await?;
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, rx) = mpsc::channel::<proto::SubscribeRequest>(4);
        tx.send(open_request(&format!("idle:{i}"), 64, 0, false))
            .await
            .map_err(|_| "request stream closed")?;
        let mut inbound = client
            .subscribe(ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("Subscribe {i}: {s}"))?
            .into_inner();
        match inbound.message().await {
            Ok(Some(proto::SubscribeResponse {
                kind: Some(Kind::Opened(_)),
            })) => {}
            other => return Err(format!("subscription {i} did not open: {other:?}")),
        }
        held.push((tx, inbound));
    }
    Ok(held)
}

// ---------------------------------------------------------------------------------------------
// The raw fred loop

pub(crate) struct FredLoop {
    client: Client,
    count: u32,
}

fn bytes_of(value: Value) -> Option<Bytes> {
    match value {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        _ => None,
    }
}

/// `(id, _payload)` of each entry of an XREADGROUP reply (`nil` on a BLOCK timeout).
fn parse_read(reply: Value) -> Result<Vec<(Bytes, Bytes)>, String> {
    let Value::Array(streams) = reply else {
        return Ok(Vec::new());
    };
    let mut entries = Vec::new();
    for stream in streams {
        let Value::Array(pair) = stream else { continue };
        let Some(Value::Array(list)) = pair.into_iter().nth(1) else {
            continue;
        };
        for entry in list {
            let Value::Array(mut parts) = entry else {
                return Err("an entry is not an array".into());
            };
            let fields = parts.pop();
            let id = parts
                .pop()
                .and_then(bytes_of)
                .ok_or("an entry without an id")?;
            let Some(Value::Array(fields)) = fields else {
                return Err("an entry without fields".into());
            };
            let mut payload = None;
            let mut it = fields.into_iter();
            while let (Some(name), Some(value)) = (it.next(), it.next()) {
                if name.as_bytes() == Some(b"_payload".as_slice()) {
                    payload = bytes_of(value);
                }
            }
            entries.push((id, payload.ok_or("an entry without _payload")?));
        }
    }
    Ok(entries)
}

impl FredLoop {
    pub(crate) async fn connect(url: &str, count: u32) -> Result<Self, String> {
        Ok(Self {
            client: workload::connect(url).await?,
            count,
        })
    }

    /// XREADGROUP COUNT n, then one pipeline with an INCR per entry and one XACK.
    pub(crate) async fn run(self, expect: u64, latency: bool) -> Result<ClientOutcome, String> {
        let xreadgroup = CustomCommand::new_static("XREADGROUP", ClusterHash::FirstKey, true);
        let read_args: Vec<Value> = vec![
            "GROUP".into(),
            GROUP.into(),
            CONSUMER.into(),
            "COUNT".into(),
            Value::Integer(self.count.into()),
            "BLOCK".into(),
            Value::Integer(1000),
            "STREAMS".into(),
            STREAM.into(),
            ">".into(),
        ];
        let mut out = ClientOutcome::default();
        while out.acked < expect {
            let reply: Value = self
                .client
                .custom(xreadgroup.clone(), read_args.clone())
                .await
                .map_err(|e| format!("XREADGROUP: {e}"))?;
            out.round_trips += 1;
            let entries = parse_read(reply)?;
            if entries.is_empty() {
                continue;
            }
            out.reads += 1;
            let arrived = now_us();
            let n = entries.len();
            let pipeline = self.client.pipeline();
            let mut xack: Vec<Value> = Vec::with_capacity(n + 2);
            xack.push(STREAM.into());
            xack.push(GROUP.into());
            let mut sent = Vec::with_capacity(if latency { n } else { 0 });
            for (id, payload) in entries {
                let payload = Payload::decode(&payload)?;
                let _: Result<Value, _> = pipeline.incr(payload.counter_key()).await;
                xack.push(Value::Bytes(id));
                if latency {
                    sent.push(payload.ts);
                }
            }
            let _: Result<Value, _> = pipeline.custom(fred::cmd!("XACK"), xack).await;
            let replies: Vec<Value> = pipeline.all().await.map_err(|e| format!("pipeline: {e}"))?;
            out.round_trips += 1;
            let acked = replies.last().and_then(Value::as_u64).unwrap_or(0);
            if acked != n as u64 {
                return Err(format!("XACK acknowledged {acked} of {n}"));
            }
            out.sample(now_us(), arrived, &sent, n, latency);
            out.acked += acked;
        }
        out.done_at = Some(Instant::now());
        let _ = self.client.quit().await;
        Ok(out)
    }
}
