//! A partitioned stream's subscription: one client stream carrying the partitions this replica
//! reads. The replica is a member of its group's partitioned stream ([`Membership`]); from the
//! live members it computes which partitions are its own ([`crate::partition::assign`]) and
//! reads each with a subscription of its own, under that partition's consumer name
//! (`partition-<n>`), whose lease keeps every other replica off it. A partition that is no
//! longer its own is handed over: its subscription stops reading, waits for its outstanding
//! deliveries' outcomes (as at shutdown), flushes and frees the lease, and the new owner, which
//! has been trying for it meanwhile, takes it and reads its pending entries first, in stream
//! order. So a key's entries, all in one partition, go out one at a time across the group.
//!
//! Each partition's subscription numbers its slots and reads from its own range
//! ([`NUMBER_SHIFT`]), so one client stream carries them all and a client's batch is split by
//! slot alone. A slot of a partition handed over is answered `ALREADY_SETTLED`: abandoned, its
//! entry pending on the partition's consumer, delivered again by the new owner.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::observe::{MemberView, PartitionView, Waiting};
use super::subscription::{Placement, Subscription};
use super::{
    ClientBatch, ClientMessage, Event, Inbound, InboundError, OpenRequest, Opened, Outbound,
    Release, SessionError, Shared, Wanted, take_consumer,
};
use crate::domain::{Source, StreamSource};
use crate::metrics::GroupLabels;
use crate::partition::{self, assign};
use crate::redis::RedisError;
use crate::redis::members::Membership;
use crate::window::{SlotError, SlotId};

/// A partition's subscription numbers its slots and reads from `number << NUMBER_SHIFT`: room
/// for 2^36 deliveries each, and, numbers staying below 2^17, ids below 2^53, which a
/// JavaScript number holds exactly.
const NUMBER_SHIFT: u32 = 36;
const MAX_NUMBER: u64 = (1 << 17) - 1;

/// Events a partition's subscription may have on the way to the client stream.
const PART_OUTBOUND: usize = 16;

/// How often a replica waiting for a partition's lease tries it again.
const RETRY: Duration = Duration::from_millis(250);

/// What a partition's task tells the member.
enum PartEvent {
    /// The partition's subscription opened: it reads now.
    Reading { partition: u32, number: u64 },
    /// It ended.
    Ended { partition: u32, number: u64 },
    /// It cannot be read (its key holds another type, Redis refused the group): the client
    /// stream ends with why.
    Failed(SessionError),
}

/// One partition this replica reads or is about to.
struct Part {
    number: u64,
    /// The client's messages for it; `None` once the client stopped sending.
    inbound: Option<mpsc::Sender<Inbound>>,
    stop: CancellationToken,
    /// When it became this replica's, until its subscription reads.
    wanted_since: Option<tokio::time::Instant>,
    /// Handed over: it ends once drained.
    leaving: bool,
}

/// Runs a partitioned stream's subscription until the client leaves and every partition it
/// read is closed.
pub(super) async fn run(
    shared: Arc<Shared>,
    id: String,
    stream: StreamSource,
    open: OpenRequest,
    inbound: impl Stream<Item = Inbound> + Unpin,
    out: Outbound,
) {
    let membership = Membership::new(
        &stream.key,
        &stream.group,
        &stream.consumer,
        shared.settings.consumer_lease,
    );
    let (events_tx, events) = mpsc::unbounded_channel();
    let mut member = Member {
        stop: shared.shutdown.child_token(),
        shared,
        id,
        stream,
        open,
        out,
        membership,
        members: Vec::new(),
        parts: HashMap::new(),
        numbers: HashMap::new(),
        last_number: 0,
        events_tx,
        draining_told: Arc::new(AtomicBool::new(false)),
        ended_with: None,
        closing: false,
        wrapped: false,
    };
    member.run(inbound, events).await;
}

