//! Printing: one line per run as it finishes, then the tables of figures, the figures the
//! performance targets name and, with `--baseline-bin`, the ratios of each sidecar contender to
//! its `@baseline` twin. The tables print a [`Report`] (figures.rs), the same one `--json`
//! writes. Figures only: nothing here asserts on them.

use crate::figures::{
    PhaseFigures, Report, SCALES, Spread, Target, percentile_ms, ratio_text, thousands,
};
use crate::many::{Many, Topology};
use crate::partitioned::Group;
use crate::{Contender, Measured, Phase};

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
                    "{head} {:>9} deliveries/s ({:.2} s, {:.2} commands/delivery{retried}{}), \
                     verified{wall}",
                    thousands(m.rate()),
                    m.secs,
                    m.commands_total() as f64 / m.entries as f64,
                    replicas_note(m)
                ),
                Phase::Latency | Phase::LatencyBusy | Phase::LatencyFast => println!(
                    "{head} p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms over {} entries{}{retried}, \
                     verified{wall}",
                    percentile_ms(&m.lat_us, 50.0),
                    percentile_ms(&m.lat_us, 99.0),
                    percentile_ms(&m.lat_us, 99.9),
                    m.entries,
                    hops(m)
                ),
            }
        }
        Err(err) => println!("{head} FAILED: {err}{wall}"),
    }
}

/// A replicas run: the partitions each replica read and its sidecar's CPU.
fn replicas_note(m: &Measured) -> String {
    if m.replicas.is_empty() {
        return String::new();
    }
    let shares: Vec<String> = m
        .replicas
        .iter()
        .map(|r| r.partitions.len().to_string())
        .collect();
    let cpu: Vec<String> = m.replicas.iter().map(|r| opt(r.cpu_s, 2)).collect();
    format!(
        ", partitions {} per replica, sidecars' CPU {} s",
        shares.join("+"),
        cpu.join(" + ")
    )
}

/// A latency run's parts: how late the producer sent, and the two hops when its consumer split
/// its samples.
fn hops(m: &Measured) -> String {
    let mut parts = Vec::new();
    if !m.producer_late_us.is_empty() {
        parts.push(format!(
            "sent late p50 {:.3} / p99 {:.3} ms",
            percentile_ms(&m.producer_late_us, 50.0),
            percentile_ms(&m.producer_late_us, 99.0)
        ));
    }
    if !m.to_consumer_us.is_empty() {
        parts.push(format!(
            "to the consumer p50 {:.2} / p99 {:.2} ms, then to settled p50 {:.2} / p99 {:.2} ms",
            percentile_ms(&m.to_consumer_us, 50.0),
            percentile_ms(&m.to_consumer_us, 99.0),
            percentile_ms(&m.to_settled_us, 50.0),
            percentile_ms(&m.to_settled_us, 99.0)
        ));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!(" ({})", parts.join("; "))
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

pub(crate) fn partitions_progress(
    round: u32,
    rounds: u32,
    partitions: u32,
    result: &Result<Group, String>,
    wall: std::time::Duration,
    w: usize,
) {
    let head = format!(
        "[round {round}/{rounds}] {:<10} {:<w$}",
        "partitions",
        format!("cluster, {partitions} partitions")
    );
    let wall = format!(" [{:.1} s]", wall.as_secs_f64());
    match result {
        Ok(g) => {
            let nodes: Vec<String> = g
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "{} ({} partitions)",
                        thousands(n.total() as f64),
                        n.partitions.len()
                    )
                })
                .collect();
            println!(
                "{head} {} replicas {:>9} deliveries/s ({:.2} s), commands per primary {}, \
                 verified{wall}",
                g.replicas.len(),
                thousands(g.rate()),
                g.secs,
                nodes.join(" / ")
            );
        }
        Err(err) => println!("{head} FAILED: {err}{wall}"),
    }
}

/// The median of a figure over rounds.
fn med(spread: Option<Spread>) -> Option<f64> {
    spread.map(|s| s.median)
}

/// A size in MB, or `none`.
fn mb(mb: Option<f64>, none: &str) -> String {
    mb.map_or_else(|| none.to_owned(), |mb| format!("{mb:.1} MB"))
}

/// Every table, in the order a reader meets them: throughput, resources, latency, retries,
/// the many-subscriptions phase, the Redis commands, the targets and, with `--baseline-bin`,
/// the ratios to the baseline binary.
pub(crate) fn tables(report: &Report) {
    let w = report
        .contenders
        .iter()
        .map(|c| c.name.len())
        .fold(26, usize::max);
    throughput_table(report, w);
    resources_table(report, w);
    replicas_table(report, w);
    latency_table(report, w);
    retry_table(report, w);
    many_table(report);
    partitions_table(report);
    scaling_table(report);
    command_lists(report, w);
    targets(&report.targets);
    println!();
    against_baseline(report, w);
}

