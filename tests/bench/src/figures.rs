//! The figures of a run, computed once from its records: the one data model of the report,
//! which report.rs prints as tables and `--json` writes as one JSON document (serde), so the
//! two cannot tell different stories. `.ci/perf_doc.py` renders docs/performance.md and the
//! README's headline figures from the JSON. Figures only: nothing here asserts on them.
//!
//! The JSON's fields are named after what they hold, with their unit in the name
//! (`deliveries_per_s`, `sidecar_cpu_s_per_100k`, `p99_ms`, `sidecar_peak_rss_mb`). A figure
//! over rounds is a [`Spread`] (median, min, max and how many rounds had one); a figure a run
//! did not measure is `null`.

use serde::{Serialize, Serializer};

use crate::many::{Many, Topology};
use crate::partitioned::{self, Group, Replica};
use crate::{Contender, IdleRss, ManyRecord, Measured, PartitionsRecord, Phase, PythonApi, Record};

/// The version of the JSON's layout: raised when a field changes meaning or goes away.
pub(crate) const SCHEMA: u32 = 1;

/// Everything the report holds.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub schema: u32,
    pub run: Run,
    /// In the order they ran (each `@baseline` twin beside its contender).
    pub contenders: Vec<ContenderFigures>,
    /// The RSS check with idle subscriptions open: the measured binary, then the baseline one.
    pub idle: Vec<IdleFigures>,
    /// The many-subscriptions phase, per topology.
    pub many: Vec<ManyFigures>,
    /// The replicas contenders beside `sidecar-rust-ordered-64`; null when none ran.
    pub replicas: Option<ReplicasFigures>,
    /// The many-partitions phase; null when it was skipped.
    pub partitions: Option<PartitionsFigures>,
    /// Capacity on paper from this run's CPU per delivery; null without a run to take it from.
    pub scaling: Option<Scaling>,
    pub targets: Vec<Target>,
    /// With `--baseline-bin`: each sidecar contender over its twin.
    pub baseline: Option<Baseline>,
    /// Runs verified and runs failed, as the closing line counts them.
    pub passed: usize,
    pub failed: usize,
}

/// What was run, where and when.
#[derive(Debug, Serialize)]
pub(crate) struct Run {
    /// The bench's arguments (without the program).
    pub args: Vec<String>,
    /// `release` or `debug`: a debug build's in-process clients are slow.
    pub profile: &'static str,
    /// When the run finished, RFC 3339, UTC.
    pub date: String,
    /// `git rev-parse HEAD` of the repository the bench was built in, when git answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Whether that work tree had uncommitted changes (to tracked files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty: Option<bool>,
    pub cores: usize,
    pub redis: String,
    pub entries: u64,
    pub rounds: u32,
    pub latency_rate: u64,
    pub latency_secs: f64,
    /// `max_in_flight` of every sidecar contender: this many reads of its COUNT.
    pub window_reads: u32,
    pub idle_subscriptions: usize,
    pub many_subscriptions: usize,
    /// Partitions of the many-partitions phase (0: skipped).
    pub many_partitions: u32,
    /// Partitions of the replicas contenders' stream.
    pub replica_partitions: u32,
    pub sidecar_bin: Option<String>,
    pub baseline_bin: Option<String>,
}

/// A figure over the verified rounds. `n`: how many had one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// The spread of the finite values; none when there is none.
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len().is_multiple_of(2) {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        };
        Some(Self {
            median,
            min: v[0],
            max: v[v.len() - 1],
            n: v.len(),
        })
    }
}

/// A run that could not be verified, left out of every figure.
#[derive(Debug, Serialize)]
pub(crate) struct Failure {
    pub round: u32,
    pub error: String,
}

/// One contender: its throughput runs and, for each latency phase it ran in, those runs.
#[derive(Debug, Serialize)]
pub(crate) struct ContenderFigures {
    pub name: String,
    /// Run against the `--baseline-bin` binary (a `<name>@baseline` twin).
    pub baseline_binary: bool,
    /// The COUNT of its reads.
    pub count: u32,
    /// The sidecar contenders' window.
    pub max_in_flight: Option<u32>,
    pub throughput: PhaseFigures,
    /// At `--latency-rate`.
    pub latency: Option<PhaseFigures>,
    /// At that rate, beside a neighbour process keeping a core busy.
    pub latency_busy: Option<PhaseFigures>,
    /// At ten times that rate.
    pub latency_fast: Option<PhaseFigures>,
}

/// One contender's runs in one phase, and their figures over rounds.
#[derive(Debug, Serialize)]
pub(crate) struct PhaseFigures {
    pub runs: Vec<RunFigures>,
    pub failures: Vec<Failure>,
    pub deliveries_per_s: Option<Spread>,
    pub commands_per_delivery: Option<Spread>,
    pub round_trips_per_read: Option<Spread>,
    pub flush_round_trips_per_read: Option<Spread>,
    pub flush_ms: Option<Spread>,
    pub sidecar_cpu_s_per_100k: Option<Spread>,
    pub client_cpu_s_per_100k: Option<Spread>,
    pub redis_cpu_s_per_100k: Option<Spread>,
    /// A replicas contender: each sidecar process's CPU per 100,000 of the group's deliveries,
    /// replica by replica (`sidecar_cpu_s_per_100k` is their sum); null for the others.
    pub per_sidecar_cpu_s_per_100k: Option<Vec<Option<Spread>>>,
    /// The largest over rounds.
    pub sidecar_peak_rss_mb: Option<f64>,
    /// Throughput phase: flat out, from the read's arrival at the consumer to the reply that
    /// settled the entry. Latency phases: from the time the entry's XADD was due to that reply.
    pub p50_ms: Option<Spread>,
    pub p99_ms: Option<Spread>,
    pub p999_ms: Option<Spread>,
    /// Latency phases: the p50 and p99 of each part of a sample, to the consumer and from
    /// there to the settling reply (see `ClientOutcome`).
    pub to_consumer_p50_ms: Option<Spread>,
    pub to_consumer_p99_ms: Option<Spread>,
    pub to_settled_p50_ms: Option<Spread>,
    pub to_settled_p99_ms: Option<Spread>,
    /// An ordered run with a hot key: the other keys' entries over the time until the last
    /// of them was settled.
    pub other_keys_deliveries_per_s: Option<Spread>,
    pub retries: Option<RetrySummary>,
}

/// One verified run.
#[derive(Debug, Serialize)]
pub(crate) struct RunFigures {
    pub round: u32,
    pub entries: u64,
    pub seconds: f64,
    pub deliveries_per_s: f64,
    pub commands_per_delivery: f64,
    /// Reads that delivered entries, and Redis round trips (the sidecar's own counters for
    /// sidecar contenders, the consumer's for the others).
    pub reads: u64,
    pub round_trips: u64,
    pub round_trips_per_read: Option<f64>,
    pub flush_round_trips_per_read: Option<f64>,
    pub flush_ms: Option<f64>,
    pub sidecar_cpu_s_per_100k: Option<f64>,
    pub client_cpu_s_per_100k: Option<f64>,
    pub redis_cpu_s_per_100k: Option<f64>,
    pub sidecar_peak_rss_mb: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub to_consumer_p50_ms: Option<f64>,
    pub to_consumer_p99_ms: Option<f64>,
    pub to_settled_p50_ms: Option<f64>,
    pub to_settled_p99_ms: Option<f64>,
    pub other_keys_deliveries_per_s: Option<f64>,
    pub retries: Option<RetryRun>,
    /// A replicas run: each replica's sidecar (`sidecar_cpu_s_per_100k` is their sum,
    /// `sidecar_peak_rss_mb` the largest); null for the others.
    pub sidecars: Option<Vec<SidecarRun>>,
    /// Calls per Redis command (`INFO commandstats`), in the order Redis lists them.
    #[serde(serialize_with = "as_map")]
    pub commands: Vec<(String, u64)>,
}

/// One replica of a group on a partitioned stream: its consumer name, the partitions it read,
/// the deliveries its client acknowledged, and its sidecar process's CPU per 100,000 of the
/// group's deliveries and peak RSS.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SidecarRun {
    pub replica: String,
    pub partitions: Vec<u32>,
    pub deliveries: u64,
    pub cpu_s_per_100k: Option<f64>,
    pub peak_rss_mb: Option<f64>,
}