struct Member {
    shared: Arc<Shared>,
    id: String,
    /// The partitioned stream, `consumer` naming this replica.
    stream: StreamSource,
    open: OpenRequest,
    out: Outbound,
    membership: Membership,
    /// The live members at the last renewal.
    members: Vec<String>,
    parts: HashMap<u32, Part>,
    /// Which partition each number in use belongs to.
    numbers: HashMap<u64, u32>,
    last_number: u64,
    events_tx: mpsc::UnboundedSender<PartEvent>,
    /// Cancelled at shutdown: every partition drains.
    stop: CancellationToken,
    /// The client stopped sending: no partition starts any more, those read close.
    closing: bool,
    /// The numbers went round once: any in range may have been issued.
    wrapped: bool,
    /// Draining is told the client once, whichever partition drains first.
    draining_told: Arc<AtomicBool>,
    /// Why the client stream ended, if the member ended it.
    ended_with: Option<String>,
}

impl Member {
    async fn run(
        &mut self,
        mut inbound: impl Stream<Item = Inbound> + Unpin,
        mut events: mpsc::UnboundedReceiver<PartEvent>,
    ) {
        let renew_every = self.shared.settings.consumer_lease / 3;
        let opened = Opened {
            subscription_id: self.id.clone(),
            source: Source::Stream(self.stream.clone()),
            request: self.open.clone(),
        };
        if self
            .out
            .send(Ok(Event::Opened(Box::new(opened))))
            .await
            .is_err()
        {
            return;
        }
        info!(
            partitions = self.open.partitions,
            member = %self.stream.consumer,
            "partitioned subscription opened"
        );
        let mut renew = tokio::time::interval(renew_every);
        let mut inbound_open = true;
        loop {
            tokio::select! {
                // Cancel-safe: a message is either returned or left in the stream.
                message = inbound.next(), if inbound_open => match message {
                    Some(Ok(ClientMessage::Batch(batch))) => self.route(batch).await,
                    None => {
                        inbound_open = false;
                        self.client_left(None);
                    }
                    Some(Err(InboundError::Transport(reason))) => {
                        inbound_open = false;
                        self.client_left(Some(reason));
                    }
                    Some(Ok(ClientMessage::Open(_))) => {
                        inbound_open = false;
                        self.end(SessionError::SecondOpen).await;
                    }
                    Some(Err(InboundError::Invalid(msg))) => {
                        inbound_open = false;
                        self.end(SessionError::InvalidRequest(msg)).await;
                    }
                    Some(Err(InboundError::TooLarge(msg))) => {
                        inbound_open = false;
                        self.end(SessionError::TooLarge(msg)).await;
                    }
                },
                // Cancel-safe: mpsc receive.
                Some(event) = events.recv() => self.part_event(event).await,
                _ = renew.tick(), if !self.stop.is_cancelled() && !self.closing => self.rebalance().await,
                () = self.stop.cancelled(), if self.parts.values().any(|p| !p.leaving) => {
                    for part in self.parts.values_mut() {
                        part.leaving = true;
                    }
                }
            }
            if (self.stop.is_cancelled() || self.closing) && self.parts.is_empty() {
                break;
            }
            self.publish_view();
        }
        self.shared.members.lock().remove(&self.id);
        if let Err(err) = self.membership.leave(self.shared.redis.pool()).await {
            debug!(error = %err, "could not leave the partitioned stream's members; the membership expires by itself");
        }
        info!(reason = ?self.ended_with, "partitioned subscription closed");
    }

