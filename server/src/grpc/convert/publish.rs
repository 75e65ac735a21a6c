//! Publish requests to the domain: where the entries go (exactly one target) and how each
//! entry becomes the fields or the value written there.

use bytes::Bytes;

use super::{ConvertError, framing, key_source};
use crate::domain::{Framing, OrderingKey, Target};
use crate::partition::MAX_PARTITIONS;
use crate::proto;

/// Where a Publish writes, and how its entries become values there.
pub fn publish_target(request: &proto::PublishRequest) -> Result<(Target, Framing), ConvertError> {
    let name = |s: &String| Bytes::copy_from_slice(s.as_bytes());
    let mut targets = [
        (!request.stream.is_empty()).then(|| Target::Stream {
            key: name(&request.stream),
            max_len: (request.max_len > 0).then_some(request.max_len),
        }),
        (!request.list.is_empty()).then(|| Target::List(name(&request.list))),
        (!request.channel.is_empty()).then(|| Target::Channel(name(&request.channel))),
        (!request.sharded_channel.is_empty())
            .then(|| Target::ShardedChannel(name(&request.sharded_channel))),
    ]
    .into_iter()
    .flatten();
    let (Some(target), None) = (targets.next(), targets.next()) else {
        return Err(ConvertError::Combination(
            "set exactly one of stream, list, channel and sharded_channel: where the entries go",
        ));
    };
    let framing = framing(request.framing, "framing")?;
    if let Target::Stream { .. } = target {
        if request.framing != 0 {
            return Err(ConvertError::Combination(
                "framing is for lists and channels; a stream entry keeps its headers as fields",
            ));
        }
    } else if request.max_len > 0 {
        return Err(ConvertError::Combination(
            "max_len trims a stream; it does not apply to lists and channels",
        ));
    }
    Ok((target, framing))
}

/// A partitioned stream's Publish: how many partitions, and where each entry's ordering key
/// is; `None` for any other target.
pub fn publish_partitions(
    request: &proto::PublishRequest,
) -> Result<Option<(u32, OrderingKey)>, ConvertError> {
    match (request.partitions, request.partition_by.clone()) {
        (0, None) => Ok(None),
        (0, Some(_)) => Err(ConvertError::Combination(
            "partition_by needs partitions: how many partitions the stream has",
        )),
        (_, _) if request.stream.is_empty() => Err(ConvertError::Combination(
            "partitions is for streams: set stream to the partitioned stream's name",
        )),
        (partitions, _) if partitions > MAX_PARTITIONS => Err(ConvertError::OutOfRange {
            field: "partitions",
            allowed: format!("0 (the stream itself) to {MAX_PARTITIONS}"),
            got: partitions.to_string(),
        }),
        (_, None) => Err(ConvertError::Combination(
            "partitions needs partition_by: the header or field that holds each entry's ordering key",
        )),
        (partitions, Some(by)) => {
            let by = key_source(
                by,
                ["partition_by.header", "partition_by.field"],
                "partition_by needs its source: set partition_by.header or partition_by.field",
            )?;
            Ok(Some((partitions, by)))
        }
    }
}

/// A Publish entry as the fields to write. `trace` is the context written when the entry
/// brings none of its own (the publish span's, or the caller's); a bare payload for a list or a
/// channel stays bare, so consumers that know no frame read it as it is.
pub fn publish_fields(
    mut entry: proto::PublishEntry,
    target: &Target,
    framing: Framing,
    trace: Option<&str>,
) -> Result<Vec<(Bytes, Bytes)>, ConvertError> {
    let has_layout =
        !entry.payload.is_empty() || !entry.headers.is_empty() || entry.trace.is_some();
    if !entry.fields.is_empty() && has_layout {
        return Err(ConvertError::Combination(
            "a publish entry has either `fields` or `payload`/`headers`, not both",
        ));
    }
    let value_target = !matches!(target, Target::Stream { .. });
    if value_target && !entry.fields.is_empty() {
        return Err(ConvertError::Combination(
            "a list value or a message is a `payload` with `headers`; `fields` are for streams",
        ));
    }
    let has_headers = !entry.headers.is_empty() || entry.trace.is_some();
    if value_target && framing == Framing::Raw && has_headers {
        return Err(ConvertError::Combination(
            "FRAMING_RAW writes the payload alone: drop the headers and trace, or frame them (FRAMING_FRAMES)",
        ));
    }
    let carries_trace = !value_target || (framing == Framing::Frames && has_headers);
    if carries_trace && entry.trace.is_none() && !entry.headers.contains_key("traceparent") {
        entry.trace = trace.map(|traceparent| proto::TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: String::new(),
        });
    }
    if !has_layout && !value_target {
        if entry.fields.is_empty() {
            return Err(ConvertError::Combination(
                "a publish entry needs `fields` or a `payload`",
            ));
        }
        let mut fields: Vec<_> = entry
            .fields
            .into_iter()
            .map(|f| (f.name, f.value))
            .collect();
        if let Some(trace) = entry.trace {
            fields.push((
                Bytes::from_static(b"h:traceparent"),
                Bytes::from(trace.traceparent),
            ));
        }
        return Ok(fields);
    }
    let mut fields = vec![(Bytes::from_static(b"_payload"), entry.payload)];
    let mut headers: Vec<_> = entry.headers.into_iter().collect();
    // Map order is random; a stable order makes entries reproducible.
    headers.sort();
    if let Some(trace) = entry.trace {
        if !trace.traceparent.is_empty() {
            headers.push(("traceparent".into(), trace.traceparent));
        }
        if !trace.tracestate.is_empty() {
            headers.push(("tracestate".into(), trace.tracestate));
        }
    }
    for (name, value) in headers {
        if name.is_empty() {
            return Err(ConvertError::Combination("a header name must not be empty"));
        }
        fields.push((Bytes::from(format!("h:{name}")), Bytes::from(value)));
    }
    Ok(fields)
}
