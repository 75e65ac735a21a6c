//! The benchmark: the window sidecar side by side with what users write instead.
//!
//! ```sh
//! cargo run --release -p window-sidecar-bench -- [--entries N] [--rounds R] [--contenders a,b,…] [--quick] [--json PATH]
//! ```
//!
//! Each contender consumes a stream of N entries (`_payload`: ~100 bytes of JSON with an `id`)
//! in group `g` on a `redis-server` of its own; per entry it decodes the payload, runs
//! `INCR count:<id mod 1000>` and acknowledges the entry. Runs are interleaved (A B C … A B C
//! …), each is verified (XPENDING 0, the counters sum to N) and only verified runs are
//! reported. With `--baseline-bin` every sidecar contender also runs against a second sidecar
//! binary (`<name>@baseline`, right after it in every round), and the report gives the ratios
//! of the two. With `--json PATH` the report is also written as one JSON document (the
//! figures of figures.rs, which the tables print), from which `.ci/perf_doc.py` renders
//! docs/performance.md and the top-level README's headline figures. See README.md beside this file for the contenders and the figures.

mod client;
mod figures;
mod many;
mod partitioned;
mod procs;
mod producer;
mod python;
mod redis_rs;
mod report;
mod seed;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use fred::prelude::*;
use tokio::time::Instant;
use window_sidecar_harness::RedisServer;

use crate::client::{ClientOutcome, FredLoop, SidecarClient};
use crate::procs::{SidecarProcess, cpu_seconds, metric_sum, status_kb};
use crate::producer::Producer;
use crate::redis_rs::RedisRsLoop;
use crate::seed::SeedApp;

/// Runs the benchmark and prints figures (never asserts on them).
#[derive(Parser, Debug)]
#[command(name = "window-sidecar-bench", version, about)]
struct Args {
    /// Entries per throughput run [default: 100000; with --quick 5000].
    #[arg(long)]
    entries: Option<u64>,
    /// Rounds; each runs every contender once per phase, interleaved [default: 3; --quick 1].
    #[arg(long)]
    rounds: Option<u32>,
    /// Comma-separated contenders [default: all]: sidecar-rust-pipeline-64,
    /// sidecar-rust-pipeline-256, sidecar-rust-atomic-64, sidecar-rust-atomic-256,
    /// sidecar-rust-ordered-64, sidecar-rust-ordered-hot-64, sidecar-rust-replicas-1,
    /// sidecar-rust-replicas-2, sidecar-rust-replicas-3, sidecar-rust-retry-64, sidecar-python, sidecar-python-typed, sidecar-python-batches, redis-py-per-message, redis-py-pipelined, seed-in-process,
    /// redis-rs-pipelined, fred-raw; the sidecar ones
    /// also as `<name>@baseline` (with --baseline-bin).
    #[arg(long, value_delimiter = ',')]
    contenders: Vec<String>,
    /// CI size: 5,000 entries, one round, a ~1 s latency phase.
    #[arg(long)]
    quick: bool,
    /// Entries per second in the latency phases (ten times that in latency-fast).
    #[arg(long, default_value_t = 1000)]
    latency_rate: u64,
    /// Seconds of each latency phase [default: 5; --quick 1]; 0 skips them.
    #[arg(long)]
    latency_secs: Option<f64>,
    /// Idle subscriptions for the RSS figure; 0 skips it.
    #[arg(long, default_value_t = 100)]
    idle_subscriptions: usize,
    /// The sidecar binary [default: built with `cargo build --release -p window-sidecar` into
    /// the bench's own target directory].
    #[arg(long)]
    sidecar_bin: Option<PathBuf>,
    /// A second sidecar binary to compare with (the previous commit's, say): every sidecar
    /// contender also runs against it as `<name>@baseline`, right after it in every round.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
    /// The Python interpreter for the Python contenders [default: tests/bench/python/.venv,
    /// created and filled from requirements.txt when missing].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Subscriptions of the many-subscriptions phase (on a single node and on a 3-primary
    /// cluster), sharing `--entries` [default: 100; --quick 10]; 0 skips it.
    #[arg(long)]
    many_subscriptions: Option<usize>,
    /// Partitions of the many-partitions phase: one partitioned stream on a 3-primary
    /// cluster, read by 3 replicas (sidecars), `--entries` entries [default: 48; --quick 12];
    /// 0 skips it.
    #[arg(long)]
    many_partitions: Option<u32>,
    /// The window of every sidecar contender, in reads: `max_in_flight` = this × COUNT, so
    /// the client has reads to work on while earlier ones flush.
    #[arg(long, default_value_t = 4)]
    window_reads: u32,
    /// Also write the report as one JSON document to PATH (the run's parameters, every run's
    /// figures, their medians and ranges, the targets, the baseline ratios); `.ci/perf_doc.py`
    /// renders docs/performance.md and the README's headline figures from it.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// The suffix of a sidecar contender run against `--baseline-bin`.
const BASELINE: &str = "@baseline";

/// One consumer implementation under test. `baseline`: a sidecar contender run against the
/// `--baseline-bin` binary rather than the one measured, the twin it is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    SidecarRust {
        count: u32,
        atomic: bool,
        baseline: bool,
    },
    /// `SidecarRust` in pipeline mode at COUNT 64 over a Unix socket instead of loopback TCP,
    /// as a pod's containers can share one on a volume (the chart's `sidecar.unixSocket`).
    SidecarRustUnix {
        baseline: bool,
    },
    /// The Python helper, used through `api`.
    SidecarPython {
        api: PythonApi,
        baseline: bool,
    },
    RedisPyPerMessage,
    RedisPyPipelined,
    /// The Rust client of `SidecarRust` at COUNT 64, ordered by the entries' key (1,000 keys
    /// round-robin; `hot`: one key holds every other entry). Throughput phase only: its
    /// figures are throughput ratios.
    SidecarRustOrdered {
        hot: bool,
        baseline: bool,
    },
    /// `SidecarRustOrdered`'s client and keys (1,000 round-robin) as `replicas` replicas of one
    /// group on a partitioned stream of [`partitioned::PARTITIONS`] partitions: a sidecar
    /// process and a client stream each, under its own consumer name. Throughput phase only.
    SidecarRustReplicas {
        replicas: u32,
        baseline: bool,
    },
    /// The Rust client of `SidecarRust` at COUNT 64, retrying one delivery in 20 (each entry
    /// once, then acked), its sidecar keeping the stream under retention by acknowledgement.
    SidecarRustRetry {
        baseline: bool,
    },
    /// ruststream-fred's pipelined window in this process.
    SeedInProcess,
    RedisRsPipelined,
    FredRaw,
}