    /// Renews this replica's membership and reads the partitions that are now its own, handing
    /// over those that are not.
    async fn rebalance(&mut self) {
        match self.membership.renew(self.shared.redis.pool()).await {
            Ok(members) => self.members = members,
            // The partitions' leases, not the membership, keep replicas apart: read on with
            // the last view and try again at the next renewal. A replica that never saw the
            // members reads as if alone: the leases let it have only what nobody else reads.
            Err(err) => {
                warn!(error = %self.shared.redis.explain(err), "could not renew this replica's membership of the partitioned stream; reading on with the members last seen");
            }
        }
        if !self.members.contains(&self.stream.consumer) {
            self.members.push(self.stream.consumer.clone());
        }
        let owners = assign(&self.members, self.open.partitions);
        let mine: BTreeSet<u32> = (0..self.open.partitions)
            .filter(|p| {
                owners[*p as usize].is_some_and(|o| self.members[o] == self.stream.consumer)
            })
            .collect();
        for (partition, part) in &mut self.parts {
            if !mine.contains(partition) && !part.leaving {
                info!(partition, "handing the partition over");
                part.leaving = true;
                part.stop.cancel();
            }
        }
        for partition in mine {
            if !self.parts.contains_key(&partition) {
                self.start(partition);
            }
        }
    }

    /// Starts reading `partition`: its task waits for the partition's lease, then runs its
    /// subscription.
    fn start(&mut self, partition: u32) {
        let Some(number) = self.next_number() else {
            warn!(
                partition,
                "no slot range left for another partition on this stream; it waits for one to close"
            );
            return;
        };
        let (inbound_tx, inbound_rx) = mpsc::channel(16);
        let stop = self.stop.child_token();
        let source = Source::Stream(StreamSource {
            key: partition::stream_key(&self.stream.key, partition),
            consumer: format!("partition-{partition}"),
            ..self.stream.clone()
        });
        let view = PartitionView {
            stream: self.stream.key.clone(),
            partition,
            partitions: self.open.partitions,
            member: self.stream.consumer.clone(),
            subscription: self.id.clone(),
        };
        let task = PartTask {
            shared: Arc::clone(&self.shared),
            id: format!("{}.p{partition}", self.id),
            source,
            request: self.open.clone(),
            placement: Placement {
                stop: stop.clone(),
                numbered_from: number << NUMBER_SHIFT,
                partition: Some(view),
            },
            out: self.out.clone(),
            events: self.events_tx.clone(),
            draining_told: Arc::clone(&self.draining_told),
            partition,
            number,
        };
        let span = info_span!("partition", partition, number);
        tokio::spawn(task.run(inbound_rx).instrument(span));
        self.numbers.insert(number, partition);
        self.gauges().1.inc();
        self.parts.insert(
            partition,
            Part {
                number,
                inbound: Some(inbound_tx),
                stop,
                wanted_since: Some(tokio::time::Instant::now()),
                leaving: false,
            },
        );
    }

    fn next_number(&mut self) -> Option<u64> {
        for _ in 0..MAX_NUMBER {
            self.wrapped |= self.last_number == MAX_NUMBER;
            self.last_number = self.last_number % MAX_NUMBER + 1;
            if !self.numbers.contains_key(&self.last_number) {
                return Some(self.last_number);
            }
        }
        None
    }

    async fn part_event(&mut self, event: PartEvent) {
        match event {
            PartEvent::Failed(err) => {
                if self.ended_with.is_none() {
                    self.end(err).await;
                }
            }
            PartEvent::Reading { partition, number } => {
                if let Some(part) = self
                    .parts
                    .get_mut(&partition)
                    .filter(|p| p.number == number)
                    && let Some(since) = part.wanted_since.take()
                {
                    let waited = since.elapsed();
                    info!(
                        partition,
                        waited_ms = waited.as_millis() as u64,
                        "reading the partition"
                    );
                    let (read, waiting, handover) = self.gauges();
                    waiting.dec();
                    read.inc();
                    handover.observe(waited.as_secs_f64());
                }
            }
            PartEvent::Ended { partition, number } => {
                self.numbers.remove(&number);
                if let Some(part) = self.parts.get(&partition).filter(|p| p.number == number) {
                    let (read, waiting, _) = self.gauges();
                    match part.wanted_since {
                        Some(_) => waiting.dec(),
                        None => read.dec(),
                    };
                    self.parts.remove(&partition);
                    debug!(partition, "partition closed");
                }
            }
        }
    }

