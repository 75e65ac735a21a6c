//! What the sidecar samples of a subscription's keys for its backlog gauges: a stream group's
//! pending count and lag (XINFO GROUPS), a list's length and what its consumers hold on their
//! processing lists (LLEN), and the delay set's depth (ZCARD).

use fred::prelude::*;

use super::form::Form;
use super::list;
use super::stream::{self, GroupInfo, StreamKeys};
use super::{RedisError, arg, call, call_at};

/// One sample; `None` where Redis did not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sample {
    /// Streams: the group, if it exists.
    pub group: Option<Group>,
    /// Lists: entries waiting in the list, and entries on consumers' processing lists.
    pub list: Option<(i64, i64)>,
    pub delayed: Option<i64>,
}

/// What XINFO GROUPS says of one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Group {
    /// The stream has no such group (or no longer).
    Missing,
    /// Its pending entries and its lag (nil when Redis cannot tell).
    Found { pending: i64, lag: Option<i64> },
}

/// Samples a subscription's keys; what fails is left out (and logged at debug).
pub(crate) async fn sample(client: &Client, form: &Form) -> Sample {
    let mut sample = Sample::default();
    match form {
        Form::Stream(keys) => match group_info(client, keys).await {
            Ok(group) => sample.group = Some(group),
            Err(err) => tracing::debug!(error = %err, "sampling XINFO GROUPS failed"),
        },
        Form::List(keys) => match list::depth(client, keys).await {
            Ok(depth) => sample.list = Some(depth),
            Err(err) => tracing::debug!(error = %err, "sampling a list's length failed"),
        },
        Form::PubSub(_) => {}
    }
    if let Ok(Value::Integer(depth)) = call(client, "ZCARD", vec![arg(form.delayed())], false).await
    {
        sample.delayed = Some(depth);
    }
    sample
}

/// The group's `pending` and `lag` from XINFO GROUPS.
async fn group_info(client: &Client, keys: &StreamKeys) -> Result<Group, RedisError> {
    // Routed by the key's slot: the first argument is "GROUPS", not the key.
    let reply = call_at(
        client,
        "XINFO",
        vec![Value::from("GROUPS"), arg(&keys.key)],
        false,
        Some(keys.slot),
    )
    .await?;
    Ok(match stream::find_group(reply, &keys.group) {
        Some(GroupInfo { pending, lag, .. }) => Group::Found { pending, lag },
        None => Group::Missing,
    })
}