/// How the Python contender uses the helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonApi {
    /// `async for d in sub`, `d.queue("INCR", …)`, `d.ack()`.
    Deliveries,
    /// The same, its side effect through redis-py's command methods (`d.redis.incr`): what
    /// the typed API costs, in the same run.
    Typed,
    /// `async for batch in sub.batches()`, `d.queue(…)` per delivery, one `batch.ack()`: a
    /// read handled as one batch.
    Batches,
}

impl PythonApi {
    /// The contender's name and `bench_worker.py`'s mode.
    fn mode(self) -> &'static str {
        match self {
            PythonApi::Deliveries => "sidecar-python",
            PythonApi::Typed => "sidecar-python-typed",
            PythonApi::Batches => "sidecar-python-batches",
        }
    }
}

impl Contender {
    pub const ALL: [Contender; 19] = [
        Contender::SidecarRust {
            count: 64,
            atomic: false,
            baseline: false,
        },
        Contender::SidecarRustUnix { baseline: false },
        Contender::SidecarRust {
            count: 256,
            atomic: false,
            baseline: false,
        },
        Contender::SidecarRust {
            count: 64,
            atomic: true,
            baseline: false,
        },
        Contender::SidecarRust {
            count: 256,
            atomic: true,
            baseline: false,
        },
        Contender::SidecarRustOrdered {
            hot: false,
            baseline: false,
        },
        Contender::SidecarRustOrdered {
            hot: true,
            baseline: false,
        },
        Contender::SidecarRustReplicas {
            replicas: 1,
            baseline: false,
        },
        Contender::SidecarRustReplicas {
            replicas: 2,
            baseline: false,
        },
        Contender::SidecarRustReplicas {
            replicas: 3,
            baseline: false,
        },
        Contender::SidecarRustRetry { baseline: false },
        Contender::SidecarPython {
            api: PythonApi::Deliveries,
            baseline: false,
        },
        Contender::SidecarPython {
            api: PythonApi::Typed,
            baseline: false,
        },
        Contender::SidecarPython {
            api: PythonApi::Batches,
            baseline: false,
        },
        Contender::RedisPyPerMessage,
        Contender::RedisPyPipelined,
        Contender::SeedInProcess,
        Contender::RedisRsPipelined,
        Contender::FredRaw,
    ];

    pub fn name(&self) -> String {
        let name = match self {
            Contender::SidecarRust { count, atomic, .. } => format!(
                "sidecar-rust-{}-{count}",
                if *atomic { "atomic" } else { "pipeline" }
            ),
            Contender::SidecarRustUnix { .. } => "sidecar-rust-pipeline-64-unix".into(),
            Contender::SidecarRustOrdered { hot: false, .. } => "sidecar-rust-ordered-64".into(),
            Contender::SidecarRustOrdered { hot: true, .. } => "sidecar-rust-ordered-hot-64".into(),
            Contender::SidecarRustReplicas { replicas, .. } => {
                format!("sidecar-rust-replicas-{replicas}")
            }
            Contender::SidecarRustRetry { .. } => "sidecar-rust-retry-64".into(),
            Contender::SidecarPython { api, .. } => api.mode().into(),
            Contender::RedisPyPerMessage => "redis-py-per-message".into(),
            Contender::RedisPyPipelined => "redis-py-pipelined".into(),
            Contender::SeedInProcess => "seed-in-process".into(),
            Contender::RedisRsPipelined => "redis-rs-pipelined".into(),
            Contender::FredRaw => "fred-raw".into(),
        };
        if self.on_baseline() {
            name + BASELINE
        } else {
            name
        }
    }

    fn parse(name: &str) -> Option<Self> {
        let name = name.trim();
        match name.strip_suffix(BASELINE) {
            Some(twin) => Self::parse(twin)?.baseline_twin(),
            None => Self::ALL.into_iter().find(|c| c.name() == name),
        }
    }

    pub fn uses_sidecar(&self) -> bool {
        matches!(
            self,
            Contender::SidecarRust { .. }
                | Contender::SidecarRustUnix { .. }
                | Contender::SidecarRustOrdered { .. }
                | Contender::SidecarRustReplicas { .. }
                | Contender::SidecarRustRetry { .. }
                | Contender::SidecarPython { .. }
        )
    }

    /// The replicas of a replicas contender; none for the others.
    pub(crate) fn replicas(&self) -> Option<u32> {
        match self {
            Contender::SidecarRustReplicas { replicas, .. } => Some(*replicas),
            _ => None,
        }
    }

    /// Whether it retries some of its deliveries (its sidecar keeps the stream under
    /// retention by acknowledgement, and its run reports what the stream held).
    pub(crate) fn retries(&self) -> bool {
        matches!(self, Contender::SidecarRustRetry { .. })
    }