    /// This stream's series: partitions read, partitions waiting, hand-over times.
    fn gauges(&self) -> (Gauge, Gauge, Histogram) {
        let metrics = &self.shared.metrics;
        let labels = GroupLabels {
            key: self.stream.key.clone(),
            group: self.stream.group.clone(),
        };
        (
            metrics.partitions_read.get_or_create(&labels).clone(),
            metrics.partitions_waiting.get_or_create(&labels).clone(),
            metrics.partition_handover.get_or_create(&labels).clone(),
        )
    }

    fn publish_view(&self) {
        let mut view = MemberView {
            id: self.id.clone(),
            stream: self.stream.key.clone(),
            group: self.stream.group.clone(),
            member: self.stream.consumer.clone(),
            partitions: self.open.partitions,
            members: self.members.clone(),
            ..Default::default()
        };
        for (partition, part) in &self.parts {
            match (part.leaving, part.wanted_since) {
                (true, _) => view.leaving.push(*partition),
                (false, Some(since)) => view.waiting.push(Waiting {
                    partition: *partition,
                    waiting_ms: since.elapsed().as_millis() as u64,
                }),
                (false, None) => view.reading.push(*partition),
            }
        }
        view.reading.sort_unstable();
        view.leaving.sort_unstable();
        view.waiting.sort_unstable_by_key(|w| w.partition);
        self.shared.members.lock().insert(self.id.clone(), view);
    }

    /// Splits a client batch by the partition of each slot.
    async fn route(&mut self, batch: ClientBatch) {
        let split = batch.split_by(|slot| slot >> NUMBER_SHIFT);
        let mut rejected = Vec::new();
        for (number, part_batch) in split {
            let inbound = self
                .numbers
                .get(&number)
                .and_then(|p| self.parts.get(p))
                .filter(|p| p.number == number)
                .and_then(|p| p.inbound.as_ref());
            let sent = match inbound {
                Some(tx) => {
                    tx.send(Ok(ClientMessage::Batch(part_batch)))
                        .await
                        .map_err(|e| match e.0 {
                            Ok(ClientMessage::Batch(b)) => b,
                            _ => unreachable!("a batch was sent"),
                        })
                }
                None => Err(part_batch),
            };
            if let Err(unsent) = sent {
                let issued = number > 0
                    && number <= MAX_NUMBER
                    && (self.wrapped || number <= self.last_number);
                rejected.extend(abandoned(unsent, issued));
            }
        }
        if !rejected.is_empty() {
            let _ = self.out.send(Ok(Event::Rejected(rejected))).await;
        }
    }

    /// The client stopped sending: each partition finishes what it has and closes.
    fn client_left(&mut self, transport: Option<String>) {
        self.closing = true;
        for part in self.parts.values_mut() {
            if let Some(tx) = part.inbound.take()
                && let Some(reason) = &transport
            {
                let _ = tx.try_send(Err(InboundError::Transport(reason.clone())));
            }
            // A partition still waiting for its lease has nothing to finish.
            if part.wanted_since.is_some() {
                part.stop.cancel();
            }
            part.leaving = true;
        }
    }

    /// Ends the client stream with `err`; the partitions close as if the client had gone.
    async fn end(&mut self, err: SessionError) {
        self.ended_with = Some(err.to_string());
        let _ = self.out.send(Err(err)).await;
        self.client_left(Some("the subscription stream ended".into()));
    }
}

/// The rejections for a batch whose partition is not read here (any more).
fn abandoned(batch: ClientBatch, issued: bool) -> Vec<SlotError> {
    let reject = |slot: SlotId| {
        if issued {
            SlotError::AlreadySettled(slot)
        } else {
            SlotError::UnknownSlot(slot)
        }
    };
    batch.slots().into_iter().map(reject).collect()
}

