//! One command with raw arguments, routed to the node of its key or of a given slot, and
//! arguments made from bytes: how the sidecar's own commands (scripts, reads, look-ups) are
//! sent. Visible to `redis/` alone: the rest of the server asks Redis through the named
//! functions of `redis/`, so every command the sidecar sends is written, and its refusals
//! classified, in one folder.

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, Resp3Frame};

use super::error::RedisError;

/// Sends one command with raw arguments and returns its reply; on a cluster it goes to the
/// node of its first string argument.
pub(super) async fn call(
    client: &Client,
    name: &'static str,
    args: Vec<Value>,
    blocking: bool,
) -> Result<Value, RedisError> {
    call_at(client, name, args, blocking, None).await
}

/// Like [`call`], routed to the node that owns `slot` when one is given (for commands whose
/// key is not their first argument, such as XREADGROUP).
pub(super) async fn call_at<C: ClientLike>(
    client: &C,
    name: &'static str,
    args: Vec<Value>,
    blocking: bool,
    slot: Option<u16>,
) -> Result<Value, RedisError> {
    let frame = call_frame_at(client, name, args, blocking, slot).await?;
    Value::try_from(frame).map_err(|e| RedisError::from_fred(name, &e))
}

/// Like [`call_at`], with the reply as the frame it came in, for a reply the sidecar takes
/// apart itself (a read's entries, see [`super::entry::Reply`]): no fred value per element.
pub(super) async fn call_frame_at<C: ClientLike>(
    client: &C,
    name: &'static str,
    args: Vec<Value>,
    blocking: bool,
    slot: Option<u16>,
) -> Result<Resp3Frame, RedisError> {
    let hash = slot.map_or(ClusterHash::FirstKey, ClusterHash::Custom);
    let command = CustomCommand::new_static(name, hash, blocking);
    client
        .custom_raw(command, args)
        .await
        .and_then(refused)
        .map_err(|e| RedisError::from_fred(name, &e))
}

/// A reply frame that is an error reply as the error fred makes of it (as [`call_at`] returns
/// it), any other as it came.
pub(super) fn refused(frame: Resp3Frame) -> Result<Resp3Frame, Error> {
    match frame {
        Resp3Frame::SimpleError { .. } | Resp3Frame::BlobError { .. } => {
            Err(Value::try_from(frame).expect_err("an error reply converts to an error"))
        }
        frame => Ok(frame),
    }
}

/// Bytes to a fred argument without copying.
pub(super) fn arg(bytes: &Bytes) -> Value {
    Value::Bytes(bytes.clone())
}

/// A string to a fred argument.
pub(super) fn str_arg(s: &str) -> Value {
    Value::Bytes(Bytes::copy_from_slice(s.as_bytes()))
}

/// Runs a script by its SHA on the node of `slot`, loading it first where the node does not
/// have it (one that restarted or was promoted): fred's `evalsha_with_reload` as plain
/// commands, so that any client sends them with its options (a subscription's reader, see
/// [`super::read_connection`]).
pub(super) async fn eval_script<C: ClientLike>(
    client: &C,
    script: &Script,
    slot: u16,
    keys: Vec<Value>,
    args: Vec<Value>,
) -> Result<Value, RedisError> {
    let mut evalsha = Vec::with_capacity(2 + keys.len() + args.len());
    evalsha.push(Value::from(script.sha1().clone()));
    evalsha.push(Value::Integer(keys.len() as i64));
    evalsha.extend(keys);
    evalsha.extend(args);
    match call_at(client, "EVALSHA", evalsha.clone(), false, Some(slot)).await {
        Err(RedisError::Refused { message, .. }) if message.starts_with("NOSCRIPT") => {
            let lua = script.lua().cloned().unwrap_or_default();
            let load = vec![Value::from("LOAD"), Value::from(lua)];
            call_at(client, "SCRIPT", load, false, Some(slot)).await?;
            call_at(client, "EVALSHA", evalsha, false, Some(slot)).await
        }
        reply => reply,
    }
}