impl SidecarRun {
    fn of(r: &Replica, entries: u64) -> Self {
        Self {
            replica: r.name.clone(),
            partitions: r.partitions.clone(),
            deliveries: r.deliveries,
            cpu_s_per_100k: r.cpu_s.map(|s| s * 100_000.0 / entries as f64),
            peak_rss_mb: r.hwm_kb.map(kb_to_mb),
        }
    }
}

/// Per replica (by its place in the runs' lists), its sidecar's CPU over the runs.
fn per_sidecar<'a>(runs: impl Iterator<Item = &'a [SidecarRun]> + Clone) -> Vec<Option<Spread>> {
    let n = runs.clone().map(<[SidecarRun]>::len).max().unwrap_or(0);
    (0..n)
        .map(|i| Spread::of(runs.clone().filter_map(|r| r.get(i)?.cpu_s_per_100k)))
        .collect()
}

/// The replicas contenders against `sidecar-rust-ordered-64` in the same rounds.
#[derive(Debug, Serialize)]
pub(crate) struct ReplicasFigures {
    /// Partitions of their stream.
    pub partitions: u32,
    pub rows: Vec<ReplicasRatio>,
}

/// A replicas contender's deliveries/s over `sidecar-rust-ordered-64`'s (its `@baseline` twin's
/// over the twin's), per round (both verified in that round).
#[derive(Debug, Serialize)]
pub(crate) struct ReplicasRatio {
    pub name: String,
    pub replicas: u32,
    pub per_ordered_64: Option<Spread>,
}

/// The many-partitions phase: one partitioned stream on a 3-primary cluster, read by
/// replicas that each have a sidecar of their own.
#[derive(Debug, Serialize)]
pub(crate) struct PartitionsFigures {
    pub topology: &'static str,
    pub partitions: u32,
    pub replicas: usize,
    pub runs: Vec<PartitionsRun>,
    pub failures: Vec<Failure>,
    pub deliveries_per_s: Option<Spread>,
    /// Each replica's sidecar, per 100,000 of the group's deliveries.
    pub per_sidecar_cpu_s_per_100k: Vec<Option<Spread>>,
    /// The sidecars together.
    pub sidecar_cpu_s_per_100k: Option<Spread>,
    pub client_cpu_s_per_100k: Option<Spread>,
    /// The primaries together.
    pub redis_cpu_s_per_100k: Option<Spread>,
    /// Per primary, in slot order.
    pub nodes: Vec<NodeFigures>,
}

/// One verified run of the many-partitions phase.
#[derive(Debug, Serialize)]
pub(crate) struct PartitionsRun {
    pub round: u32,
    pub entries: u64,
    pub seconds: f64,
    pub deliveries_per_s: f64,
    pub sidecars: Vec<SidecarRun>,
    pub client_cpu_s_per_100k: Option<f64>,
    pub redis_cpu_s_per_100k: Option<f64>,
    pub round_trips_per_read: Option<f64>,
    pub nodes: Vec<NodeRun>,
}

/// One primary in one run: the partitions it holds, its CPU per 100,000 of the group's
/// deliveries and its commands.
#[derive(Debug, Serialize)]
pub(crate) struct NodeRun {
    /// 1-based, in slot order.
    pub node: usize,
    pub port: u16,
    pub partitions: Vec<u32>,
    pub cpu_s_per_100k: Option<f64>,
    pub commands_total: u64,
    pub xreadgroup: u64,
    pub xack: u64,
    pub evalsha: u64,
    #[serde(serialize_with = "as_map")]
    pub commands: Vec<(String, u64)>,
}

/// One primary (by its place in slot order) over the verified runs.
#[derive(Debug, Serialize)]
pub(crate) struct NodeFigures {
    pub node: usize,
    /// The first verified run's (the same in every run: the slots are laid out alike).
    pub partitions: Vec<u32>,
    pub cpu_s_per_100k: Option<Spread>,
    pub commands_total: Option<Spread>,
    /// Its commands over all the primaries' (1 / primaries when the work is even).
    pub commands_share: Option<Spread>,
    pub xreadgroup: Option<Spread>,
    pub xack: Option<Spread>,
    pub evalsha: Option<Spread>,
}

/// Capacity on paper: S shards and K sidecars, each process on a core of its own, deliver
/// about min(S / c_r, K / c_s) a second, `c_r` and `c_s` the Redis and sidecar CPU seconds
/// per delivery this run measured (each summed over its processes).
#[derive(Debug, Serialize)]
pub(crate) struct Scaling {
    /// Which run's figures: the many-partitions phase or a replicas contender.
    pub source: String,
    pub sidecar_cpu_s_per_delivery: f64,
    pub redis_cpu_s_per_delivery: f64,
    /// The clients' (not in the table: a client per sidecar on a core of its own adds the
    /// bound K / c_c).
    pub client_cpu_s_per_delivery: Option<f64>,
    pub rows: Vec<ScalingCell>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ScalingCell {
    pub shards: u32,
    pub sidecars: u32,
    pub deliveries_per_s: f64,
    /// `redis` or `sidecars`: whichever bound is lower.
    pub bound_by: &'static str,
}

/// The shard and sidecar counts of the scaling table.
pub(crate) const SCALES: [u32; 4] = [1, 3, 6, 12];

/// A retrying run: the deliveries it retried and what the stream held at the end.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct RetryRun {
    pub retried: u64,
    pub entries_added: u64,
    pub xlen_at_end: u64,
}

/// A retrying contender's runs of one phase.
#[derive(Debug, Serialize)]
pub(crate) struct RetrySummary {
    /// The first verified run's entries.
    pub entries: u64,
    pub retried: Option<Spread>,
    pub entries_added: Option<Spread>,
    pub added_per_entry: Option<Spread>,
    pub xlen_at_end: Option<Spread>,
}

/// The RSS check of one binary: the sidecar's RSS two seconds after its idle subscriptions
/// were opened, and before.
#[derive(Debug, Serialize)]
pub(crate) struct IdleFigures {
    pub baseline_binary: bool,
    pub subscriptions: usize,
    pub runs: Vec<IdleRun>,
    pub failures: Vec<Failure>,
    pub rss_mb: Option<Spread>,
}

#[derive(Debug, Serialize)]
pub(crate) struct IdleRun {
    pub round: u32,
    pub rss_mb: f64,
    pub before_mb: f64,
}

