//! What the soak prints besides its checks: the plan first, then the run's figures (phases,
//! memory, connections, file descriptors and threads, the idle commands, the subscriptions'
//! ends, the sidecar's counters, the clients' tallies by form and the sidecar's warnings).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use window_sidecar_harness::{metric_sum, ok_body};

use crate::load::{Load, Phases};
use crate::plan::{
    CHURN_EVERY, CHURNERS, Form, PER_TICK, RELIABLE_KEYS, SAMPLE_EVERY, SIMPLE_KEYS, STREAM_KEYS,
    SUBSCRIPTIONS, TICK, Target,
};
use crate::rest::{AfterRest, IDLE_LOOK};
use crate::samples::{Sample, reference};
use crate::world::Rig;

pub(crate) fn print_plan(soak: Duration) {
    println!(
        "soak: {} s of load, {SUBSCRIPTIONS} subscriptions ({CHURNERS} reopening every {} s), {} entries/s produced, samples every {} s",
        soak.as_secs(),
        CHURN_EVERY.as_secs(),
        (STREAM_KEYS + RELIABLE_KEYS + SIMPLE_KEYS + 2) * PER_TICK * 1000
            / TICK.as_millis() as usize,
        SAMPLE_EVERY.as_secs()
    );
}

/// Prints the run's figures: phases, memory, connections, fds and threads, the idle commands,
/// the subscriptions' ends, the sidecar's counters, the clients' tallies and its warnings.
pub(crate) async fn report(
    rig: &Rig,
    load: &Load,
    samples: &[Sample],
    soak: Duration,
    phases: &Phases,
    after: &AfterRest,
    wall: Instant,
) {
    println!();
    println!(
        "load {:.0} s; settled {:.1} s after the producers stopped; all closed in {:.1} s; wall {:.0} s",
        phases.load_secs,
        phases.settle_secs,
        phases.close_secs,
        wall.elapsed().as_secs_f64()
    );
    print_resources(rig, samples, soak, after);
    println!(
        "Redis commands in {} s with no subscription open (ours excluded): {:?}",
        IDLE_LOOK.as_secs(),
        after.idle_commands
    );
    let global = &load.global;
    println!(
        "subscriptions: {} opened, {} reopened, {} ALREADY_EXISTS retries, {} unexpected ends",
        global.opened.load(Relaxed),
        global.reopened.load(Relaxed),
        global.already_exists.load(Relaxed),
        global.unexpected.load(Relaxed)
    );
    print_counters(&ok_body(&rig.metrics_addr, "/metrics").await);
    print_tallies(&load.targets);
    print_warnings(rig);
}

fn print_counters(metrics: &str) {
    let flushes = |result: &str| -> f64 {
        metric_sum(
            metrics,
            "window_sidecar_flushes_total",
            &format!("result=\"{result}\""),
        )
    };
    println!(
        "sidecar counters: {:.0} reads, {:.0} deliveries ({:.0} redeliveries, {:.0} reclaimed), {:.0} flushes ok, {:.0} failed, {:.0} rejections, {:.0} published",
        metric_sum(metrics, "window_sidecar_reads_total", ""),
        metric_sum(metrics, "window_sidecar_deliveries_total", ""),
        metric_sum(metrics, "window_sidecar_redeliveries_total", ""),
        metric_sum(metrics, "window_sidecar_reclaimed_entries_total", ""),
        flushes("ok"),
        flushes("failed"),
        metric_sum(metrics, "window_sidecar_rejections_total", ""),
        metric_sum(metrics, "window_sidecar_published_entries_total", ""),
    );
}

/// The clients' tallies, by form.
fn print_tallies(targets: &[Arc<Target>]) {
    const COLUMNS: [&str; 11] = [
        "form",
        "produced",
        "delivered",
        "acked",
        "dropped",
        "retried",
        "retry_after",
        "lost",
        "abandoned",
        "failed",
        "dups",
    ];
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(COLUMNS)
            .enumerate()
            .map(|(i, (cell, column))| {
                let width = if i == 0 { 14 } else { column.len().max(9) };
                format!("{cell:>width$}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("{}", line(COLUMNS.iter().map(|c| c.to_string()).collect()));
    let mut by_form: BTreeMap<Form, [u64; 10]> = BTreeMap::new();
    for t in targets {
        let tally = &t.tally;
        let row = by_form.entry(t.form).or_default();
        for (cell, v) in row.iter_mut().zip([
            tally.produced.load(Relaxed),
            tally.delivered.load(Relaxed),
            tally.acks.load(Relaxed),
            tally.drops.load(Relaxed),
            tally.retries.load(Relaxed),
            tally.retry_afters.load(Relaxed),
            tally.lost.load(Relaxed),
            tally.abandoned.load(Relaxed),
            tally.failed_flushes.load(Relaxed),
            tally.duplicates.load(Relaxed),
        ]) {
            *cell += v;
        }
    }
    for (form, row) in by_form {
        let mut cells = vec![form.name().to_owned()];
        cells.extend(row.iter().map(u64::to_string));
        println!("{}", line(cells));
    }
}

/// Memory, the sidecar's Redis connections, its file descriptors and threads: before the first
/// subscription, at the reference sample, at the end of the load and after every subscription
/// closed (what the checks compare).
fn print_resources(rig: &Rig, samples: &[Sample], soak: Duration, after: &AfterRest) {
    let (baseline, baseline_rss) = (&rig.baseline, rig.baseline_rss);
    let reference = reference(samples, soak);
    let last = samples.last().expect("samples");
    println!(
        "RSS KiB: before {baseline_rss}, at {:.0} s (reference) {}, at {:.0} s (last) {} ({:+.1} %), after closing {}; peak {}",
        reference.t,
        reference.rss_kib,
        last.t,
        last.rss_kib,
        (last.rss_kib as f64 / reference.rss_kib as f64 - 1.0) * 100.0,
        after.rss,
        samples.iter().map(|s| s.rss_kib).max().unwrap_or(0)
    );
    println!(
        "sidecar connections to Redis: before {}, reference {}, last {}, max {}, after closing {}",
        baseline.redis_connections,
        reference.sidecar_connections,
        last.sidecar_connections,
        samples
            .iter()
            .map(|s| s.sidecar_connections)
            .max()
            .unwrap_or(0),
        after.rest.redis_connections
    );
    println!(
        "fds: before {}, reference {}, last {}, after closing {}; threads: before {}, last {}, after closing {}",
        baseline.fds,
        reference.fds,
        last.fds,
        after.rest.fds,
        baseline.threads,
        last.threads,
        after.rest.threads
    );
}

/// The sidecar's own warnings and errors: how many, and the first 20.
fn print_warnings(rig: &Rig) {
    let warnings: Vec<String> = rig
        .sidecar
        .logged_lines()
        .into_iter()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    println!("sidecar warnings and errors: {}", warnings.len());
    for line in warnings.iter().take(20) {
        println!("  {line}");
    }
}
