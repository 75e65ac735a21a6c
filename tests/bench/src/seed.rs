//! The seed in process: a service built on ruststream-fred, the library the sidecar grew from,
//! consuming the bench stream through its pipelined window in the bench process.
//!
//! The handler takes one read's entries at a time (a batch mount of COUNT entries is one
//! XREADGROUP COUNT n and one segment of the `.pipeline()` window), queues an INCR per entry into
//! the window and acknowledges them; the window sends the INCRs and one XACK in one pipeline once
//! the batch has settled. The seed shows a handler nothing of that flush, so the bench learns of
//! it from the outcome's `and_after` continuation, which the runtime spawns once the settle that
//! sent the flush has its replies.

use std::convert::Infallible;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use ruststream_fred::context::keys;
use ruststream_fred::prelude::{
    AppInfo, Ctx, FromRef, HandlerOutcome, RedisBroker, RedisPipelineSteps, RedisStream,
    RustStream, State, SubscriberSettings, subscriber,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::ClientOutcome;
use crate::workload::{CONSUMER, GROUP, Payload, STREAM, now_us};

/// The connections the seed's broker shares for settles and handler commands (its default);
/// the subscription reads on one more of its own.
const POOL_SIZE: usize = 4;

/// What the handler and its continuations count, shared with the bench.
#[derive(Clone)]
pub(crate) struct Tally(Arc<TallyInner>);

struct TallyInner {
    latency: bool,
    expect: u64,
    outcome: Mutex<ClientOutcome>,
    done: Notify,
}

impl FromRef<Tally> for Tally {
    fn from_ref(state: &Tally) -> Self {
        state.clone()
    }
}

impl Tally {
    fn new(expect: u64, latency: bool) -> Self {
        Self(Arc::new(TallyInner {
            latency,
            expect,
            outcome: Mutex::default(),
            done: Notify::new(),
        }))
    }

    /// A read's entries settled: their flush has its replies.
    fn settled(&self, arrived: u64, sent: &[u64], n: usize) {
        let now = now_us();
        let mut out = self.0.outcome.lock().expect("the tally");
        out.sample(now, arrived, sent, n, self.0.latency);
        out.reads += 1;
        // The read that delivered the entries and the flush that settled them.
        out.round_trips += 2;
        out.acked += n as u64;
        if out.acked >= self.0.expect && out.done_at.is_none() {
            out.done_at = Some(Instant::now());
            self.0.done.notify_one();
        }
    }

    fn take(&self) -> ClientOutcome {
        std::mem::take(&mut *self.0.outcome.lock().expect("the tally"))
    }
}

/// One read's entries: an INCR each into the window, then the acknowledgement.
#[subscriber(
    RedisStream::new(STREAM)
        .group(GROUP)
        .consumer(CONSUMER)
        .block(Duration::from_secs(1))
)]
async fn consume(
    entries: &[Payload],
    Ctx(pipeline): Ctx<keys::Pipeline>,
    State(tally): State<Tally>,
) -> HandlerOutcome {
    let arrived = now_us();
    let mut sent = Vec::with_capacity(if tally.0.latency { entries.len() } else { 0 });
    for entry in entries {
        if pipeline.incr(entry.counter_key()).await.is_err() {
            return HandlerOutcome::retry();
        }
        if tally.0.latency {
            sent.push(entry.ts);
        }
    }
    let n = entries.len();
    HandlerOutcome::ack().and_after(async move { tally.settled(arrived, &sent, n) })
}

pub(crate) struct SeedApp {
    pool: Pool,
    count: NonZeroUsize,
}

impl SeedApp {
    /// Connects the broker's pool, as a service that built its own would (the subscription's
    /// read connection opens with the app).
    pub(crate) async fn connect(url: &str, count: usize) -> Result<Self, String> {
        let config = Config::from_url(url).map_err(|e| format!("redis url: {e}"))?;
        let pool = Builder::from_config(config)
            .build_pool(POOL_SIZE)
            .map_err(|e| format!("fred pool: {e}"))?;
        pool.init()
            .await
            .map_err(|e| format!("connect to redis: {e}"))?;
        let count = NonZeroUsize::new(count).ok_or("a batch of no entries")?;
        Ok(Self { pool, count })
    }

    /// Starts the service and waits until its continuations have seen `expect` entries
    /// settled, then shuts it down.
    pub(crate) async fn run(self, expect: u64, latency: bool) -> Result<ClientOutcome, String> {
        let tally = Tally::new(expect, latency);
        let state = tally.clone();
        let app = RustStream::new(AppInfo::new("window-sidecar-bench", "0.1.0"))
            .on_startup(async move |()| Ok::<_, Infallible>(state))
            .with_broker(RedisBroker::from_pool(self.pool), |b| {
                b.include(consume.batch(self.count).pipeline());
            });
        let running = app.start().await.map_err(|e| format!("the app: {e}"))?;
        tokio::select! {
            () = tally.0.done.notified() => {}
            () = running.stopping() => {}
        }
        let done = tally.0.outcome.lock().expect("the tally").done_at.is_some();
        running
            .shutdown()
            .await
            .map_err(|e| format!("the app's shutdown: {e}"))?;
        if !done {
            return Err("the app stopped before every entry was settled".into());
        }
        Ok(tally.take())
    }
}
