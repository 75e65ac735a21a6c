//! The workload: the stream `bench` with its entries, the group `g`, the Redis-side figures
//! (`INFO commandstats` after `CONFIG RESETSTAT`) and the verification of a run; for the
//! ordered contenders, each entry's ordering key and the per-key lists that prove the order;
//! for the retrying contender, which entries it retries and what the stream holds after.

use bytes::Bytes;
use fred::prelude::*;
use serde::Deserialize;

pub(crate) const STREAM: &str = "bench";
pub(crate) const GROUP: &str = "g";
pub(crate) const CONSUMER: &str = "c1";
/// The side effect's key space: `count:<id mod COUNTERS>`.
pub(crate) const COUNTERS: u64 = 1000;

/// What a consumer decodes from an entry's `_payload`.
#[derive(Debug, Deserialize)]
pub(crate) struct Payload {
    pub id: u64,
    /// When the producer was due to send the XADD (microseconds since the epoch); 0 in
    /// prefilled streams.
    #[serde(default)]
    pub ts: u64,
}

impl Payload {
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("payload is not the bench JSON: {e}"))
    }

    /// The key of this entry's side effect.
    pub(crate) fn counter_key(&self) -> String {
        format!("count:{}", self.id % COUNTERS)
    }
}

/// About 100 bytes of JSON with an `id` (and the producer's send time `ts`).
pub(crate) fn payload(id: u64, ts: u64) -> Bytes {
    let mut s = format!(
        r#"{{"id":{id},"ts":{ts},"kind":"order.created","customer":"c-{}","sku":"sku-{}","note":""#,
        id % 7919,
        id % 997
    );
    while s.len() < 98 {
        s.push('x');
    }
    s.push_str("\"}");
    Bytes::from(s)
}

/// Microseconds since the Unix epoch (the clock every process of the bench shares).
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

fn err(what: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

pub(crate) async fn connect(url: &str) -> Result<Client, String> {
    let config = Config::from_url(url).map_err(err("redis url"))?;
    let client = Builder::from_config(config)
        .build()
        .map_err(err("redis client"))?;
    client.init().await.map_err(err("connect to redis"))?;
    Ok(client)
}

fn xadd_args(stream: &str, id: u64, ts: u64) -> Vec<Value> {
    vec![
        Value::from(stream),
        Value::from("*"),
        Value::from("_payload"),
        Value::Bytes(payload(id, ts)),
    ]
}

/// The raw field of an entry that holds its ordering key (`Open.ordering_key.field`): the
/// bench's producer writes plain fields, not the headers layout.
pub(crate) const KEY_FIELD: &str = "k";
/// Keys of the ordered contenders.
pub(crate) const ORDERING_KEYS: u64 = 1000;
/// The hot key of the hot-key variant.
pub(crate) const HOT_KEY: &str = "hot";

/// How the ordered contenders' entries are keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keying {
    /// Entry `id` has key `k<id mod 1000>`: 1,000 keys round-robin.
    RoundRobin,
    /// Every even `id` has the hot key; the odd ones go round-robin over the other 999 keys.
    Hot,
}

impl Keying {
    /// The ordering key of entry `id`.
    pub(crate) fn key_of(self, id: u64) -> String {
        match self {
            Keying::RoundRobin => format!("k{}", id % ORDERING_KEYS),
            Keying::Hot if id.is_multiple_of(2) => HOT_KEY.to_owned(),
            Keying::Hot => format!("k{}", (id / 2) % (ORDERING_KEYS - 1)),
        }
    }

    /// Whether entry `id` has the hot key.
    pub(crate) fn is_hot(self, id: u64) -> bool {
        self == Keying::Hot && id.is_multiple_of(2)
    }

    /// Entries of `0..n` that are not hot.
    pub(crate) fn others(self, n: u64) -> u64 {
        match self {
            Keying::RoundRobin => n,
            Keying::Hot => n / 2,
        }
    }
}

/// The list an ordered contender's side effect appends an entry's id to: `RPUSH
/// order:<key> <id>`, one command per delivery like the unordered contenders' `INCR`.
pub(crate) fn order_list(key: &str) -> String {
    format!("{ORDER_PREFIX}{key}")
}

/// A tagged replica's list for `key` (the many-partitions phase): `order:{<p>}:<key>`, `p` the
/// key's partition of `partitions`, in the slot of the partition's stream on a cluster.
pub(crate) fn tagged_order_list(key: &str, partitions: u32) -> String {
    let p = window_sidecar::partition::of_key(key.as_bytes(), partitions);
    format!("{ORDER_PREFIX}{{{p}}}:{key}")
}

/// What an ordered contender's list names start with, before the key.
pub(crate) const ORDER_PREFIX: &str = "order:";

/// Creates the stream and group `g` (at `0`, so it sees every entry).
pub(crate) async fn create_group(client: &Client) -> Result<(), String> {
    create_group_on(client, STREAM).await
}

