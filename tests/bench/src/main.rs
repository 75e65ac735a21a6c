//! The benchmark: the window sidecar side by side with what users write instead.
//!
//! ```sh
//! cargo run --release -p window-sidecar-bench -- [--entries N] [--rounds R] [--contenders a,b,…] [--quick]
//! ```
//!
//! Each contender consumes a stream of N entries (`_payload`: ~100 bytes of JSON with an `id`)
//! in group `g` on a `redis-server` of its own; per entry it decodes the payload, runs
//! `INCR count:<id mod 1000>` and acknowledges the entry. Runs are interleaved (A B C … A B C
//! …), each is verified (XPENDING 0, the counters sum to N) and only verified runs are
//! reported. With `--baseline-bin` every sidecar contender also runs against a second sidecar
//! binary (`<name>@baseline`, right after it in every round), and the report gives the ratios
//! of the two. See README.md beside this file for the contenders and the figures.

mod client;
mod many;
mod procs;
mod python;
mod report;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use fred::prelude::*;
use tokio::time::{Instant, MissedTickBehavior};
use window_sidecar_harness::RedisServer;

use crate::client::{ClientOutcome, FredLoop, SidecarClient};
use crate::procs::{SidecarProcess, cpu_seconds, metric_sum, status_kb};

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
    /// sidecar-python, redis-py-per-message, redis-py-pipelined, fred-raw; the sidecar ones
    /// also as `<name>@baseline` (with --baseline-bin).
    #[arg(long, value_delimiter = ',')]
    contenders: Vec<String>,
    /// CI size: 5,000 entries, one round, a ~1 s latency phase.
    #[arg(long)]
    quick: bool,
    /// Entries per second in the latency phase.
    #[arg(long, default_value_t = 1000)]
    latency_rate: u64,
    /// Seconds of the latency phase [default: 5; --quick 1]; 0 skips it.
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
    /// The window of every sidecar contender, in reads: `max_in_flight` = this × COUNT, so
    /// the client has reads to work on while earlier ones flush.
    #[arg(long, default_value_t = 4)]
    window_reads: u32,
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
    SidecarPython {
        baseline: bool,
    },
    RedisPyPerMessage,
    RedisPyPipelined,
    FredRaw,
}

impl Contender {
    pub const ALL: [Contender; 8] = [
        Contender::SidecarRust {
            count: 64,
            atomic: false,
            baseline: false,
        },
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
        Contender::SidecarPython { baseline: false },
        Contender::RedisPyPerMessage,
        Contender::RedisPyPipelined,
        Contender::FredRaw,
    ];

    pub fn name(&self) -> String {
        let name = match self {
            Contender::SidecarRust { count, atomic, .. } => format!(
                "sidecar-rust-{}-{count}",
                if *atomic { "atomic" } else { "pipeline" }
            ),
            Contender::SidecarPython { .. } => "sidecar-python".into(),
            Contender::RedisPyPerMessage => "redis-py-per-message".into(),
            Contender::RedisPyPipelined => "redis-py-pipelined".into(),
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
            Contender::SidecarRust { .. } | Contender::SidecarPython { .. }
        )
    }

    /// Whether this runs against the `--baseline-bin` binary.
    pub fn on_baseline(&self) -> bool {
        matches!(
            self,
            Contender::SidecarRust { baseline: true, .. }
                | Contender::SidecarPython { baseline: true }
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
            Contender::SidecarPython { baseline: false } => {
                Some(Contender::SidecarPython { baseline: true })
            }
            _ => None,
        }
    }

