//! What the soak reads of the sidecar and Redis: connections (`CLIENT LIST`, `INFO`), the
//! sidecar's file descriptors and threads at rest, what its metrics and admin view still show
//! of subscriptions, the commands it sends, and whether Redis holds every produced entry
//! settled.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar_harness::{SidecarProcess, metric_sum, ok_body, pending, series};

use crate::plan::{DEADLINE, Form, SUBSCRIPTIONS, Target};

/// (all connections, the sidecar's) from `CLIENT LIST`.
pub(crate) async fn client_list(inspect: &Client) -> (usize, usize) {
    let list: String = inspect
        .custom(fred::cmd!("CLIENT"), vec!["LIST"])
        .await
        .expect("CLIENT LIST");
    let lines: Vec<&str> = list.lines().filter(|l| !l.trim().is_empty()).collect();
    let unnamed = lines
        .iter()
        .filter(|l| l.split_whitespace().any(|field| field == "name="))
        .count();
    (lines.len(), unnamed)
}

pub(crate) async fn info_field(
    inspect: &Client,
    section: fred::types::InfoKind,
    field: &str,
) -> u64 {
    let info: String = inspect.info(Some(section)).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO"))
}

pub(crate) fn admin_view_len(json: &str) -> usize {
    let view: serde_json::Value = serde_json::from_str(json).expect("JSON from /subscriptions");
    view["subscriptions"]
        .as_array()
        .expect("a `subscriptions` array")
        .len()
}

/// The sidecar's own figures at rest (before any subscription, after all closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rest {
    pub(crate) redis_connections: usize,
    pub(crate) fds: usize,
    pub(crate) threads: u64,
}

pub(crate) async fn at_rest(sidecar: &SidecarProcess, inspect: &Client) -> Rest {
    Rest {
        redis_connections: client_list(inspect).await.1,
        fds: sidecar.open_fds(),
        threads: sidecar.thread_count(),
    }
}

/// Waits until three looks 300 ms apart agree (the pool connects in the background).
pub(crate) async fn settled_rest(sidecar: &SidecarProcess, inspect: &Client) -> Rest {
    let deadline = Instant::now() + DEADLINE;
    let mut last = at_rest(sidecar, inspect).await;
    let mut same = 0;
    while same < 3 {
        assert!(
            Instant::now() < deadline,
            "the idle sidecar never settled: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = at_rest(sidecar, inspect).await;
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// What Redis and the clients say about one target.
#[derive(Debug)]
pub(crate) struct State {
    produced: u64,
    acked: usize,
    dropped: usize,
    lost: u64,
    seen_in_redis: u64,
    /// Pending in the group (streams) or left in the list (lists).
    waiting: u64,
}

impl State {
    pub(crate) fn settled(&self) -> bool {
        self.acked as u64 + self.dropped as u64 + self.lost == self.produced
            && self.seen_in_redis == self.acked as u64
            && self.waiting == 0
    }
}

pub(crate) async fn state(inspect: &Client, target: &Target) -> State {
    let (acked, dropped) = {
        let s = target.tally.settled.lock().expect("not poisoned");
        (s.acked.len(), s.dropped.len())
    };
    let seen_in_redis: u64 = inspect.scard(target.seen_key()).await.expect("SCARD");
    let waiting = match target.form {
        Form::Stream => pending(inspect, &target.name, "g").await,
        Form::Reliable | Form::Simple => inspect.llen(&target.name).await.expect("LLEN"),
        Form::PubSub => 0,
    };
    State {
        produced: target.tally.produced.load(Relaxed),
        acked,
        dropped,
        lost: target.tally.lost.load(Relaxed),
        seen_in_redis,
        waiting,
    }
}

/// Calls per command since the last `CONFIG RESETSTAT`, without the commands this test's
/// inspecting client sends itself (`INFO`, `CONFIG`, `CLIENT`).
pub(crate) async fn commands_run(inspect: &Client) -> BTreeMap<String, u64> {
    let info: String = inspect
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (command, rest) = l.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((command.to_owned(), calls))
        })
        .filter(|(command, _)| {
            // Redis 7 names subcommands `config|resetstat`.
            let name = command.split('|').next().unwrap_or_default();
            !["info", "config", "client"].contains(&name)
        })
        .collect()
}

/// The sidecar's bookkeeping keys (`…:window:…`) that still hold something.
pub(crate) async fn window_keys(inspect: &Client) -> BTreeMap<String, u64> {
    let keys: Vec<String> = inspect
        .custom(fred::cmd!("KEYS"), vec!["*window:*"])
        .await
        .expect("KEYS");
    let mut sizes = BTreeMap::new();
    for key in keys {
        let kind: String = inspect
            .custom(fred::cmd!("TYPE"), vec![key.as_str()])
            .await
            .expect("TYPE");
        let size: u64 = match kind.as_str() {
            "zset" => inspect.zcard(&key).await.expect("ZCARD"),
            "list" => inspect.llen(&key).await.expect("LLEN"),
            "hash" => inspect.hlen(&key).await.expect("HLEN"),
            _ => continue, // heartbeats (strings) and the consumer sets
        };
        sizes.insert(format!("{key} ({kind})"), size);
    }
    sizes
}

/// What the metrics and the admin view still show of subscriptions (one look).
pub(crate) async fn leftovers(metrics_addr: &str) -> Vec<String> {
    let metrics = ok_body(metrics_addr, "/metrics").await;
    let view = ok_body(metrics_addr, "/subscriptions").await;
    // A subscription's own series go with it.
    let mut leftover: Vec<String> = series(&metrics, "window_sidecar_outstanding_deliveries")
        .into_iter()
        .map(|(labels, v)| format!("window_sidecar_outstanding_deliveries{{{labels}}} {v}"))
        .collect();
    // The backlog gauges stay for every key served (an alert must see a backlog nobody
    // consumes): with everything settled, each reads 0.
    leftover.extend(
        [
            "window_sidecar_group_pending_entries",
            "window_sidecar_group_lag_entries",
            "window_sidecar_list_entries",
            "window_sidecar_list_processing_entries",
            "window_sidecar_delay_set_entries",
        ]
        .iter()
        .flat_map(|name| {
            let all = series(&metrics, name);
            // One series per key served at most: they do not grow with subscriptions opened.
            let too_many = (all.len() > SUBSCRIPTIONS)
                .then(|| format!("{} series of {name} for {SUBSCRIPTIONS} keys", all.len()));
            all.into_iter()
                .filter(|(_, v)| *v != 0.0)
                .map(move |(labels, v)| format!("{name}{{{labels}}} {v}, not 0"))
                .chain(too_many)
        }),
    );
    let open = metric_sum(&metrics, "window_sidecar_subscriptions_open", "");
    if open != 0.0 {
        leftover.push(format!("window_sidecar_subscriptions_open sums to {open}"));
    }
    let views = admin_view_len(&view);
    if views != 0 {
        leftover.push(format!("/subscriptions lists {views}: {view}"));
    }
    leftover
}