/// The many-subscriptions phase on one topology.
#[derive(Debug, Serialize)]
pub(crate) struct ManyFigures {
    pub topology: &'static str,
    /// The first verified run's.
    pub subscriptions: Option<usize>,
    pub runs: Vec<ManyRun>,
    pub failures: Vec<Failure>,
    pub one_deliveries_per_s: Option<Spread>,
    pub all_deliveries_per_s: Option<Spread>,
    pub all_per_one: Option<Spread>,
    pub slowest_share: Option<Spread>,
    /// The largest over rounds, in the runs of many.
    pub sidecar_peak_rss_mb: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ManyRun {
    pub round: u32,
    pub subscriptions: usize,
    pub one_deliveries_per_s: f64,
    pub all_deliveries_per_s: f64,
    pub slowest_share: f64,
    pub sidecar_peak_rss_mb: Option<f64>,
}

/// One figure docs/performance.md holds the sidecar to, or one printed beside them.
#[derive(Debug, Serialize)]
pub(crate) struct Target {
    pub name: String,
    /// The target as written (`>= 1.5x`), or in parentheses what a figure without one is.
    pub threshold: String,
    /// The figure held to the threshold: a median over rounds (of per-round ratios for a
    /// ratio), or an added latency.
    pub measured: Option<f64>,
    /// A per-round ratio's range over rounds, when more than one round had it.
    pub range: Option<[f64; 2]>,
    pub unit: &'static str,
    /// The figure as the report prints it.
    pub figure: String,
    /// Whether the target is met; null for a figure without one or with nothing measured.
    pub met: Option<bool>,
    pub note: Option<String>,
}

/// With `--baseline-bin`: the new binary over the baseline one.
#[derive(Debug, Serialize)]
pub(crate) struct Baseline {
    pub pairs: Vec<BaselinePair>,
    pub idle: Option<IdleRatio>,
}

/// A sidecar contender over its `@baseline` twin: ratios per round (both runs verified in
/// that round), over rounds.
#[derive(Debug, Serialize)]
pub(crate) struct BaselinePair {
    pub name: String,
    pub twin: String,
    pub deliveries_per_s: Option<Spread>,
    pub sidecar_cpu_s_per_100k: Option<Spread>,
}

/// The idle RSS of the two binaries, medians over rounds, and their ratio.
#[derive(Debug, Serialize)]
pub(crate) struct IdleRatio {
    pub subscriptions: usize,
    pub rss_mb: Option<f64>,
    pub baseline_rss_mb: Option<f64>,
    pub ratio: Option<f64>,
}

/// `[("xack", 12), …]` as `{"xack": 12, …}`, in that order.
fn as_map<S: Serializer>(pairs: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// Every run's record, as the bench gathered them.
pub(crate) struct Records<'a> {
    pub records: &'a [Record],
    pub idle: &'a [IdleRss],
    pub many: &'a [ManyRecord],
    pub partitions: &'a [PartitionsRecord],
}

impl Report {
    /// The figures of every run.
    pub(crate) fn of(run: Run, contenders: &[Contender], runs: &Records<'_>) -> Self {
        let rate = run.latency_rate;
        let figures = contenders
            .iter()
            .map(|&c| ContenderFigures::of(c, run.window_reads, runs.records))
            .collect();
        let idle = [false, true]
            .into_iter()
            .filter_map(|baseline| IdleFigures::of(runs.idle, baseline))
            .collect();
        let many = [Topology::SingleNode, Topology::Cluster]
            .into_iter()
            .filter_map(|t| ManyFigures::of(runs.many, t))
            .collect();
        let failed = runs.records.iter().filter(|r| r.result.is_err()).count()
            + runs.idle.iter().filter(|r| r.result.is_err()).count()
            + runs.many.iter().filter(|r| r.2.is_err()).count()
            + runs.partitions.iter().filter(|r| r.1.is_err()).count();
        let passed =
            runs.records.len() + runs.idle.len() + runs.many.len() + runs.partitions.len() - failed;
        let partitions = PartitionsFigures::of(runs.partitions);
        let mut report = Report {
            schema: SCHEMA,
            replicas: None,
            partitions,
            scaling: None,
            run,
            contenders: figures,
            idle,
            many,
            targets: Vec::new(),
            baseline: None,
            passed,
            failed,
        };
        report.targets = targets(&report, runs.records, rate);
        report.baseline = baseline(&report, contenders, runs.records);
        report.replicas = replicas(&report, contenders, runs.records);
        report.scaling = scaling(&report);
        report
    }

    /// A contender's figures, by its name.
    pub(crate) fn contender(&self, c: Contender) -> Option<&ContenderFigures> {
        let name = c.name();
        self.contenders.iter().find(|f| f.name == name)
    }

    fn idle_of(&self, baseline: bool) -> Option<&IdleFigures> {
        self.idle.iter().find(|i| i.baseline_binary == baseline)
    }
}

/// Nearest-rank percentile of sorted samples, in milliseconds.
pub(crate) fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn kb_to_mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

impl ContenderFigures {
    fn of(c: Contender, window_reads: u32, records: &[Record]) -> Self {
        let ran = |phase| {
            records
                .iter()
                .any(|r| r.contender == c && r.phase == phase)
                .then(|| PhaseFigures::of(records, c, phase))
        };
        Self {
            name: c.name(),
            baseline_binary: c.on_baseline(),
            count: c.count(),
            max_in_flight: c.uses_sidecar().then(|| window_reads * c.count()),
            throughput: PhaseFigures::of(records, c, Phase::Throughput),
            latency: ran(Phase::Latency),
            latency_busy: ran(Phase::LatencyBusy),
            latency_fast: ran(Phase::LatencyFast),
        }
    }
}

impl PhaseFigures {
    fn of(records: &[Record], c: Contender, phase: Phase) -> Self {
        let hot = c.keying() == Some(crate::workload::Keying::Hot);
        let mut runs = Vec::new();
        let mut failures = Vec::new();
        for r in records
            .iter()
            .filter(|r| r.contender == c && r.phase == phase)
        {
            match &r.result {
                Ok(m) => runs.push(RunFigures::of(r.round, m, hot)),
                Err(error) => failures.push(Failure {
                    round: r.round,
                    error: error.clone(),
                }),
            }
        }
        let spread = |f: fn(&RunFigures) -> Option<f64>| Spread::of(runs.iter().filter_map(f));
        let retries = runs
            .first()
            .filter(|first| first.retries.is_some())
            .map(|first| {
                let of = |f: fn(&RunFigures, RetryRun) -> f64| {
                    Spread::of(runs.iter().filter_map(|r| Some(f(r, r.retries?))))
                };
                RetrySummary {
                    entries: first.entries,
                    retried: of(|_, k| k.retried as f64),
                    entries_added: of(|_, k| k.entries_added as f64),
                    added_per_entry: of(|r, k| k.entries_added as f64 / r.entries as f64),
                    xlen_at_end: of(|_, k| k.xlen_at_end as f64),
                }
            });
        Self {
            deliveries_per_s: spread(|r| Some(r.deliveries_per_s)),
            commands_per_delivery: spread(|r| Some(r.commands_per_delivery)),
            round_trips_per_read: spread(|r| r.round_trips_per_read),
            flush_round_trips_per_read: spread(|r| r.flush_round_trips_per_read),
            flush_ms: spread(|r| r.flush_ms),
            sidecar_cpu_s_per_100k: spread(|r| r.sidecar_cpu_s_per_100k),
            client_cpu_s_per_100k: spread(|r| r.client_cpu_s_per_100k),
            redis_cpu_s_per_100k: spread(|r| r.redis_cpu_s_per_100k),
            per_sidecar_cpu_s_per_100k: c
                .replicas()
                .map(|_| per_sidecar(runs.iter().filter_map(|r| r.sidecars.as_deref()))),
            sidecar_peak_rss_mb: runs
                .iter()
                .filter_map(|r| r.sidecar_peak_rss_mb)
                .reduce(f64::max),
            p50_ms: spread(|r| r.p50_ms),
            p99_ms: spread(|r| r.p99_ms),
            p999_ms: spread(|r| r.p999_ms),
            to_consumer_p50_ms: spread(|r| r.to_consumer_p50_ms),
            to_consumer_p99_ms: spread(|r| r.to_consumer_p99_ms),
            to_settled_p50_ms: spread(|r| r.to_settled_p50_ms),
            to_settled_p99_ms: spread(|r| r.to_settled_p99_ms),
            other_keys_deliveries_per_s: spread(|r| r.other_keys_deliveries_per_s),
            retries,
            runs,
            failures,
        }
    }