/// Deliveries/s (median and range over the verified rounds), commands per delivery, round trips
/// per read and the sidecar's flushes.
fn throughput_table(report: &Report, w: usize) {
    println!();
    println!("== throughput (deliveries/s over verified rounds; other columns: median)");
    println!(
        "{:<w$} {:>10} {:>21} {:>10} {:>10} {:>10} {:>10}",
        "contender", "median", "min–max", "cmds/del", "rt/read", "flush/read", "flush ms"
    );
    for c in &report.contenders {
        let t = &c.throughput;
        let (med_rate, range) = match t.deliveries_per_s {
            Some(s) => (
                thousands(s.median),
                format!("{}–{}", thousands(s.min), thousands(s.max)),
            ),
            None => ("n/a".into(), "-".into()),
        };
        println!(
            "{:<w$} {:>10} {:>21} {:>10} {:>10} {:>10} {:>10}",
            c.name,
            med_rate,
            range,
            opt(med(t.commands_per_delivery), 3),
            opt(med(t.round_trips_per_read), 3),
            opt(med(t.flush_round_trips_per_read), 3),
            opt(med(t.flush_ms), 3),
        );
    }
}

/// CPU seconds per 100,000 deliveries of the sidecar, the client and Redis, and the sidecar's
/// peak RSS.
fn resources_table(report: &Report, w: usize) {
    println!();
    println!("== resources in the throughput runs (CPU seconds per 100,000 deliveries; median)");
    println!(
        "{:<w$} {:>12} {:>12} {:>12} {:>16}",
        "contender", "sidecar CPU", "client CPU", "redis CPU", "sidecar peak RSS"
    );
    for c in &report.contenders {
        let t = &c.throughput;
        println!(
            "{:<w$} {:>12} {:>12} {:>12} {:>16}",
            c.name,
            opt(med(t.sidecar_cpu_s_per_100k), 2),
            opt(med(t.client_cpu_s_per_100k), 2),
            opt(med(t.redis_cpu_s_per_100k), 2),
            mb(t.sidecar_peak_rss_mb, "-"),
        );
    }
    if report.replicas.is_some() {
        println!(
            "(sidecar-rust-replicas-*: the sidecar CPU of all their sidecars together, the largest \
             RSS; each process below)"
        );
    }
}

/// The replicas contenders beside `sidecar-rust-ordered-64`: deliveries/s, their ratio to it
/// in the same rounds, the partitions each replica read, and the CPU per 100,000 of the
/// group's deliveries of every process: each sidecar, the sidecars together, the client (this
/// process: every replica's client) and Redis.
fn replicas_table(report: &Report, w: usize) {
    let Some(replicas) = &report.replicas else {
        return;
    };
    let rows: Vec<_> = report
        .contenders
        .iter()
        .filter(|c| {
            c.name.starts_with("sidecar-rust-ordered-64")
                || c.name.starts_with("sidecar-rust-replicas-")
        })
        .collect();
    let sidecars = rows
        .iter()
        .filter_map(|c| c.throughput.per_sidecar_cpu_s_per_100k.as_ref())
        .map(Vec::len)
        .fold(1, usize::max);
    println!();
    println!(
        "== ordered across replicas: one stream of {} partitions, a sidecar process and a client \
         stream per replica (throughput runs; median over verified rounds; CPU seconds per \
         100,000 of the group's deliveries, per process)",
        replicas.partitions
    );
    let mut head = format!(
        "{:<w$} {:>12} {:>11} {:>11}",
        "contender", "deliveries/s", "/ ordered", "partitions"
    );
    for i in 1..=sidecars {
        head.push_str(&format!(" {:>10}", format!("sidecar {i}")));
    }
    head.push_str(&format!(
        " {:>9} {:>8} {:>8}",
        "sidecars", "client", "redis"
    ));
    println!("{head}");
    for c in rows {
        let t = &c.throughput;
        let ratio = replicas
            .rows
            .iter()
            .find(|r| r.name == c.name)
            .and_then(|r| med(r.per_ordered_64))
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"));
        let shares = t
            .runs
            .first()
            .and_then(|r| r.sidecars.as_ref())
            .map_or_else(
                || "-".to_owned(),
                |s| {
                    s.iter()
                        .map(|s| s.partitions.len().to_string())
                        .collect::<Vec<_>>()
                        .join("+")
                },
            );
        let mut line = format!(
            "{:<w$} {:>12} {:>11} {:>11}",
            c.name,
            med(t.deliveries_per_s).map_or("n/a".into(), thousands),
            ratio,
            shares
        );
        let each = t.per_sidecar_cpu_s_per_100k.as_deref();
        for i in 0..sidecars {
            let cpu = match each {
                Some(each) => each.get(i).copied().flatten().map(|s| s.median),
                // One sidecar of its own.
                None if i == 0 => med(t.sidecar_cpu_s_per_100k),
                None => None,
            };
            line.push_str(&format!(" {:>10}", opt(cpu, 2)));
        }
        line.push_str(&format!(
            " {:>9} {:>8} {:>8}",
            opt(med(t.sidecar_cpu_s_per_100k), 2),
            opt(med(t.client_cpu_s_per_100k), 2),
            opt(med(t.redis_cpu_s_per_100k), 2),
        ));
        println!("{line}");
    }
}

