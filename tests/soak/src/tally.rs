//! What the clients counted: per target, what was produced, delivered and decided and which
//! tokens were settled how; across all subscriptions, how often they opened and ended.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) produced: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) acks: AtomicU64,
    pub(crate) drops: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) retry_afters: AtomicU64,
    /// Pub/sub messages the sidecar reported lost (`Read.lost`).
    pub(crate) lost: AtomicU64,
    /// Deliveries received after the client half-closed (left to the sidecar to abandon).
    pub(crate) abandoned: AtomicU64,
    pub(crate) failed_flushes: AtomicU64,
    pub(crate) rejections: AtomicU64,
    /// A token acked twice, or both acked and dropped.
    pub(crate) duplicates: AtomicU64,
    pub(crate) settled: Mutex<Settled>,
}

#[derive(Default)]
pub(crate) struct Settled {
    /// Tokens that got a drop, retry or retry_after once: acked when they come again.
    pub(crate) deferred: HashSet<String>,
    pub(crate) acked: HashSet<String>,
    pub(crate) dropped: HashSet<String>,
}

/// What all subscription tasks share.
#[derive(Default)]
pub(crate) struct Global {
    pub(crate) opened: AtomicU64,
    pub(crate) reopened: AtomicU64,
    pub(crate) already_exists: AtomicU64,
    /// Streams that ended or failed when the client did not ask for it.
    pub(crate) unexpected: AtomicU64,
}
