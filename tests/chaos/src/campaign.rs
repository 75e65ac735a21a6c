//! A run under way and what it left: the workers, producers, nemesis and audit reader it
//! starts, their wind-down, and the history, records and sidecars' views that the checker and
//! the report read.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admin::SubscriptionState;
use crate::auditor::{audit, retained};
use crate::faults::nemesis;
use crate::form::end_state::add_delivered_roots;
use crate::form::{Fields, Form};
use crate::history::{EndState, Event, Stamped};
use crate::log::Log;
use crate::plan::{Args, Run};
use crate::producers::produce;
use crate::quiesce::{Quiesce, quiesce, subscriptions_closed};
use crate::refusal;
use crate::workers::{Shared, Waits, work};
use crate::world::{Backend, Sidecars};

/// The tasks of a run under way: the workers, the producers, the nemesis and (under
/// retention) the audit group's reader, and what they record into.
pub(crate) struct Campaign {
    pub(crate) shared: Arc<Shared>,
    workers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    workers_stop: Arc<AtomicBool>,
    /// Stops the producers.
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    nemesis_stop: Arc<AtomicBool>,
    nemesis: tokio::task::JoinHandle<()>,
    /// The numbers Redis certainly has.
    published: Arc<Mutex<BTreeSet<u64>>>,
    auditor: Option<tokio::task::JoinHandle<()>>,
    audit_drain: Arc<AtomicBool>,
    audited: Arc<Mutex<Vec<(String, Fields)>>>,
}

/// What a run left once it wound down: its history, what was published and audited, and the
/// sidecars' subscriptions at the end of the quiesce and once the workers stopped.
pub(crate) struct Ended {
    pub(crate) history: Vec<Stamped>,
    published: BTreeSet<u64>,
    audited: Vec<(String, Fields)>,
    retained_after_settling: Option<u64>,
    pub(crate) quiesce: Quiesce,
    pub(crate) at_quiet: Vec<Option<Vec<SubscriptionState>>>,
    pub(crate) after_stop: Vec<Option<Vec<SubscriptionState>>>,
    /// Fetches of parked entries the sidecars up at the quiesce made.
    pub(crate) parked_fetches: u64,
    /// What the sidecars up at the quiesce counted of refusals since they last started.
    pub(crate) refusals_counted: refusal::Counted,
    /// Dropped (with the sidecars it holds) once the run is reported.
    pub(crate) campaign: Campaign,
}

impl Campaign {
    pub(crate) async fn start(
        args: &Args,
        run: Run,
        admin: &Client,
        sidecars: &Arc<Sidecars>,
        redis: &Arc<Mutex<Backend>>,
    ) -> Campaign {
        let form = run.form;
        let log = Arc::new(Log {
            started: Instant::now(),
            events: Mutex::new(Vec::new()),
        });
        let audited = Arc::new(Mutex::new(Vec::new()));
        let audit_drain = Arc::new(AtomicBool::new(false));
        let auditor = form.streams().then(|| {
            tokio::spawn(audit(
                form,
                admin.clone(),
                Arc::clone(&audit_drain),
                Arc::clone(&audited),
                Arc::clone(&log),
            ))
        });
        let workers_stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            run,
            sidecars: Arc::clone(sidecars),
            log,
            stop: Arc::clone(&workers_stop),
            settle: Arc::new(AtomicBool::new(false)),
            streams: AtomicU32::new(0),
            waits: Waits::default(),
        });
        let spawn_worker = {
            let shared = Arc::clone(&shared);
            move |id: u32| tokio::spawn(work(id, Arc::clone(&shared)))
        };
        let workers = Arc::new(Mutex::new(
            (0..worker_count(args, form) as u32)
                .map(&spawn_worker)
                .collect::<Vec<_>>(),
        ));
        // Producers and the nemesis stop first; the workers go on to settle what is left.
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(Mutex::new(BTreeSet::new()));
        if form == Form::Pubsub {
            // Messages published before the worker listens reach nobody.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let producers = spawn_producers(args.rate, form, sidecars, &stop, &published);
        let nemesis_stop = Arc::new(AtomicBool::new(args.no_faults));
        let nemesis = spawn_nemesis(&shared, &nemesis_stop, redis, &workers, spawn_worker);
        Campaign {
            shared,
            workers,
            workers_stop,
            stop,
            producers,
            nemesis_stop,
            nemesis,
            published,
            auditor,
            audit_drain,
            audited,
        }
    }

    /// Producers and the nemesis stop; the workers settle what is left until the run is quiet
    /// (then the audit group reads the rest), then stop, and their subscriptions close.
    pub(crate) async fn wind_down(
        mut self,
        form: Form,
        admin: &Client,
        sidecars: &Sidecars,
    ) -> Ended {
        self.stop.store(true, Ordering::Relaxed);
        self.nemesis_stop.store(true, Ordering::Relaxed);
        (&mut self.nemesis).await.expect("nemesis");
        for p in self.producers.drain(..) {
            p.await.expect("producer");
        }
        // Quiesce: everything still out is acked, until for 2 s Redis has nothing unsettled
        // and no sidecar holds a delivery without an outcome, an ack not yet flushed or a
        // flush. Redis alone is not enough: a simple list's popped entries exist only in their
        // sidecar until settled, and go back to the list when their worker leaves (a slow ack
        // when the quiesce began, a worker that left while its sidecar's blocking read was
        // under way).
        self.shared.log.push(Event::Settling);
        self.shared.settle.store(true, Ordering::Relaxed);
        let quiesce = quiesce(form, admin, sidecars).await;
        let at_quiet = sidecars.subscriptions().await;
        let metrics = sidecars.metrics().await;
        let parked_fetches = parked_fetches(&metrics);
        let mut refusals_counted = refusal::Counted::default();
        for body in &metrics {
            refusals_counted.add(body);
        }
        // The audit group reads the rest while the workers' subscriptions are still open: the
        // trim runs beside them.
        let mut retained_after_settling = None;
        if let Some(auditor) = self.auditor.take() {
            self.audit_drain.store(true, Ordering::Relaxed);
            if tokio::time::timeout(Duration::from_secs(60), auditor)
                .await
                .is_err()
            {
                println!("   the audit group did not catch up within 60 s");
            }
            if form == Form::Stream {
                retained_after_settling = retained(admin).await;
            }
        }
        self.workers_stop.store(true, Ordering::Relaxed);
        for w in self.workers.lock().drain(..) {
            w.abort();
        }
        let after_stop = subscriptions_closed(sidecars).await;
        for event in crate::said::events(&sidecars.logged()) {
            self.shared.log.push(event);
        }
        let history = std::mem::take(&mut *self.shared.log.events.lock());
        let published = std::mem::take(&mut *self.published.lock());
        let audited = std::mem::take(&mut *self.audited.lock());
        Ended {
            history,
            published,
            audited,
            retained_after_settling,
            quiesce,
            at_quiet,
            after_stop,
            parked_fetches,
            refusals_counted,
            campaign: self,
        }
    }
}