/// p50, p99 and p999 at the latency phase's rate, and p50 and p99 flat out (the throughput
/// runs); then the tail beside a busy neighbour and at ten times the rate, for the contenders
/// that ran there.
fn latency_table(report: &Report, w: usize) {
    let rate = report.run.latency_rate;
    println!();
    println!(
        "== latency, ms (median over rounds). At {rate}/s: from the time the entry's XADD was \
         due to the reply that settled it. Flat out: the read reaching the consumer to that reply"
    );
    println!(
        "{:<w$} {:>12} {:>12} {:>13} {:>14} {:>14}",
        "contender",
        format!("{rate}/s p50"),
        format!("{rate}/s p99"),
        format!("{rate}/s p999"),
        "flat-out p50",
        "flat-out p99"
    );
    for c in &report.contenders {
        let l = c.latency.as_ref();
        let t = &c.throughput;
        println!(
            "{:<w$} {:>12} {:>12} {:>13} {:>14} {:>14}",
            c.name,
            opt(l.and_then(|l| med(l.p50_ms)), 3),
            opt(l.and_then(|l| med(l.p99_ms)), 3),
            opt(l.and_then(|l| med(l.p999_ms)), 3),
            opt(med(t.p50_ms), 3),
            opt(med(t.p99_ms), 3),
        );
    }
    hops_table(report, w);
    let tails: Vec<_> = report
        .contenders
        .iter()
        .filter(|c| c.latency_busy.is_some() || c.latency_fast.is_some())
        .collect();
    if tails.is_empty() {
        return;
    }
    println!();
    println!(
        "== the tail, ms (median over rounds): at {rate}/s beside a neighbour process keeping a \
         core busy, and at {}/s",
        rate * 10
    );
    println!(
        "{:<w$} {:>10} {:>10} {:>11} {:>10} {:>10} {:>11}",
        "contender", "busy p50", "busy p99", "busy p999", "10x p50", "10x p99", "10x p999"
    );
    for c in tails {
        let (b, f) = (c.latency_busy.as_ref(), c.latency_fast.as_ref());
        println!(
            "{:<w$} {:>10} {:>10} {:>11} {:>10} {:>10} {:>11}",
            c.name,
            opt(b.and_then(|l| med(l.p50_ms)), 3),
            opt(b.and_then(|l| med(l.p99_ms)), 3),
            opt(b.and_then(|l| med(l.p999_ms)), 3),
            opt(f.and_then(|l| med(l.p50_ms)), 3),
            opt(f.and_then(|l| med(l.p99_ms)), 3),
            opt(f.and_then(|l| med(l.p999_ms)), 3),
        );
    }
}

/// Where a sample's time goes at the latency phase's rate, for the contenders that split it:
/// up to the entry's arrival at the consumer, then on to the reply that settled it. Through
/// the sidecar, the first part has the sidecar's hop to the client on top of Redis's read, and
/// the second the client's answer crossing to the sidecar and the report crossing back on top
/// of the flush.
fn hops_table(report: &Report, w: usize) {
    let rate = report.run.latency_rate;
    let rows: Vec<(&str, &PhaseFigures)> = report
        .contenders
        .iter()
        .filter_map(|c| Some((c.name.as_str(), c.latency.as_ref()?)))
        .filter(|(_, l)| l.to_consumer_p50_ms.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "== where the time goes at {rate}/s, ms (median over rounds): from the XADD to the \
         read's arrival at the consumer, then on to the reply that settled the entry"
    );
    println!(
        "{:<w$} {:>16} {:>16} {:>15} {:>15}",
        "contender", "to consumer p50", "to consumer p99", "to settled p50", "to settled p99"
    );
    for (name, l) in rows {
        println!(
            "{:<w$} {:>16} {:>16} {:>15} {:>15}",
            name,
            opt(med(l.to_consumer_p50_ms), 3),
            opt(med(l.to_consumer_p99_ms), 3),
            opt(med(l.to_settled_p50_ms), 3),
            opt(med(l.to_settled_p99_ms), 3),
        );
    }
}

