//! A subscription's dedicated connection for its blocking reads, and, on a cluster, the node
//! it reads from.
//!
//! Every key a subscription reads lives in one hash slot, so on a cluster its reads need one
//! node: fred's cluster client would connect to every primary, two idle connections (their
//! tasks, queues and buffers) per subscription on three primaries. The reader connects to the
//! slot's owner alone and follows the slot: after a failed read that may mean the slot is
//! served elsewhere now (`-MOVED`, `-CLUSTERDOWN`, the node unreachable or silent) it asks
//! the pool for the slot map again and moves to the new owner; a migration under way
//! (`-ASK`) hands it to fred's cluster client, which follows `-ASK` with `ASKING`. Its read
//! interrupter follows it through a watch channel.

use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Options, Server};
use tokio::sync::watch;

use super::connection::Redis;
use super::error::RedisError;

/// Where a reader's connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    /// To the deployment as configured: a single node, a sentinel group, or a cluster through
    /// fred's cluster client.
    Deployment,
    /// To the cluster node that owned the subscription's slot when last looked up.
    Pinned(Server),
}

/// What a failed read says about where the subscription's slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moved {
    /// Nothing: the node answered and the slot is still its own.
    No,
    /// Perhaps: the slot has a new owner, or the node is gone (a failover).
    Perhaps,
    /// A migration of the slot is under way: its keys are on two nodes until it ends.
    Migrating,
}

/// One classification of read errors by what they say about the slot.
fn moved(err: &RedisError) -> Moved {
    match err {
        RedisError::Refused { message, .. } if message.starts_with("ASK ") => Moved::Migrating,
        RedisError::Refused { message, .. }
            if message.starts_with("MOVED ") || message.starts_with("CLUSTERDOWN") =>
        {
            Moved::Perhaps
        }
        RedisError::Unavailable(_) | RedisError::Timeout(_) => Moved::Perhaps,
        _ => Moved::No,
    }
}

/// A subscription's dedicated connection for its blocking reads.
pub(crate) struct ReadConnection {
    redis: Redis,
    /// The subscription's hash slot, on a cluster.
    slot: Option<u16>,
    route: Route,
    client: Client,
    /// The current client, for the read interrupter.
    current: watch::Sender<Client>,
}

impl ReadConnection {
    /// Connects for a subscription whose keys live in `slot`: to the slot's owner on a
    /// cluster whose slot map the pool knows, else to the deployment.
    pub(crate) async fn open(redis: &Redis, slot: u16) -> Result<Self, RedisError> {
        let slot = redis.is_cluster().then_some(slot);
        let route = match slot.and_then(|slot| owner(redis.pool(), slot)) {
            Some(node) => Route::Pinned(node),
            None => Route::Deployment,
        };
        let client = connect(redis, &route).await?;
        Ok(Self {
            redis: redis.clone(),
            slot,
            route,
            current: watch::Sender::new(client.clone()),
            client,
        })
    }

    /// The client itself: its events, and commands that carry options of their own.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The client as reads send their commands, `block`: how long a blocking one may wait in
    /// Redis. Pinned, a command fails at once when the connection is down or breaks under it,
    /// and one that was queued while it broke (fred notices only at its first reconnection
    /// attempt) gives up after `block` and the Redis timeout, rather than wait for fred to
    /// reconnect to a node that may be gone for good (a failover): the failed read is what
    /// makes the connection follow the slot.
    pub(crate) fn commands(&self, block: Option<Duration>) -> WithOptions<Client> {
        let options = match self.give_up_after(block.unwrap_or_default()) {
            Some(timeout) => Options {
                fail_fast: true,
                max_attempts: Some(1),
                timeout: Some(timeout),
                ..Default::default()
            },
            None => Options::default(),
        };
        self.client.with_options(&options)
    }

    /// How long a command that may wait `waits` in Redis is waited for (pinned: see
    /// [`ReadConnection::commands`]); `None`: as long as fred takes.
    pub(crate) fn give_up_after(&self, waits: Duration) -> Option<Duration> {
        match self.route {
            Route::Pinned(_) => Some(waits + self.redis.timeout()),
            Route::Deployment => None,
        }
    }

    /// The client a read is blocked on, whichever that is when asked.
    pub(crate) fn current(&self) -> watch::Receiver<Client> {
        self.current.subscribe()
    }

    /// After a failed read: moves the connection where the slot is served now, if that is
    /// elsewhere. Whether it moved (the next read runs on a new connection).
    pub(crate) async fn follow(&mut self, err: &RedisError) -> bool {
        let (Route::Pinned(node), Some(slot)) = (&self.route, self.slot) else {
            return false;
        };
        let route = match moved(err) {
            Moved::No => return false,
            Moved::Migrating => Route::Deployment,
            Moved::Perhaps => {
                // One pool client's map: each client keeps its own.
                let pool = self.redis.pool().clone();
                match tokio::time::timeout(self.redis.timeout(), pool.sync_cluster()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, "the cluster's slot map could not be read again")
                    }
                    Err(_) => tracing::debug!("the cluster's slot map could not be read in time"),
                }
                match owner(&pool, slot) {
                    Some(owner) if owner != *node => Route::Pinned(owner),
                    _ => return false,
                }
            }
        };
        let client = match connect(&self.redis, &route).await {
            Ok(client) => client,
            Err(err) => {
                tracing::debug!(error = %err, "the subscription's slot moved; connecting there failed, tried again after the next failed read");
                return false;
            }
        };
        tracing::info!(
            slot,
            from = %node,
            to = %match &route { Route::Pinned(node) => node.to_string(), Route::Deployment => "the cluster client".to_owned() },
            "the subscription's slot is served elsewhere; its reads follow"
        );
        let old = std::mem::replace(&mut self.client, client);
        self.route = route;
        self.current.send_replace(self.client.clone());
        // The old node may be gone: its QUIT waits out a timeout, which no read should.
        tokio::spawn(async move {
            let _ = old.quit().await;
        });
        true
    }

    pub(crate) async fn close(self) {
        let _ = self.client.quit().await;
    }
}

/// The node that owns `slot` in a pool client's slot map.
fn owner(pool: &Client, slot: u16) -> Option<Server> {
    pool.cached_cluster_state()
        .and_then(|state| state.get_server(slot).cloned())
}

async fn connect(redis: &Redis, route: &Route) -> Result<Client, RedisError> {
    match route {
        Route::Deployment => redis.dedicated_client(None).await,
        Route::Pinned(node) => redis.dedicated_client(Some(node.clone())).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str) -> RedisError {
        RedisError::Refused {
            command: "XREADGROUP".into(),
            message: message.into(),
        }
    }

    #[test]
    fn what_a_failed_read_says_about_the_slot() {
        let cases = [
            (refused("MOVED 3999 127.0.0.1:7001"), Moved::Perhaps),
            (refused("CLUSTERDOWN The cluster is down"), Moved::Perhaps),
            (refused("ASK 3999 127.0.0.1:7001"), Moved::Migrating),
            (
                RedisError::Unavailable("connection reset".into()),
                Moved::Perhaps,
            ),
            (RedisError::Timeout("XREADGROUP".into()), Moved::Perhaps),
            (refused("NOGROUP No such key"), Moved::No),
            (refused("WRONGTYPE Operation against a key"), Moved::No),
            (refused("ASKING is not a redirection"), Moved::No),
        ];
        for (err, expected) in cases {
            assert_eq!(moved(&err), expected, "{err}");
        }
    }
}
