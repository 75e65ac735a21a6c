//! What the soak must satisfy, one printed line per check: stable under load, nothing left at
//! rest, and every entry settled exactly once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use fred::prelude::*;
use window_sidecar_harness::pending;

use crate::load::Load;
use crate::observe::{state, window_keys};
use crate::plan::{CHURNERS, Form, SUBSCRIPTIONS, Target};
use crate::rest::{AfterRest, IDLE_LOOK};
use crate::samples::{Sample, reference};
use crate::world::Rig;

/// What the soak checked: each check prints a line as it is made.
#[derive(Default)]
pub(crate) struct Checks {
    pub(crate) passed: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Checks {
    pub(crate) fn check(&self, ok: bool, what: &str, detail: impl FnOnce() -> String) {
        if ok {
            self.passed.fetch_add(1, Relaxed);
            println!("ok: {what}");
        } else {
            self.failed.fetch_add(1, Relaxed);
            println!("FAILED: {what}: {}", detail());
        }
    }
}

/// Stable under load: memory and Redis connections from the first minute to the last, and
/// never more connections than the pool and one per subscription.
pub(crate) fn check_under_load(checks: &Checks, rig: &Rig, samples: &[Sample], soak: Duration) {
    let reference = reference(samples, soak);
    let last = samples.last().expect("samples");
    checks.check(
        last.rss_kib <= reference.rss_kib * 3 / 2 + 8 * 1024,
        "RSS at the end of the load at most 1.5x (+ 8 MiB) the reference",
        || {
            format!(
                "RSS grew from {} KiB at {:.0} s to {} KiB at {:.0} s",
                reference.rss_kib, reference.t, last.rss_kib, last.t
            )
        },
    );
    checks.check(
        last.sidecar_connections
            .abs_diff(reference.sidecar_connections)
            <= CHURNERS,
        "the sidecar's Redis connections at the end of the load as at the reference (± the churners)",
        || {
            format!(
                "the sidecar's Redis connections went from {} at {:.0} s to {} at {:.0} s",
                reference.sidecar_connections, reference.t, last.sidecar_connections, last.t
            )
        },
    );
    let most = rig.baseline.redis_connections + SUBSCRIPTIONS;
    let too_many: Vec<String> = samples
        .iter()
        .filter(|s| s.sidecar_connections > most)
        .map(|s| format!("{} at {:.0} s", s.sidecar_connections, s.t))
        .collect();
    checks.check(
        too_many.is_empty(),
        "never more sidecar connections to Redis than the pool and one per subscription",
        || format!("sidecar connections to Redis: {too_many:?}, more than {most}"),
    );
}

/// Nothing left once every subscription closed: no series, gauge or view entry, the sidecar
/// back to its connections, fds and threads, and sending Redis only read-only samples.
pub(crate) fn check_at_rest(checks: &Checks, rig: &Rig, after: &AfterRest) {
    let (baseline, rest) = (&rig.baseline, &after.rest);
    let leftover = &after.leftover;
    checks.check(
        leftover.is_empty(),
        "no subscription series, gauge or admin view entry left after every subscription closed",
        || format!("left after every subscription closed: {leftover:#?}"),
    );
    checks.check(
        rest.redis_connections == baseline.redis_connections,
        "the sidecar's Redis connections after every subscription closed as before the first opened",
        || format!("{} after vs {} before", rest.redis_connections, baseline.redis_connections),
    );
    checks.check(
        rest.fds == baseline.fds,
        "the sidecar's file descriptors after every subscription closed as before the first opened",
        || {
            format!(
                "{} after vs {} before; now: {:#?}",
                rest.fds,
                baseline.fds,
                rig.sidecar.fd_targets()
            )
        },
    );
    // Tokio's blocking threads (startup's file and DNS work) retire after 10 s idle, so the
    // baseline may hold some that are gone by the end: a leak is more threads, not fewer.
    checks.check(
        rest.threads <= baseline.threads,
        "the sidecar's threads after every subscription closed at most as before the first opened",
        || format!("{} after vs {} before", rest.threads, baseline.threads),
    );
    // At rest the sidecar pings and samples the backlog and the work waiting of the keys it
    // served, read only: no read, claim, write or script.
    let read_only = [
        "ping",
        "xinfo|groups",
        "llen",
        "smembers",
        "zcard",
        "zcount",
        "xlen",
        "xrange",
        "xpending",
    ];
    let idle_commands = &after.idle_commands;
    checks.check(
        idle_commands
            .keys()
            .all(|c| read_only.contains(&c.as_str())),
        "with no subscription open the sidecar sends only pings and backlog samples",
        || {
            format!(
                "commands the sidecar sent in {} s with no subscription open: {idle_commands:?}",
                IDLE_LOOK.as_secs()
            )
        },
    );
}

/// The clients saw no failure, and every entry was settled exactly once.
pub(crate) async fn check_clients(checks: &Checks, rig: &Rig, load: &Load) {
    let unexpected = load.global.unexpected.load(Relaxed);
    checks.check(unexpected == 0, "no stream ended unasked", || {
        format!("{unexpected} streams ended unasked (see stderr)")
    });
    check_every_entry(&rig.inspect, &load.targets, checks).await;
}

/// Every entry produced was acked (its side effects ran once) or dropped (they never ran),
/// with no failed flush, rejection or double settle; nothing is left pending, in a list, in a
/// processing list or delay set, or in the delivery-count bookkeeping.
async fn check_every_entry(inspect: &Client, targets: &[Arc<Target>], checks: &Checks) {
    let mut breaches = Breaches::default();
    for t in targets {
        breaches.of_clients(t);
        breaches.in_redis(inspect, t).await;
    }
    breaches.check(checks);
    let bookkeeping: BTreeMap<String, u64> = window_keys(inspect)
        .await
        .into_iter()
        .filter(|(_, size)| *size > 0)
        .collect();
    checks.check(
        bookkeeping.is_empty(),
        "no delay set, processing list or delivery count left",
        || format!("{bookkeeping:#?}"),
    );
}

/// For each property of every entry settled exactly once, the targets that break it.
#[derive(Default)]
struct Breaches {
    failed_flushes: Vec<String>,
    rejections: Vec<String>,
    duplicates: Vec<String>,
    unsettled: Vec<String>,
    incr_vs_acks: Vec<String>,
    never_ran: Vec<String>,
    missing_entries: Vec<String>,
    xpending: Vec<String>,
}

impl Breaches {
    /// What the target's clients saw: failed flushes, rejections, tokens settled twice, and
    /// tokens produced that were neither acked nor dropped.
    fn of_clients(&mut self, t: &Target) {
        let tally = &t.tally;
        let flushes = tally.failed_flushes.load(Relaxed);
        if flushes != 0 {
            self.failed_flushes
                .push(format!("{}: {flushes} failed flushes", t.name));
        }
        let rejected = tally.rejections.load(Relaxed);
        if rejected != 0 {
            self.rejections
                .push(format!("{}: {rejected} rejections", t.name));
        }
        let twice = tally.duplicates.load(Relaxed);
        if twice != 0 {
            self.duplicates
                .push(format!("{}: {twice} settled twice", t.name));
        }
        let missing: Vec<String> = {
            let settled = tally.settled.lock().expect("not poisoned");
            (1..=tally.produced.load(Relaxed))
                .map(|n| format!("{}#{n}", t.produce_to))
                .filter(|token| !settled.acked.contains(token) && !settled.dropped.contains(token))
                .collect()
        };
        // Pub/sub is at most once: what the sidecar reported lost is all that may be missing.
        let may_miss = if t.form == Form::PubSub {
            tally.lost.load(Relaxed)
        } else {
            0
        };
        if missing.len() as u64 != may_miss {
            self.missing_entries.push(format!(
                "{}: {} produced and neither acked nor dropped (may miss {may_miss}): {:?}",
                t.name,
                missing.len(),
                &missing[..missing.len().min(10)]
            ));
        }
    }

