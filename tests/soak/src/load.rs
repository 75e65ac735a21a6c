//! The load's phases: every subscription opened before its producers start, the load sampled
//! for its length, then drained (producers stop, the clients settle what is left, every
//! subscription closes).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use fred::prelude::*;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::observe::{state, window_keys};
use crate::plan::{DEADLINE, SAMPLE_EVERY, SUBSCRIPTIONS, Target, plan};
use crate::producers::producer;
use crate::samples::{Sample, print_header, print_sample, sample};
use crate::stop::fail_fast;
use crate::tally::Global;
use crate::workers::subscription;
use crate::world::Rig;

/// The subscriptions and producers under way, and what they share.
pub(crate) struct Load {
    pub(crate) targets: Vec<Arc<Target>>,
    pub(crate) global: Arc<Global>,
    stop_subs: watch::Sender<bool>,
    sub_tasks: Vec<JoinHandle<()>>,
    stop_producers: watch::Sender<bool>,
    producer_tasks: Vec<JoinHandle<()>>,
}

/// How long each phase after the load took.
pub(crate) struct Phases {
    pub(crate) load_secs: f64,
    pub(crate) settle_secs: f64,
    pub(crate) close_secs: f64,
}

impl Load {
    /// Opens every subscription, then starts the producers (pub/sub hears only what is
    /// published after it subscribed).
    pub(crate) async fn open(rig: &Rig) -> Load {
        let (targets, subs) = plan();
        let global = Arc::new(Global::default());
        let (stop_subs, stop_rx) = watch::channel(false);
        let mut sub_tasks: Vec<JoinHandle<()>> = subs
            .into_iter()
            .map(|sub| {
                tokio::spawn(subscription(
                    rig.listen.clone(),
                    sub,
                    Arc::clone(&global),
                    stop_rx.clone(),
                ))
            })
            .collect();
        let deadline = Instant::now() + DEADLINE;
        while global.opened.load(Relaxed) < SUBSCRIPTIONS as u64 {
            fail_fast(&mut sub_tasks).await;
            assert!(
                Instant::now() < deadline,
                "only {} of {SUBSCRIPTIONS} subscriptions opened",
                global.opened.load(Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (stop_producers, producers_rx) = watch::channel(false);
        let producer_tasks: Vec<JoinHandle<()>> = targets
            .iter()
            .map(|t| {
                tokio::spawn(producer(
                    Arc::clone(t),
                    rig.producers_redis.clone(),
                    rig.listen.clone(),
                    producers_rx.clone(),
                ))
            })
            .collect();
        Load {
            targets,
            global,
            stop_subs,
            sub_tasks,
            stop_producers,
            producer_tasks,
        }
    }

    /// The load for `soak`, sampled every `SAMPLE_EVERY` (and once at its end); a subscription
    /// task's panic ends it early.
    pub(crate) async fn run(&mut self, rig: &Rig, soak: Duration) -> (Vec<Sample>, f64) {
        let started = Instant::now();
        let mut samples: Vec<Sample> = Vec::new();
        print_header();
        loop {
            let s = sample(
                started,
                samples.last(),
                &rig.sidecar,
                &rig.inspect,
                &rig.metrics_addr,
                &self.targets,
            )
            .await;
            print_sample(&s);
            samples.push(s);
            let elapsed = started.elapsed();
            if elapsed >= soak {
                break;
            }
            let next = (SAMPLE_EVERY * samples.len() as u32).min(soak);
            let wake = Instant::now() + next.saturating_sub(elapsed);
            while Instant::now() < wake {
                fail_fast(&mut self.sub_tasks).await;
                tokio::time::sleep(
                    wake.saturating_duration_since(Instant::now())
                        .min(Duration::from_secs(1)),
                )
                .await;
            }
        }
        (samples, started.elapsed().as_secs_f64())
    }

    /// Producers stop; the clients go on until everything produced is settled; then every
    /// subscription closes (half-close, then the stream ends).
    pub(crate) async fn drain(&mut self, rig: &Rig, load_secs: f64) -> Phases {
        self.stop_producers.send(true).expect("producers listen");
        for task in self.producer_tasks.drain(..) {
            task.await.expect("a producer");
        }
        let quiet = Instant::now();
        wait_until_settled(&rig.inspect, &self.targets, &mut self.sub_tasks).await;
        let settle_secs = quiet.elapsed().as_secs_f64();

        let closing = Instant::now();
        self.stop_subs.send(true).expect("subscriptions listen");
        for task in self.sub_tasks.drain(..) {
            task.await.expect("a subscription task");
        }
        Phases {
            load_secs,
            settle_secs,
            close_secs: closing.elapsed().as_secs_f64(),
        }
    }
}

/// Waits until every entry produced has been acked or dropped, its side effects are in Redis
/// and nothing is pending or waiting in a list (clients keep answering meanwhile).
async fn wait_until_settled(
    inspect: &Client,
    targets: &[Arc<Target>],
    sub_tasks: &mut [JoinHandle<()>],
) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        fail_fast(sub_tasks).await;
        let mut open = Vec::new();
        for target in targets {
            let s = state(inspect, target).await;
            if !s.settled() {
                open.push((target.name.clone(), s));
            }
        }
        if open.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not everything produced was settled {} s after the producers stopped: {open:#?}\nsidecar bookkeeping: {:#?}",
            DEADLINE.as_secs(),
            window_keys(inspect).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
