//! What a run prints once checked: its figures (entries, deliveries, decisions, the audit
//! group, per-key order, waits, faults, refusals, the quiesce), each anomaly with its seed and
//! the events around it, and, when entries were left, every sidecar's subscriptions.

use std::sync::atomic::Ordering;

use crate::admin::describe_subscriptions;
use crate::campaign::Ended;
use crate::form;
use crate::history::{self, EndState, Promise, Stamped};
use crate::plan::{Run, mode, topology};
use crate::workers::{SLOW, Waits};

/// Prints the run's figures and each anomaly with the events around it; when entries were left
/// pending or the run never went quiet, every sidecar's subscriptions.
pub(crate) fn report(
    run: Run,
    ended: &Ended,
    end: &EndState,
    promise: Promise,
    figures: &history::Figures,
    anomalies: &[history::Anomaly],
) {
    report_figures(run, ended, promise, figures);
    report_waits(&ended.campaign.shared.waits);
    println!("   faults {:?}", figures.faults);
    report_refusals(ended, figures);
    println!("   quiesce: {}", ended.quiesce);
    for anomaly in anomalies {
        report_anomaly(run, &ended.history, anomaly);
    }
    // What held the entries still pending: every sidecar's subscriptions.
    if end.pending != 0 || !ended.quiesce.quiet {
        report_subscriptions(ended);
    }
}

/// The refusals the nemesis injected, by kind, with the flush reports they touched (received
/// from each one's start until a moment after its undo); the requeues refused by reason over
/// the run, from the reports; and what the sidecars up at the quiesce counted since they last
/// started (a killed sidecar's counters are gone with it).
fn report_refusals(ended: &Ended, figures: &history::Figures) {
    let injected: Vec<String> = figures
        .refusals
        .iter()
        .map(|(kind, touched)| format!("{kind} {touched}"))
        .collect();
    println!(
        "   refusals injected: {}",
        if injected.is_empty() {
            "none".to_owned()
        } else {
            injected.join("; ")
        }
    );
    let by_reason = |counts: Vec<(&String, u64)>| {
        if counts.is_empty() {
            return "none".to_owned();
        }
        counts
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "   requeues refused (entries, by reason, in the workers' flush reports): {}; acked \
         entries settled without their side effect (Redis refused it, reported): {}; named in \
         the sidecars' logs: {} settled without their side effect, {} retries claimed by \
         another consumer",
        by_reason(
            figures
                .requeue_refused
                .iter()
                .map(|(r, n)| (r, *n as u64))
                .collect()
        ),
        figures.effects_refused,
        figures.said_effects_refused,
        figures.said_claimed_away
    );
    let counted = &ended.refusals_counted;
    println!(
        "   the sidecars' counters at the quiesce (each since it last started): \
         window_sidecar_requeue_refused_total {}, window_sidecar_flushes_total{{result=\"failed\"}} {}",
        by_reason(
            counted
                .requeue_refused
                .iter()
                .map(|(r, n)| (r, *n))
                .collect()
        ),
        counted.flushes_failed
    );
}

/// What the run went through: its entries, deliveries and decisions, and what the audit group,
/// the per-key order check and parking saw.
fn report_figures(run: Run, ended: &Ended, promise: Promise, figures: &history::Figures) {
    println!(
        "   {} entries, {} deliveries, {} flush reports, decisions {:?}, dead letters {}, \
         redriven {} ({} back into their group), duplicate side effects {}, publishes written \
         twice {}{}",
        figures.roots,
        figures.deliveries,
        figures.flushes,
        figures.decisions,
        figures.dead_letters,
        figures.redriven,
        figures.redriven_in_place,
        figures.duplicate_effects,
        figures.duplicate_publishes,
        if promise.at_most_once {
            format!(
                ", lost in flight (at most once) {}",
                figures.lost_at_most_once
            )
        } else {
            String::new()
        }
    );
    if !figures.dead_counted_past_seen.is_empty() {
        println!(
            "   dead letters by deliveries counted past the highest count a worker saw: {:?}",
            figures.dead_counted_past_seen
        );
    }
    if run.form.streams() {
        let audit = &figures.audit;
        println!(
            "   audit group: {} entries in {} reads ({} again from its own pending before an ack \
             was confirmed, {} again after a failover), {} fresh entries written by redrives",
            audit.entries,
            audit.reads,
            audit.own_rereads,
            audit.after_failover,
            audit.redrive_copies
        );
    }
    if figures.ordered_streams > 0 {
        println!(
            "   per-key order checked on {} ordered subscription streams, {} deliveries",
            figures.ordered_streams, figures.ordered_deliveries
        );
    }
    if figures.across_keys > 0 {
        println!(
            "   per-key order across the group checked on {} keys, {} deliveries",
            figures.across_keys, figures.across_deliveries
        );
    }
    if ended.parked_fetches > 0 {
        println!(
            "   fetches of entries parked for their ordering key (sidecars up at the quiesce): {}",
            ended.parked_fetches
        );
    }
}

/// How long reads waited for their worker (a worker asleep on a slow ack leaves the reads
/// behind it waiting): what made reads count as handled past `min_idle`.
fn report_waits(waits: &Waits) {
    println!(
        "   reads handled late for waiting on their worker: {} ({} not right after a slow \
         read; the longest wait {} ms); right after a slow read but not late: {}",
        waits.late.load(Ordering::Relaxed),
        waits.further_back.load(Ordering::Relaxed),
        waits.longest_ms.load(Ordering::Relaxed),
        waits.prompt_after_slow.load(Ordering::Relaxed)
    );
}

/// An anomaly with its run, the events around its entry, and what that entry's workers did
/// before each delivery of it.
fn report_anomaly(run: Run, events: &[Stamped], anomaly: &history::Anomaly) {
    println!(
        "ANOMALY (seed {}, {}, {}, {}): {anomaly}",
        run.seed,
        run.form.name(),
        mode(run),
        topology(run)
    );
    if let Some(root) = &anomaly.root {
        for event in history::around(events, root, 2_000) {
            println!("     {:>7} ms  {:?}", event.at_ms, event.event);
        }
        let window = (form::MIN_IDLE + SLOW).as_millis() as u64;
        let before = history::workers_before(events, root, window);
        if !before.is_empty() {
            println!("     its workers before each delivery (read, slow acks):");
            for event in before {
                println!("     {:>7} ms  {:?}", event.at_ms, event.event);
            }
        }
    }
}

/// Every sidecar's subscriptions at the end of the quiesce and once the workers stopped: what
/// held the entries still pending.
fn report_subscriptions(ended: &Ended) {
    println!("   subscriptions open at the end of the quiesce:");
    for line in describe_subscriptions(&ended.at_quiet) {
        println!("     {line}");
    }
    println!("   subscriptions open once the workers stopped (15 s at most):");
    for line in describe_subscriptions(&ended.after_stop) {
        println!("     {line}");
    }
}