    /// The run of one round, when it verified.
    fn round(&self, round: u32) -> Option<&RunFigures> {
        self.runs.iter().find(|r| r.round == round)
    }
}

impl RunFigures {
    /// `hot`: an ordered run with a hot key, whose other keys' pace is a figure of its own.
    fn of(round: u32, m: &Measured, hot: bool) -> Self {
        let per_100k = |cpu: Option<f64>| cpu.map(|s| s * 100_000.0 / m.entries as f64);
        let of = |samples: &[u64], p| (!samples.is_empty()).then(|| percentile_ms(samples, p));
        let percentile = |p| of(&m.lat_us, p);
        Self {
            round,
            entries: m.entries,
            seconds: m.secs,
            deliveries_per_s: m.rate(),
            commands_per_delivery: m.commands_total() as f64 / m.entries as f64,
            reads: m.reads,
            round_trips: m.round_trips,
            round_trips_per_read: (m.reads > 0).then(|| m.round_trips as f64 / m.reads as f64),
            flush_round_trips_per_read: m
                .flush_round_trips
                .map(|n| n as f64 / m.reads.max(1) as f64),
            flush_ms: m.flush_mean_ms,
            sidecar_cpu_s_per_100k: per_100k(m.sidecar_cpu),
            client_cpu_s_per_100k: per_100k(m.client_cpu),
            redis_cpu_s_per_100k: per_100k(m.redis_cpu),
            sidecar_peak_rss_mb: m.sidecar_hwm_kb.map(kb_to_mb),
            p50_ms: percentile(50.0),
            p99_ms: percentile(99.0),
            p999_ms: percentile(99.9),
            to_consumer_p50_ms: of(&m.to_consumer_us, 50.0),
            to_consumer_p99_ms: of(&m.to_consumer_us, 99.0),
            to_settled_p50_ms: of(&m.to_settled_us, 50.0),
            to_settled_p99_ms: of(&m.to_settled_us, 99.0),
            other_keys_deliveries_per_s: m.others_rate().filter(|_| hot),
            retries: m.retried.map(|(retried, kept)| RetryRun {
                retried,
                entries_added: kept.entries_added,
                xlen_at_end: kept.xlen,
            }),
            sidecars: (!m.replicas.is_empty()).then(|| {
                m.replicas
                    .iter()
                    .map(|r| SidecarRun::of(r, m.entries))
                    .collect()
            }),
            commands: m.commands.clone(),
        }
    }
}

impl IdleFigures {
    fn of(idle: &[IdleRss], baseline: bool) -> Option<Self> {
        let mine: Vec<&IdleRss> = idle.iter().filter(|r| r.baseline == baseline).collect();
        let first = mine.first()?;
        let mut runs = Vec::new();
        let mut failures = Vec::new();
        for r in &mine {
            match &r.result {
                Ok((rss, before)) => runs.push(IdleRun {
                    round: r.round,
                    rss_mb: kb_to_mb(*rss),
                    before_mb: kb_to_mb(*before),
                }),
                Err(error) => failures.push(Failure {
                    round: r.round,
                    error: error.clone(),
                }),
            }
        }
        Some(Self {
            baseline_binary: baseline,
            subscriptions: first.subscriptions,
            rss_mb: Spread::of(runs.iter().map(|r| r.rss_mb)),
            runs,
            failures,
        })
    }
}

impl ManyFigures {
    fn of(many: &[ManyRecord], topology: Topology) -> Option<Self> {
        let mine: Vec<&ManyRecord> = many.iter().filter(|(t, _, _)| *t == topology).collect();
        if mine.is_empty() {
            return None;
        }
        let mut runs = Vec::new();
        let mut failures = Vec::new();
        for (_, round, result) in mine {
            match result {
                Ok(m) => runs.push(ManyRun::of(*round, m)),
                Err(error) => failures.push(Failure {
                    round: *round,
                    error: error.clone(),
                }),
            }
        }
        let spread = |f: fn(&ManyRun) -> f64| Spread::of(runs.iter().map(f));
        Some(Self {
            topology: topology.name(),
            subscriptions: runs.first().map(|r| r.subscriptions),
            one_deliveries_per_s: spread(|r| r.one_deliveries_per_s),
            all_deliveries_per_s: spread(|r| r.all_deliveries_per_s),
            all_per_one: spread(|r| r.all_deliveries_per_s / r.one_deliveries_per_s),
            slowest_share: spread(|r| r.slowest_share),
            sidecar_peak_rss_mb: runs
                .iter()
                .filter_map(|r| r.sidecar_peak_rss_mb)
                .reduce(f64::max),
            runs,
            failures,
        })
    }
}

impl ManyRun {
    fn of(round: u32, m: &Many) -> Self {
        Self {
            round,
            subscriptions: m.subscriptions,
            one_deliveries_per_s: m.single_rate,
            all_deliveries_per_s: m.aggregate_rate,
            slowest_share: m.slowest_share,
            sidecar_peak_rss_mb: m.sidecar_hwm_kb.map(kb_to_mb),
        }
    }
}

impl PartitionsFigures {
    fn of(records: &[PartitionsRecord]) -> Option<Self> {
        let mut runs = Vec::new();
        let mut failures = Vec::new();
        for (round, result) in records {
            match result {
                Ok(g) => runs.push(PartitionsRun::of(*round, g)),
                Err(error) => failures.push(Failure {
                    round: *round,
                    error: error.clone(),
                }),
            }
        }
        let first = records.iter().find_map(|(_, r)| r.as_ref().ok());
        if records.is_empty() {
            return None;
        }
        let spread =
            |f: &dyn Fn(&PartitionsRun) -> Option<f64>| Spread::of(runs.iter().filter_map(f));
        let n_nodes = runs.iter().map(|r| r.nodes.len()).max().unwrap_or(0);
        let nodes = (0..n_nodes)
            .map(|i| {
                let of = |f: &dyn Fn(&NodeRun) -> Option<f64>| {
                    Spread::of(runs.iter().filter_map(|r| f(r.nodes.get(i)?)))
                };
                NodeFigures {
                    node: i + 1,
                    partitions: runs
                        .first()
                        .and_then(|r| r.nodes.get(i))
                        .map(|n| n.partitions.clone())
                        .unwrap_or_default(),
                    cpu_s_per_100k: of(&|n| n.cpu_s_per_100k),
                    commands_total: of(&|n| Some(n.commands_total as f64)),
                    commands_share: Spread::of(runs.iter().filter_map(|r| {
                        let all: u64 = r.nodes.iter().map(|n| n.commands_total).sum();
                        let node = r.nodes.get(i)?;
                        (all > 0).then(|| node.commands_total as f64 / all as f64)
                    })),
                    xreadgroup: of(&|n| Some(n.xreadgroup as f64)),
                    xack: of(&|n| Some(n.xack as f64)),
                    evalsha: of(&|n| Some(n.evalsha as f64)),
                }
            })
            .collect();
        Some(Self {
            topology: Topology::Cluster.name(),
            partitions: first.map_or(0, |g| g.partitions),
            replicas: first.map_or(partitioned::CLUSTER_REPLICAS, |g| g.replicas.len()),
            deliveries_per_s: spread(&|r| Some(r.deliveries_per_s)),
            per_sidecar_cpu_s_per_100k: per_sidecar(runs.iter().map(|r| r.sidecars.as_slice())),
            sidecar_cpu_s_per_100k: spread(&|r| r.sidecars.iter().map(|s| s.cpu_s_per_100k).sum()),
            client_cpu_s_per_100k: spread(&|r| r.client_cpu_s_per_100k),
            redis_cpu_s_per_100k: spread(&|r| r.redis_cpu_s_per_100k),
            nodes,
            runs,
            failures,
        })
    }
}

impl PartitionsRun {
    fn of(round: u32, g: &Group) -> Self {
        let per_100k = |cpu: Option<f64>| cpu.map(|s| s * 100_000.0 / g.entries as f64);
        Self {
            round,
            entries: g.entries,
            seconds: g.secs,
            deliveries_per_s: g.rate(),
            sidecars: g
                .replicas
                .iter()
                .map(|r| SidecarRun::of(r, g.entries))
                .collect(),
            client_cpu_s_per_100k: per_100k(g.client_cpu),
            redis_cpu_s_per_100k: per_100k(g.redis_cpu()),
            round_trips_per_read: (g.reads > 0).then(|| g.round_trips as f64 / g.reads as f64),
            nodes: g
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| NodeRun {
                    node: i + 1,
                    port: n.port,
                    partitions: n.partitions.clone(),
                    cpu_s_per_100k: per_100k(n.cpu_s),
                    commands_total: n.total(),
                    xreadgroup: n.calls("xreadgroup"),
                    xack: n.calls("xack"),
                    evalsha: n.calls("evalsha"),
                    commands: n.commands.clone(),
                })
                .collect(),
        }
    }
}

/// Each replicas contender's deliveries/s over `sidecar-rust-ordered-64`'s, per round; none
/// when no replicas contender ran.
fn replicas(
    report: &Report,
    contenders: &[Contender],
    records: &[Record],
) -> Option<ReplicasFigures> {
    let last_round = records.iter().map(|r| r.round).max().unwrap_or(0);
    let rows: Vec<ReplicasRatio> = contenders
        .iter()
        .filter_map(|&c| {
            let replicas = c.replicas()?;
            let ordered = if c.on_baseline() {
                ORDERED.baseline_twin()?
            } else {
                ORDERED
            };
            Some(ReplicasRatio {
                name: c.name(),
                replicas,
                per_ordered_64: ratios(report, last_round, (c, &rate), (ordered, &rate)),
            })
        })
        .collect();
    (!rows.is_empty()).then_some(ReplicasFigures {
        partitions: report.run.replica_partitions,
        rows,
    })
}