    /// How an ordered contender's entries are keyed; None for the others.
    pub(crate) fn keying(&self) -> Option<workload::Keying> {
        match self {
            Contender::SidecarRustOrdered { hot: false, .. } => Some(workload::Keying::RoundRobin),
            Contender::SidecarRustOrdered { hot: true, .. } => Some(workload::Keying::Hot),
            Contender::SidecarRustReplicas { .. } => Some(workload::Keying::RoundRobin),
            _ => None,
        }
    }

    /// Whether it runs in `phase`: the ordered contenders' figures are throughput ratios, so
    /// they skip the latency phases (shorter runs, in CI too). The tail beside a busy
    /// neighbour and at ten times the rate is the Rust client's against the raw loop it
    /// replaces.
    pub(crate) fn runs_in(&self, phase: Phase) -> bool {
        match phase {
            Phase::Throughput => true,
            Phase::Latency => self.keying().is_none(),
            Phase::LatencyBusy | Phase::LatencyFast => matches!(
                self,
                Contender::SidecarRust {
                    count: 64,
                    atomic: false,
                    ..
                } | Contender::SidecarRustUnix { .. }
                    | Contender::FredRaw
            ),
        }
    }

    /// Whether this runs against the `--baseline-bin` binary.
    pub fn on_baseline(&self) -> bool {
        matches!(
            self,
            Contender::SidecarRust { baseline: true, .. }
                | Contender::SidecarRustUnix { baseline: true }
                | Contender::SidecarRustOrdered { baseline: true, .. }
                | Contender::SidecarRustReplicas { baseline: true, .. }
                | Contender::SidecarRustRetry { baseline: true }
                | Contender::SidecarPython { baseline: true, .. }
        )
    }

    /// The same contender against the `--baseline-bin` binary; none for the contenders
    /// without a sidecar and for the twins themselves.
    pub fn baseline_twin(&self) -> Option<Self> {
        match *self {
            Contender::SidecarRust {
                count,
                atomic,
                baseline: false,
            } => Some(Contender::SidecarRust {
                count,
                atomic,
                baseline: true,
            }),
            Contender::SidecarPython {
                api,
                baseline: false,
            } => Some(Contender::SidecarPython {
                api,
                baseline: true,
            }),
            Contender::SidecarRustOrdered {
                hot,
                baseline: false,
            } => Some(Contender::SidecarRustOrdered {
                hot,
                baseline: true,
            }),
            Contender::SidecarRustReplicas {
                replicas,
                baseline: false,
            } => Some(Contender::SidecarRustReplicas {
                replicas,
                baseline: true,
            }),
            Contender::SidecarRustRetry { baseline: false } => {
                Some(Contender::SidecarRustRetry { baseline: true })
            }
            Contender::SidecarRustUnix { baseline: false } => {
                Some(Contender::SidecarRustUnix { baseline: true })
            }
            _ => None,
        }
    }

    /// The COUNT of its reads.
    pub(crate) fn count(&self) -> u32 {
        match self {
            Contender::SidecarRust { count, .. } => *count,
            _ => 64,
        }
    }

    fn python_mode(&self) -> Option<&'static str> {
        match self {
            Contender::SidecarPython { api, .. } => Some(api.mode()),
            Contender::RedisPyPerMessage => Some("redis-py-per-message"),
            Contender::RedisPyPipelined => Some("redis-py-pipelined"),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A prefilled stream of N entries, consumed flat out.
    Throughput,
    /// A producer XADDs at `--latency-rate` while the consumer runs.
    Latency,
    /// The same beside a neighbour process that keeps a core busy: the tail a pod sees on a
    /// node it shares.
    LatencyBusy,
    /// The same at ten times `--latency-rate`.
    LatencyFast,
}

impl Phase {
    /// A producer writes at a fixed rate while the consumer runs.
    pub fn latency(self) -> bool {
        self != Phase::Throughput
    }

    /// The producer's entries per second, with `--latency-rate` at `base`.
    pub fn rate(self, base: u64) -> u64 {
        match self {
            Phase::LatencyFast => base * 10,
            _ => base,
        }
    }
}

/// The figures of one verified run.
#[derive(Debug, Default)]
pub struct Measured {
    pub entries: u64,
    pub secs: f64,
    /// Calls per Redis command during the consumer's run (without the producer's XADDs).
    pub commands: Vec<(String, u64)>,
    /// Reads that delivered entries, and round trips: the sidecar's own counters for sidecar
    /// contenders, the consumer's for the baselines.
    pub reads: u64,
    pub round_trips: u64,
    pub flush_round_trips: Option<u64>,
    pub sidecar_cpu: Option<f64>,
    pub client_cpu: Option<f64>,
    pub redis_cpu: Option<f64>,
    pub sidecar_hwm_kb: Option<u64>,
    pub flush_mean_ms: Option<f64>,
    /// Latency samples, microseconds, sorted.
    pub lat_us: Vec<u64>,
    /// Latency phases: the samples' two parts, each sorted (see [`ClientOutcome`]); empty for
    /// a consumer that does not report them.
    pub to_consumer_us: Vec<u64>,
    pub to_settled_us: Vec<u64>,
    /// Latency phases: how late the producer sent each entry after it was due, microseconds,
    /// sorted (part of every latency sample: the stamp is the due time).
    pub producer_late_us: Vec<u64>,
    /// An ordered run: its entries without the hot key (all of them without one), and the
    /// seconds until the last of them was settled.
    pub others: Option<(u64, f64)>,
    /// A retrying run: the deliveries it retried, and what the stream held at the end.
    pub(crate) retried: Option<(u64, workload::Retained)>,
    /// A replicas run: each replica's partitions, deliveries and sidecar (`sidecar_cpu` and
    /// `sidecar_hwm_kb` are then their sum and their largest).
    pub(crate) replicas: Vec<partitioned::Replica>,
}

impl Measured {
    pub fn rate(&self) -> f64 {
        self.entries as f64 / self.secs
    }