/// Creates `stream` and its group `g` (at `0`).
pub(crate) async fn create_group_on(client: &Client, stream: &str) -> Result<(), String> {
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", stream, GROUP, "0", "MKSTREAM"],
        )
        .await
        .map_err(err("XGROUP CREATE"))?;
    Ok(())
}

/// Appends `n` entries with ids `0..n`, in pipelines of 2,000.
pub(crate) async fn fill(client: &Client, n: u64) -> Result<(), String> {
    fill_stream(client, STREAM, n).await
}

/// Appends `n` entries with ids `0..n` to `stream`, in pipelines of 2,000.
pub(crate) async fn fill_stream(client: &Client, stream: &str, n: u64) -> Result<(), String> {
    let mut next = 0;
    while next < n {
        let end = (next + 2_000).min(n);
        let pipeline = client.pipeline();
        for id in next..end {
            let _: Result<Value, _> = pipeline
                .custom(fred::cmd!("XADD"), xadd_args(stream, id, 0))
                .await;
        }
        for reply in pipeline.try_all::<Value>().await {
            reply.map_err(err("XADD"))?;
        }
        next = end;
    }
    Ok(())
}

/// Appends `n` entries with ids `0..n`, each with its ordering key in field `k`, in
/// pipelines of 2,000.
pub(crate) async fn fill_keyed(client: &Client, n: u64, keying: Keying) -> Result<(), String> {
    let ids: Vec<u64> = (0..n).collect();
    fill_keyed_to(client, &ids, keying, |_| STREAM.to_owned()).await
}

/// The XADD of entry `id` with its ordering key in field `k`, to `stream`.
pub(crate) fn xadd_keyed_args(stream: &str, id: u64, keying: Keying) -> Vec<Value> {
    let mut args = xadd_args(stream, id, 0);
    args.push(Value::from(KEY_FIELD));
    args.push(Value::from(keying.key_of(id)));
    args
}

/// Appends the entries `ids`, in that order, each with its ordering key in field `k`, each to
/// the stream `stream_of` names for it, in pipelines of 2,000.
pub(crate) async fn fill_keyed_to(
    client: &Client,
    ids: &[u64],
    keying: Keying,
    stream_of: impl Fn(u64) -> String,
) -> Result<(), String> {
    for chunk in ids.chunks(2_000) {
        let pipeline = client.pipeline();
        for &id in chunk {
            let args = xadd_keyed_args(&stream_of(id), id, keying);
            let _: Result<Value, _> = pipeline.custom(fred::cmd!("XADD"), args).await;
        }
        for reply in pipeline.try_all::<Value>().await {
            reply.map_err(err("XADD"))?;
        }
    }
    Ok(())
}

pub(crate) async fn reset_stats(client: &Client) -> Result<(), String> {
    let _: Value = client
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .map_err(err("CONFIG RESETSTAT"))?;
    Ok(())
}

/// Calls per command since the last `CONFIG RESETSTAT` (from `INFO commandstats`), without the
/// bench's own `INFO` and `CONFIG`, sorted by calls.
pub(crate) async fn command_stats(client: &Client) -> Result<Vec<(String, u64)>, String> {
    let info: String = client
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .map_err(err("INFO commandstats"))?;
    let mut stats: Vec<(String, u64)> = info
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, fields) = rest.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| name != "info" && name != "config")
        .collect();
    stats.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(stats)
}

/// XPENDING's count of group `g`.
async fn pending(client: &Client) -> Result<u64, String> {
    pending_on(client, STREAM).await
}

/// XPENDING's count of group `g` on `stream`.
pub(crate) async fn pending_on(client: &Client, stream: &str) -> Result<u64, String> {
    let reply: Value = client
        .xpending(stream, GROUP, ())
        .await
        .map_err(err("XPENDING"))?;
    match reply {
        Value::Array(parts) => parts.first().and_then(Value::as_u64),
        _ => None,
    }
    .ok_or_else(|| "XPENDING summary without a count".to_owned())
}

/// The sum of the counters `count:0…count:999`.
async fn counters_sum(client: &Client) -> Result<u64, String> {
    let keys: Vec<Value> = (0..COUNTERS)
        .map(|i| Value::from(format!("count:{i}")))
        .collect();
    let reply: Value = client
        .custom(fred::cmd!("MGET"), keys)
        .await
        .map_err(err("MGET"))?;
    let Value::Array(values) = reply else {
        return Err("MGET did not answer an array".into());
    };
    Ok(values.iter().filter_map(Value::as_u64).sum())
}

async fn xlen(client: &Client) -> Result<u64, String> {
    xlen_on(client, STREAM).await
}

pub(crate) async fn xlen_on(client: &Client, stream: &str) -> Result<u64, String> {
    let xlen: Value = client.xlen(stream).await.map_err(err("XLEN"))?;
    Ok(xlen.as_u64().unwrap_or(0))
}