/// The capacity table from this run's CPU per delivery: the many-partitions phase's (its
/// sidecars' and primaries' CPU, each summed) when it verified, else the replicas contender
/// with the most replicas that verified.
fn scaling(report: &Report) -> Option<Scaling> {
    let med = |s: Option<Spread>| s.map(|s| s.median / 100_000.0);
    let from_cluster = report.partitions.as_ref().and_then(|p| {
        Some((
            format!(
                "the many-partitions phase ({} partitions, {} sidecars, {} primaries)",
                p.partitions,
                p.replicas,
                p.nodes.len()
            ),
            med(p.sidecar_cpu_s_per_100k)?,
            med(p.redis_cpu_s_per_100k)?,
            med(p.client_cpu_s_per_100k),
        ))
    });
    let from_replicas = || {
        report
            .contenders
            .iter()
            .filter(|c| !c.baseline_binary)
            .filter_map(|c| {
                let replicas: u32 = c
                    .name
                    .strip_prefix("sidecar-rust-replicas-")?
                    .parse()
                    .ok()?;
                let t = &c.throughput;
                Some((
                    replicas,
                    (
                        format!("{} (one redis-server)", c.name),
                        med(t.sidecar_cpu_s_per_100k)?,
                        med(t.redis_cpu_s_per_100k)?,
                        med(t.client_cpu_s_per_100k),
                    ),
                ))
            })
            .max_by_key(|(replicas, _)| *replicas)
            .map(|(_, costs)| costs)
    };
    let (source, c_s, c_r, c_c) = from_cluster.or_else(from_replicas)?;
    if c_s <= 0.0 || c_r <= 0.0 {
        return None;
    }
    let rows = SCALES
        .iter()
        .flat_map(|&shards| {
            SCALES.iter().map(move |&sidecars| {
                let (redis, sidecar) = (f64::from(shards) / c_r, f64::from(sidecars) / c_s);
                ScalingCell {
                    shards,
                    sidecars,
                    deliveries_per_s: redis.min(sidecar),
                    bound_by: if redis <= sidecar {
                        "redis"
                    } else {
                        "sidecars"
                    },
                }
            })
        })
        .collect();
    Some(Scaling {
        source,
        sidecar_cpu_s_per_delivery: c_s,
        redis_cpu_s_per_delivery: c_r,
        client_cpu_s_per_delivery: c_c,
        rows,
    })
}

// ---------------------------------------------------------------------------------------------
// The targets

/// What a target's figure is held to.
#[derive(Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
    Below(f64),
    /// A figure printed beside the targets, held to none.
    None,
}

impl Bound {
    fn met(self, measured: Option<f64>) -> Option<bool> {
        let m = measured?;
        match self {
            Bound::AtLeast(t) => Some(m >= t),
            Bound::AtMost(t) => Some(m <= t),
            Bound::Below(t) => Some(m < t),
            Bound::None => None,
        }
    }
}