    /// An ordered run's deliveries/s of the entries without the hot key.
    pub fn others_rate(&self) -> Option<f64> {
        self.others.map(|(n, secs)| n as f64 / secs)
    }

    pub fn commands_total(&self) -> u64 {
        self.commands.iter().map(|(_, n)| n).sum()
    }
}

pub struct Record {
    pub round: u32,
    pub contender: Contender,
    pub phase: Phase,
    pub result: Result<Measured, String>,
}

/// The sidecar's RSS with idle subscriptions open, and before they were opened (kB).
/// One run of the many-subscriptions phase: its topology and round.
pub(crate) type ManyRecord = (many::Topology, u32, Result<many::Many, String>);

/// One run of the many-partitions phase: its round.
pub(crate) type PartitionsRecord = (u32, Result<partitioned::Group, String>);

pub struct IdleRss {
    pub round: u32,
    pub subscriptions: usize,
    /// Measured on the `--baseline-bin` binary.
    pub baseline: bool,
    pub result: Result<(u64, u64), String>,
}

struct Ctx {
    root: PathBuf,
    sidecar_bin: Result<PathBuf, String>,
    baseline_bin: Option<PathBuf>,
    python: Result<PathBuf, String>,
    entries: u64,
    latency_rate: u64,
    latency_secs: f64,
    window_reads: u32,
    idle_subscriptions: usize,
}

impl Ctx {
    /// The sidecar binary to run: the measured one, or with `baseline` the one it is
    /// compared with.
    fn sidecar_bin(&self, baseline: bool) -> Result<&Path, String> {
        if baseline {
            self.baseline_bin
                .as_deref()
                .ok_or("no --baseline-bin".into())
        } else {
            self.sidecar_bin.as_deref().map_err(Clone::clone)
        }
    }
}

enum Consumer {
    Sidecar(SidecarClient),
    Fred(FredLoop),
    RedisRs(RedisRsLoop),
    Seed(SeedApp),
    Python(python::Worker),
}

impl Consumer {
    async fn prepare(
        ctx: &Ctx,
        contender: Contender,
        redis: &RedisServer,
        sidecar: Option<&SidecarProcess>,
        expect: u64,
        latency: bool,
    ) -> Result<Self, String> {
        if let Some(mode) = contender.python_mode() {
            let python = ctx.python.as_ref().map_err(Clone::clone)?;
            let args = python_args(ctx, redis, sidecar, expect, contender.count(), latency);
            return Ok(Consumer::Python(
                python::Worker::start(python, &ctx.root, mode, &args).await?,
            ));
        }
        let count = contender.count();
        let max_in_flight = ctx.window_reads * count;
        Ok(match contender {
            Contender::SidecarRust { atomic, .. } => {
                let sidecar = sidecar.ok_or("no sidecar")?;
                Consumer::Sidecar(
                    SidecarClient::connect(sidecar.grpc, count, max_in_flight, atomic).await?,
                )
            }
            Contender::SidecarRustUnix { .. } => {
                let sidecar = sidecar.ok_or("no sidecar")?;
                Consumer::Sidecar(SidecarClient::over(
                    sidecar.client().await?,
                    count,
                    max_in_flight,
                    false,
                ))
            }
            Contender::SidecarRustOrdered { .. } => {
                let sidecar = sidecar.ok_or("no sidecar")?;
                let keying = contender.keying().ok_or("not ordered")?;
                Consumer::Sidecar(
                    SidecarClient::connect(sidecar.grpc, count, max_in_flight, false)
                        .await?
                        .ordered(keying),
                )
            }
            Contender::SidecarRustRetry { .. } => {
                let sidecar = sidecar.ok_or("no sidecar")?;
                Consumer::Sidecar(
                    SidecarClient::connect(sidecar.grpc, count, max_in_flight, false)
                        .await?
                        .retrying(),
                )
            }
            Contender::SidecarRustReplicas { .. } => {
                return Err("a replicas contender runs in partitioned.rs".into());
            }
            Contender::SeedInProcess => {
                Consumer::Seed(SeedApp::connect(&redis.url(), count as usize).await?)
            }
            Contender::RedisRsPipelined => {
                Consumer::RedisRs(RedisRsLoop::connect(&redis.url(), count).await?)
            }
            _ => Consumer::Fred(FredLoop::connect(&redis.url(), count).await?),
        })
    }

    /// The consumer's process when it is not this one.
    fn pid(&self) -> Option<u32> {
        match self {
            Consumer::Python(worker) => worker.pid(),
            _ => None,
        }
    }