/// The retrying contenders: the deliveries retried, the entries ever added to the stream
/// (`XINFO STREAM` `entries-added`: N when retries stay in place, N plus the retries when each
/// appends a copy) and its length once retention trimmed it. Nothing when none verified.
fn retry_table(report: &Report, w: usize) {
    let rows: Vec<(&str, Phase, &PhaseFigures)> = report
        .contenders
        .iter()
        .flat_map(|c| {
            [
                (Phase::Throughput, Some(&c.throughput)),
                (Phase::Latency, c.latency.as_ref()),
            ]
            .into_iter()
            .filter_map(|(phase, p)| Some((c.name.as_str(), phase, p?)))
        })
        .filter(|(_, _, p)| p.retries.is_some())
        .collect();
    if rows.is_empty() {
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
    for (name, phase, p) in rows {
        let Some(r) = &p.retries else { continue };
        println!(
            "{:<w$} {:<10} {:>10} {:>10} {:>14} {:>12} {:>14}",
            name,
            phase_name(phase),
            thousands(r.entries as f64),
            med(r.retried).map_or("n/a".into(), thousands),
            med(r.entries_added).map_or("n/a".into(), thousands),
            opt(med(r.added_per_entry), 3),
            opt(med(r.xlen_at_end), 0),
        );
    }
}

/// Per topology: one subscription alone against all of them at once, their fairness and the
/// sidecar's peak RSS. Nothing when the phase was skipped.
fn many_table(report: &Report) {
    if report.many.is_empty() {
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
    for m in &report.many {
        let Some(n) = m.subscriptions else { continue };
        println!(
            "{:<22} {:>6} {:>12} {:>12} {:>10} {:>14} {:>12}",
            m.topology,
            n,
            med(m.one_deliveries_per_s).map_or("n/a".into(), thousands),
            med(m.all_deliveries_per_s).map_or("n/a".into(), thousands),
            opt(med(m.all_per_one), 2),
            opt(med(m.slowest_share), 2),
            mb(m.sidecar_peak_rss_mb, "-"),
        );
    }
}

/// The many-partitions phase: deliveries/s and the CPU of every process, then per primary the
/// partitions it holds, its CPU and its commands (all, XREADGROUP, XACK, EVALSHA).
fn partitions_table(report: &Report) {
    let Some(p) = &report.partitions else {
        return;
    };
    println!();
    println!(
        "== many partitions: one stream of {} partitions on a {}, {} replicas (a sidecar \
         process and a client stream each), ordered, pipeline-64 (median over verified rounds)",
        p.partitions, p.topology, p.replicas
    );
    let Some(rate) = p.deliveries_per_s else {
        println!("no verified run");
        return;
    };
    let each: Vec<String> = p
        .per_sidecar_cpu_s_per_100k
        .iter()
        .enumerate()
        .map(|(i, s)| format!("sidecar {} {}", i + 1, opt(med(*s), 2)))
        .collect();
    println!(
        "{} deliveries/s ({}–{}); CPU seconds per 100,000 deliveries: {} (together {}), client \
         {}, redis {} (all primaries)",
        thousands(rate.median),
        thousands(rate.min),
        thousands(rate.max),
        each.join(", "),
        opt(med(p.sidecar_cpu_s_per_100k), 2),
        opt(med(p.client_cpu_s_per_100k), 2),
        opt(med(p.redis_cpu_s_per_100k), 2),
    );
    println!(
        "{:<6} {:>10} {:>10} {:>10} {:>7} {:>11} {:>9} {:>9}",
        "node", "partitions", "redis CPU", "commands", "share", "XREADGROUP", "XACK", "EVALSHA"
    );
    let count = |s: Option<Spread>| med(s).map_or("n/a".into(), thousands);
    for n in &p.nodes {
        println!(
            "{:<6} {:>10} {:>10} {:>10} {:>7} {:>11} {:>9} {:>9}",
            n.node,
            n.partitions.len(),
            opt(med(n.cpu_s_per_100k), 2),
            count(n.commands_total),
            opt(med(n.commands_share), 2),
            count(n.xreadgroup),
            count(n.xack),
            count(n.evalsha),
        );
    }
    for n in &p.nodes {
        let list: Vec<String> = n.partitions.iter().map(u32::to_string).collect();
        println!("node {} holds partitions {}", n.node, list.join(" "));
    }
}

/// Capacity on paper from the run's CPU per delivery: S shards and K sidecars, each process on
/// a core of its own, min(S / c_r, K / c_s) deliveries/s.
fn scaling_table(report: &Report) {
    let Some(s) = &report.scaling else {
        return;
    };
    let us = |secs: f64| format!("{:.2} µs", secs * 1e6);
    println!();
    println!(
        "== capacity on paper: min(S / c_r, K / c_s) deliveries/s for S shards and K sidecars, \
         each process on a core of its own, keys spread evenly over more partitions than either"
    );
    println!(
        "from {}: c_s = {} of sidecar CPU per delivery, c_r = {} of Redis CPU per delivery{}",
        s.source,
        us(s.sidecar_cpu_s_per_delivery),
        us(s.redis_cpu_s_per_delivery),
        s.client_cpu_s_per_delivery.map_or_else(String::new, |c| format!(
            "; the client's {} is not counted (a client per sidecar, on a core of its own, adds \
             the bound K / c_c = {} per sidecar)",
            us(c),
            thousands(1.0 / c)
        ))
    );
    let mut head = format!("{:<18}", "shards \\ sidecars");
    for k in SCALES {
        head.push_str(&format!(" {k:>11}"));
    }
    println!("{head}");
    for shards in SCALES {
        let mut line = format!("{shards:<18}");
        for sidecars in SCALES {
            let cell = s
                .rows
                .iter()
                .find(|c| c.shards == shards && c.sidecars == sidecars);
            let text = cell.map_or_else(
                || "-".to_owned(),
                |c| {
                    let by = if c.bound_by == "redis" { 'R' } else { 'S' };
                    format!("{} {by}", thousands(c.deliveries_per_s))
                },
            );
            line.push_str(&format!(" {text:>11}"));
        }
        println!("{line}");
    }
    println!("(R: bound by Redis, S / c_r; S: bound by the sidecars, K / c_s)");
}

/// The calls per Redis command of each contender's last verified throughput run.
fn command_lists(report: &Report, w: usize) {
    println!();
    println!("== Redis commands per throughput run (last verified round; INFO commandstats)");
    for c in &report.contenders {
        if let Some(r) = c.throughput.runs.last() {
            let list: Vec<String> = r
                .commands
                .iter()
                .map(|(name, n)| format!("{name} {n}"))
                .collect();
            println!("{:<w$} {}", c.name, list.join(", "));
        }
    }
}

/// The figures docs/performance.md holds the sidecar to: what is measured, the figure, the
/// target it is held to and whether it is met; a note under the row.
fn targets(targets: &[Target]) {
    println!();
    println!("== the targets (figures, not assertions; see docs/performance.md)");
    for t in targets {
        let met = match t.met {
            Some(true) => ": met",
            Some(false) => ": not met",
            None => "",
        };
        println!(
            "{:<58} {:<34} target {}{met}",
            t.name, t.figure, t.threshold
        );
        if let Some(note) = &t.note {
            for line in wrap(note, 96) {
                println!("  {line}");
            }
        }
    }
}

/// `text` in lines of at most `width` characters (a longer word alone on its line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// Each sidecar contender over its `@baseline` twin, per round (see figures.rs), and the idle
/// RSS of both binaries.
fn against_baseline(report: &Report, w: usize) {
    let Some(baseline) = &report.baseline else {
        return;
    };
    println!(
        "== new / baseline binary (per round, both runs verified; median with the rounds' range)"
    );
    println!(
        "{:<w$} {:<32} sidecar CPU per 100k",
        "contender", "deliveries/s"
    );
    for pair in &baseline.pairs {
        println!(
            "{:<w$} {:<32} {}",
            pair.name,
            ratio_text(pair.deliveries_per_s),
            ratio_text(pair.sidecar_cpu_s_per_100k),
        );
    }
    if let Some(idle) = &baseline.idle {
        let figure = match (idle.rss_mb, idle.baseline_rss_mb, idle.ratio) {
            (Some(new), Some(old), Some(ratio)) => {
                format!("{new:.1} MB / {old:.1} MB = {ratio:.2}x")
            }
            _ => "n/a".into(),
        };
        println!(
            "sidecar RSS with {} idle subscriptions (median): {figure}",
            idle.subscriptions
        );
    }
    println!();
}