/// Pub/sub has one worker: every subscriber of a channel gets every message.
fn worker_count(args: &Args, form: Form) -> usize {
    if form == Form::Pubsub {
        1
    } else {
        args.workers
    }
}

/// The two producers, each numbering its entries from the shared counter, recording into
/// `published` until `stop`.
fn spawn_producers(
    rate: u64,
    form: Form,
    sidecars: &Arc<Sidecars>,
    stop: &Arc<AtomicBool>,
    published: &Arc<Mutex<BTreeSet<u64>>>,
) -> Vec<JoinHandle<()>> {
    let numbers = Arc::new(AtomicU64::new(0));
    (0..2)
        .map(|id| {
            tokio::spawn(produce(
                id,
                form,
                rate,
                Arc::clone(sidecars),
                Arc::clone(stop),
                Arc::clone(&numbers),
                Arc::clone(published),
            ))
        })
        .collect()
}

/// The nemesis, with a share of its own: the workers' log and settle flag, its own stop, and
/// `respawn` for the workers it kills.
fn spawn_nemesis(
    shared: &Shared,
    nemesis_stop: &Arc<AtomicBool>,
    redis: &Arc<Mutex<Backend>>,
    workers: &Arc<Mutex<Vec<JoinHandle<()>>>>,
    respawn: impl Fn(u32) -> JoinHandle<()> + Send + 'static,
) -> JoinHandle<()> {
    let run = shared.run;
    let sidecars = &shared.sidecars;
    let nemesis_shared = Arc::new(Shared {
        run,
        sidecars: Arc::clone(sidecars),
        log: Arc::clone(&shared.log),
        stop: Arc::clone(nemesis_stop),
        settle: Arc::clone(&shared.settle),
        streams: AtomicU32::new(0),
        waits: Waits::default(),
    });
    tokio::spawn(nemesis(
        nemesis_shared,
        Arc::clone(redis),
        Arc::clone(workers),
        respawn,
    ))
}

/// Fetches of entries parked for their ordering key, summed over the sidecars' `/metrics`:
/// that the campaign ran through parking at all.
fn parked_fetches(metrics: &[String]) -> u64 {
    const SERIES: &str = "window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"fetch\"} ";
    metrics
        .iter()
        .flat_map(|body| body.lines())
        .filter_map(|line| line.strip_prefix(SERIES)?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What Redis holds at the end, with the retention measured; for forms known by payload, every
/// value delivered is a root too.
pub(crate) async fn end_state(form: Form, admin: &Client, ended: &Ended) -> EndState {
    let mut end = form
        .end_state(admin, &ended.published, &ended.audited)
        .await;
    end.retained_after_settling = ended.retained_after_settling;
    if !form.streams() {
        add_delivered_roots(
            &mut end,
            ended.history.iter().filter_map(|s| match &s.event {
                Event::Delivered { entry, .. } => Some(entry.clone()),
                _ => None,
            }),
        );
    }
    end
}