    async fn run(self, expect: u64, latency: bool) -> Result<ClientOutcome, String> {
        match self {
            Consumer::Sidecar(client) => client.run(expect, latency).await,
            Consumer::Fred(client) => client.run(expect, latency).await,
            Consumer::RedisRs(client) => client.run(expect, latency).await,
            Consumer::Seed(app) => app.run(expect, latency).await,
            Consumer::Python(worker) => worker.run().await,
        }
    }
}

/// The command line of a Python worker: what it consumes from (the sidecar or Redis), its
/// COUNT and, through the sidecar, the window.
fn python_args(
    ctx: &Ctx,
    redis: &RedisServer,
    sidecar: Option<&SidecarProcess>,
    expect: u64,
    count: u32,
    latency: bool,
) -> Vec<String> {
    let mut args = vec!["--expect".to_owned(), expect.to_string()];
    match sidecar {
        Some(sidecar) => args.extend(["--sidecar".to_owned(), sidecar.grpc.to_string()]),
        None => args.extend(["--redis-url".to_owned(), redis.url()]),
    }
    args.extend(["--count".to_owned(), count.to_string()]);
    if sidecar.is_some() {
        let max_in_flight = ctx.window_reads * count;
        args.extend(["--max-in-flight".to_owned(), max_in_flight.to_string()]);
    }
    if latency {
        args.push("--latency".into());
    }
    args
}

/// A neighbour process that keeps one core busy while it lives (the busy-neighbour phase).
struct Neighbour(std::process::Child);

impl Neighbour {
    fn start() -> Result<Self, String> {
        std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .map(Self)
            .map_err(|e| format!("start the busy neighbour: {e}"))
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds used so far by the processes of one run: the sidecar, Redis and this process.
struct CpuMark {
    sidecar: Option<f64>,
    redis: Option<f64>,
    bench: Option<f64>,
}

impl CpuMark {
    fn take(sidecar: Option<u32>, redis: Option<u32>) -> Self {
        Self {
            sidecar: sidecar.and_then(cpu_seconds),
            redis: redis.and_then(cpu_seconds),
            bench: cpu_seconds(std::process::id()),
        }
    }

    /// Fills in the CPU used between `self` and `now`, the client's as this process's (an
    /// in-process consumer's).
    fn used(&self, now: &CpuMark, measured: &mut Measured) {
        let delta = |before: Option<f64>, after: Option<f64>| Some(after? - before?);
        measured.sidecar_cpu = delta(self.sidecar, now.sidecar);
        measured.redis_cpu = delta(self.redis, now.redis);
        measured.client_cpu = delta(self.bench, now.bench);
    }
}

impl Ctx {
    /// The entries of one run: `--entries`, or what the producer sends in a latency phase.
    fn expected(&self, phase: Phase) -> u64 {
        if phase.latency() {
            ((phase.rate(self.latency_rate) as f64 * self.latency_secs).round() as u64).max(1)
        } else {
            self.entries
        }
    }

    /// How long a run may take before it counts as failed.
    fn time_limit(&self, latency: bool, expect: u64) -> Duration {
        if latency {
            Duration::from_secs_f64(60.0 + 3.0 * self.latency_secs)
        } else {
            Duration::from_secs(60) + Duration::from_millis(2 * expect)
        }
    }
}

async fn run_one(ctx: &Ctx, contender: Contender, phase: Phase) -> Result<Measured, String> {
    let latency = phase.latency();
    let expect = ctx.expected(phase);
    if let Some(replicas) = contender.replicas() {
        let bin = ctx.sidecar_bin(contender.on_baseline())?;
        return partitioned::run_contender(bin, replicas as usize, expect, ctx.window_reads).await;
    }
    let redis = RedisServer::start();
    let admin = workload::connect(&redis.url()).await?;
    workload::create_group(&admin).await?;
    match (latency, contender.keying()) {
        (true, _) => {}
        (false, None) => workload::fill(&admin, expect).await?,
        (false, Some(keying)) => workload::fill_keyed(&admin, expect, keying).await?,
    }
    let sidecar = if contender.uses_sidecar() {
        let bin = ctx.sidecar_bin(contender.on_baseline())?;
        let retention: &[&str] = if contender.retries() {
            &[
                "--ack-retention",
                workload::STREAM,
                "--retention-interval",
                "100ms",
            ]
        } else {
            &[]
        };
        Some(match contender {
            Contender::SidecarRustUnix { .. } => {
                SidecarProcess::start_unix(bin, &redis.url(), retention).await?
            }
            _ => SidecarProcess::start(bin, &redis.url(), retention).await?,
        })
    } else {
        None
    };
    let consumer =
        Consumer::prepare(ctx, contender, &redis, sidecar.as_ref(), expect, latency).await?;
    let client_pid = consumer.pid();
    let sidecar_pid = sidecar.as_ref().map(SidecarProcess::pid);
    workload::reset_stats(&admin).await?;

    let before = CpuMark::take(sidecar_pid, redis.pid());
    let started = Instant::now();
    let neighbour = if phase == Phase::LatencyBusy {
        Some(Neighbour::start()?)
    } else {
        None
    };
    let rate = phase.rate(ctx.latency_rate);
    let producer = if latency {
        // Set-up of the consumer's subscription is not latency: it subscribes meanwhile.
        Some(Producer::start(
            redis.addr(),
            rate,
            expect,
            Duration::from_millis(300),
        )?)
    } else {
        None
    };
    let limit = ctx.time_limit(latency, expect);
    let outcome = tokio::time::timeout(limit, consumer.run(expect, latency))
        .await
        .map_err(|_| format!("timed out after {limit:?}"))??;
    let done_at = outcome.done_at.unwrap_or_else(Instant::now);
    drop(neighbour);
    let after = CpuMark::take(sidecar_pid, redis.pid());
    let mut commands = workload::command_stats(&admin).await?;
    if latency {
        commands.retain(|(name, _)| name != "xadd");
    }
    let mut measured = Measured {
        entries: expect,
        secs: (done_at - started).as_secs_f64(),
        others: contender.keying().map(|keying| {
            let others = keying.others(expect);
            let done = outcome.others_done_at.unwrap_or(done_at);
            (others, (done - started).as_secs_f64())
        }),
        commands,
        reads: outcome.reads,
        round_trips: outcome.round_trips,
        ..Default::default()
    };
    before.used(&after, &mut measured);
    if client_pid.is_some() {
        // A consumer of its own process measured itself.
        measured.client_cpu = outcome.cpu_s;
    }
    if let Some(sidecar) = &sidecar {
        sidecar_figures(sidecar, &mut measured).await?;
    }
    if let Some(producer) = producer {
        measured.producer_late_us = producer.finish().await?;
    }
    check_outcome(&outcome, expect)?;
    match contender.keying() {
        None if contender.retries() => {
            let want = (0..expect).filter(|id| workload::retried(*id)).count() as u64;
            if outcome.retried != want {
                return Err(format!(
                    "the consumer retried {} entries, want {want}",
                    outcome.retried
                ));
            }
            let retained = workload::verify_retried(&admin, expect).await?;
            measured.retried = Some((outcome.retried, retained));
        }
        None => workload::verify(&admin, expect).await?,
        Some(keying) => workload::verify_ordered(&admin, expect, keying).await?,
    }
    for (into, mut samples) in [
        (&mut measured.lat_us, outcome.lat_us),
        (&mut measured.to_consumer_us, outcome.to_consumer_us),
        (&mut measured.to_settled_us, outcome.to_settled_us),
    ] {
        samples.sort_unstable();
        *into = samples;
    }
    let _ = admin.quit().await;
    drop(sidecar);
    Ok(measured)
}

/// The sidecar's own figures of a run: its reads and round trips (from `/metrics`, replacing
/// the consumer's), its flushes and its peak RSS.
async fn sidecar_figures(sidecar: &SidecarProcess, measured: &mut Measured) -> Result<(), String> {
    let metrics = sidecar.scrape().await?;
    measured.reads = metric_sum(&metrics, "window_sidecar_reads_total", "") as u64;
    measured.round_trips =
        metric_sum(&metrics, "window_sidecar_redis_round_trips_total", "") as u64;
    measured.flush_round_trips = Some(metric_sum(
        &metrics,
        "window_sidecar_redis_round_trips_total",
        "kind=\"flush\"",
    ) as u64);
    let flushes = metric_sum(&metrics, "window_sidecar_flush_duration_seconds_count", "");
    if flushes > 0.0 {
        measured.flush_mean_ms = Some(
            1000.0 * metric_sum(&metrics, "window_sidecar_flush_duration_seconds_sum", "")
                / flushes,
        );
    }
    measured.sidecar_hwm_kb = status_kb(sidecar.pid(), "VmHWM");
    Ok(())
}

/// What the consumer itself says of a run: every entry acknowledged, one latency sample each.
pub(crate) fn check_outcome(outcome: &ClientOutcome, expect: u64) -> Result<(), String> {
    if outcome.acked < expect {
        return Err(format!("the consumer acked {} of {expect}", outcome.acked));
    }
    if outcome.lat_us.len() as u64 != expect {
        return Err(format!(
            "{} latency samples for {expect} entries",
            outcome.lat_us.len()
        ));
    }
    Ok(())
}

async fn idle_rss(ctx: &Ctx, n: usize, baseline: bool) -> Result<(u64, u64), String> {
    let bin = ctx.sidecar_bin(baseline)?;
    let redis = RedisServer::start();
    let sidecar = SidecarProcess::start(bin, &redis.url(), &[]).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = status_kb(sidecar.pid(), "VmRSS").ok_or("no VmRSS")?;
    let held = client::open_idle(sidecar.grpc, n).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = status_kb(sidecar.pid(), "VmRSS").ok_or("no VmRSS")?;
    let open = metric_sum(
        &sidecar.scrape().await?,
        "window_sidecar_subscriptions_open",
        "",
    ) as usize;
    drop(held);
    drop(sidecar);
    if open != n {
        return Err(format!("{open} subscriptions open, want {n}"));
    }
    Ok((rss, before))
}

/// Builds the sidecar binary (a no-op when it is fresh) next to this binary, so a stale one is
/// never measured; falls back to an existing binary when cargo is not there.
fn sidecar_bin(explicit: Option<PathBuf>, root: &Path) -> Result<PathBuf, String> {
    if let Some(bin) = explicit {
        return Ok(bin);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = exe.parent().ok_or("no directory of the bench binary")?;
    let target_dir = profile_dir.parent().ok_or("no target directory")?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let target_dir = if release {
        target_dir.to_owned()
    } else {
        root.join("target")
    };
    let bin = target_dir.join("release/window-sidecar");
    println!("bench: cargo build --release -p window-sidecar");
    match window_sidecar_harness::build_sidecar(true, Some(&target_dir)) {
        Ok(built) => Ok(built),
        Err(_) if bin.exists() => {
            println!(
                "bench: the build failed; using the existing {}",
                bin.display()
            );
            Ok(bin)
        }
        Err(e) => Err(format!("could not build the sidecar: {e}")),
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Throughput => "throughput",
        Phase::Latency => "latency",
        Phase::LatencyBusy => "latency-busy",
        Phase::LatencyFast => "latency-fast",
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench(args))
}

/// The sizes of a run: the options' values, or their defaults (`--quick`'s or the full run's).
struct Sizes {
    entries: u64,
    rounds: u32,
    latency_secs: f64,
    many_subscriptions: usize,
    many_partitions: u32,
}

impl Sizes {
    fn of(args: &Args) -> Self {
        let quick = args.quick;
        Self {
            entries: args.entries.unwrap_or(if quick { 5_000 } else { 100_000 }),
            rounds: args.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1),
            latency_secs: args.latency_secs.unwrap_or(if quick { 1.0 } else { 5.0 }),
            many_subscriptions: args
                .many_subscriptions
                .unwrap_or(if quick { 10 } else { 100 }),
            many_partitions: args
                .many_partitions
                .unwrap_or(if quick { 12 } else { 48 })
                .min(window_sidecar::partition::MAX_PARTITIONS),
        }
    }
}

/// Every run of the bench, as the tables read them.
#[derive(Default)]
struct Runs {
    records: Vec<Record>,
    idle: Vec<IdleRss>,
    many: Vec<ManyRecord>,
    partitions: Vec<PartitionsRecord>,
}

async fn bench(args: Args) -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let sizes = Sizes::of(&args);
    let contenders = match choose_contenders(&args.contenders, args.baseline_bin.as_deref()) {
        Ok(contenders) => contenders,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    // Checked before the runs rather than after them: a long run's report is not lost to a
    // path that cannot be written.
    if let Some(path) = &args.json
        && let Err(err) = json_writable(path)
    {
        eprintln!("--json {}: {err}", path.display());
        return ExitCode::from(2);
    }
    if cfg!(debug_assertions) {
        println!("bench: note: built without --release; the in-process clients are slow");
    }
    let json = args.json.clone();
    let baseline_bin = args.baseline_bin.clone();
    let ctx = prepare(args, &sizes, &contenders, root);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let redis = redis_version();
    println!(
        "bench: {} contenders, {} round(s), {} entries per throughput run, \
         latency phase {} s at {}/s, {cores} cores, {redis}",
        contenders.len(),
        sizes.rounds,
        sizes.entries,
        sizes.latency_secs,
        ctx.latency_rate,
    );
    let width = report::name_width(&contenders);
    let mut runs = Runs::default();
    for round in 1..=sizes.rounds {
        run_round(&ctx, &contenders, &sizes, round, width, &mut runs).await;
    }
    let run = run_info(&ctx, &sizes, (cores, redis), baseline_bin);
    let report = figures::Report::of(
        run,
        &contenders,
        &figures::Records {
            records: &runs.records,
            idle: &runs.idle,
            many: &runs.many,
            partitions: &runs.partitions,
        },
    );
    report::tables(&report);
    finish(&report, json.as_deref())
}

/// What the JSON says of the run besides its figures: the command, the build, when, which
/// commit, the machine and the sizes.
fn run_info(
    ctx: &Ctx,
    sizes: &Sizes,
    (cores, redis): (usize, String),
    baseline_bin: Option<PathBuf>,
) -> figures::Run {
    let (commit, dirty) = git_commit(&ctx.root);
    figures::Run {
        args: std::env::args().skip(1).collect(),
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        commit,
        dirty,
        cores,
        redis,
        entries: sizes.entries,
        rounds: sizes.rounds,
        latency_rate: ctx.latency_rate,
        latency_secs: sizes.latency_secs,
        window_reads: ctx.window_reads,
        idle_subscriptions: ctx.idle_subscriptions,
        many_subscriptions: sizes.many_subscriptions,
        many_partitions: sizes.many_partitions,
        replica_partitions: partitioned::PARTITIONS,
        sidecar_bin: ctx
            .sidecar_bin
            .as_ref()
            .ok()
            .map(|bin| bin.display().to_string()),
        baseline_bin: baseline_bin.map(|bin| bin.display().to_string()),
    }
}

/// The closing line, `bench: N passed, M failed`, the JSON when asked for, and the exit code:
/// failure when a run failed or the JSON could not be written.
fn finish(report: &figures::Report, json: Option<&Path>) -> ExitCode {
    println!("bench: {} passed, {} failed", report.passed, report.failed);
    let mut code = if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if let Some(path) = json {
        match write_json(path, report) {
            Ok(()) => println!("bench: the report as JSON in {}", path.display()),
            Err(err) => {
                eprintln!("bench: could not write {}: {err}", path.display());
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

/// Whether `--json`'s file can be written: its folder exists, and the path is no folder.
fn json_writable(path: &Path) -> Result<(), String> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(format!("no folder {}", parent.display()));
    }
    if path.is_dir() {
        return Err("a folder".into());
    }
    Ok(())
}

/// The report as pretty-printed JSON, with a final newline.
fn write_json(path: &Path, report: &figures::Report) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| e.to_string())
}

/// `git rev-parse HEAD` in the repository, and whether its tracked files have changes; none
/// when git does not answer.
fn git_commit(root: &Path) -> (Option<String>, Option<bool>) {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
    };
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return (None, None);
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.trim().is_empty());
    (Some(commit.trim().to_owned()), dirty)
}

/// The contenders named (all of them when none is), each `@baseline` twin right after the
/// contender it is compared with when there is a `--baseline-bin`.
fn choose_contenders(
    names: &[String],
    baseline_bin: Option<&Path>,
) -> Result<Vec<Contender>, String> {
    let contenders = if names.is_empty() {
        Contender::ALL.to_vec()
    } else {
        parse_contenders(names)?
    };
    match baseline_bin {
        None => match contenders.iter().find(|c| c.on_baseline()) {
            Some(c) => Err(format!("{} needs --baseline-bin", c.name())),
            None => Ok(contenders),
        },
        // Checked here rather than failing every run of the twins one by one.
        Some(bin) if !bin.is_file() => {
            Err(format!("--baseline-bin {}: no such file", bin.display()))
        }
        Some(_) => Ok(pair_twins(&contenders)),
    }
}

fn parse_contenders(names: &[String]) -> Result<Vec<Contender>, String> {
    names
        .iter()
        .map(|name| {
            Contender::parse(name).ok_or_else(|| {
                format!(
                    "unknown contender {name:?}; known: {} (the sidecar ones also as \
                     <name>{BASELINE})",
                    Contender::ALL.map(|c| c.name()).join(", ")
                )
            })
        })
        .collect()
}

/// Each twin right after the contender it is compared with, so that the two run back to back
/// in every round and share whatever the machine is doing then. Twins named in --contenders
/// are the only ones, each in its place: a full run can compare the contenders that matter
/// with the baseline binary without doubling its length.
fn pair_twins(contenders: &[Contender]) -> Vec<Contender> {
    if contenders.iter().any(Contender::on_baseline) {
        return contenders.to_vec();
    }
    let mut paired = Vec::new();
    for &c in contenders {
        paired.push(c);
        if let Some(twin) = c.baseline_twin()
            && !contenders.contains(&twin)
            && !paired.contains(&twin)
        {
            paired.push(twin);
        }
    }
    paired
}

/// What the runs need besides the options: the sidecar binary (built when needed) and the
/// Python interpreter (prepared when a Python contender runs).
fn prepare(args: Args, sizes: &Sizes, contenders: &[Contender], root: PathBuf) -> Ctx {
    let needs_sidecar = contenders
        .iter()
        .any(|c| c.uses_sidecar() && !c.on_baseline())
        || args.idle_subscriptions > 0
        || sizes.many_subscriptions > 0
        || sizes.many_partitions > 0;
    let sidecar_bin = if needs_sidecar {
        sidecar_bin(args.sidecar_bin, &root)
    } else {
        Err("not needed".into())
    };
    let python = if contenders.iter().any(|c| c.python_mode().is_some()) {
        python::prepare(&root, args.python)
    } else {
        Err("not needed".into())
    };
    if let Err(err) = &python
        && err != "not needed"
    {
        println!("bench: the Python contenders cannot run: {err}");
    }
    if let Some(baseline) = &args.baseline_bin {
        let measured = match &sidecar_bin {
            Ok(bin) => bin.display().to_string(),
            Err(err) => err.clone(),
        };
        println!(
            "bench: sidecar binary {measured}, baseline binary {} (the {BASELINE} contenders)",
            baseline.display()
        );
    }
    Ctx {
        root,
        sidecar_bin,
        baseline_bin: args.baseline_bin,
        python,
        entries: sizes.entries,
        latency_rate: args.latency_rate,
        latency_secs: sizes.latency_secs,
        window_reads: args.window_reads,
        idle_subscriptions: args.idle_subscriptions,
    }
}

/// One round: every contender's throughput run, then every latency run, then the idle-RSS
/// check, the many-subscriptions phase and the many-partitions phase.
async fn run_round(
    ctx: &Ctx,
    contenders: &[Contender],
    sizes: &Sizes,
    round: u32,
    width: usize,
    runs: &mut Runs,
) {
    let rounds = sizes.rounds;
    let mut phases = vec![Phase::Throughput];
    if sizes.latency_secs > 0.0 {
        phases.extend([Phase::Latency, Phase::LatencyBusy, Phase::LatencyFast]);
    }
    // Which of two runs back to back goes first tilts the comparison (the first measured
    // was faster in most pairs tried): the twins swap places every other round.
    let order = if round.is_multiple_of(2) {
        swap_twins(contenders)
    } else {
        contenders.to_vec()
    };
    for phase in phases {
        for &contender in order.iter().filter(|c| c.runs_in(phase)) {
            let wall = std::time::Instant::now();
            let result = run_one(ctx, contender, phase).await;
            report::progress(
                round,
                rounds,
                phase,
                contender,
                &result,
                wall.elapsed(),
                width,
            );
            runs.records.push(Record {
                round,
                contender,
                phase,
                result,
            });
        }
    }
    let n = ctx.idle_subscriptions;
    // The baseline binary's check right after the measured one's, like the twins'.
    let binaries: &[bool] = match (n, &ctx.baseline_bin) {
        (0, _) => &[],
        (_, None) => &[false],
        (_, Some(_)) => &[false, true],
    };
    for &baseline in binaries {
        let result = idle_rss(ctx, n, baseline).await;
        report::idle_progress(round, rounds, n, baseline, &result, width);
        runs.idle.push(IdleRss {
            round,
            subscriptions: n,
            baseline,
            result,
        });
    }
    let many_n = sizes.many_subscriptions;
    if many_n > 0 {
        for topology in [many::Topology::SingleNode, many::Topology::Cluster] {
            let result = match &ctx.sidecar_bin {
                Ok(bin) => many::run(bin, topology, many_n, ctx.entries, ctx.window_reads).await,
                Err(err) => Err(err.clone()),
            };
            report::many_progress(round, rounds, topology, &result, width);
            runs.many.push((topology, round, result));
        }
    }
    let partitions = sizes.many_partitions;
    if partitions > 0 {
        let wall = std::time::Instant::now();
        let result = match &ctx.sidecar_bin {
            Ok(bin) => {
                partitioned::run_cluster(bin, partitions, ctx.entries, ctx.window_reads).await
            }
            Err(err) => Err(err.clone()),
        };
        report::partitions_progress(round, rounds, partitions, &result, wall.elapsed(), width);
        runs.partitions.push((round, result));
    }
}

fn redis_version() -> String {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(|v| format!("redis-server {v}")))
        })
        .unwrap_or_else(|| "redis-server (version unknown)".into())
}