/// A figure's decimals as the report prints them, or `n/a`.
fn fixed(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

/// `1.52x (rounds 1.39–1.64)`, the range when more than one round had the ratio.
pub(crate) fn ratio_text(ratio: Option<Spread>) -> String {
    match ratio {
        Some(s) if s.n > 1 => format!("{:.2}x (rounds {:.2}–{:.2})", s.median, s.min, s.max),
        Some(s) => format!("{:.2}x", s.median),
        None => "n/a".into(),
    }
}

/// `1,234,567`.
pub(crate) fn thousands(n: f64) -> String {
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

/// The targets' rows, in the order they are printed.
struct Targets<'a> {
    report: &'a Report,
    /// The last round any run had.
    last_round: u32,
    rows: Vec<Target>,
}

/// The figure of one contender's throughput run of one round.
type Figure<'a> = &'a dyn Fn(&RunFigures) -> Option<f64>;

fn rate(r: &RunFigures) -> Option<f64> {
    Some(r.deliveries_per_s)
}

fn client_cpu(r: &RunFigures) -> Option<f64> {
    r.client_cpu_s_per_100k
}

fn others_rate(r: &RunFigures) -> Option<f64> {
    r.other_keys_deliveries_per_s
}

impl Targets<'_> {
    fn throughput(&self, c: Contender) -> Option<&PhaseFigures> {
        Some(&self.report.contender(c)?.throughput)
    }

    fn latency(&self, c: Contender) -> Option<&PhaseFigures> {
        self.latency_in(c, Phase::Latency)
    }

    fn latency_in(&self, c: Contender, phase: Phase) -> Option<&PhaseFigures> {
        let c = self.report.contender(c)?;
        match phase {
            Phase::Throughput => None,
            Phase::Latency => c.latency.as_ref(),
            Phase::LatencyBusy => c.latency_busy.as_ref(),
            Phase::LatencyFast => c.latency_fast.as_ref(),
        }
    }

    /// Per round, one figure of `a`'s throughput run over another of `b`'s (both verified in
    /// that round, the ratio finite: a CPU time of zero ticks has no ratio).
    fn ratios(
        &self,
        (a, of_a): (Contender, Figure<'_>),
        (b, of_b): (Contender, Figure<'_>),
    ) -> Option<Spread> {
        ratios(self.report, self.last_round, (a, of_a), (b, of_b))
    }

    fn push(
        &mut self,
        name: String,
        threshold: &str,
        bound: Bound,
        measured: Option<f64>,
        unit: &'static str,
        figure: String,
    ) -> &mut Target {
        self.rows.push(Target {
            name,
            threshold: threshold.to_owned(),
            met: bound.met(measured),
            measured,
            range: None,
            unit,
            figure,
            note: None,
        });
        self.rows.last_mut().expect("just pushed")
    }

    /// A per-round ratio of two contenders' figures, held to `bound`.
    fn ratio(
        &mut self,
        name: String,
        ratio: Option<Spread>,
        threshold: &str,
        bound: Bound,
    ) -> &mut Target {
        let row = self.push(
            name,
            threshold,
            bound,
            ratio.map(|s| s.median),
            "x",
            ratio_text(ratio),
        );
        row.range = ratio.filter(|s| s.n > 1).map(|s| [s.min, s.max]);
        row
    }

    /// `a`'s deliveries/s over `b`'s, per round.
    fn rate_ratio(
        &mut self,
        name: String,
        (a, b): (Contender, Contender),
        threshold: &str,
        bound: Bound,
    ) {
        let ratio = self.ratios((a, &rate), (b, &rate));
        self.ratio(name, ratio, threshold, bound);
    }
}

/// Per round, one figure of `a`'s throughput run over another of `b`'s, over rounds.
fn ratios(
    report: &Report,
    last_round: u32,
    (a, of_a): (Contender, Figure<'_>),
    (b, of_b): (Contender, Figure<'_>),
) -> Option<Spread> {
    let a = &report.contender(a)?.throughput;
    let b = &report.contender(b)?.throughput;
    Spread::of(
        (1..=last_round).filter_map(|round| Some(of_a(a.round(round)?)? / of_b(b.round(round)?)?)),
    )
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

const ORDERED: Contender = Contender::SidecarRustOrdered {
    hot: false,
    baseline: false,
};
const ORDERED_HOT: Contender = Contender::SidecarRustOrdered {
    hot: true,
    baseline: false,
};

/// The figures docs/performance.md holds the sidecar to.
fn targets(report: &Report, records: &[Record], rate: u64) -> Vec<Target> {
    let mut t = Targets {
        report,
        last_round: records.iter().map(|r| r.round).max().unwrap_or(0),
        rows: Vec::new(),
    };
    cpu_targets(&mut t);
    t.rate_ratio(
        "sidecar-rust-pipeline-64 / fred-raw (deliveries/s)".into(),
        (rust_client(64, false), Contender::FredRaw),
        ">= 1.5x",
        Bound::AtLeast(1.5),
    );
    // The strongest in-process Rust loops: the sidecar should cost no throughput against a
    // hand-pipelined redis-rs loop, and beat the seed's own pipelined window by half again.
    for (other, target, bound) in [
        (Contender::RedisRsPipelined, ">= 1.0x", Bound::AtLeast(1.0)),
        (Contender::SeedInProcess, ">= 1.5x", Bound::AtLeast(1.5)),
    ] {
        t.rate_ratio(
            format!("sidecar-rust-pipeline-64 / {}", other.name()),
            (rust_client(64, false), other),
            target,
            bound,
        );
    }
    ordered_targets(&mut t);
    round_trip_targets(&mut t);
    // The target is held by a read handled as one batch, as the hand-pipelined loop handles
    // its reads; delivery by delivery is the figure beside it.
    t.rate_ratio(
        "sidecar-python-batches / redis-py-pipelined".into(),
        (python(PythonApi::Batches), Contender::RedisPyPipelined),
        ">= 2.0x",
        Bound::AtLeast(2.0),
    );
    t.rate_ratio(
        "sidecar-python / redis-py-pipelined".into(),
        (SIDECAR_PYTHON, Contender::RedisPyPipelined),
        "(delivery by delivery)",
        Bound::None,
    );
    // What a Python team pays on every pod: the client's CPU per delivery, whatever the
    // throughput two cores allow.
    for (api, target, bound) in [
        (PythonApi::Batches, "<= 0.5x", Bound::AtMost(0.5)),
        (PythonApi::Deliveries, "<= 0.5x", Bound::AtMost(0.5)),
    ] {
        let contender = python(api);
        let ratio = t.ratios(
            (contender, &client_cpu),
            (Contender::RedisPyPipelined, &client_cpu),
        );
        t.ratio(
            format!(
                "client CPU per delivery, {} / redis-py-pipelined",
                contender.name()
            ),
            ratio,
            target,
            bound,
        );
    }
    // The typed API records redis-py's command methods instead of taking a name and
    // arguments: it should cost nothing a run can see.
    t.rate_ratio(
        "sidecar-python-typed / sidecar-python".into(),
        (python(PythonApi::Typed), SIDECAR_PYTHON),
        ">= 0.9x (within noise)",
        Bound::AtLeast(0.9),
    );
    t.rate_ratio(
        "sidecar-python / redis-py-per-message".into(),
        (SIDECAR_PYTHON, Contender::RedisPyPerMessage),
        ">= 10x",
        Bound::AtLeast(10.0),
    );
    atomic_targets(&mut t);
    latency_targets(&mut t, rate);
    idle_target(&mut t);
    many_targets(&mut t);
    t.rows
}

/// The sidecar's CPU per delivery, pipeline and atomic.
fn cpu_targets(t: &mut Targets<'_>) {
    for (contender, target, bound) in [
        (rust_client(64, false), "<= 0.35 s", Bound::AtMost(0.35)),
        (rust_client(64, true), "<= 1.0 s", Bound::AtMost(1.0)),
    ] {
        let cpu = t
            .throughput(contender)
            .and_then(|p| p.sidecar_cpu_s_per_100k)
            .map(|s| s.median);
        t.push(
            format!("sidecar CPU per 100k deliveries, {}", contender.name()),
            target,
            bound,
            cpu,
            "s",
            cpu.map_or("n/a".into(), |v| format!("{v:.2} s")),
        );
    }
}

/// Ordering keys: what one delivery per key at a time costs against the unordered client,
/// and what a hot key leaves the other keys.
fn ordered_targets(t: &mut Targets<'_>) {
    t.rate_ratio(
        "sidecar-rust-ordered-64 / sidecar-rust-pipeline-64".into(),
        (ORDERED, rust_client(64, false)),
        ">= 0.8x",
        Bound::AtLeast(0.8),
    );
    let others = |t: &Targets<'_>, c: Contender| {
        t.throughput(c)
            .and_then(|p| p.other_keys_deliveries_per_s)
            .map(|s| s.median)
    };
    let hot = others(t, ORDERED_HOT);
    t.push(
        "other keys beside a hot key (deliveries/s of theirs)".into(),
        "(figure)",
        Bound::None,
        hot,
        "/s",
        hot.map_or("n/a".into(), thousands),
    );
    let ratio = t.ratios((ORDERED_HOT, &others_rate), (ORDERED, &rate));
    let row = t.ratio(
        "other keys beside a hot key / sidecar-rust-ordered-64".into(),
        ratio,
        ">= 0.8x",
        Bound::AtLeast(0.8),
    );
    if row.met == Some(false) {
        row.note = Some(
            "the reads run past the hot key's parked backlog and ask for twice COUNT, so the \
             other keys get about COUNT deliveries a read; but the stream is read in order, so \
             each of those reads also brings COUNT of the hot key's entries: twice the entries \
             read per delivery of theirs"
                .into(),
        );
    }
    // Paired with --baseline-bin: what the other keys got from the binary before.
    let twin = ORDERED_HOT
        .baseline_twin()
        .expect("a sidecar contender has a twin");
    if t.throughput(twin).is_some_and(|p| !p.runs.is_empty()) {
        let before = others(t, twin);
        t.push(
            "other keys beside a hot key, the baseline binary".into(),
            "(figure)",
            Bound::None,
            before,
            "/s",
            before.map_or("n/a".into(), thousands),
        );
        let gain = t.ratios((ORDERED_HOT, &others_rate), (twin, &others_rate));
        t.ratio(
            "other keys beside a hot key / the baseline binary's".into(),
            gain,
            "(figure)",
            Bound::None,
        );
    }
}

/// All Redis round trips per read, Rust and Python clients.
fn round_trip_targets(t: &mut Targets<'_>) {
    for contender in [rust_client(64, false), SIDECAR_PYTHON] {
        let per_read = t
            .throughput(contender)
            .and_then(|p| p.round_trips_per_read)
            .map(|s| s.median);
        t.push(
            format!(
                "Redis round trips per read (all kinds), {}",
                contender.name()
            ),
            "<= 1",
            Bound::AtMost(1.0),
            per_read,
            "",
            fixed(per_read, 3),
        );
    }
}

/// The atomic mode's deliveries/s at COUNT 64 and its flat-out p50 at COUNT 256.
fn atomic_targets(t: &mut Targets<'_>) {
    let rate = t
        .throughput(rust_client(64, true))
        .and_then(|p| p.deliveries_per_s)
        .map(|s| s.median);
    t.push(
        "sidecar-rust-atomic-64 (deliveries/s)".into(),
        ">= 70,000",
        Bound::AtLeast(70_000.0),
        rate,
        "/s",
        rate.map_or("n/a".into(), thousands),
    );
    let p50 = t
        .throughput(rust_client(256, true))
        .and_then(|p| p.p50_ms)
        .map(|s| s.median);
    t.push(
        "flat-out p50, sidecar-rust-atomic-256".into(),
        "< 5 ms",
        Bound::Below(5.0),
        p50,
        "ms",
        p50.map_or("n/a".into(), |v| format!("{v:.2} ms")),
    );
}

/// The p99 the Rust client through the sidecar adds over the raw loop it replaces, in every
/// round (each round's pair measured back to back): at the latency rate, beside a busy
/// neighbour, and at ten times the rate. The held figure is the worst round's. The same over a
/// Unix socket is a figure beside each, and so is Python's p99 at the rate: the best Python
/// can have.
fn latency_targets(t: &mut Targets<'_>, rate: u64) {
    for (phase, at, target, bound) in [
        (
            Phase::Latency,
            format!("{rate}/s"),
            "<= 0.5 ms added, every round",
            Bound::AtMost(0.5),
        ),
        (
            Phase::LatencyBusy,
            format!("{rate}/s beside a busy neighbour"),
            "<= 1.0 ms added, every round",
            Bound::AtMost(1.0),
        ),
        (
            Phase::LatencyFast,
            format!("{}/s", rate * 10),
            "<= 0.5 ms added, every round",
            Bound::AtMost(0.5),
        ),
    ] {
        added_p99(t, rust_client(64, false), phase, &at, target, bound);
        let unix = Contender::SidecarRustUnix { baseline: false };
        added_p99(
            t,
            unix,
            phase,
            &at,
            "(figure: over a Unix socket)",
            Bound::None,
        );
    }
    let p99 = |c| t.latency(c).and_then(|p| p.p99_ms).map(|s| s.median);
    let (s, b) = (p99(SIDECAR_PYTHON), p99(Contender::RedisPyPipelined));
    let figure = match (s, b) {
        (Some(s), Some(b)) => format!("{s:.2} ms ({:+.2} ms vs redis-py-pipelined)", s - b),
        (Some(s), None) => format!("{s:.2} ms"),
        _ => "n/a".into(),
    };
    t.push(
        format!("p99 at {rate}/s, {}", SIDECAR_PYTHON.name()),
        "(the best Python can have)",
        Bound::None,
        s.zip(b).map(|(s, b)| s - b),
        "ms",
        figure,
    );
}

/// One contender's p99 added over the raw loop in `phase`, in every round.
fn added_p99(
    t: &mut Targets<'_>,
    sidecar: Contender,
    phase: Phase,
    at: &str,
    target: &str,
    bound: Bound,
) {
    let (s, b) = (
        t.latency_in(sidecar, phase),
        t.latency_in(Contender::FredRaw, phase),
    );
    let added = s.zip(b).and_then(|(s, b)| {
        Spread::of(
            (1..=t.last_round)
                .filter_map(|round| Some(s.round(round)?.p99_ms? - b.round(round)?.p99_ms?)),
        )
    });
    let med = |p: Option<&PhaseFigures>, f: fn(&PhaseFigures) -> Option<Spread>| {
        p.and_then(f).map(|s| s.median)
    };
    let figure = match (added, med(s, |p| p.p99_ms), med(s, |p| p.p999_ms)) {
        (Some(added), Some(p99), Some(p999)) => format!(
            "worst round {:+.2} ms (rounds {:+.2}..{:+.2}); p99 {p99:.2} ms, p999 {p999:.2} ms",
            added.max, added.min, added.max
        ),
        (None, Some(p99), Some(p999)) => format!("p99 {p99:.2} ms, p999 {p999:.2} ms"),
        _ => "n/a".into(),
    };
    t.push(
        format!("p99 added at {at}, {}", sidecar.name()),
        target,
        bound,
        added.map(|a| a.max),
        "ms",
        figure,
    );
}

/// The sidecar's RSS with the idle subscriptions open.
fn idle_target(t: &mut Targets<'_>) {
    let idle = t.report.idle_of(false);
    let n = idle.map_or(100, |i| i.subscriptions);
    let rss = idle.and_then(|i| i.rss_mb).map(|s| s.median);
    t.push(
        format!("sidecar RSS with {n} idle subscriptions"),
        "< 50 MB",
        Bound::Below(50.0),
        rss,
        "MB",
        rss.map_or("n/a".into(), |m| format!("{m:.1} MB")),
    );
}

/// Per topology: many subscriptions against one, the slowest one's share and the RSS.
fn many_targets(t: &mut Targets<'_>) {
    let rows: Vec<_> = t
        .report
        .many
        .iter()
        .filter_map(|m| {
            Some((
                m.topology,
                m.subscriptions?,
                m.all_per_one.map(|s| s.median),
                m.slowest_share.map(|s| s.median),
                m.sidecar_peak_rss_mb,
            ))
        })
        .collect();
    for (topology, n, all_per_one, slowest, rss) in rows {
        t.push(
            format!("{n} subscriptions / one, {topology}"),
            ">= 0.9x",
            Bound::AtLeast(0.9),
            all_per_one,
            "x",
            all_per_one.map_or("n/a".into(), |v| format!("{v:.2}x")),
        );
        t.push(
            format!("slowest subscription's share, {topology}"),
            ">= 0.5x",
            Bound::AtLeast(0.5),
            slowest,
            "x",
            slowest.map_or("n/a".into(), |v| format!("{v:.2}x")),
        );
        t.push(
            format!("sidecar peak RSS, {n} loaded subscriptions, {topology}"),
            "< 64 MB",
            Bound::Below(64.0),
            rss,
            "MB",
            rss.map_or("n/a".into(), |m| format!("{m:.1} MB")),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Against the baseline binary

/// Each sidecar contender over its `@baseline` twin. The ratios are taken per round, where
/// the two ran back to back, so what the machine was doing then weighs on both; the figures
/// of the contenders are medians over rounds and keep the noise between rounds. The idle
/// RSS is steadier: its ratio is that of the two medians. None without twins.
fn baseline(report: &Report, contenders: &[Contender], records: &[Record]) -> Option<Baseline> {
    let last_round = records.iter().map(|r| r.round).max().unwrap_or(0);
    let cpu = |r: &RunFigures| r.sidecar_cpu_s_per_100k;
    let pairs: Vec<BaselinePair> = contenders
        .iter()
        .filter_map(|&c| Some((c, c.baseline_twin().filter(|t| contenders.contains(t))?)))
        .map(|(new, twin)| BaselinePair {
            name: new.name(),
            twin: twin.name(),
            deliveries_per_s: ratios(report, last_round, (new, &rate), (twin, &rate)),
            sidecar_cpu_s_per_100k: ratios(report, last_round, (new, &cpu), (twin, &cpu)),
        })
        .collect();
    let idle = report.idle_of(true).map(|twin| {
        let rss_mb = report
            .idle_of(false)
            .and_then(|i| i.rss_mb)
            .map(|s| s.median);
        let baseline_rss_mb = twin.rss_mb.map(|s| s.median);
        IdleRatio {
            subscriptions: twin.subscriptions,
            rss_mb,
            baseline_rss_mb,
            ratio: rss_mb.zip(baseline_rss_mb).map(|(new, old)| new / old),
        }
    });
    (!pairs.is_empty() || idle.is_some()).then_some(Baseline { pairs, idle })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report of throughput and latency records alone (no idle or many-subscriptions
    /// runs).
    fn report_of(contenders: &[Contender], records: &[Record]) -> Report {
        Report::of(
            run_info(),
            contenders,
            &Records {
                records,
                idle: &[],
                many: &[],
                partitions: &[],
            },
        )
    }

    fn run_info() -> Run {
        Run {
            args: vec!["--rounds".into(), "2".into()],
            profile: "release",
            date: "2025-01-01T00:00:00Z".into(),
            commit: None,
            dirty: None,
            cores: 2,
            redis: "redis-server 7".into(),
            entries: 100_000,
            rounds: 2,
            latency_rate: 1000,
            latency_secs: 0.0,
            window_reads: 4,
            idle_subscriptions: 0,
            many_subscriptions: 0,
            many_partitions: 0,
            replica_partitions: 6,
            sidecar_bin: None,
            baseline_bin: None,
        }
    }

    fn throughput(round: u32, contender: Contender, secs: f64) -> Record {
        Record {
            round,
            contender,
            phase: Phase::Throughput,
            result: Ok(Measured {
                entries: 100_000,
                secs,
                reads: 10,
                round_trips: 5,
                sidecar_cpu: contender.uses_sidecar().then_some(0.25),
                lat_us: vec![1000, 2000, 3000],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_spread_is_the_median_and_range_of_the_finite_values() {
        let spread = Spread::of([3.0, f64::NAN, 1.0, 2.0, 10.0]);
        assert_eq!(
            spread,
            Some(Spread {
                median: 2.5,
                min: 1.0,
                max: 10.0,
                n: 4
            })
        );
        assert_eq!(Spread::of([f64::INFINITY]), None);
    }

    /// The tables and the JSON read the same figures: the ratio of a target is taken per round,
    /// its median held to the target, and a failed run is left out and listed.
    #[test]
    fn the_report_takes_ratios_per_round_and_says_whether_a_target_is_met() {
        let pipeline = rust_client(64, false);
        let records = vec![
            throughput(1, pipeline, 0.25),
            throughput(1, Contender::FredRaw, 1.0),
            throughput(2, pipeline, 0.5),
            throughput(2, Contender::FredRaw, 0.5),
            Record {
                round: 3,
                contender: pipeline,
                phase: Phase::Throughput,
                result: Err("the consumer acked 1 of 2".into()),
            },
        ];
        let report = report_of(&[pipeline, Contender::FredRaw], &records);
        let target = report
            .targets
            .iter()
            .find(|t| t.name == "sidecar-rust-pipeline-64 / fred-raw (deliveries/s)")
            .expect("the fred-raw target");
        assert_eq!(target.measured, Some(2.5));
        assert_eq!(target.range, Some([1.0, 4.0]));
        assert_eq!(target.met, Some(true));
        assert_eq!(target.figure, "2.50x (rounds 1.00–4.00)");
        assert_eq!((report.passed, report.failed), (4, 1));

        let json = serde_json::to_value(&report).expect("the report as JSON");
        let first = &json["contenders"][0];
        assert_eq!(first["name"], "sidecar-rust-pipeline-64");
        assert_eq!(first["max_in_flight"], 256);
        assert_eq!(first["throughput"]["deliveries_per_s"]["median"], 300_000.0);
        assert_eq!(first["throughput"]["round_trips_per_read"]["median"], 0.5);
        assert_eq!(first["throughput"]["p50_ms"]["median"], 2.0);
        assert_eq!(first["throughput"]["failures"][0]["round"], 3);
        assert!(first["latency"].is_null());
        assert!(json["contenders"][1]["throughput"]["sidecar_cpu_s_per_100k"].is_null());
        assert!(json["baseline"].is_null());
    }

    /// A replicas contender is set beside `sidecar-rust-ordered-64` round by round, each of its
    /// sidecars has a CPU figure of its own, and the capacity on paper takes the lower bound of
    /// the sidecars' and Redis's CPU per delivery.
    #[test]
    fn replicas_stand_beside_the_ordered_contender_and_scale_on_paper() {
        let replicas = Contender::SidecarRustReplicas {
            replicas: 2,
            baseline: false,
        };
        let replica = |name: &str, cpu_s| Replica {
            name: name.into(),
            partitions: vec![0, 1, 2],
            deliveries: 50_000,
            cpu_s: Some(cpu_s),
            hwm_kb: Some(1024),
        };
        let group = |round, secs| {
            let mut record = throughput(round, replicas, secs);
            if let Ok(m) = &mut record.result {
                m.sidecar_cpu = Some(0.5);
                m.redis_cpu = Some(0.25);
                m.client_cpu = Some(0.1);
                m.replicas = vec![replica("replica-1", 0.2), replica("replica-2", 0.3)];
            }
            record
        };
        let records = vec![
            throughput(1, ORDERED, 1.0),
            group(1, 0.5),
            throughput(2, ORDERED, 1.0),
            group(2, 2.0),
        ];
        let report = report_of(&[ORDERED, replicas], &records);
        let ratio = report.replicas.as_ref().expect("the replicas figures").rows[0]
            .per_ordered_64
            .expect("a ratio");
        assert_eq!((ratio.median, ratio.min, ratio.max), (1.25, 0.5, 2.0));
        let each = report.contenders[1]
            .throughput
            .per_sidecar_cpu_s_per_100k
            .as_ref()
            .expect("per sidecar");
        let medians: Vec<f64> = each.iter().map(|s| s.expect("a figure").median).collect();
        assert_eq!(medians, [0.2, 0.3]);
        assert!(
            report.contenders[0]
                .throughput
                .per_sidecar_cpu_s_per_100k
                .is_none()
        );
        let scaling = report.scaling.as_ref().expect("the capacity on paper");
        assert!(scaling.source.starts_with("sidecar-rust-replicas-2"));
        let cell = |shards, sidecars| {
            scaling
                .rows
                .iter()
                .find(|c| c.shards == shards && c.sidecars == sidecars)
                .map(|c| (c.deliveries_per_s.round(), c.bound_by))
        };
        // c_s = 5 µs, c_r = 2.5 µs per delivery.
        assert_eq!(cell(1, 1), Some((200_000.0, "sidecars")));
        assert_eq!(cell(1, 3), Some((400_000.0, "redis")));
        assert_eq!(cell(12, 12), Some((2_400_000.0, "sidecars")));
        let json = serde_json::to_value(&report).expect("the report as JSON");
        assert_eq!(
            json["contenders"][1]["throughput"]["runs"][0]["sidecars"][1]["replica"],
            "replica-2"
        );
        assert!(json["contenders"][0]["throughput"]["runs"][0]["sidecars"].is_null());
        assert!(json["partitions"].is_null());
    }

    /// The Python client's CPU per delivery is held against the hand-pipelined loop's, round
    /// by round, whatever their throughput.
    #[test]
    fn the_python_clients_cpu_is_held_to_half_of_redis_py() {
        let batches = python(PythonApi::Batches);
        let cpu = |round, contender, client_cpu| match throughput(round, contender, 1.0) {
            Record {
                result: Ok(measured),
                ..
            } => Record {
                result: Ok(Measured {
                    client_cpu: Some(client_cpu),
                    ..measured
                }),
                ..throughput(round, contender, 1.0)
            },
            record => record,
        };
        let records = vec![
            cpu(1, batches, 0.4),
            cpu(1, Contender::RedisPyPipelined, 1.0),
            cpu(2, batches, 0.9),
            cpu(2, Contender::RedisPyPipelined, 1.5),
        ];
        let report = report_of(&[batches, Contender::RedisPyPipelined], &records);
        let target = report
            .targets
            .iter()
            .find(|t| {
                t.name == "client CPU per delivery, sidecar-python-batches / redis-py-pipelined"
            })
            .expect("the Python CPU target");
        assert_eq!(target.measured, Some(0.5));
        assert_eq!(target.range, Some([0.4, 0.6]));
        assert_eq!(target.met, Some(true));
        assert_eq!(target.threshold, "<= 0.5x");
    }

    /// One latency run of 1,000 samples, `slow` of them at `tail_us` and the rest at 1 ms.
    fn latency(
        round: u32,
        contender: Contender,
        phase: Phase,
        slow: usize,
        tail_us: u64,
    ) -> Record {
        let mut lat_us = vec![1000; 1000 - slow];
        lat_us.extend(std::iter::repeat_n(tail_us, slow));
        Record {
            round,
            contender,
            phase,
            result: Ok(Measured {
                entries: 1000,
                secs: 1.0,
                lat_us,
                ..Default::default()
            }),
        }
    }

    /// The p99 the sidecar adds is held in every round, each round's pair against each other:
    /// one bad round misses the target however good the median is. The p999 is reported.
    #[test]
    fn the_added_p99_is_held_to_its_target_in_every_round() {
        let pipeline = rust_client(64, false);
        let fred = Contender::FredRaw;
        let records = vec![
            latency(1, pipeline, Phase::Latency, 20, 1300),
            latency(1, fred, Phase::Latency, 20, 1000),
            latency(2, pipeline, Phase::Latency, 20, 1200),
            latency(2, fred, Phase::Latency, 20, 1000),
            latency(3, pipeline, Phase::Latency, 20, 2000),
            latency(3, fred, Phase::Latency, 20, 1000),
            latency(1, pipeline, Phase::LatencyBusy, 2, 9000),
            latency(1, fred, Phase::LatencyBusy, 2, 1000),
        ];
        let report = report_of(&[pipeline, fred], &records);
        let target = |name: &str| {
            report
                .targets
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("the target {name}"))
        };
        let steady = target("p99 added at 1000/s, sidecar-rust-pipeline-64");
        assert_eq!(
            steady.measured,
            Some(1.0),
            "round 3's, not the median's 0.3"
        );
        assert_eq!(steady.met, Some(false));
        assert_eq!(
            steady.figure,
            "worst round +1.00 ms (rounds +0.20..+1.00); p99 1.30 ms, p999 1.30 ms"
        );
        // Two slow samples in 1,000 are past the p99 and at the p999.
        let busy = target("p99 added at 1000/s beside a busy neighbour, sidecar-rust-pipeline-64");
        assert_eq!((busy.measured, busy.met), (Some(0.0), Some(true)));
        assert!(busy.figure.ends_with("p999 9.00 ms"), "{}", busy.figure);
        let fast = target("p99 added at 10000/s, sidecar-rust-pipeline-64");
        assert_eq!((fast.measured, fast.met), (None, None));
        let json = serde_json::to_value(&report).expect("the report as JSON");
        assert_eq!(json["contenders"][0]["latency"]["p999_ms"]["median"], 1.3);
        assert_eq!(
            json["contenders"][0]["latency_busy"]["p999_ms"]["median"],
            9.0
        );
        assert!(json["contenders"][0]["latency_fast"].is_null());
    }

    /// A latency run whose consumer split its samples reports each part's percentiles: the
    /// entry reaching the consumer, then its settling reply.
    #[test]
    fn a_latency_runs_two_parts_are_reported() {
        let pipeline = rust_client(64, false);
        let mut record = latency(1, pipeline, Phase::Latency, 0, 0);
        if let Ok(m) = &mut record.result {
            m.to_consumer_us = (1..=100).map(|n| n * 10).collect();
            m.to_settled_us = (1..=100).map(|n| n * 20).collect();
        }
        let records = [record, latency(1, Contender::FredRaw, Phase::Latency, 0, 0)];
        let report = report_of(&[pipeline, Contender::FredRaw], &records);
        let parts = |c: usize| {
            let l = report.contenders[c]
                .latency
                .as_ref()
                .expect("a latency phase");
            [
                &l.to_consumer_p50_ms,
                &l.to_consumer_p99_ms,
                &l.to_settled_p50_ms,
                &l.to_settled_p99_ms,
            ]
            .map(|s| s.as_ref().map(|s| s.median))
        };
        assert_eq!(parts(0), [Some(0.5), Some(0.99), Some(1.0), Some(1.98)]);
        assert_eq!(parts(1), [None; 4], "no split samples, no parts");
    }
}
