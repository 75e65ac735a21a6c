//! What the sidecar asks of a list without reading it: its type before a subscription opens,
//! its depth for the backlog gauges.

use fred::prelude::*;

use super::super::entry::into_bytes;
use super::super::keys::key_type;
use super::super::{RedisError, arg, call_at};
use super::ListKeys;

/// The list's length and the entries its consumers hold on their processing lists (reliable
/// lists; 0 for a simple list), for the backlog gauges.
pub(crate) async fn depth(client: &Client, keys: &ListKeys) -> Result<(i64, i64), RedisError> {
    let at = |name, args| call_at(client, name, args, false, Some(keys.slot));
    let waiting = at("LLEN", vec![arg(&keys.key)])
        .await?
        .as_i64()
        .unwrap_or(0);
    let Value::Array(consumers) = at("SMEMBERS", vec![arg(&keys.consumers)]).await? else {
        return Ok((waiting, 0));
    };
    let mut held = 0;
    for consumer in consumers.into_iter().filter_map(into_bytes) {
        let processing = keys.processing_of(&consumer);
        held += at("LLEN", vec![arg(&processing)])
            .await?
            .as_i64()
            .unwrap_or(0);
    }
    Ok((waiting, held))
}

/// Refuses to read a key that holds something other than a list (or nothing yet).
pub(crate) async fn check_type(client: &Client, keys: &ListKeys) -> Result<(), RedisError> {
    match key_type(client, &keys.key, keys.slot).await?.as_str() {
        "list" | "none" => Ok(()),
        other => Err(RedisError::Refused {
            command: "a list read".into(),
            message: format!(
                "WRONGTYPE {:?} holds a {}, not a list",
                String::from_utf8_lossy(&keys.key),
                if other.is_empty() { "?" } else { other }
            ),
        }),
    }
}
