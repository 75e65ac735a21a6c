//! The messages between the gRPC layer and a subscription, in the domain's terms: what a
//! client asks ([`ClientMessage`]: an open, then batches of commands and outcomes), what a
//! subscription tells it ([`Event`]), and why a stream ends ([`SessionError`]). The gRPC layer
//! converts them from and to the wire; nothing here knows a proto type.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::SpanContext;
use thiserror::Error;
use tokio::sync::mpsc;

use crate::domain::{Entry, Mode, Source};
use crate::engine::FlushReport;
use crate::policy::PolicyError;
use crate::redis::RedisError;
use crate::redis::keys::admit::SlotMismatch;
use crate::window::{Command, CommandError, Outcome, ReadId, SlotError, SlotId};

/// A validated open request.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenRequest {
    pub source: Source,
    pub count: u32,
    pub block: Duration,
    pub mode: Mode,
    pub max_in_flight: u32,
    /// Deliveries at which an entry goes to `dead_letter` instead of back; 0: no cap.
    pub max_deliveries: u32,
    /// The dead-letter key (a stream for streams, a list for lists).
    pub dead_letter: Option<String>,
    /// A flush report whose flush carried the next read goes out in that read's message.
    pub reports_in_reads: bool,
    /// Where an entry's ordering key comes from; `None`: unordered.
    pub ordering_key: Option<crate::domain::OrderingKey>,
    /// A stream's partitions, shared out among the group's subscriptions that open it alike
    /// (see [`crate::partition`]); 0: the stream itself.
    pub partitions: u32,
}

/// A client message, converted and checked by the gRPC layer.
#[derive(Debug)]
pub enum ClientMessage {
    Open(OpenRequest),
    Batch(ClientBatch),
}

/// Commands and outcomes of one client message; items that failed conversion are errors here
/// and become per-slot rejections.
#[derive(Debug, Default)]
pub struct ClientBatch {
    pub commands: Vec<(SlotId, Result<Command, CommandError>)>,
    pub outcomes: Vec<Result<SettleRequest, SlotError>>,
    /// Slots still being worked on.
    pub extend: Vec<SlotId>,
}

impl ClientBatch {
    /// The batch split by `part` of each item's slot, in the batch's order within each part.
    pub fn split_by<K: Eq + Hash>(self, part: impl Fn(SlotId) -> K) -> HashMap<K, ClientBatch> {
        let mut split: HashMap<K, ClientBatch> = HashMap::new();
        for (slot, command) in self.commands {
            let batch = split.entry(part(slot)).or_default();
            batch.commands.push((slot, command));
        }
        for outcome in self.outcomes {
            let batch = split.entry(part(outcome_slot(&outcome))).or_default();
            batch.outcomes.push(outcome);
        }
        for slot in self.extend {
            split.entry(part(slot)).or_default().extend.push(slot);
        }
        split
    }

    /// Every slot the batch names, once each, in ascending order.
    pub fn slots(&self) -> Vec<SlotId> {
        let mut slots: Vec<SlotId> = self.commands.iter().map(|(slot, _)| *slot).collect();
        slots.extend(self.outcomes.iter().map(outcome_slot));
        slots.extend(&self.extend);
        slots.sort_unstable();
        slots.dedup();
        slots
    }
}

/// The slot an outcome is for, whether or not it converted.
fn outcome_slot(outcome: &Result<SettleRequest, SlotError>) -> SlotId {
    match outcome {
        Ok(settle) => settle.slot,
        Err(err) => err.slot(),
    }
}

/// An outcome for a slot, with the client's reason and trace context.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleRequest {
    pub slot: SlotId,
    pub outcome: Outcome,
    pub reason: Option<String>,
    /// The client's span for handling the delivery, if it sent a valid one.
    pub trace: Option<SpanContext>,
}

/// What the session tells the client.
#[derive(Debug)]
pub enum Event {
    Opened(Box<Opened>),
    Read {
        read_id: ReadId,
        first_slot: SlotId,
        entries: Vec<Arc<Entry>>,
        /// Pub/sub: messages dropped for a slow client since the previous read.
        lost: u64,
        /// The read span's `traceparent`, for deliveries whose producer sent no context.
        read_trace: Option<String>,
        /// The report of the flush this read rode on (`reports_in_reads`).
        flushed: Option<FlushReport>,
        /// The partition it came from, on a partitioned stream.
        partition: Option<u32>,
    },
    Flushed(FlushReport),
    Rejected(Vec<SlotError>),
    /// Shutdown began: outcomes within `grace` still count.
    Draining {
        grace: Duration,
        outstanding: usize,
    },
}

/// The settings in effect for an opened subscription.
#[derive(Clone, Debug)]
pub struct Opened {
    pub subscription_id: String,
    /// The source with the consumer name in use filled in.
    pub source: Source,
    pub request: OpenRequest,
}

/// Why a session ended the stream.
#[derive(Debug, Error)]
pub enum SessionError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("the first message of a subscription must be `open`")]
    NotOpened,
    #[error("the subscription is already open: send `open` only once per stream")]
    SecondOpen,
    #[error(
        "consumer {consumer:?} is already reading {key:?} in group {group:?}, on this sidecar or another sharing its Redis; give each subscription its own consumer name, or wait for the other stream to close (a holder that died frees the name when its lease expires)"
    )]
    ConsumerBusy {
        key: String,
        group: String,
        consumer: String,
    },
    #[error("cannot open the subscription: {0}")]
    Layout(#[from] SlotMismatch),
    #[error(
        "the consumer group {group:?} of {key:?} was deleted while this subscription read it; create it again where consumers should resume (XGROUP CREATE {key} {group} <id>), or reopen to create it at the open's start_id"
    )]
    GroupDeleted { key: String, group: String },
    #[error("{key:?} no longer holds what a {form} subscription reads (WRONGTYPE)")]
    WrongType { key: String, form: &'static str },
    #[error(
        "the lease on consumer {consumer:?} of {key:?} expired unrenewed and another subscription took the name; reopen to get a fresh consumer state"
    )]
    LeaseLost { key: String, consumer: String },
    #[error("cannot open the subscription: {0}")]
    Redis(#[from] RedisError),
    #[error("cannot open the subscription: {0}")]
    Denied(#[from] PolicyError),
    #[error("{0}")]
    TooLarge(String),
    #[error(
        "window-sidecar is shutting down; unsettled deliveries stay pending and will be delivered again"
    )]
    ShuttingDown,
}

/// An item of the client's stream as the session sees it.
pub type Inbound = Result<ClientMessage, InboundError>;

/// A client message that could not be used.
#[derive(Debug, Error)]
pub enum InboundError {
    /// The message is malformed: the stream ends with INVALID_ARGUMENT.
    #[error("{0}")]
    Invalid(String),
    /// The message is larger than the sidecar accepts: the stream ends with
    /// RESOURCE_EXHAUSTED.
    #[error("{0}")]
    TooLarge(String),
    /// The transport failed: the client is gone.
    #[error("the client's stream failed: {0}")]
    Transport(String),
}

/// Where a subscription's events go.
pub(super) type Outbound = mpsc::Sender<Result<Event, SessionError>>;