    fn python_mode(&self) -> Option<&'static str> {
        match self {
            Contender::SidecarPython { .. } => Some("sidecar-python"),
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
    /// A producer XADDs at a fixed rate while the consumer runs.
    Latency,
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
}

impl Measured {
    pub fn rate(&self) -> f64 {
        self.entries as f64 / self.secs
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

pub struct IdleRss {
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
            let mut args = vec!["--expect".to_owned(), expect.to_string()];
            match sidecar {
                Some(sidecar) => args.extend(["--sidecar".to_owned(), sidecar.grpc.to_string()]),
                None => args.extend(["--redis-url".to_owned(), redis.url()]),
            }
            args.extend(["--count".to_owned(), "64".to_owned()]);
            if sidecar.is_some() {
                let max_in_flight = ctx.window_reads * 64;
                args.extend(["--max-in-flight".to_owned(), max_in_flight.to_string()]);
            }
            if latency {
                args.push("--latency".into());
            }
            return Ok(Consumer::Python(
                python::Worker::start(python, &ctx.root, mode, &args).await?,
            ));
        }
        Ok(match contender {
            Contender::SidecarRust { count, atomic, .. } => {
                let sidecar = sidecar.ok_or("no sidecar")?;
                let max_in_flight = ctx.window_reads * count;
                Consumer::Sidecar(
                    SidecarClient::connect(sidecar.grpc, count, max_in_flight, atomic).await?,
                )
            }
            _ => Consumer::Fred(FredLoop::connect(&redis.url(), 64).await?),
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
            Consumer::Python(worker) => worker.run().await,
        }
    }
}

/// XADDs `total` entries at `rate` per second, each stamped with its send time.
async fn produce(client: Client, rate: u64, total: u64) -> Result<(), String> {
    // Let the consumer subscribe first: its set-up is not latency.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    for id in 0..total {
        tick.tick().await;
        workload::xadd_now(&client, id).await?;
    }
    let _ = client.quit().await;
    Ok(())
}

async fn run_one(ctx: &Ctx, contender: Contender, phase: Phase) -> Result<Measured, String> {
    let latency = phase == Phase::Latency;
    let redis = RedisServer::start();
    let admin = workload::connect(&redis.url()).await?;
    workload::create_group(&admin).await?;
    let expect = if latency {
        ((ctx.latency_rate as f64 * ctx.latency_secs).round() as u64).max(1)
    } else {
        ctx.entries
    };
    if !latency {
        workload::fill(&admin, expect).await?;
    }
    let sidecar = if contender.uses_sidecar() {
        let bin = ctx.sidecar_bin(contender.on_baseline())?;
        Some(SidecarProcess::start(bin, &redis.url()).await?)
    } else {
        None
    };
    let consumer =
        Consumer::prepare(ctx, contender, &redis, sidecar.as_ref(), expect, latency).await?;
    let producer = if latency {
        Some(workload::connect(&redis.url()).await?)
    } else {
        None
    };
    let client_pid = consumer.pid();
    let sidecar_pid = sidecar.as_ref().map(SidecarProcess::pid);
    let redis_pid = redis.pid();
    workload::reset_stats(&admin).await?;

    let cpu = |pid: Option<u32>| pid.and_then(cpu_seconds);
    let (sidecar_cpu0, redis_cpu0) = (cpu(sidecar_pid), cpu(redis_pid));
    let self_cpu0 = cpu_seconds(std::process::id());
    let started = Instant::now();
    let producer = producer.map(|client| tokio::spawn(produce(client, ctx.latency_rate, expect)));
    let limit = if latency {
        Duration::from_secs_f64(60.0 + 3.0 * ctx.latency_secs)
    } else {
        Duration::from_secs(60) + Duration::from_millis(2 * expect)
    };
    let outcome = tokio::time::timeout(limit, consumer.run(expect, latency))
        .await
        .map_err(|_| format!("timed out after {limit:?}"))??;
    let done_at = outcome.done_at.unwrap_or_else(Instant::now);
    let delta = |before: Option<f64>, after: Option<f64>| Some(after? - before?);
    let sidecar_cpu = delta(sidecar_cpu0, cpu(sidecar_pid));
    let redis_cpu = delta(redis_cpu0, cpu(redis_pid));
    let client_cpu = match client_pid {
        Some(_) => outcome.cpu_s,
        None => delta(self_cpu0, cpu_seconds(std::process::id())),
    };
    let mut commands = workload::command_stats(&admin).await?;
    if latency {
        commands.retain(|(name, _)| name != "xadd");
    }
    let mut measured = Measured {
        entries: expect,
        secs: (done_at - started).as_secs_f64(),
        commands,
        reads: outcome.reads,
        round_trips: outcome.round_trips,
        sidecar_cpu,
        client_cpu,
        redis_cpu,
        ..Default::default()
    };
    if let Some(sidecar) = &sidecar {
        let metrics = sidecar.scrape().await?;
        measured.reads = metric_sum(&metrics, "window_reads_total", "") as u64;
        measured.round_trips = metric_sum(&metrics, "window_redis_round_trips_total", "") as u64;
        measured.flush_round_trips =
            Some(metric_sum(&metrics, "window_redis_round_trips_total", "kind=\"flush\"") as u64);
        let flushes = metric_sum(&metrics, "window_flush_duration_seconds_count", "");
        if flushes > 0.0 {
            measured.flush_mean_ms = Some(
                1000.0 * metric_sum(&metrics, "window_flush_duration_seconds_sum", "") / flushes,
            );
        }
        measured.sidecar_hwm_kb = status_kb(sidecar.pid(), "VmHWM");
    }
    if let Some(producer) = producer {
        producer
            .await
            .map_err(|e| format!("producer task: {e}"))??;
    }
    if outcome.acked < expect {
        return Err(format!("the consumer acked {} of {expect}", outcome.acked));
    }
    if outcome.lat_us.len() as u64 != expect {
        return Err(format!(
            "{} latency samples for {expect} entries",
            outcome.lat_us.len()
        ));
    }
    workload::verify(&admin, expect).await?;
    measured.lat_us = outcome.lat_us;
    measured.lat_us.sort_unstable();
    let _ = admin.quit().await;
    drop(sidecar);
    Ok(measured)
}

async fn idle_rss(ctx: &Ctx, n: usize, baseline: bool) -> Result<(u64, u64), String> {
    let bin = ctx.sidecar_bin(baseline)?;
    let redis = RedisServer::start();
    let sidecar = SidecarProcess::start(bin, &redis.url()).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = status_kb(sidecar.pid(), "VmRSS").ok_or("no VmRSS")?;
    let held = client::open_idle(sidecar.grpc, n).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = status_kb(sidecar.pid(), "VmRSS").ok_or("no VmRSS")?;
    let open = metric_sum(&sidecar.scrape().await?, "window_subscriptions_open", "") as usize;
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

async fn bench(args: Args) -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let entries = args
        .entries
        .unwrap_or(if args.quick { 5_000 } else { 100_000 });
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    let latency_secs = args
        .latency_secs
        .unwrap_or(if args.quick { 1.0 } else { 5.0 });
    let mut contenders: Vec<Contender> = if args.contenders.is_empty() {
        Contender::ALL.to_vec()
    } else {
        let mut chosen = Vec::new();
        for name in &args.contenders {
            match Contender::parse(name) {
                Some(c) => chosen.push(c),
                None => {
                    eprintln!(
                        "unknown contender {name:?}; known: {} (the sidecar ones also as \
                         <name>{BASELINE})",
                        Contender::ALL.map(|c| c.name()).join(", ")
                    );
                    return ExitCode::from(2);
                }
            }
        }
        chosen
    };
    match &args.baseline_bin {
        None => {
            if let Some(c) = contenders.iter().find(|c| c.on_baseline()) {
                eprintln!("{} needs --baseline-bin", c.name());
                return ExitCode::from(2);
            }
        }
        // Checked here rather than failing every run of the twins one by one.
        Some(bin) if !bin.is_file() => {
            eprintln!("--baseline-bin {}: no such file", bin.display());
            return ExitCode::from(2);
        }
        Some(_) => {
            // Each twin right after the contender it is compared with, so that the two run
            // back to back in every round and share whatever the machine is doing then. A
            // twin named in --contenders keeps its place.
            let mut paired = Vec::new();
            for &c in &contenders {
                paired.push(c);
                if let Some(twin) = c.baseline_twin()
                    && !contenders.contains(&twin)
                    && !paired.contains(&twin)
                {
                    paired.push(twin);
                }
            }
            contenders = paired;
        }
    }
    if cfg!(debug_assertions) {
        println!("bench: note: built without --release; the in-process clients are slow");
    }
    let needs_sidecar = contenders
        .iter()
        .any(|c| c.uses_sidecar() && !c.on_baseline())
        || args.idle_subscriptions > 0
        || args.many_subscriptions != Some(0);
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
    let ctx = Ctx {
        root,
        sidecar_bin,
        baseline_bin: args.baseline_bin,
        python,
        entries,
        latency_rate: args.latency_rate,
        latency_secs,
        window_reads: args.window_reads,
    };
    println!(
        "bench: {} contenders, {rounds} round(s), {entries} entries per throughput run, \
         latency phase {latency_secs} s at {}/s, {} cores, {}",
        contenders.len(),
        ctx.latency_rate,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        redis_version()
    );

    let width = report::name_width(&contenders);
    let mut records = Vec::new();
    let mut idle = Vec::new();
    let mut many_runs: Vec<ManyRecord> = Vec::new();
    let many_n = args
        .many_subscriptions
        .unwrap_or(if args.quick { 10 } else { 100 });
    for round in 1..=rounds {
        let mut phases = vec![Phase::Throughput];
        if latency_secs > 0.0 {
            phases.push(Phase::Latency);
        }
        // Which of two runs back to back goes first tilts the comparison (the first measured
        // was faster in most pairs tried): the twins swap places every other round.
        let order = if round % 2 == 0 {
            swap_twins(&contenders)
        } else {
            contenders.clone()
        };
        for phase in phases {
            for &contender in &order {
                let wall = std::time::Instant::now();
                let result = run_one(&ctx, contender, phase).await;
                report::progress(
                    round,
                    rounds,
                    phase,
                    contender,
                    &result,
                    wall.elapsed(),
                    width,
                );
                records.push(Record {
                    round,
                    contender,
                    phase,
                    result,
                });
            }
        }
        let n = args.idle_subscriptions;
        // The baseline binary's check right after the measured one's, like the twins'.
        let binaries: &[bool] = match (n, &ctx.baseline_bin) {
            (0, _) => &[],
            (_, None) => &[false],
            (_, Some(_)) => &[false, true],
        };
        for &baseline in binaries {
            let result = idle_rss(&ctx, n, baseline).await;
            report::idle_progress(round, rounds, n, baseline, &result, width);
            idle.push(IdleRss {
                subscriptions: n,
                baseline,
                result,
            });
        }
        if many_n > 0 {
            for topology in [many::Topology::SingleNode, many::Topology::Cluster] {
                let result = match &ctx.sidecar_bin {
                    Ok(bin) => many::run(bin, topology, many_n, entries, ctx.window_reads).await,
                    Err(err) => Err(err.clone()),
                };
                report::many_progress(round, rounds, topology, &result, width);
                many_runs.push((topology, round, result));
            }
        }
    }
    report::tables(&contenders, &records, &idle, &many_runs, ctx.latency_rate);
    let failed = records.iter().filter(|r| r.result.is_err()).count()
        + idle.iter().filter(|r| r.result.is_err()).count()
        + many_runs.iter().filter(|r| r.2.is_err()).count();
    let passed = records.len() + idle.len() + many_runs.len() - failed;
    println!("bench: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
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
