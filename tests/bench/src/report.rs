//! Printing: one line per run as it finishes, then the tables of figures, the figures the
//! performance targets name and, with `--baseline-bin`, the ratios of each sidecar contender to
//! its `@baseline` twin. Figures only: nothing here asserts on them.

use crate::many::{Many, Topology};
use crate::{Contender, IdleRss, ManyRecord, Measured, Phase, PythonApi, Record};

fn thousands(n: f64) -> String {
    let n = n.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Nearest-rank percentile of sorted samples, in milliseconds.
fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    let min = values.iter().copied().reduce(f64::min)?;
    let max = values.iter().copied().reduce(f64::max)?;
    Some((min, max))
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

fn phase_name(phase: Phase) -> &'static str {
    crate::phase_name(phase)
}

/// The width of the contender column: the longest name (the `@baseline` twins are longer than
/// the usual 26).
pub(crate) fn name_width(contenders: &[Contender]) -> usize {
    contenders
        .iter()
        .map(|c| c.name().len())
        .fold(26, usize::max)
}

pub(crate) fn progress(
    round: u32,
    rounds: u32,
    phase: Phase,
    contender: Contender,
    result: &Result<Measured, String>,
    wall: std::time::Duration,
    w: usize,
) {
    let head = format!(
        "[round {round}/{rounds}] {:<10} {:<w$}",
        phase_name(phase),
        contender.name()
    );
    let wall = format!(" [{:.1} s]", wall.as_secs_f64());
    match result {
        Ok(m) => {
            let retried = m.retried.map_or_else(String::new, |(retried, kept)| {
                format!(
                    ", {retried} retried, {} entries added, XLEN {} at the end",
                    thousands(kept.entries_added as f64),
                    kept.xlen
                )
            });
            match phase {
                Phase::Throughput => println!(
                    "{head} {:>9} deliveries/s ({:.2} s, {:.2} commands/delivery{retried}), \
                     verified{wall}",
                    thousands(m.rate()),
                    m.secs,
                    m.commands_total() as f64 / m.entries as f64
                ),
                Phase::Latency => println!(
                    "{head} p50 {:.2} ms, p99 {:.2} ms over {} entries{retried}, verified{wall}",
                    percentile_ms(&m.lat_us, 50.0),
                    percentile_ms(&m.lat_us, 99.0),
                    m.entries
                ),
            }
        }
        Err(err) => println!("{head} FAILED: {err}{wall}"),
    }
}

pub(crate) fn idle_progress(
    round: u32,
    rounds: u32,
    n: usize,
    baseline: bool,
    result: &Result<(u64, u64), String>,
    w: usize,
) {
    let head = format!(
        "[round {round}/{rounds}] {:<10} {:<w$}",
        "idle",
        format!(
            "{n} subscriptions{}",
            if baseline { crate::BASELINE } else { "" }
        )
    );
    match result {
        Ok((rss, before)) => println!(
            "{head} sidecar RSS {:.1} MB ({:.1} MB before opening them), verified",
            *rss as f64 / 1024.0,
            *before as f64 / 1024.0
        ),
        Err(err) => println!("{head} FAILED: {err}"),
    }
}

pub(crate) fn many_progress(
    round: u32,
    rounds: u32,
    topology: Topology,
    result: &Result<Many, String>,
    w: usize,
) {
    let head = format!(
        "[round {round}/{rounds}] {:<10} {:<w$}",
        "many",
        topology.name()
    );
    match result {
        Ok(m) => println!(
            "{head} {} subscriptions {} deliveries/s, one alone {}, slowest share {:.2}, \
             verified",
            m.subscriptions,
            thousands(m.aggregate_rate),
            thousands(m.single_rate),
            m.slowest_share
        ),
        Err(err) => println!("{head} FAILED: {err}"),
    }
}

/// Verified runs of the many-subscriptions phase on one topology.
fn verified_many(many: &[ManyRecord], topology: Topology) -> Vec<&Many> {
    many.iter()
        .filter(|(t, _, _)| *t == topology)
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .collect()
}

