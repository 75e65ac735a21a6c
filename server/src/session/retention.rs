//! Retention by acknowledgement's background job: one per sidecar started with
//! `--ack-retention`, owning the set of streams under retention and trimming each of them below
//! what its groups still need every `--retention-interval`, whether or not anything subscribes
//! to it here (the trim and the walk that finds streams are Redis's side,
//! `crate::redis::retention`).
//!
//! The set is fed three ways: a subscription of a matching stream registers it as it opens, and
//! it is trimmed at once; the keeper (`--keep`) registers the streams it keeps, which stay in
//! the set even while they do not exist; and a walk of every primary's keyspace, a bounded step
//! per interval, finds the others, whoever consumes them (other sidecars, other services, or
//! nobody right now). A stream leaves the set when the trim finds no stream at its key.
//!
//! One job rather than a trim per subscription: the trim must run where no subscription is
//! open (every group acknowledged everything and its workers are scaled to zero, or consume
//! through another sidecar), and a stream that several subscriptions of this sidecar read is
//! then trimmed once per interval rather than once per subscription. The settle's `XACKDEL`
//! (where the server has it) is unchanged: that is the cheap way for open subscriptions.
//!
//! Several sidecars trim the same streams, each with its own job: each trim is one script that
//! Redis runs alone, so they never interleave with each other or with a group's reads (see
//! `crate::redis::retention`); the second of two trims in a row finds nothing to cut.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::{GroupLabels, KeyLabels, Metrics};
use crate::policy::Patterns;
use crate::redis::retention::{self, Discovery, Trim};
use crate::redis::{Redis, RedisError};

/// The most streams under retention at once: each costs a round trip per interval.
const MAX_STREAMS: usize = 10_000;
/// Trims under way at once.
const TRIMS_AT_ONCE: usize = 8;

/// Why a stream is in the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// A subscription opened on it, or the walk found it: it leaves the set once it is gone.
    Seen,
    /// The keeper keeps it: it stays in the set while it does not exist.
    Kept,
}

/// Where subscriptions and the keeper hand streams to the job.
#[derive(Debug)]
pub struct Retention {
    patterns: Option<Patterns>,
    registered: mpsc::UnboundedSender<(Bytes, Why)>,
    /// Taken by the job as it starts.
    receiver: Mutex<Option<mpsc::UnboundedReceiver<(Bytes, Why)>>>,
}

impl Retention {
    pub(super) fn new(patterns: Option<Patterns>) -> Self {
        let (registered, receiver) = mpsc::unbounded_channel();
        Self {
            patterns,
            registered,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    /// Whether entries of this stream leave once every group has acknowledged them.
    pub fn covers(&self, key: &[u8]) -> bool {
        self.patterns.as_ref().is_some_and(|p| p.allows(key))
    }

    /// Puts `key` under the job's trim, if retention covers it.
    pub fn register(&self, key: &str, why: Why) {
        if self.covers(key.as_bytes()) {
            // No job (retention off, or the process is stopping): nothing to trim.
            let _ = self
                .registered
                .send((Bytes::copy_from_slice(key.as_bytes()), why));
        }
    }
}

/// What the job knows of one stream.
#[derive(Debug)]
struct Retained {
    why: Why,
    /// The group whose unknown position stops the trim, while one does.
    blocked_by: Option<String>,
    /// Whether Redis refuses its trims (said once when that starts and once when it ends).
    refused: bool,
}

/// Trims every stream under retention every `every` until `shutdown` begins. `patterns` are
/// the `--ack-retention` patterns, which the walk of the keyspace looks for. Given the parts of
/// the shared state it uses rather than all of it: that state holds the [`Retention`].
pub async fn run(
    retention: &Retention,
    redis: &Redis,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    patterns: Vec<String>,
    every: Duration,
) {
    let Some(mut registered) = retention.receiver.lock().take() else {
        return;
    };
    let mut job = Job {
        discovery: Discovery::new(retention::scan_glob(&patterns)),
        retention,
        redis,
        metrics,
        streams: BTreeMap::new(),
        walk_failing: BTreeSet::new(),
        full: false,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => job.round().await,
            Some(first) = registered.recv() => {
                let mut fresh = Vec::new();
                let mut next = Some(first);
                while let Some((key, why)) = next {
                    if job.add(key.clone(), why) {
                        fresh.push(key);
                    }
                    next = registered.try_recv().ok();
                }
                job.trim(fresh).await;
            }
        }
    }
}

struct Job<'a> {
    retention: &'a Retention,
    redis: &'a Redis,
    metrics: &'a Metrics,
    discovery: Discovery,
    streams: BTreeMap<Bytes, Retained>,
    /// The nodes whose walk failed at its last step (said once when that starts and ends).
    walk_failing: BTreeSet<String>,
    /// Whether the set was found full (said once).
    full: bool,
}