/// One partition's task: takes its consumer name here and its lease in Redis, waiting while
/// the previous owner drains, then runs its subscription until it ends.
struct PartTask {
    shared: Arc<Shared>,
    id: String,
    source: Source,
    request: OpenRequest,
    placement: Placement,
    out: Outbound,
    events: mpsc::UnboundedSender<PartEvent>,
    draining_told: Arc<AtomicBool>,
    partition: u32,
    number: u64,
}

impl PartTask {
    async fn run(self, inbound: mpsc::Receiver<Inbound>) {
        let (partition, number) = (self.partition, self.number);
        let events = self.events.clone();
        self.read(inbound).await;
        let _ = events.send(PartEvent::Ended { partition, number });
    }

    async fn read(self, inbound: mpsc::Receiver<Inbound>) {
        let stop = self.placement.stop.clone();
        let claim = self.source.claim().expect("a stream has a consumer");
        let (part_out, events) = mpsc::channel(PART_OUTBOUND);
        tokio::spawn(
            forward(
                events,
                self.out.clone(),
                Arc::clone(&self.draining_told),
                Arc::clone(&self.shared),
            )
            .in_current_span(),
        );
        loop {
            if stop.is_cancelled() {
                return;
            }
            let opened = match take_consumer(&self.shared, &claim, Wanted::ForPartition).await {
                Ok(()) => {
                    let release = Release(Arc::clone(&self.shared), claim.clone());
                    Subscription::open(
                        &self.shared,
                        self.id.clone(),
                        self.source.clone(),
                        self.request.clone(),
                        &part_out,
                        Some(release),
                        self.placement.clone(),
                    )
                    .await
                }
                Err(busy) => Err(busy),
            };
            match opened {
                Ok(subscription) => {
                    let _ = self.events.send(PartEvent::Reading {
                        partition: self.partition,
                        number: self.number,
                    });
                    drop(part_out);
                    subscription.run(ReceiverStream::new(inbound)).await;
                    return;
                }
                // Another replica still holds it (draining, or dead and its lease not yet
                // expired), or Redis did not answer: try again. What Redis refuses (ACL, a
                // key's type) ends the client stream with why.
                Err(
                    err @ (SessionError::ConsumerBusy { .. }
                    | SessionError::Redis(RedisError::Unavailable(_) | RedisError::Timeout(_))),
                ) => {
                    let wait = match err {
                        SessionError::ConsumerBusy { .. } => RETRY,
                        _ => {
                            warn!(error = %err, "cannot open the partition yet; trying again");
                            RETRY * 4
                        }
                    };
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = stop.cancelled() => return,
                    }
                }
                Err(err) => {
                    warn!(error = %err, "cannot read the partition");
                    let _ = self.events.send(PartEvent::Failed(err));
                    return;
                }
            }
        }
    }
}

/// Passes a partition's events to the client stream. Its `Opened` is the member's to tell, and
/// `Draining` too, once, at shutdown; a partition handed over drains and ends unannounced. A
/// lease lost to another replica ends the partition, not the client stream.
async fn forward(
    mut events: mpsc::Receiver<Result<Event, SessionError>>,
    out: Outbound,
    draining_told: Arc<AtomicBool>,
    shared: Arc<Shared>,
) {
    while let Some(event) = events.recv().await {
        let event = match event {
            Ok(Event::Opened(_)) => continue,
            Ok(Event::Draining { .. })
                if !shared.shutdown.is_cancelled()
                    || draining_told.swap(true, Ordering::Relaxed) =>
            {
                continue;
            }
            // A partition handed over ends as a subscription does at shutdown; the client
            // stream goes on.
            Err(SessionError::ShuttingDown) if !shared.shutdown.is_cancelled() => continue,
            Err(SessionError::LeaseLost { key, consumer }) => {
                warn!(
                    key,
                    consumer, "the partition's lease was lost to another replica"
                );
                continue;
            }
            event => event,
        };
        if out.send(event).await.is_err() {
            return;
        }
    }
}
