//! An ordered stream's read lane: its reads under a backlog, written in the order asked on one
//! connection, so that they take entries in that order.

use std::sync::Arc;
use std::task::Poll;

use futures::StreamExt;
use futures::future::Either;
use tokio::sync::mpsc;

use super::{Flushed, ReadAhead, UNKNOWN_FLUSH_BARRIER};
use crate::engine::LaneReadId;
use crate::metrics::RoundTripLabels;
use crate::redis::Redis;
use crate::redis::flush::{FlushConnection, Planned};
use crate::redis::stream;
use crate::session::shared::Shared;

/// A read the engine asked of an ordered stream's read lane.
pub(in crate::session) struct LaneRead {
    pub id: LaneReadId,
    pub read: Planned,
}

/// Runs an ordered stream's reads under a backlog, each sent as it
/// comes on the connection of the reads still out, and reports them in the order asked. One
/// connection runs its commands in the order they were written, so the reads take entries in
/// the order asked: what keeps a key's entries in order (see Ordering keys in design.md).
/// With none out, the next goes on the pool's next connection that is up. While Redis runs
/// one read, this task takes the last one's reply apart.
pub(in crate::session) async fn read_lane(
    redis: Redis,
    shared: Arc<Shared>,
    form: &'static str,
    mut jobs: mpsc::UnboundedReceiver<LaneRead>,
    reports: mpsc::UnboundedSender<Flushed>,
) {
    let round_trips = shared
        .metrics
        .round_trips
        .get_or_create(&RoundTripLabels { form, kind: "read" })
        .clone();
    // A lost read is settled on the connection it went on.
    let report = |(id, read, connection): (LaneReadId, ReadAhead, FlushConnection)| {
        if matches!(read, Err((_, true))) {
            let reports = reports.clone();
            tokio::spawn(async move {
                connection.settle_unknown(UNKNOWN_FLUSH_BARRIER).await;
                let _ = reports.send(Flushed::ReadSettled(id));
            });
        }
        reports.send(Flushed::Read(id, read)).is_ok()
    };
    let read = |job: LaneRead, connection: &FlushConnection| {
        let (connection, redis) = (connection.clone(), &redis);
        round_trips.inc();
        async move {
            let reply = connection.read(redis, &job.read).await;
            (job.id, stream::read_ahead_reply(reply), connection)
        }
    };
    let mut connection = FlushConnection::next(&redis);
    let mut out = futures::stream::FuturesOrdered::new();
    loop {
        tokio::select! {
            job = jobs.recv() => {
                let Some(job) = job else { break };
                if out.is_empty() {
                    // No read out to stay behind: the pool's next connection that is up.
                    connection = FlushConnection::next(&redis);
                }
                if !connection.is_connected() {
                    // Reads waiting for the connection to come back could then be written in
                    // either order: until it is, one at a time.
                    while let Some(done) = out.next().await {
                        if !report(done) {
                            return;
                        }
                    }
                    if !report(read(job, &connection).await) {
                        return;
                    }
                    continue;
                }
                // Polled once now, so that fred writes it behind the reads before it.
                let mut started = Box::pin(read(job, &connection));
                match futures::poll!(started.as_mut()) {
                    Poll::Ready(done) => out.push_back(Either::Left(std::future::ready(done))),
                    Poll::Pending => out.push_back(Either::Right(started)),
                }
            }
            Some(done) = out.next(), if !out.is_empty() => {
                if !report(done) {
                    return;
                }
            }
        }
    }
    // The subscription is gone; what it left out still runs, and is still settled if lost.
    while let Some(done) = out.next().await {
        report(done);
    }
}