/// The contenders with every twin run before the contender it follows.
fn swap_twins(contenders: &[Contender]) -> Vec<Contender> {
    let mut order = contenders.to_vec();
    let mut i = 0;
    while i + 1 < order.len() {
        if order[i].baseline_twin() == Some(order[i + 1]) {
            order.swap(i, i + 1);
            i += 2;
        } else {
            i += 1;
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(names: &[&str]) -> Vec<String> {
        pair_twins(
            &parse_contenders(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap(),
        )
        .iter()
        .map(Contender::name)
        .collect()
    }

    /// With no twin named every sidecar contender gets one right after it; with twins named
    /// only those run, each in its place.
    #[test]
    fn twins_named_are_the_only_ones() {
        assert_eq!(
            named(&["sidecar-rust-pipeline-64", "sidecar-python", "fred-raw"]),
            [
                "sidecar-rust-pipeline-64",
                "sidecar-rust-pipeline-64@baseline",
                "sidecar-python",
                "sidecar-python@baseline",
                "fred-raw"
            ]
        );
        assert_eq!(
            named(&[
                "sidecar-rust-pipeline-64",
                "sidecar-rust-pipeline-64@baseline",
                "sidecar-python",
                "fred-raw"
            ]),
            [
                "sidecar-rust-pipeline-64",
                "sidecar-rust-pipeline-64@baseline",
                "sidecar-python",
                "fred-raw"
            ]
        );
    }
}
