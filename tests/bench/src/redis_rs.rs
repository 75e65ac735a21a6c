//! The hand-pipelined redis-rs loop: what a Rust user writes with the `redis` crate (tokio, one
//! multiplexed connection) instead of the sidecar.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::time::Instant;

use crate::client::ClientOutcome;
use crate::workload::{CONSUMER, GROUP, Payload, STREAM, now_us};

pub(crate) struct RedisRsLoop {
    connection: MultiplexedConnection,
    count: u32,
}

/// One entry of a read: its id and its `_payload`.
type Entry = (Vec<u8>, Vec<u8>);

/// The entries of an XREADGROUP reply (`nil` on a BLOCK timeout).
fn parse_read(reply: Value) -> Result<Vec<Entry>, String> {
    let Value::Array(streams) = reply else {
        return Ok(Vec::new());
    };
    let mut entries = Vec::new();
    for stream in streams {
        let Value::Array(pair) = stream else { continue };
        let Some(Value::Array(list)) = pair.into_iter().nth(1) else {
            continue;
        };
        for entry in list {
            let Value::Array(mut parts) = entry else {
                return Err("an entry is not an array".into());
            };
            let fields = parts.pop();
            let Some(Value::BulkString(id)) = parts.pop() else {
                return Err("an entry without an id".into());
            };
            let Some(Value::Array(fields)) = fields else {
                return Err("an entry without fields".into());
            };
            let mut payload = None;
            let mut it = fields.into_iter();
            while let (Some(name), Some(value)) = (it.next(), it.next()) {
                if let (Value::BulkString(name), Value::BulkString(value)) = (name, value)
                    && name == b"_payload"
                {
                    payload = Some(value);
                }
            }
            entries.push((id, payload.ok_or("an entry without _payload")?));
        }
    }
    Ok(entries)
}

impl RedisRsLoop {
    /// One multiplexed connection, without a response timeout: a read blocks for a second when
    /// the stream is empty, longer than redis-rs's default of half a second.
    pub(crate) async fn connect(url: &str, count: u32) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis-rs client: {e}"))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(None);
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| format!("redis-rs connect: {e}"))?;
        Ok(Self { connection, count })
    }

    /// XREADGROUP COUNT n, then one pipeline with an INCR per entry and one XACK.
    pub(crate) async fn run(mut self, expect: u64, latency: bool) -> Result<ClientOutcome, String> {
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(GROUP)
            .arg(CONSUMER)
            .arg("COUNT")
            .arg(self.count)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg(STREAM)
            .arg(">");
        let mut out = ClientOutcome::default();
        while out.acked < expect {
            let reply: Value = read
                .query_async(&mut self.connection)
                .await
                .map_err(|e| format!("XREADGROUP: {e}"))?;
            out.round_trips += 1;
            let entries = parse_read(reply)?;
            if entries.is_empty() {
                continue;
            }
            out.reads += 1;
            let arrived = now_us();
            let n = entries.len();
            let mut pipeline = redis::pipe();
            let mut xack = redis::cmd("XACK");
            xack.arg(STREAM).arg(GROUP);
            let mut sent = Vec::with_capacity(if latency { n } else { 0 });
            for (id, payload) in &entries {
                let payload = Payload::decode(payload)?;
                pipeline.cmd("INCR").arg(payload.counter_key());
                xack.arg(id.as_slice());
                if latency {
                    sent.push(payload.ts);
                }
            }
            pipeline.add_command(xack);
            let replies: Vec<Value> = pipeline
                .query_async(&mut self.connection)
                .await
                .map_err(|e| format!("pipeline: {e}"))?;
            out.round_trips += 1;
            let acked = match replies.last() {
                Some(Value::Int(acked)) => u64::try_from(*acked).unwrap_or(0),
                _ => 0,
            };
            if acked != n as u64 {
                return Err(format!("XACK acknowledged {acked} of {n}"));
            }
            out.sample(now_us(), arrived, &sent, n, latency);
            out.acked += acked;
        }
        out.done_at = Some(Instant::now());
        Ok(out)
    }
}
