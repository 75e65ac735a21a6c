//! The fault campaign: producers publish through the sidecars, workers consume with queued
//! side effects and random outcomes, and a nemesis kills, pauses, cuts and restarts what
//! production loses (sidecars, workers, their TCP connections, Redis connections, Redis itself,
//! a cluster primary, a slot's owner) at random moments, and has Redis refuse the sidecars'
//! writes for a moment ([`refusal`]: out of memory, an ACL, a key's type, scripts flushed,
//! writes paused). At the end the whole history is checked against what Redis holds
//! ([`history::check`]): nothing lost, nothing done twice that the README does not allow.
//! Streams run under retention by acknowledgement, with a second
//! group the campaign reads itself behind the workers (no entry may leave before both groups
//! have it, and that group sees every published entry exactly once: the workers' retries and
//! redrives stay in their own group), and the nemesis also redrives dead letters through the
//! dead-letter service.
//! Stream and reliable-list workers open ordered subscriptions (`Open.ordering_key`, few keys
//! that collide), by default every other worker, and the checker holds each ordered
//! subscription stream to per-key order ([`history`]'s `order`).
//! The partitioned form (`--form partitioned`) splits the stream into
//! [`form::PARTITIONS`] partitions that every worker reads as an ordered replica of one group,
//! the producers publishing by key; the checker then holds the group as a whole to per-key
//! order ([`history`]'s `across`). It runs without retention; the audit group, the end state,
//! the dead letters and the redrives go over every partition.
//!
//!   cargo run --release -p window-sidecar-chaos -- --quick              CI: fixed seeds + one
//!   cargo run --release -p window-sidecar-chaos -- --minutes 60         an hour, every form
//!   cargo run --release -p window-sidecar-chaos -- --seed 42 --form stream --mode atomic --cluster
//!   cargo run --release -p window-sidecar-chaos -- --form partitioned --minutes 20
//!
//! A run prints its seed first; the same seed replays the same decisions and faults (the
//! moments they land on still depend on the machine's timing).
//!
//! The parts, in the order a run meets them: [`mod@plan`] (the flags and the runs they make),
//! [`world`] (Redis, the sidecars behind their [`proxy`]), then a [`campaign`]: its [`workers`],
//! [`producers`], the [`faults`] ([`refusal`] among them) and the [`auditor`], all writing one
//! [`log`]; the [`quiesce`] that ends it, [`form`] reading back what Redis holds, the
//! [`history`] checker, and the [`mod@report`] ([`admin`] reads the sidecars' own view).

mod admin;
mod auditor;
mod campaign;
mod faults;
mod form;
mod history;
mod log;
mod plan;
mod producers;
mod proxy;
mod quiesce;
mod refusal;
mod report;
mod said;
mod workers;
mod world;

use std::sync::Arc;

use clap::Parser;
use fred::prelude::*;
use parking_lot::Mutex;
use rand::Rng;
use window_sidecar_harness::url_with_auth;

use campaign::{Campaign, end_state};
use form::{AUDIT_GROUP, Form, MAX_DELIVERIES};
use history::Promise;
use plan::{Args, Run, mode, plan, topology};
use report::report;
use world::{Backend, Sidecars, start_backend};

/// One run: one form, one mode, one seed. Returns the number of anomalies.
async fn run(args: &Args, run: Run) -> usize {
    let Run {
        form,
        cluster,
        faults_for,
        ..
    } = run;
    println!(
        "== run: seed {}, {}, {}, {}, {faults_for:?} of faults{}",
        run.seed,
        form.name(),
        mode(run),
        topology(run),
        if form == Form::Partitioned {
            format!(", {} partitions, every worker ordered", form::PARTITIONS)
        } else if form.can_order() {
            format!(", ordered workers: {:?}", run.ordered).to_lowercase()
        } else {
            String::new()
        }
    );
    let backend = start_backend(cluster).await;
    let url = backend.url();
    let admin = match &backend {
        Backend::Single(_) => window_sidecar_harness::connect(&url).await,
        Backend::Cluster(c) => c.client().await,
    };
    let redis = Arc::new(Mutex::new(backend));
    // Retention is by acknowledgement on one stream key: the partitioned form runs without.
    let retain = form == Form::Stream;
    if form.streams() {
        // Both groups before the first publish: retention trims what every group of the
        // stream has acknowledged, and a group made later by the workers' first `open` would
        // find the entries the audit group acknowledged meanwhile gone; and the audit group
        // reads each stream from its start.
        for stream in form.stream_keys() {
            for group in [AUDIT_GROUP, form::GROUP] {
                let _: Result<(), _> = admin.xgroup_create(&stream, group, "0", true).await;
            }
        }
    }
    // The sidecars as a user of their own: the nemesis takes rights from it, never from the
    // campaign's clients.
    let sidecar_url = url_with_auth(&url, Some(refusal::SIDECAR_USER), refusal::SIDECAR_PASSWORD);
    let sidecars = Sidecars::start(&sidecar_url, args.sidecars, cluster, retain).await;
    let campaign = Campaign::start(args, run, &admin, &sidecars, &redis).await;

    tokio::time::sleep(faults_for).await;
    let ended = campaign.wind_down(form, &admin, &sidecars).await;
    let end = end_state(form, &admin, &ended).await;
    let promise = Promise {
        exactly_once: run.atomic && form.at_least_once(),
        max_deliveries: form.max_deliveries().unwrap_or(u32::MAX),
        at_most_once: !form.at_least_once(),
        by_payload: !form.streams(),
        across_group: form == Form::Partitioned,
    };
    let (anomalies, figures) = history::check(&ended.history, &end, promise);
    report(run, &ended, &end, promise, &figures, &anomalies);
    if let Some(dir) = args.keep.as_deref().filter(|_| !anomalies.is_empty()) {
        keep(dir, run, &ended.history, &sidecars.logged());
    }
    let _ = admin.quit().await;
    drop(ended.campaign);
    drop(sidecars);
    anomalies.len()
}

/// Writes a failed run's history, one event per line, and its sidecars' log lines into `dir`.
fn keep(dir: &std::path::Path, run: Run, history: &[history::Stamped], logged: &[String]) {
    let name = format!(
        "{}-{}-{}-{}",
        run.seed,
        run.form.name(),
        mode(run),
        topology(run)
    )
    .replace(' ', "-");
    let events: Vec<String> = history
        .iter()
        .map(|s| format!("{:>8} {:?}", s.at_ms, s.event))
        .collect();
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(dir.join(format!("{name}.history")), events.join("\n")))
        .and_then(|()| std::fs::write(dir.join(format!("{name}.sidecars.log")), logged.join("\n")));
    match written {
        Ok(()) => println!(
            "   kept in {}: {name}.history, {name}.sidecars.log",
            dir.display()
        ),
        Err(e) => println!("   could not keep the run in {}: {e}", dir.display()),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.cluster && args.form.is_some_and(|f| !f.streams()) {
        eprintln!("--cluster runs streams only");
        return std::process::ExitCode::from(2);
    }
    let random = args.seed.unwrap_or_else(|| rand::rng().random());
    let runs = plan(&args, random);
    println!(
        "window-sidecar chaos: seed {random}, {} runs, max_deliveries {MAX_DELIVERIES}",
        runs.len()
    );
    let mut failed = 0;
    for r in &runs {
        if run(&args, *r).await > 0 {
            failed += 1;
        }
    }
    // One check per run: a run passes when its history has no anomaly.
    println!("{} passed, {failed} failed", runs.len() - failed);
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