/// Checks that the run is complete: nothing pending in group `g`, and the counters sum to
/// exactly `expect` (every entry's side effect ran once).
pub(crate) async fn verify(client: &Client, expect: u64) -> Result<(), String> {
    let pending = pending(client).await?;
    let sum = counters_sum(client).await?;
    let xlen = xlen(client).await?;
    if pending != 0 || sum != expect || xlen != expect {
        return Err(format!(
            "not verified: XPENDING {pending} (want 0), counters sum {sum} (want {expect}), \
             XLEN {xlen} (want {expect})"
        ));
    }
    Ok(())
}

/// Checks an ordered run: nothing pending, XLEN `expect`, and each key's list holds exactly
/// its entries' ids in stream order (every side effect ran once, and in the key's order).
pub(crate) async fn verify_ordered(
    client: &Client,
    expect: u64,
    keying: Keying,
) -> Result<(), String> {
    let (pending, xlen) = (pending(client).await?, xlen(client).await?);
    if pending != 0 || xlen != expect {
        return Err(format!(
            "not verified: XPENDING {pending} (want 0), XLEN {xlen} (want {expect})"
        ));
    }
    verify_lists(client, &keyed(0..expect, keying), order_list).await
}

/// Each key's ids, in the order `ids` gives them.
pub(crate) fn keyed(
    ids: impl IntoIterator<Item = u64>,
    keying: Keying,
) -> std::collections::BTreeMap<String, Vec<u64>> {
    let mut want: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for id in ids {
        want.entry(keying.key_of(id)).or_default().push(id);
    }
    want
}

/// Checks that each key's list (named by `list_of`) holds exactly its ids of `want`, in that
/// order: every side effect ran once, in its key's order.
pub(crate) async fn verify_lists(
    client: &Client,
    want: &std::collections::BTreeMap<String, Vec<u64>>,
    list_of: impl Fn(&str) -> String,
) -> Result<(), String> {
    let pipeline = client.pipeline();
    for key in want.keys() {
        let _: Result<Value, _> = pipeline.lrange(list_of(key), 0, -1).await;
    }
    let lists: Vec<Vec<u64>> = pipeline.all().await.map_err(err("LRANGE"))?;
    for ((key, want), got) in want.iter().zip(&lists) {
        if got != want {
            return Err(format!(
                "not verified: key {key}'s side effects ran {} times for {} entries{}",
                got.len(),
                want.len(),
                out_of_order(got, want)
            ));
        }
    }
    Ok(())
}

/// Where `got` leaves `want`, for an error message.
pub(crate) fn out_of_order(got: &[u64], want: &[u64]) -> String {
    let at = got.iter().zip(want).position(|(g, w)| g != w);
    format!(
        ", out of order from position {at:?} (first ids {:?}, want {:?})",
        &got[..got.len().min(5)],
        &want[..want.len().min(5)]
    )
}

/// One delivery in [`RETRY_ONE_IN`] is retried: the retrying contender's share.
pub(crate) const RETRY_ONE_IN: u64 = 20;

/// Whether the retrying contender retries entry `id` (once, on its first delivery): a hash of
/// the id, so that which entries are retried is the same in every run and spread over the
/// reads rather than every 20th.
pub(crate) fn retried(id: u64) -> bool {
    // splitmix64's finalizer.
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).is_multiple_of(RETRY_ONE_IN)
}

/// What a stream under retention holds once a retrying run is over.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Retained {
    /// Entries ever added to the stream (`XINFO STREAM` `entries-added`, which a trim leaves):
    /// N when retries stay in place, N plus the retries when each appends a copy.
    pub entries_added: u64,
    /// XLEN once the trim had run (or two seconds passed).
    pub xlen: u64,
}

/// Checks a retrying run: nothing pending in group `g` and the counters sum to exactly
/// `expect` (a retried delivery runs no side effect: each entry's ran once, at its ack). The
/// stream's length is not checked but measured ([`Retained`]): retention trims what every
/// group acknowledged, and a retry that appends a copy adds an entry.
pub(crate) async fn verify_retried(client: &Client, expect: u64) -> Result<Retained, String> {
    let pending = pending(client).await?;
    let sum = counters_sum(client).await?;
    if pending != 0 || sum != expect {
        return Err(format!(
            "not verified: XPENDING {pending} (want 0), counters sum {sum} (want {expect})"
        ));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut length = xlen(client).await?;
    while length > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        length = xlen(client).await?;
    }
    let info: Value = client
        .custom(fred::cmd!("XINFO"), vec!["STREAM", STREAM])
        .await
        .map_err(err("XINFO STREAM"))?;
    let Value::Array(fields) = info else {
        return Err("XINFO STREAM did not answer an array".into());
    };
    let entries_added = fields
        .chunks(2)
        .find_map(|kv| match kv {
            [k, v] if k.as_str().as_deref() == Some("entries-added") => v.as_u64(),
            _ => None,
        })
        .ok_or("XINFO STREAM without entries-added (Redis 7.0 or later has it)")?;
    Ok(Retained {
        entries_added,
        xlen: length,
    })
}
