//! Subscriptions: [`run`] takes one Subscribe stream from its `open` to its end. The messages
//! between the gRPC layer and a subscription are in [`messages`], what all subscriptions share
//! (and the consumer names they hold) in [`shared`]. The task that runs a subscription's engine
//! is in [`subscription`], the tasks that read and flush beside it in [`io`]; what
//! operators see of it (admin view, spans) is in [`observe`], the backlog and work gauges of
//! every key it served (and every key watched or kept) in [`sampler`], the trim of every stream
//! under retention by acknowledgement in [`retention`]. A partitioned stream's Subscribe stream
//! is a replica ([`partitioned`]), which runs a subscription per partition it reads.
//!
//! This file is the top of the module and none of its parts uses it: they build on each other
//! from the bottom up (the messages, observe, the sampling and retention jobs with their
//! registries; then what is shared, which holds those registries; then the I/O tasks and the
//! subscription), so what they share lives in them, re-exported here as the session's API.

mod io;
mod messages;
mod observe;
mod partitioned;
pub mod retention;
pub mod sampler;
mod shared;
mod subscription;

pub use messages::{
    ClientBatch, ClientMessage, Event, Inbound, InboundError, OpenRequest, Opened, SessionError,
    SettleRequest,
};
pub use observe::{MemberView, SubscriptionView, Waiting};
pub use shared::{Settings, Shared};
// For the subscription's parts, which name them through this module.
use messages::Outbound;
use shared::{Release, Wanted, take_consumer, take_lease};

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{Stream, StreamExt};
use tracing::{Instrument, debug, info_span};

use crate::domain::Source;
use crate::policy::{Policy, PolicyError};
use subscription::{Placement, Subscription};

/// Runs one subscription until the client leaves or shutdown completes.
pub async fn run(
    shared: Arc<Shared>,
    mut inbound: impl Stream<Item = Inbound> + Unpin,
    out: Outbound,
) {
    let open = tokio::select! {
        first = inbound.next() => match first {
            Some(Ok(ClientMessage::Open(open))) => open,
            Some(Ok(ClientMessage::Batch(_))) => return fail(&out, SessionError::NotOpened).await,
            Some(Err(InboundError::Invalid(msg))) => return fail(&out, SessionError::InvalidRequest(msg)).await,
            Some(Err(InboundError::TooLarge(msg))) => return fail(&out, SessionError::TooLarge(msg)).await,
            Some(Err(InboundError::Transport(_))) | None => return,
        },
        () = shared.shutdown.cancelled() => return fail(&out, SessionError::ShuttingDown).await,
    };
    let id = format!("sub-{}", shared.next_id.fetch_add(1, Ordering::Relaxed));
    let mut source = open.source.clone();
    if let Some(consumer) = source.consumer_mut().filter(|c| c.is_empty()) {
        *consumer = shared.settings.default_consumer.clone();
    }
    if let Err(err) = check_policy(&shared.settings.policy, &source, &open) {
        return fail(&out, err.into()).await;
    }
    let (key, group, consumer) = source.describe();
    let span = info_span!("subscription", id = %id, form = source.form(), key = %key, group = %group, consumer = %consumer);
    async move {
        if let (Source::Stream(stream), partitions @ 1..) = (&source, open.partitions) {
            // The replica's own name, held here so that two streams of one sidecar do not
            // both claim to be it; each partition's consumer name is held by its reader.
            let claim = source.claim().expect("a stream has a consumer");
            let _release = match take_consumer(&shared, &claim, Wanted::ByClient).await {
                Ok(()) => Release(Arc::clone(&shared), claim),
                Err(busy) => return fail(&out, busy).await,
            };
            debug!(partitions, "reading a partitioned stream");
            return partitioned::run(shared.clone(), id, stream.clone(), open, inbound, out).await;
        }
        let release = match source.claim() {
            Some(claim) => match take_consumer(&shared, &claim, Wanted::ByClient).await {
                Ok(()) => Some(Release(Arc::clone(&shared), claim)),
                Err(busy) => return fail(&out, busy).await,
            },
            None => None,
        };
        match Subscription::open(
            &shared,
            id,
            source,
            open,
            &out,
            release,
            Placement::alone(&shared),
        )
        .await
        {
            Ok(subscription) => {
                // The subscription holds its own sender: the client's stream ends when it says.
                drop(out);
                subscription.run(inbound).await;
            }
            Err(err) => fail(&out, err).await,
        }
    }
    .instrument(span)
    .await
}

/// The keys and channels a subscription reads and dead-letters to must be allowed. Its own
/// companion keys (processing lists, delay set) are the sidecar's and need no pattern.
fn check_policy(policy: &Policy, source: &Source, open: &OpenRequest) -> Result<(), PolicyError> {
    match source {
        Source::Stream(stream) if open.partitions > 0 => {
            for partition in 0..open.partitions {
                let key = crate::partition::stream_key(&stream.key, partition);
                policy.check_key(key.as_bytes())?;
            }
        }
        Source::Stream(stream) => policy.check_key(stream.key.as_bytes())?,
        Source::List(list) => policy.check_key(list.key.as_bytes())?,
        Source::PubSub(pubsub) => {
            for channel in pubsub
                .channels
                .iter()
                .chain(&pubsub.patterns)
                .chain(&pubsub.sharded_channels)
            {
                policy.check_channel(channel.as_bytes())?;
            }
        }
    }
    match &open.dead_letter {
        Some(target) => policy.check_key(target.as_bytes()),
        None => Ok(()),
    }
}

async fn fail(out: &Outbound, err: SessionError) {
    debug!(error = %err, "ending the subscription stream");
    let _ = out.send(Err(err)).await;
}
