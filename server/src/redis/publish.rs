//! Publish: entries written in one pipeline to a stream (XADD), a list (LPUSH) or a channel
//! (PUBLISH, SPUBLISH); to a partitioned stream, one pipeline per partition.

use bytes::Bytes;
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use super::entry::into_bytes;
use super::{RedisError, str_arg};
use crate::domain::{Framing, Target, frame};

/// What each entry became.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Published {
    /// Streams: the ids Redis gave the entries.
    pub ids: Vec<Bytes>,
    /// Channels: the subscribers each entry reached.
    pub receivers: Vec<u64>,
}

/// One entry as the value a list or a channel holds: a frame when it has headers (and the
/// framing allows them), else the bare payload. `fields` are in the payload-and-headers layout.
pub(crate) fn value_of(fields: &[(Bytes, Bytes)], framing: Framing) -> Bytes {
    match fields {
        [(_, payload)] => payload.clone(),
        [(_, payload), ..] if framing == Framing::Raw => payload.clone(),
        _ => frame::encode(fields),
    }
}

/// Writes entries (one field list each) in one pipeline.
pub(crate) async fn publish(
    client: &Client,
    target: &Target,
    entries: Vec<Vec<(Bytes, Bytes)>>,
    framing: Framing,
) -> Result<Published, RedisError> {
    // Publish waits for a connection, follows MOVED and retries after a reconnect (a retried
    // write may happen twice: publishing is at least once, as with any client).
    let options = fred::types::config::Options {
        max_attempts: Some(3),
        ..Default::default()
    };
    let pipeline = fred::clients::Pipeline::from(client.with_options(&options));
    let name = match target {
        Target::Stream { .. } => "XADD",
        Target::List(_) => "LPUSH",
        Target::Channel(_) => "PUBLISH",
        Target::ShardedChannel(_) => "SPUBLISH",
    };
    let command = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
    for fields in entries {
        let args = match target {
            Target::Stream { key, max_len } => {
                let mut args = vec![Value::Bytes(key.clone())];
                if let Some(max_len) = max_len {
                    args.extend([
                        str_arg("MAXLEN"),
                        str_arg("~"),
                        Value::Integer(*max_len as i64),
                    ]);
                }
                args.push(str_arg("*"));
                args.extend(
                    fields
                        .into_iter()
                        .flat_map(|(f, v)| [Value::Bytes(f), Value::Bytes(v)]),
                );
                args
            }
            Target::List(key) | Target::Channel(key) | Target::ShardedChannel(key) => {
                vec![
                    Value::Bytes(key.clone()),
                    Value::Bytes(value_of(&fields, framing)),
                ]
            }
        };
        // Buffering a command in a pipeline only stores it; it cannot fail.
        let _: Result<Value, _> = pipeline.custom(command.clone(), args).await;
    }
    let mut published = Published::default();
    // Sent once: the commands move into fred's request (fred as patched in server/vendor).
    for reply in pipeline.try_all_taken::<Value>().await {
        let reply = reply.map_err(|e| RedisError::from_fred(name, &e))?;
        match target {
            Target::Stream { .. } => {
                published
                    .ids
                    .push(into_bytes(reply).ok_or_else(|| RedisError::Protocol {
                        command: "XADD",
                        detail: "the reply is not an id".into(),
                    })?)
            }
            Target::List(_) => {}
            Target::Channel(_) | Target::ShardedChannel(_) => {
                published.receivers.push(reply.as_u64().unwrap_or(0))
            }
        }
    }
    Ok(published)
}

/// Writes entries to the partitions of a stream, `partitions[i]` being entry `i`'s: one
/// pipeline per partition, side by side (on a cluster each partition may be on another node),
/// each partition's entries in the order given. The ids come back in the entries' order. A
/// partition Redis refuses fails the call, though the others may have been written: publishing
/// is at least once, and the caller writes them all again.
pub(crate) async fn publish_partitioned(
    client: &Client,
    streams: &[(Bytes, Option<u64>)],
    partitions: &[u32],
    entries: Vec<Vec<(Bytes, Bytes)>>,
) -> Result<Published, RedisError> {
    let mut by_partition: std::collections::BTreeMap<u32, (Vec<usize>, Vec<_>)> =
        Default::default();
    for (index, (partition, fields)) in partitions.iter().zip(entries).enumerate() {
        let (indexes, entries) = by_partition.entry(*partition).or_default();
        indexes.push(index);
        entries.push(fields);
    }
    let writes = by_partition
        .into_iter()
        .map(|(partition, (indexes, entries))| {
            let (key, max_len) = streams[partition as usize].clone();
            async move {
                let target = Target::Stream { key, max_len };
                let written = publish(client, &target, entries, Framing::Frames).await?;
                Ok::<_, RedisError>(indexes.into_iter().zip(written.ids))
            }
        });
    let mut ids = vec![Bytes::new(); partitions.len()];
    for written in futures::future::try_join_all(writes).await? {
        for (index, id) in written {
            ids[index] = id;
        }
    }
    Ok(Published {
        ids,
        receivers: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn a_bare_payload_stays_bare_and_headers_make_a_frame() {
        let bare = [(b("_payload"), b("{}"))];
        assert_eq!(value_of(&bare, Framing::Frames), b("{}"));
        let with_headers = [(b("_payload"), b("{}")), (b("h:k"), b("v"))];
        let framed = value_of(&with_headers, Framing::Frames);
        assert_eq!(frame::decode(&framed).as_deref(), Some(&with_headers[..]));
        assert_eq!(value_of(&with_headers, Framing::Raw), b("{}"));
    }
}