impl Job<'_> {
    /// Walks a step for streams, then trims every stream of the set.
    async fn round(&mut self) {
        let found = self.discovery.step(self.redis).await;
        for (node, result) in found.nodes {
            match result {
                Ok(()) => {
                    if self.walk_failing.remove(&node) {
                        info!(%node, "retention: looking for streams under retention works again");
                    }
                }
                Err(err) => {
                    if self.walk_failing.insert(node.clone()) {
                        warn!(%node, error = %err, "retention: cannot look for streams under retention (SCAN); those subscribed or kept here are still trimmed, the walk is tried again every interval");
                    } else {
                        debug!(%node, error = %err, "retention: SCAN failed again");
                    }
                }
            }
        }
        for key in found.streams {
            if self.retention.covers(&key) {
                self.add(key, Why::Seen);
            }
        }
        let keys: Vec<Bytes> = self.streams.keys().cloned().collect();
        self.trim(keys).await;
    }

    /// Adds a stream to the set; whether it is new there.
    fn add(&mut self, key: Bytes, why: Why) -> bool {
        if let Some(known) = self.streams.get_mut(&key) {
            if why == Why::Kept {
                known.why = Why::Kept;
            }
            return false;
        }
        if self.streams.len() >= MAX_STREAMS {
            if !self.full {
                warn!(
                    key = %String::from_utf8_lossy(&key),
                    "retention: {MAX_STREAMS} streams are under retention already: not trimming more"
                );
                self.full = true;
            }
            return false;
        }
        self.streams.insert(
            key,
            Retained {
                why,
                blocked_by: None,
                refused: false,
            },
        );
        true
    }

    async fn trim(&mut self, keys: Vec<Bytes>) {
        if keys.is_empty() {
            return;
        }
        let redis = self.redis;
        let trims: Vec<(Bytes, Result<Trim, RedisError>)> = futures::stream::iter(keys)
            .map(|key| async move {
                let trim = retention::trim_acknowledged(redis.pool(), &key).await;
                (key, trim)
            })
            .buffer_unordered(TRIMS_AT_ONCE)
            .collect()
            .await;
        for (key, trim) in trims {
            self.record(key, trim);
        }
    }

    /// Counts, logs and remembers what one trim did.
    fn record(&mut self, key: Bytes, trim: Result<Trim, RedisError>) {
        let metrics = self.metrics;
        let name = String::from_utf8_lossy(&key).into_owned();
        let Some(stream) = self.streams.get_mut(&key) else {
            return;
        };
        let now_blocked = match trim {
            Ok(Trim::Trimmed { entries, floor }) => {
                if entries > 0 {
                    debug!(key = %name, entries, %floor, "retention: trimmed acknowledged entries");
                    metrics
                        .retention_trimmed
                        .get_or_create(&KeyLabels { key: name.clone() })
                        .inc_by(entries);
                }
                None
            }
            Ok(Trim::Unknown { group }) => Some(group),
            Ok(Trim::NoGroups) => None,
            Ok(Trim::Gone) => {
                let blocked_by = stream.blocked_by.take();
                if stream.why == Why::Seen {
                    self.streams.remove(&key);
                }
                if let Some(group) = blocked_by {
                    metrics
                        .retention_blocked
                        .remove(&GroupLabels { key: name, group });
                }
                return;
            }
            // Nothing is lost when a trim fails: it only ever deletes, and the entries it would
            // have cut wait for the next interval's. A refusal (NOPERM from an ACL, READONLY
            // from a replica, a script error) repeats until an operator acts, so it is said
            // once when it starts and once when it ends; an unreachable Redis is the health
            // check's to say.
            Err(err) => {
                metrics
                    .retention_failures
                    .get_or_create(&KeyLabels { key: name.clone() })
                    .inc();
                let refusal = matches!(
                    err,
                    RedisError::Refused { .. } | RedisError::Protocol { .. }
                );
                if refusal && !stream.refused {
                    warn!(key = %name, error = %err, "retention: Redis refuses to trim the stream; its acknowledged entries stay until it accepts, tried again every interval");
                    stream.refused = true;
                } else {
                    debug!(key = %name, error = %err, "retention trim failed; will try again");
                }
                return;
            }
        };
        if stream.refused {
            info!(key = %name, "retention: Redis trims the stream again");
            stream.refused = false;
        }
        if now_blocked == stream.blocked_by {
            return;
        }
        let metric = &metrics.retention_blocked;
        if let Some(group) = stream.blocked_by.take() {
            info!(key = %name, group = %group, "retention: the group's position is known again; trimming resumes");
            metric.remove(&GroupLabels {
                key: name.clone(),
                group,
            });
        }
        if let Some(group) = &now_blocked {
            warn!(
                key = %name,
                group = %group,
                "retention: not trimming the stream: Redis cannot tell this group's position (XINFO GROUPS has no lag), and an entry it has not read would be lost"
            );
            metric
                .get_or_create(&GroupLabels {
                    key: name,
                    group: group.clone(),
                })
                .set(1);
        }
        stream.blocked_by = now_blocked;
    }
}
