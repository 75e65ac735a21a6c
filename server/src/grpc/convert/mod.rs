//! Every conversion between the wire contract and the domain, in one place. Client messages
//! are checked here: a malformed `open` becomes an error that ends the stream, a malformed
//! command or outcome becomes a per-slot rejection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use crate::domain::{
    Body, Entry, Framing, ListSource, Mode, OrderingKey, PubSubSource, Source, StreamSource,
};
use crate::engine::FlushReport;
use crate::partition::MAX_PARTITIONS;
use crate::proto;
use crate::session::{
    ClientBatch, ClientMessage, Event, InboundError, OpenRequest, Opened, SettleRequest,
};
use crate::telemetry::parse_traceparent;
use crate::window::{Command, Outcome, Reason, SlotError};

/// Why a client's message cannot be taken: each names the field and what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConvertError {
    #[error("{0} is required")]
    Required(&'static str),
    #[error("{0} must not be negative")]
    Negative(&'static str),
    #[error("{field} {value} is not a known {kind} ({known})")]
    UnknownValue {
        field: &'static str,
        value: i32,
        kind: &'static str,
        known: &'static str,
    },
    #[error("{field} must be {allowed}, got {got}")]
    OutOfRange {
        field: &'static str,
        allowed: String,
        got: String,
    },
    /// Fields that do not go together, or one that does not apply where it is set.
    #[error("{0}")]
    Combination(&'static str),
    #[error(transparent)]
    Packed(#[from] PackedError),
}

/// Limits an `open` is checked against.
#[derive(Clone, Copy, Debug)]
pub struct OpenLimits {
    pub max_count: u32,
    pub max_in_flight: u32,
}

/// BLOCK when the client sets none.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(5);
/// The longest BLOCK a client may ask for: longer only delays shutdown and reconnects.
pub use crate::domain::MAX_BLOCK;
/// min_idle when the client sets none.
pub const DEFAULT_MIN_IDLE: Duration = Duration::from_secs(60);
/// A reliable list's dead_after when the client sets none.
pub use crate::domain::DEFAULT_DEAD_AFTER;
/// A pub/sub buffer when the client sets none.
pub const DEFAULT_PUBSUB_BUFFER: usize = 10_000;
/// The largest pub/sub buffer a client may ask for.
pub const MAX_PUBSUB_BUFFER: usize = 1_000_000;

/// A client message to the domain.
pub fn client_message(
    message: proto::SubscribeRequest,
    limits: OpenLimits,
) -> Result<ClientMessage, InboundError> {
    match message.kind {
        Some(proto::subscribe_request::Kind::Open(open)) => open_request(open, limits)
            .map(ClientMessage::Open)
            .map_err(|err| InboundError::Invalid(err.to_string())),
        Some(proto::subscribe_request::Kind::Batch(batch)) => client_batch(batch)
            .map(ClientMessage::Batch)
            .map_err(|err| InboundError::Invalid(err.to_string())),
        None => Err(InboundError::Invalid(
            "the message carries neither `open` nor `batch`".into(),
        )),
    }
}

fn open_request(open: proto::Open, limits: OpenLimits) -> Result<OpenRequest, ConvertError> {
    let framing = framing(open.framing, "open.framing")?;
    let partitions = match &open.source {
        Some(proto::open::Source::Stream(stream)) => stream.partitions,
        _ => 0,
    };
    if partitions > MAX_PARTITIONS {
        return Err(ConvertError::OutOfRange {
            field: "open.stream.partitions",
            allowed: format!("0 (the stream itself) to {MAX_PARTITIONS}"),
            got: partitions.to_string(),
        });
    }
    let source = match open.source {
        Some(proto::open::Source::Stream(_)) if open.framing != 0 => {
            return Err(ConvertError::Combination(
                "open.framing is for lists and pub/sub; a stream entry keeps its headers as fields",
            ));
        }
        Some(proto::open::Source::Stream(stream)) => Source::Stream(stream_source(stream)?),
        Some(proto::open::Source::ReliableList(list)) => Source::List(ListSource {
            key: required(list.key, "open.reliable_list.key")?,
            consumer: list.consumer,
            dead_after: match list.dead_after {
                None => DEFAULT_DEAD_AFTER,
                Some(d) => match duration(d, "open.reliable_list.dead_after")? {
                    d if d.is_zero() => DEFAULT_DEAD_AFTER,
                    d => d,
                },
            },
            reliable: true,
            framing,
        }),
        Some(proto::open::Source::SimpleList(list)) => Source::List(ListSource {
            key: required(list.key, "open.simple_list.key")?,
            consumer: String::new(),
            dead_after: DEFAULT_DEAD_AFTER,
            reliable: false,
            framing,
        }),
        Some(proto::open::Source::Pubsub(pubsub)) => {
            Source::PubSub(pubsub_source(pubsub, framing)?)
        }
        None => {
            return Err(ConvertError::Combination(
                "open.source is required: set open.stream, open.reliable_list, open.simple_list or open.pubsub",
            ));
        }
    };
    if open.count == 0 || open.count > limits.max_count {
        return Err(ConvertError::OutOfRange {
            field: "open.count",
            allowed: format!(
                "between 1 and {} (the sidecar's --max-count)",
                limits.max_count
            ),
            got: open.count.to_string(),
        });
    }
    let block = match open.block {
        None => DEFAULT_BLOCK,
        Some(d) => match duration(d, "open.block")? {
            d if d.is_zero() => DEFAULT_BLOCK,
            d if d > MAX_BLOCK => {
                return Err(ConvertError::OutOfRange {
                    field: "open.block",
                    allowed: format!("at most {MAX_BLOCK:?}"),
                    got: format!("{d:?}"),
                });
            }
            d => d,
        },
    };
    let mode = match proto::Mode::try_from(open.mode) {
        Ok(proto::Mode::Unspecified | proto::Mode::Pipeline) => Mode::Pipeline,
        Ok(proto::Mode::Atomic) => Mode::Atomic,
        Err(_) => {
            return Err(ConvertError::UnknownValue {
                field: "open.mode",
                value: open.mode,
                kind: "mode",
                known: "MODE_PIPELINE = 1, MODE_ATOMIC = 2",
            });
        }
    };
    let max_in_flight = match open.max_in_flight {
        0 => open
            .count
            .saturating_mul(2)
            .min(limits.max_in_flight.max(open.count)),
        n if n > limits.max_in_flight => {
            return Err(ConvertError::OutOfRange {
                field: "open.max_in_flight",
                allowed: format!(
                    "at most {} (the sidecar's --max-in-flight)",
                    limits.max_in_flight
                ),
                got: n.to_string(),
            });
        }
        n => n.max(open.count),
    };
    let dead_letter = match open.dead_letter.and_then(|d| d.target) {
        None => None,
        Some(proto::dead_letter::Target::Stream(key)) => match &source {
            Source::Stream(_) => Some(required(key, "open.dead_letter.stream")?),
            _ => {
                return Err(ConvertError::Combination(
                    "open.dead_letter.stream is for stream subscriptions; a list subscription takes open.dead_letter.list",
                ));
            }
        },
        Some(proto::dead_letter::Target::List(key)) => match &source {
            Source::List(_) => Some(required(key, "open.dead_letter.list")?),
            _ => {
                return Err(ConvertError::Combination(
                    "open.dead_letter.list is for list subscriptions; a stream subscription takes open.dead_letter.stream",
                ));
            }
        },
    };
    if matches!(source, Source::PubSub(_)) && (open.max_deliveries > 0 || dead_letter.is_some()) {
        return Err(ConvertError::Combination(
            "pub/sub messages are delivered once: open.max_deliveries and open.dead_letter do not apply",
        ));
    }
    if open.max_deliveries > 0 && dead_letter.is_none() {
        return Err(ConvertError::Combination(
            "open.max_deliveries needs open.dead_letter: where entries past the cap go",
        ));
    }
    if open.max_deliveries == 0 && dead_letter.is_some() {
        return Err(ConvertError::Combination(
            "open.dead_letter needs open.max_deliveries: after how many deliveries entries go there",
        ));
    }
    let ordering_key = ordering_key(open.ordering_key, &source)?;
    Ok(OpenRequest {
        source,
        count: open.count,
        block,
        mode,
        max_in_flight,
        max_deliveries: open.max_deliveries,
        dead_letter,
        reports_in_reads: open.reports_in_reads,
        ordering_key,
        partitions,
    })
}

/// `open.ordering_key`, for the forms that keep an entry in Redis until it is settled.
fn ordering_key(
    key: Option<proto::OrderingKey>,
    source: &Source,
) -> Result<Option<OrderingKey>, ConvertError> {
    let Some(key) = key else {
        return Ok(None);
    };
    let key = key_source(
        key,
        ["open.ordering_key.header", "open.ordering_key.field"],
        "open.ordering_key needs its source: set open.ordering_key.header or open.ordering_key.field",
    )?;
    match (source, &key) {
        (Source::Stream(_), _) => Ok(Some(key)),
        (Source::List(list), OrderingKey::Header(_)) if list.reliable => Ok(Some(key)),
        (Source::List(list), OrderingKey::Field(_)) if list.reliable => {
            Err(ConvertError::Combination(
                "open.ordering_key.field is for streams; a list value carries its key as a header of its frame (open.ordering_key.header)",
            ))
        }
        _ => Err(ConvertError::Combination(
            "open.ordering_key is for streams and reliable lists: a simple list or pub/sub entry leaves Redis when read, so a retry could not keep its place",
        )),
    }
}

/// Where an ordering key is (`at`: the names of its header and field options, for errors).
fn key_source(
    key: proto::OrderingKey,
    at: [&'static str; 2],
    missing: &'static str,
) -> Result<OrderingKey, ConvertError> {
    match key.source {
        Some(proto::ordering_key::Source::Header(name)) => {
            Ok(OrderingKey::Header(required(name, at[0])?))
        }
        Some(proto::ordering_key::Source::Field(name)) => {
            Ok(OrderingKey::Field(required(name, at[1])?))
        }
        None => Err(ConvertError::Combination(missing)),
    }
}

fn required(value: String, field: &'static str) -> Result<String, ConvertError> {
    if value.is_empty() {
        Err(ConvertError::Required(field))
    } else {
        Ok(value)
    }
}

fn pubsub_source(
    pubsub: proto::PubSubSource,
    framing: Framing,
) -> Result<PubSubSource, ConvertError> {
    if pubsub.channels.is_empty()
        && pubsub.patterns.is_empty()
        && pubsub.sharded_channels.is_empty()
    {
        return Err(ConvertError::Combination(
            "open.pubsub needs at least one of channels, patterns or sharded_channels",
        ));
    }
    let all = pubsub
        .channels
        .iter()
        .chain(&pubsub.patterns)
        .chain(&pubsub.sharded_channels);
    if all.clone().any(|c| c.is_empty()) {
        return Err(ConvertError::Combination(
            "open.pubsub: channel and pattern names must not be empty",
        ));
    }
    let buffer = match pubsub.buffer {
        0 => DEFAULT_PUBSUB_BUFFER,
        n if n as usize > MAX_PUBSUB_BUFFER => {
            return Err(ConvertError::OutOfRange {
                field: "open.pubsub.buffer",
                allowed: format!("at most {MAX_PUBSUB_BUFFER}"),
                got: n.to_string(),
            });
        }
        n => n as usize,
    };
    Ok(PubSubSource {
        channels: pubsub.channels,
        patterns: pubsub.patterns,
        sharded_channels: pubsub.sharded_channels,
        buffer,
        framing,
    })
}

fn framing(value: i32, field: &'static str) -> Result<Framing, ConvertError> {
    match proto::Framing::try_from(value) {
        Ok(proto::Framing::Unspecified | proto::Framing::Frames) => Ok(Framing::Frames),
        Ok(proto::Framing::Raw) => Ok(Framing::Raw),
        Err(_) => Err(ConvertError::UnknownValue {
            field,
            value,
            kind: "framing",
            known: "FRAMING_FRAMES = 1, FRAMING_RAW = 2",
        }),
    }
}

fn stream_source(stream: proto::StreamSource) -> Result<StreamSource, ConvertError> {
    if stream.key.is_empty() {
        return Err(ConvertError::Required("open.stream.key"));
    }
    if stream.group.is_empty() {
        return Err(ConvertError::Required("open.stream.group"));
    }
    let start_id = match stream.start_id.as_str() {
        "" => "0".to_owned(),
        "0" | "$" => stream.start_id,
        id if is_stream_id(id) => stream.start_id,
        other => {
            return Err(ConvertError::OutOfRange {
                field: "open.stream.start_id",
                allowed: r#""0", "$" or an entry id like "1700000000000-0""#.to_owned(),
                got: format!("{other:?}"),
            });
        }
    };
    let min_idle = match stream.min_idle {
        None => DEFAULT_MIN_IDLE,
        Some(d) => match duration(d, "open.stream.min_idle")? {
            d if d.is_zero() => DEFAULT_MIN_IDLE,
            d => d,
        },
    };
    Ok(StreamSource {
        key: stream.key,
        group: stream.group,
        consumer: stream.consumer,
        start_id,
        min_idle,
    })
}

fn is_stream_id(id: &str) -> bool {
    let mut parts = id.splitn(2, '-');
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    parts.next().is_some_and(digits) && parts.next().is_none_or(digits)
}

fn duration(d: prost_types::Duration, field: &'static str) -> Result<Duration, ConvertError> {
    Duration::try_from(d).map_err(|_| ConvertError::Negative(field))
}

fn client_batch(batch: proto::Batch) -> Result<ClientBatch, ConvertError> {
    let mut commands: Vec<_> = batch
        .commands
        .into_iter()
        .map(|c| (c.slot, Command::new(&c.name, c.args)))
        .collect();
    if !(batch.packed_commands.is_empty() && batch.packed_command_slots.is_empty()) {
        let slots = batch.packed_command_slots;
        let packed = packed::unpack(&batch.packed_commands, slots.len())?;
        // A name that is not UTF-8 becomes one no command has, rejected for its slot.
        commands.extend(slots.into_iter().zip(packed).map(|(slot, (name, args))| {
            (slot, Command::new(&String::from_utf8_lossy(&name), args))
        }));
    }
    let acks = batch.acks.into_iter().map(|slot| {
        Ok(SettleRequest {
            slot,
            outcome: Outcome::Ack,
            reason: None,
            trace: None,
        })
    });
    let outcomes = batch
        .outcomes
        .into_iter()
        .map(outcome)
        .chain(acks)
        .collect();
    Ok(ClientBatch {
        commands,
        outcomes,
        extend: batch.extend,
    })
}

fn outcome(o: proto::Outcome) -> Result<SettleRequest, SlotError> {
    let slot = o.slot;
    let invalid = |reason: String| SlotError::InvalidOutcome { slot, reason };
    let outcome = match proto::OutcomeKind::try_from(o.kind) {
        Ok(proto::OutcomeKind::Ack) => Outcome::Ack,
        Ok(proto::OutcomeKind::Drop) => Outcome::Drop,
        Ok(proto::OutcomeKind::Retry) => Outcome::Retry,
        Ok(proto::OutcomeKind::RetryAfter) => {
            let delay = o
                .delay
                .ok_or_else(|| invalid("retry_after needs a delay".into()))?;
            let delay = Duration::try_from(delay)
                .map_err(|_| invalid("retry_after needs a positive delay".into()))?;
            if delay < Duration::from_millis(1) {
                return Err(invalid("retry_after needs a delay of at least 1 ms".into()));
            }
            Outcome::RetryAfter(delay)
        }
        Ok(proto::OutcomeKind::DeadLetter) => Outcome::DeadLetter,
        Ok(proto::OutcomeKind::Unspecified) => {
            return Err(invalid(
                "the outcome has no kind: set ack, drop, retry, retry_after or dead_letter".into(),
            ));
        }
        Err(_) => return Err(invalid(format!("outcome kind {} is not known", o.kind))),
    };
    let reason = (!o.reason.is_empty()).then_some(o.reason);
    let trace = o.trace.and_then(|t| {
        let state = (!t.tracestate.is_empty()).then_some(t.tracestate.as_str());
        parse_traceparent(&t.traceparent, state)
    });
    Ok(SettleRequest {
        slot,
        outcome,
        reason,
        trace,
    })
}

/// A session event to the wire.
pub fn event(event: Event) -> proto::SubscribeResponse {
    use proto::subscribe_response::Kind;
    let kind = match event {
        Event::Opened(opened) => Kind::Opened(opened_message(*opened)),
        Event::Read {
            read_id,
            first_slot,
            entries,
            lost,
            read_trace,
            flushed,
            partition,
        } => Kind::Read(proto::Read {
            read_id,
            lost,
            partition,
            flushed: flushed.map(flush_report),
            deliveries: entries
                .iter()
                .zip(first_slot..)
                .map(|(entry, slot)| delivery(slot, entry, read_trace.as_deref()))
                .collect(),
        }),
        Event::Flushed(report) => Kind::Flush(flush_report(report)),
        Event::Rejected(errors) => Kind::Rejections(proto::Rejections {
            rejections: errors.iter().map(rejection).collect(),
        }),
        Event::Draining { grace, outstanding } => Kind::Draining(proto::Draining {
            grace: proto_duration(grace),
            outstanding: outstanding as u32,
        }),
    };
    proto::SubscribeResponse { kind: Some(kind) }
}

fn opened_message(opened: Opened) -> proto::Opened {
    let request = opened.request;
    let (consumer, min_idle) = match opened.source {
        Source::Stream(stream) => (stream.consumer, Some(stream.min_idle)),
        Source::List(list) => (list.consumer, None),
        Source::PubSub(_) => (String::new(), None),
    };
    proto::Opened {
        subscription_id: opened.subscription_id,
        consumer,
        count: request.count,
        block: proto_duration(request.block),
        mode: match request.mode {
            Mode::Pipeline => proto::Mode::Pipeline,
            Mode::Atomic => proto::Mode::Atomic,
        } as i32,
        max_in_flight: request.max_in_flight,
        min_idle: min_idle.and_then(proto_duration),
        packed_commands: true,
        partitions: request.partitions,
    }
}

fn proto_duration(d: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

fn delivery(slot: u64, entry: &Arc<Entry>, read_trace: Option<&str>) -> proto::Delivery {
    let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
    let mut delivery = proto::Delivery {
        slot,
        entry_id: text(&entry.id),
        delivery_count: entry.delivery_count,
        ..Default::default()
    };
    match entry.body() {
        Body::Layout { payload, headers } => {
            delivery.payload = payload.clone();
            delivery.headers = headers
                .into_iter()
                .map(|(name, value)| (String::from_utf8_lossy(name).into_owned(), text(value)))
                .collect::<HashMap<_, _>>();
        }
        Body::Fields => {
            delivery.fields = entry
                .fields
                .iter()
                .map(|(name, value)| proto::Field {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect();
        }
    }
    if let Some(channel) = &entry.channel {
        delivery.channel = text(channel);
    }
    if let Some(traceparent) = entry.header("traceparent") {
        delivery.trace = Some(proto::TraceContext {
            traceparent: text(traceparent),
            tracestate: entry.header("tracestate").map(text).unwrap_or_default(),
        });
    } else if let Some(traceparent) = read_trace {
        delivery.trace = Some(proto::TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: String::new(),
        });
    }
    delivery
}

fn flush_report(report: FlushReport) -> proto::FlushReport {
    let result = report.result;
    proto::FlushReport {
        read_id: report.read_id,
        segments_kept: report.segments_kept as u32,
        segments_dropped: report.segments_dropped as u32,
        commands: report.commands as u32,
        settles: report.settles as u32,
        ok: result.ok(),
        error: result.first_error.unwrap_or_default(),
        failed: result.failed as u32,
        settle_failed: result.settle_failed,
        aborted: result.aborted as u32,
        dead_lettered: report.dead_lettered as u32,
        outcome_unknown: result.unknown,
        requeue_refused: result
            .requeue_refused
            .into_iter()
            .map(|refused| proto::RequeueRefusal {
                slot: refused.slot,
                entry_id: String::from_utf8_lossy(&refused.entry_id).into_owned(),
                error: refused.error,
            })
            .collect(),
        side_effect_failures: result
            .side_effect_failures
            .into_iter()
            .map(|failure| proto::SideEffectFailure {
                slot: failure.slot,
                entry_id: String::from_utf8_lossy(&failure.entry_id).into_owned(),
                command: failure.command,
                error: failure.error,
                settled: failure.settled,
            })
            .collect(),
    }
}

fn rejection(err: &SlotError) -> proto::Rejection {
    proto::Rejection {
        slot: err.slot(),
        reason: wire_reason(err.reason()) as i32,
        message: err.to_string(),
        command: err.command().unwrap_or_default().to_owned(),
    }
}

/// The wire's name of each reason, one to one.
fn wire_reason(reason: Reason) -> proto::RejectionReason {
    use proto::RejectionReason as R;
    match reason {
        Reason::UnknownSlot => R::UnknownSlot,
        Reason::AlreadySettled => R::AlreadySettled,
        Reason::InvalidCommand => R::InvalidCommand,
        Reason::ForbiddenCommand => R::ForbiddenCommand,
        Reason::InvalidOutcome => R::InvalidOutcome,
        Reason::IncompleteSegment => R::IncompleteSegment,
        Reason::CrossSlot => R::CrossSlot,
        Reason::PermissionDenied => R::PermissionDenied,
        Reason::LimitExceeded => R::LimitExceeded,
    }
}

mod packed;
mod publish;

pub use packed::PackedError;
pub use publish::{publish_fields, publish_partitions, publish_target};

#[cfg(test)]
mod tests;