    /// What Redis holds of the target: every entry settled and seen once, the acked side
    /// effects once per ack, no dropped or retried one run, nothing pending in the group.
    async fn in_redis(&mut self, inspect: &Client, t: &Target) {
        let s = state(inspect, t).await;
        if !s.settled() {
            self.unsettled.push(format!("{}: {s:?}", t.name));
        }
        let acked_counter: Option<u64> = inspect.get(t.acked_key()).await.expect("GET");
        let acks = t.tally.acks.load(Relaxed);
        if acked_counter.unwrap_or(0) != acks {
            self.incr_vs_acks.push(format!(
                "{}: the INCR side effects {acked_counter:?} vs the acks sent {acks}",
                t.name
            ));
        }
        let never: Option<u64> = inspect.get(t.never_key()).await.expect("GET");
        if never.is_some() {
            self.never_ran.push(format!(
                "{}: a dropped or retried segment ran: {never:?}",
                t.name
            ));
        }
        if t.form == Form::Stream {
            let left = pending(inspect, &t.name, "g").await;
            if left != 0 {
                self.xpending.push(format!("{}: XPENDING {left}", t.name));
            }
        }
    }

    /// One check per property, in this order.
    fn check(self, checks: &Checks) {
        for (broken, what) in [
            (self.failed_flushes, "no flush failed"),
            (self.rejections, "nothing was rejected"),
            (self.duplicates, "no entry was settled twice"),
            (
                self.unsettled,
                "every entry produced is settled, seen once in Redis, none waiting",
            ),
            (
                self.incr_vs_acks,
                "the acked side effects ran once per ack sent",
            ),
            (
                self.never_ran,
                "no dropped or retried delivery's side effects ran",
            ),
            (
                self.missing_entries,
                "every entry produced was acked or dropped (pub/sub: or reported lost)",
            ),
            (self.xpending, "nothing is pending in any stream's group"),
        ] {
            checks.check(broken.is_empty(), what, || format!("{broken:#?}"));
        }
    }
}
