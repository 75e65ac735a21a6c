//! What the fault injection tests share: the stream they fill, [`KEY`], with entries `e<n>` (id
//! `<n+1>-0`), and what a [`Worker`]'s side effects tallied of them in Redis (`SADD seen e<n>`,
//! `INCR count`, `HINCRBY applied e<n> 1`): `SCARD seen` says nothing was lost, `count` how
//! often side effects ran, and `applied` which entry ran twice.

use std::time::Duration;

use fred::prelude::*;

use crate::{Worker, pending};

/// The stream the fault tests fill.
pub const KEY: &str = "orders";

/// The id of entry `e<n>`.
fn id_of(n: usize) -> String {
    format!("{}-0", n + 1)
}

/// Appends entries `e<n>` for `ns` (ids `<n+1>-0`), with a `pad`-byte header, in pipelines of
/// 1000.
pub async fn produce(client: &Client, ns: std::ops::Range<usize>, pad: usize) {
    let padding = "x".repeat(pad);
    let ns: Vec<usize> = ns.collect();
    for chunk in ns.chunks(1000) {
        let pipeline = client.pipeline();
        for &n in chunk {
            let mut args = vec![KEY.to_owned(), id_of(n), "_payload".into(), format!("e{n}")];
            if pad > 0 {
                args.extend(["h:pad".to_owned(), padding.clone()]);
            }
            let _: Result<Value, _> = pipeline.custom(fred::cmd!("XADD"), args).await;
        }
        let replies: Vec<Value> = pipeline.all().await.expect("XADD");
        assert_eq!(replies.len(), chunk.len());
    }
}

/// `SCARD seen`, `GET count` and the group's pending count.
pub async fn state(inspect: &Client) -> (usize, usize, u64) {
    let seen: usize = inspect.scard("seen").await.unwrap();
    let count: Option<usize> = inspect.get("count").await.unwrap();
    (seen, count.unwrap_or(0), pending(inspect, KEY, "g").await)
}

/// Answers reads whole until all `n` entries are in `seen` and nothing is pending.
pub async fn work_until_settled(worker: &mut Worker, inspect: &Client, n: usize, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (seen, count, pending) = state(inspect).await;
        if seen == n && pending == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled within {within:?}: seen {seen} of {n}, count {count}, pending {pending}"
        );
        worker.work_once(Duration::from_millis(300)).await;
    }
}
