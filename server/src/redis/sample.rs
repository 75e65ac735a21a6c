//! What the sidecar samples of a subscription's keys for its gauges: a stream group's pending
//! count and lag (XINFO GROUPS) and the delay set's depth (ZCARD).

use fred::prelude::*;

use super::entry::into_bytes;
use super::form::Form;
use super::stream::StreamKeys;
use super::{RedisError, arg, call, call_at};

/// One sample; `None` where Redis did not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Streams: the group's pending entries and lag (lag is nil when Redis cannot tell).
    pub group: Option<(i64, Option<i64>)>,
    pub delayed: Option<i64>,
}

/// Samples a subscription's keys; what fails is left out (and logged at debug).
pub async fn sample(client: &Client, form: &Form) -> Sample {
    let mut sample = Sample::default();
    if let Form::Stream(keys) = form {
        match group_info(client, keys).await {
            Ok(info) => sample.group = Some(info),
            Err(err) => tracing::debug!(error = %err, "sampling XINFO GROUPS failed"),
        }
    }
    if let Ok(Value::Integer(depth)) = call(client, "ZCARD", vec![arg(form.delayed())], false).await
    {
        sample.delayed = Some(depth);
    }
    sample
}

/// The group's `pending` and `lag` from XINFO GROUPS.
async fn group_info(client: &Client, keys: &StreamKeys) -> Result<(i64, Option<i64>), RedisError> {
    // Routed by the key's slot: the first argument is "GROUPS", not the key.
    let Value::Array(groups) = call_at(
        client,
        "XINFO",
        vec![Value::from("GROUPS"), arg(&keys.key)],
        false,
        Some(keys.slot),
    )
    .await?
    else {
        return Ok((0, None));
    };
    for group in groups {
        let fields: Vec<Value> = match group {
            Value::Array(fields) => fields,
            Value::Map(map) => map
                .inner()
                .into_iter()
                .flat_map(|(k, v)| [Value::from(k), v])
                .collect(),
            _ => continue,
        };
        let mut name = None;
        let mut pending = 0;
        let mut lag = None;
        for pair in fields.chunks(2) {
            let [field, value] = pair else { continue };
            match field.as_str().as_deref() {
                Some("name") => name = into_bytes(value.clone()),
                Some("pending") => pending = value.as_i64().unwrap_or(0),
                Some("lag") => lag = value.as_i64(),
                _ => {}
            }
        }
        if name.as_ref() == Some(&keys.group) {
            return Ok((pending, lag));
        }
    }
    Ok((0, None))
}
