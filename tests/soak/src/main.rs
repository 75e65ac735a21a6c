//! The soak: the real binary, loopback only, under a steady load of 54 subscriptions of
//! every form (42 stream consumers, 6 reliable-list and 4 simple-list consumers, a pub/sub
//! channel and a pattern) with their producers, for `--secs` seconds (default 150, or
//! `SOAK_SECS`; `--quick`: 20). Five of
//! the subscriptions close and reopen every 15 s. Every ~10 s it prints the sidecar's RSS,
//! threads and file descriptors, the Redis connection count (`CLIENT LIST`, `INFO clients`),
//! the subscriptions open and the deliveries per second.
//!
//! It checks, with generous bounds and never on timing:
//! * RSS at the end of the load is at most 1.5x (+ 8 MiB) what it was at the end of the first
//!   minute, and the sidecar's Redis connections then are the same (± the churning
//!   subscriptions) and never more than one per subscription plus the pool;
//! * once every subscription closed: the admin view is empty, the open-subscription gauges are
//!   0, no per-subscription series is left and the backlog gauges of the keys served read 0;
//!   the sidecar is back to the Redis connections, file descriptors and threads it had before
//!   the first subscription opened, and for 12 s sends Redis nothing but its health `PING` and
//!   the read-only sampling of the backlog and the work waiting (a reader or promoter task left
//!   running would);
//! * every produced entry was settled exactly once: acked (its side effects ran once, counted
//!   in Redis) or dropped (its side effects never ran); retried ones came back and were acked;
//!   nothing is pending, waiting in a list or a processing list, delayed, or left in the
//!   delivery-count bookkeeping; no flush failed, nothing was rejected.
//!
//! Each check prints a line (`ok: …` or `FAILED: …`), and the run ends with `N passed, N
//! failed`; it exits 1 when a check failed (a run that could not finish, a deadline passed or
//! a task panicked, is one failed check). The binary it runs is `WINDOW_SIDECAR_BIN`, or
//! `--sidecar-bin`, else the one `cargo build -p window-sidecar` makes.
//!
//! `cargo run --release -p window-sidecar-soak -- --quick` (CI), `cargo run --release -p
//! window-sidecar-soak` (the full 150 s), `-- --secs 600` for longer.
//!
//! The parts, in the order a run meets them: [`plan`] (the keys, subscriptions and bounds) and
//! [`tally`] (what the clients count); [`world`] (Redis and the sidecar); [`load`], which runs
//! the [`workers`] and [`producers`] and takes [`samples`]; [`rest`] (the sidecar once every
//! subscription closed), read through [`observe`]; then [`mod@report`] and [`checks`].

mod checks;
mod load;
mod observe;
mod plan;
mod producers;
mod report;
mod rest;
mod samples;
mod stop;
mod tally;
mod workers;
mod world;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use clap::Parser;
use window_sidecar_harness::sidecar_bin;

use checks::{Checks, check_at_rest, check_clients, check_under_load};
use load::Load;
use report::{print_plan, report};
use rest::AfterRest;
use world::Rig;

/// The soak's length; everything else is the same in every configuration.
#[derive(Parser, Debug)]
#[command(
    about = "Fifty-four subscriptions for minutes against the real binary: nothing leaks, every entry settles once."
)]
struct Args {
    /// Seconds of load.
    #[arg(
        long,
        env = "SOAK_SECS",
        default_value_t = 150,
        conflicts_with = "quick"
    )]
    secs: u64,
    /// The short configuration for CI: 20 s of load (under a minute in all).
    #[arg(long)]
    quick: bool,
    /// The sidecar binary (default: `WINDOW_SIDECAR_BIN`, else built by cargo).
    #[arg(long)]
    sidecar_bin: Option<PathBuf>,
}

/// The load of `--quick`: long enough for every churning subscription to close and reopen once
/// and for two samples to compare.
const QUICK_SECS: u64 = 20;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let secs = if args.quick { QUICK_SECS } else { args.secs };
    let bin = args.sidecar_bin.unwrap_or_else(|| sidecar_bin().to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let checks = Arc::new(Checks::default());
    let soak = soak(Duration::from_secs(secs), bin, Arc::clone(&checks));
    let run = runtime.block_on(async { tokio::spawn(soak).await });
    // A deadline that passed or a task that panicked: the run could not finish.
    checks.check(run.is_ok(), "the soak ran to its end", || {
        "it stopped early (the panic above says why)".into()
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    let (passed, failed) = (checks.passed.load(Relaxed), checks.failed.load(Relaxed));
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// One soak, from the sidecar's start to its checks; a panic anywhere in it is the run's
/// failed check (`main`).
async fn soak(soak: Duration, bin: PathBuf, checks: Arc<Checks>) {
    let wall = Instant::now();
    print_plan(soak);
    let rig = Rig::start(&bin).await;
    let mut load = Load::open(&rig).await;
    let (samples, load_secs) = load.run(&rig, soak).await;
    let phases = load.drain(&rig, load_secs).await;
    let rest = AfterRest::observe(&rig).await;
    report(&rig, &load, &samples, soak, &phases, &rest, wall).await;
    check_under_load(&checks, &rig, &samples, soak);
    check_at_rest(&checks, &rig, &rest);
    check_clients(&checks, &rig, &load).await;
    println!("soak done in {:.0} s", wall.elapsed().as_secs_f64());
    drop(rig);
}
