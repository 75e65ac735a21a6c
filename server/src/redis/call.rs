//! One command with raw arguments, routed to the node of its key or of a given slot, and
//! arguments made from bytes: how the sidecar's own commands (scripts, reads, look-ups) are
//! sent.

use bytes::Bytes;
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use super::error::RedisError;

/// Sends one command with raw arguments and returns its reply; on a cluster it goes to the
/// node of its first string argument.
pub async fn call(
    client: &Client,
    name: &'static str,
    args: Vec<Value>,
    blocking: bool,
) -> Result<Value, RedisError> {
    call_at(client, name, args, blocking, None).await
}

/// Like [`call`], routed to the node that owns `slot` when one is given (for commands whose
/// key is not their first argument, such as XREADGROUP).
pub async fn call_at(
    client: &Client,
    name: &'static str,
    args: Vec<Value>,
    blocking: bool,
    slot: Option<u16>,
) -> Result<Value, RedisError> {
    let hash = slot.map_or(ClusterHash::FirstKey, ClusterHash::Custom);
    let command = CustomCommand::new_static(name, hash, blocking);
    client
        .custom::<Value, _>(command, args)
        .await
        .map_err(|e| RedisError::from_fred(name, &e))
}

/// Bytes to a fred argument without copying.
pub fn arg(bytes: &Bytes) -> Value {
    Value::Bytes(bytes.clone())
}

/// A string to a fred argument.
pub fn str_arg(s: &str) -> Value {
    Value::Bytes(Bytes::copy_from_slice(s.as_bytes()))
}