/// Verified runs of one contender in one phase.
fn runs(records: &[Record], contender: Contender, phase: Phase) -> Vec<&Measured> {
    records
        .iter()
        .filter(|r| r.contender == contender && r.phase == phase)
        .filter_map(|r| r.result.as_ref().ok())
        .collect()
}

fn med_of(runs: &[&Measured], f: impl Fn(&Measured) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = runs.iter().filter_map(|m| f(m)).collect();
    median(&values)
}

/// Per round, `a`'s throughput over `b`'s (both verified in that round).
fn ratios(records: &[Record], a: Contender, b: Contender) -> Vec<f64> {
    figure_ratios(records, a, b, |m| Some(m.rate()))
}

/// Per round, a figure of `a`'s throughput run over the same of `b`'s (both verified in that
/// round, the figure finite on both sides: a CPU time of zero ticks has no ratio).
fn figure_ratios(
    records: &[Record],
    a: Contender,
    b: Contender,
    figure: impl Fn(&Measured) -> Option<f64>,
) -> Vec<f64> {
    figures_ratios(records, (a, &figure), (b, &figure))
}

/// A figure of a verified run, when it has one.
type Figure<'a> = &'a dyn Fn(&Measured) -> Option<f64>;

/// Per round, one figure of `a`'s throughput run over another of `b`'s (both verified in
/// that round, the ratio finite).
fn figures_ratios(
    records: &[Record],
    (a, of_a): (Contender, Figure<'_>),
    (b, of_b): (Contender, Figure<'_>),
) -> Vec<f64> {
    let value = |c: Contender, round: u32, figure: Figure<'_>| {
        records
            .iter()
            .find(|r| r.contender == c && r.phase == Phase::Throughput && r.round == round)
            .and_then(|r| r.result.as_ref().ok())
            .and_then(figure)
    };
    let last = records.iter().map(|r| r.round).max().unwrap_or(0);
    (1..=last)
        .filter_map(|round| Some(value(a, round, of_a)? / value(b, round, of_b)?))
        .filter(|ratio| ratio.is_finite())
        .collect()
}

fn sidecar_cpu_per_100k(m: &Measured) -> Option<f64> {
    Some(m.sidecar_cpu? * 100_000.0 / m.entries as f64)
}

fn ratio_text(values: &[f64]) -> String {
    match (median(values), min_max(values)) {
        (Some(m), Some((lo, hi))) if values.len() > 1 => {
            format!("{m:.2}x (rounds {lo:.2}-{hi:.2})")
        }
        (Some(m), _) => format!("{m:.2}x"),
        _ => "n/a".into(),
    }
}

fn p_ms(runs: &[&Measured], p: f64) -> Option<f64> {
    med_of(runs, |m| Some(percentile_ms(&m.lat_us, p)))
}

/// A size in kB as MB, or `none`.
fn mb(kb: Option<u64>, none: &str) -> String {
    kb.map_or_else(
        || none.to_owned(),
        |kb| format!("{:.1} MB", kb as f64 / 1024.0),
    )
}

/// The median of a figure over verified runs of the many-subscriptions phase.
fn median_many(runs: &[&Many], figure: fn(&Many) -> f64) -> Option<f64> {
    median(&runs.iter().map(|m| figure(m)).collect::<Vec<_>>())
}

/// The sidecar's peak RSS over verified runs of the many-subscriptions phase, kB.
fn peak_rss_kb(runs: &[&Many]) -> Option<u64> {
    runs.iter().filter_map(|m| m.sidecar_hwm_kb).max()
}

/// Every table, in the order a reader meets them: throughput, resources, latency, the
/// many-subscriptions phase, the Redis commands, the targets and, with `--baseline-bin`, the
/// ratios to the baseline binary.
pub(crate) fn tables(
    contenders: &[Contender],
    records: &[Record],
    idle: &[IdleRss],
    many: &[ManyRecord],
    rate: u64,
) {
    let w = name_width(contenders);
    throughput_table(contenders, records, w);
    resources_table(contenders, records, w);
    latency_table(contenders, records, rate, w);
    retry_table(contenders, records, w);
    many_table(many);
    command_lists(contenders, records, w);
    targets(records, idle, many, rate);
    println!();
    against_baseline(contenders, records, idle, w);
}

/// Redis round trips per read that delivered entries.
fn round_trips_per_read(m: &Measured) -> Option<f64> {
    (m.reads > 0).then(|| m.round_trips as f64 / m.reads as f64)
}

/// Deliveries/s (median and range over the verified rounds), commands per delivery, round trips
/// per read and the sidecar's flushes.
fn throughput_table(contenders: &[Contender], records: &[Record], w: usize) {
    println!();
    println!("== throughput (deliveries/s over verified rounds; other columns: median)");
    println!(
        "{:<w$} {:>10} {:>21} {:>10} {:>10} {:>10} {:>10}",
        "contender", "median", "min-max", "cmds/del", "rt/read", "flush/read", "flush ms"
    );
    for &c in contenders {
        let t = runs(records, c, Phase::Throughput);
        let rates: Vec<f64> = t.iter().map(|m| m.rate()).collect();
        let (range, med) = match (min_max(&rates), median(&rates)) {
            (Some((lo, hi)), Some(m)) => {
                (format!("{}-{}", thousands(lo), thousands(hi)), thousands(m))
            }
            _ => ("-".into(), "n/a".into()),
        };
        println!(
            "{:<w$} {:>10} {:>21} {:>10} {:>10} {:>10} {:>10}",
            c.name(),
            med,
            range,
            opt(
                med_of(&t, |m| Some(m.commands_total() as f64 / m.entries as f64)),
                3
            ),
            opt(med_of(&t, round_trips_per_read), 3),
            opt(
                med_of(&t, |m| Some(
                    m.flush_round_trips? as f64 / m.reads.max(1) as f64
                )),
                3
            ),
            opt(med_of(&t, |m| m.flush_mean_ms), 3),
        );
    }
}

/// CPU seconds per 100,000 deliveries of the sidecar, the client and Redis, and the sidecar's
/// peak RSS.
fn resources_table(contenders: &[Contender], records: &[Record], w: usize) {
    println!();
    println!("== resources in the throughput runs (CPU seconds per 100,000 deliveries; median)");
    println!(
        "{:<w$} {:>12} {:>12} {:>12} {:>16}",
        "contender", "sidecar CPU", "client CPU", "redis CPU", "sidecar peak RSS"
    );
    for &c in contenders {
        let t = runs(records, c, Phase::Throughput);
        let per_100k = |v: Option<f64>, m: &Measured| v.map(|s| s * 100_000.0 / m.entries as f64);
        let hwm = t.iter().filter_map(|m| m.sidecar_hwm_kb).max();
        println!(
            "{:<w$} {:>12} {:>12} {:>12} {:>16}",
            c.name(),
            opt(med_of(&t, |m| per_100k(m.sidecar_cpu, m)), 2),
            opt(med_of(&t, |m| per_100k(m.client_cpu, m)), 2),
            opt(med_of(&t, |m| per_100k(m.redis_cpu, m)), 2),
            mb(hwm, "-"),
        );
    }
}

/// p50 and p99 at the latency phase's rate and flat out (the throughput runs).
fn latency_table(contenders: &[Contender], records: &[Record], rate: u64, w: usize) {
    println!();
    println!(
        "== latency, ms (median over rounds). At {rate}/s: XADD to the reply that settled the \
         entry. Flat out: the read reaching the consumer to that reply"
    );
    println!(
        "{:<w$} {:>12} {:>12} {:>14} {:>14}",
        "contender",
        format!("{rate}/s p50"),
        format!("{rate}/s p99"),
        "flat-out p50",
        "flat-out p99"
    );
    for &c in contenders {
        let l = runs(records, c, Phase::Latency);
        let t = runs(records, c, Phase::Throughput);
        println!(
            "{:<w$} {:>12} {:>12} {:>14} {:>14}",
            c.name(),
            opt(p_ms(&l, 50.0), 3),
            opt(p_ms(&l, 99.0), 3),
            opt(p_ms(&t, 50.0), 3),
            opt(p_ms(&t, 99.0), 3),
        );
    }
}

/// The retrying contenders: the deliveries retried, the entries ever added to the stream
/// (`XINFO STREAM` `entries-added`: N when retries stay in place, N plus the retries when each
/// appends a copy) and its length once retention trimmed it. Nothing when none ran.
fn retry_table(contenders: &[Contender], records: &[Record], w: usize) {
    let retrying: Vec<Contender> = contenders
        .iter()
        .copied()
        .filter(Contender::retries)
        .collect();
    if retrying.is_empty() {
        return;
    }
    println!();
    println!(
        "== retries: one delivery in {} retried once, then acked; retention by acknowledgement \
         (median over verified rounds)",
        crate::workload::RETRY_ONE_IN
    );
    println!(
        "{:<w$} {:<10} {:>10} {:>10} {:>14} {:>12} {:>14}",
        "contender", "phase", "entries", "retried", "entries added", "added / N", "XLEN at end"
    );
    for c in retrying {
        for phase in [Phase::Throughput, Phase::Latency] {
            let r = runs(records, c, phase);
            let Some(first) = r.first() else { continue };
            let of = |f: fn(u64, &crate::workload::Retained) -> f64| {
                med_of(&r, |m| m.retried.map(|(n, kept)| f(n, &kept)))
            };
            println!(
                "{:<w$} {:<10} {:>10} {:>10} {:>14} {:>12} {:>14}",
                c.name(),
                phase_name(phase),
                thousands(first.entries as f64),
                of(|n, _| n as f64).map_or("n/a".into(), thousands),
                of(|_, kept| kept.entries_added as f64).map_or("n/a".into(), thousands),
                opt(
                    med_of(&r, |m| m
                        .retried
                        .map(|(_, kept)| kept.entries_added as f64 / m.entries as f64)),
                    3
                ),
                opt(of(|_, kept| kept.xlen as f64), 0),
            );
        }
    }
}

/// Per topology: one subscription alone against all of them at once, their fairness and the
/// sidecar's peak RSS. Nothing when the phase was skipped.
fn many_table(many: &[ManyRecord]) {
    if many.is_empty() {
        return;
    }
    println!();
    println!(
        "== many subscriptions: one sidecar, one channel, pipeline-64 (deliveries/s; median \
         over verified rounds)"
    );
    println!(
        "{:<22} {:>6} {:>12} {:>12} {:>10} {:>14} {:>12}",
        "topology", "subs", "one", "all", "all/one", "slowest share", "peak RSS"
    );
    for topology in [Topology::SingleNode, Topology::Cluster] {
        let ok = verified_many(many, topology);
        let Some(first) = ok.first() else { continue };
        let med = |f: fn(&Many) -> f64| median_many(&ok, f);
        println!(
            "{:<22} {:>6} {:>12} {:>12} {:>10} {:>14} {:>12}",
            topology.name(),
            first.subscriptions,
            med(|m| m.single_rate).map_or("n/a".into(), thousands),
            med(|m| m.aggregate_rate).map_or("n/a".into(), thousands),
            opt(med(|m| m.aggregate_rate / m.single_rate), 2),
            opt(med(|m| m.slowest_share), 2),
            mb(peak_rss_kb(&ok), "-"),
        );
    }
}

/// The calls per Redis command of each contender's last verified throughput run.
fn command_lists(contenders: &[Contender], records: &[Record], w: usize) {
    println!();
    println!("== Redis commands per throughput run (last verified round; INFO commandstats)");
    for &c in contenders {
        if let Some(m) = runs(records, c, Phase::Throughput).last() {
            let list: Vec<String> = m
                .commands
                .iter()
                .map(|(name, n)| format!("{name} {n}"))
                .collect();
            println!("{:<w$} {}", c.name(), list.join(", "));
        }
    }
}

/// One line of the targets: what is measured, the figure and the target it is held to.
fn target_row(what: &str, figure: String, target: &str) {
    println!("{what:<58} {figure:<34} target {target}");
}

/// The figures docs/performance.md holds the sidecar to.
fn targets(records: &[Record], idle: &[IdleRss], many: &[ManyRecord], rate: u64) {
    println!();
    println!("== the targets (figures, not assertions; see docs/performance.md)");
    cpu_targets(records);
    ratio_target(
        records,
        "sidecar-rust-pipeline-64 / fred-raw (deliveries/s)",
        (rust_client(64, false), Contender::FredRaw),
        ">= 1.5x",
    );
    // The strongest in-process Rust loops: the sidecar should cost no throughput against a
    // hand-pipelined redis-rs loop, and beat the seed's own pipelined window by half again.
    for (other, target) in [
        (Contender::RedisRsPipelined, ">= 1.0x"),
        (Contender::SeedInProcess, ">= 1.5x"),
    ] {
        ratio_target(
            records,
            &format!("sidecar-rust-pipeline-64 / {}", other.name()),
            (rust_client(64, false), other),
            target,
        );
    }
    ordered_targets(records);
    round_trip_targets(records);
    // The target is held by a read handled as one batch, as the hand-pipelined loop handles
    // its reads; delivery by delivery is the figure beside it.
    ratio_target(
        records,
        "sidecar-python-batches / redis-py-pipelined",
        (python(PythonApi::Batches), Contender::RedisPyPipelined),
        ">= 2.0x",
    );
    ratio_target(
        records,
        "sidecar-python / redis-py-pipelined",
        (SIDECAR_PYTHON, Contender::RedisPyPipelined),
        "(delivery by delivery)",
    );
    // The typed API records redis-py's command methods instead of taking a name and
    // arguments: it should cost nothing a run can see.
    ratio_target(
        records,
        "sidecar-python-typed / sidecar-python",
        (python(PythonApi::Typed), SIDECAR_PYTHON),
        ">= 0.9x (within noise)",
    );
    ratio_target(
        records,
        "sidecar-python / redis-py-per-message",
        (SIDECAR_PYTHON, Contender::RedisPyPerMessage),
        ">= 10x",
    );
    atomic_targets(records);
    latency_targets(records, rate);
    idle_target(idle);
    many_targets(many);
}

/// A sidecar contender of the Rust client as the targets name it.
fn rust_client(count: u32, atomic: bool) -> Contender {
    Contender::SidecarRust {
        count,
        atomic,
        baseline: false,
    }
}

const SIDECAR_PYTHON: Contender = python(PythonApi::Deliveries);

/// A Python contender as the targets name it.
const fn python(api: PythonApi) -> Contender {
    Contender::SidecarPython {
        api,
        baseline: false,
    }
}

/// The sidecar's CPU per delivery, pipeline and atomic.
fn cpu_targets(records: &[Record]) {
    for (contender, target) in [
        (rust_client(64, false), "<= 0.35 s"),
        (rust_client(64, true), "<= 1.0 s"),
    ] {
        target_row(
            &format!("sidecar CPU per 100k deliveries, {}", contender.name()),
            opt(
                med_of(
                    &runs(records, contender, Phase::Throughput),
                    sidecar_cpu_per_100k,
                ),
                2,
            ),
            target,
        );
    }
}

/// One contender's deliveries/s over another's, per round.
fn ratio_target(records: &[Record], what: &str, (a, b): (Contender, Contender), target: &str) {
    target_row(what, ratio_text(&ratios(records, a, b)), target);
}

const ORDERED: Contender = Contender::SidecarRustOrdered {
    hot: false,
    baseline: false,
};
const ORDERED_HOT: Contender = Contender::SidecarRustOrdered {
    hot: true,
    baseline: false,
};

/// Ordering keys: what one delivery per key at a time costs against the unordered client,
/// and what a hot key leaves the other keys.
fn ordered_targets(records: &[Record]) {
    ratio_target(
        records,
        "sidecar-rust-ordered-64 / sidecar-rust-pipeline-64",
        (ORDERED, rust_client(64, false)),
        ">= 0.8x",
    );
    let hot = runs(records, ORDERED_HOT, Phase::Throughput);
    target_row(
        "other keys beside a hot key (deliveries/s of theirs)",
        med_of(&hot, Measured::others_rate).map_or("n/a".into(), thousands),
        "(figure)",
    );
    let others = figures_ratios(
        records,
        (ORDERED_HOT, &Measured::others_rate),
        (ORDERED, &|m: &Measured| Some(m.rate())),
    );
    target_row(
        "other keys beside a hot key / sidecar-rust-ordered-64",
        ratio_text(&others),
        ">= 0.8x",
    );
    // Paired with --baseline-bin: what the other keys got from the binary before.
    let twin = ORDERED_HOT
        .baseline_twin()
        .expect("a sidecar contender has a twin");
    let before = runs(records, twin, Phase::Throughput);
    if !before.is_empty() {
        target_row(
            "other keys beside a hot key, the baseline binary",
            med_of(&before, Measured::others_rate).map_or("n/a".into(), thousands),
            "(figure)",
        );
        let gain = figures_ratios(
            records,
            (ORDERED_HOT, &Measured::others_rate),
            (twin, &Measured::others_rate),
        );
        target_row(
            "other keys beside a hot key / the baseline binary's",
            ratio_text(&gain),
            "(figure)",
        );
    }
    if median(&others).is_some_and(|m| m < 0.8) {
        println!(
            "  not met: the reads run past the hot key's parked backlog and ask for twice COUNT, \
             so the other\n  keys get about COUNT deliveries a read; but the stream is read in \
             order, so each of those reads\n  also brings COUNT of the hot key's entries: twice \
             the entries read per delivery of theirs"
        );
    }
}

/// All Redis round trips per read, Rust and Python clients.
fn round_trip_targets(records: &[Record]) {
    for contender in [rust_client(64, false), SIDECAR_PYTHON] {
        target_row(
            &format!(
                "Redis round trips per read (all kinds), {}",
                contender.name()
            ),
            opt(
                med_of(
                    &runs(records, contender, Phase::Throughput),
                    round_trips_per_read,
                ),
                3,
            ),
            "<= 1",
        );
    }
}

/// The atomic mode's deliveries/s at COUNT 64 and its flat-out p50 at COUNT 256.
fn atomic_targets(records: &[Record]) {
    let rates: Vec<f64> = runs(records, rust_client(64, true), Phase::Throughput)
        .iter()
        .map(|m| m.rate())
        .collect();
    target_row(
        "sidecar-rust-atomic-64 (deliveries/s)",
        median(&rates).map_or("n/a".into(), thousands),
        ">= 70,000",
    );
    target_row(
        "flat-out p50, sidecar-rust-atomic-256",
        opt(
            p_ms(
                &runs(records, rust_client(256, true), Phase::Throughput),
                50.0,
            ),
            2,
        ) + " ms",
        "< 5 ms",
    );
}

/// The p99 at the latency phase's rate, against the loop each client replaces.
fn latency_targets(records: &[Record], rate: u64) {
    for (sidecar, baseline, target) in [
        (
            rust_client(64, false),
            Contender::FredRaw,
            "<= 0.5 ms added",
        ),
        (
            SIDECAR_PYTHON,
            Contender::RedisPyPipelined,
            "(the best Python can have)",
        ),
    ] {
        let s = p_ms(&runs(records, sidecar, Phase::Latency), 99.0);
        let b = p_ms(&runs(records, baseline, Phase::Latency), 99.0);
        let figure = match (s, b) {
            (Some(s), Some(b)) => format!("{s:.2} ms ({:+.2} ms vs {})", s - b, baseline.name()),
            (Some(s), None) => format!("{s:.2} ms"),
            _ => "n/a".into(),
        };
        target_row(
            &format!("p99 at {rate}/s, {}", sidecar.name()),
            figure,
            target,
        );
    }
}

/// The sidecar's RSS with the idle subscriptions open.
fn idle_target(idle: &[IdleRss]) {
    let n = idle.first().map_or(100, |r| r.subscriptions);
    target_row(
        &format!("sidecar RSS with {n} idle subscriptions"),
        idle_rss_mb(idle, false).map_or("n/a".into(), |m| format!("{m:.1} MB")),
        "< 50 MB",
    );
}

/// Per topology: many subscriptions against one, the slowest one's share and the RSS.
fn many_targets(many: &[ManyRecord]) {
    for topology in [Topology::SingleNode, Topology::Cluster] {
        let ok = verified_many(many, topology);
        if ok.is_empty() {
            continue;
        }
        let n = ok[0].subscriptions;
        let med = |f: fn(&Many) -> f64| median_many(&ok, f);
        target_row(
            &format!("{n} subscriptions / one, {}", topology.name()),
            opt(med(|m| m.aggregate_rate / m.single_rate), 2) + "x",
            ">= 0.9x",
        );
        target_row(
            &format!("slowest subscription's share, {}", topology.name()),
            opt(med(|m| m.slowest_share), 2) + "x",
            ">= 0.5x",
        );
        target_row(
            &format!(
                "sidecar peak RSS, {n} loaded subscriptions, {}",
                topology.name()
            ),
            mb(peak_rss_kb(&ok), "n/a"),
            "< 64 MB",
        );
    }
}

/// The median RSS with the idle subscriptions open, MB, of one binary.
fn idle_rss_mb(idle: &[IdleRss], baseline: bool) -> Option<f64> {
    let rss: Vec<f64> = idle
        .iter()
        .filter(|r| r.baseline == baseline)
        .filter_map(|r| r.result.as_ref().ok())
        .map(|(rss, _)| *rss as f64 / 1024.0)
        .collect();
    median(&rss)
}

/// Each sidecar contender over its `@baseline` twin. The ratios are taken per round, where
/// the two ran back to back, so what the machine was doing then weighs on both; the figures
/// of the tables above are medians over rounds and keep the noise between rounds. The idle
/// RSS is steadier: its ratio is that of the two medians.
fn against_baseline(contenders: &[Contender], records: &[Record], idle: &[IdleRss], w: usize) {
    let pairs: Vec<(Contender, Contender)> = contenders
        .iter()
        .filter_map(|&c| Some((c, c.baseline_twin().filter(|t| contenders.contains(t))?)))
        .collect();
    let idle_twins = idle.iter().any(|r| r.baseline);
    if pairs.is_empty() && !idle_twins {
        return;
    }
    println!(
        "== new / baseline binary (per round, both runs verified; median with the rounds' range)"
    );
    println!(
        "{:<w$} {:<32} sidecar CPU per 100k",
        "contender", "deliveries/s"
    );
    for (new, baseline) in pairs {
        println!(
            "{:<w$} {:<32} {}",
            new.name(),
            ratio_text(&ratios(records, new, baseline)),
            ratio_text(&figure_ratios(records, new, baseline, sidecar_cpu_per_100k)),
        );
    }
    if idle_twins {
        let n = idle.first().map_or(100, |r| r.subscriptions);
        let figure = match (idle_rss_mb(idle, false), idle_rss_mb(idle, true)) {
            (Some(new), Some(baseline)) => {
                format!("{new:.1} MB / {baseline:.1} MB = {:.2}x", new / baseline)
            }
            _ => "n/a".into(),
        };
        println!("sidecar RSS with {n} idle subscriptions (median): {figure}");
    }
    println!();
}
