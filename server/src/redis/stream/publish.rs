//! Publish: entries appended to a stream in one pipeline.

use bytes::Bytes;
use fred::prelude::*;

use super::super::entry::into_bytes;
use super::super::{RedisError, str_arg};

/// Appends entries to a stream in one pipeline; returns their ids.
pub async fn publish(
    client: &Client,
    key: &str,
    entries: Vec<Vec<(Bytes, Bytes)>>,
    max_len: Option<u64>,
) -> Result<Vec<Bytes>, RedisError> {
    // Publish waits for a connection, follows MOVED and retries after a reconnect (a retried
    // XADD may append an entry twice: publishing is at least once, as with any client).
    let options = fred::types::config::Options {
        max_attempts: Some(3),
        ..Default::default()
    };
    let pipeline = fred::clients::Pipeline::from(client.with_options(&options));
    let key = Bytes::copy_from_slice(key.as_bytes());
    for fields in entries {
        let mut args = vec![Value::Bytes(key.clone())];
        if let Some(max_len) = max_len {
            args.extend([
                str_arg("MAXLEN"),
                str_arg("~"),
                Value::Integer(max_len as i64),
            ]);
        }
        args.push(str_arg("*"));
        args.extend(
            fields
                .into_iter()
                .flat_map(|(f, v)| [Value::Bytes(f), Value::Bytes(v)]),
        );
        let command = fred::types::CustomCommand::new_static(
            "XADD",
            fred::types::ClusterHash::FirstKey,
            false,
        );
        // Buffering a command in a pipeline only stores it; it cannot fail.
        let _: Result<Value, _> = pipeline.custom(command, args).await;
    }
    pipeline
        .try_all::<Value>()
        .await
        .into_iter()
        .map(|reply| {
            let reply = reply.map_err(|e| RedisError::from_fred("XADD", &e))?;
            into_bytes(reply).ok_or_else(|| RedisError::Protocol {
                command: "XADD",
                detail: "the reply is not an id".into(),
            })
        })
        .collect()
}
