//! Waiting for replicas: a read's claim reaches `--wait-replicas` replicas before its entries
//! are delivered.

use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use super::error::RedisError;

/// How many replicas must have a read's claim (the pending entry of a stream, the move to a
/// processing list) before its entries are delivered. Redis replicates asynchronously: without
/// this, a primary that dies right after a read can leave a new primary that never saw the
/// claim and hands the entries out again while the first delivery's transaction also runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}

/// After a WAIT fell short, how long reads wait only for the replicas that did answer before
/// asking for all of them again: a replica that is gone would otherwise cost every read the
/// whole timeout.
const REPLICATION_PROBE: Duration = Duration::from_secs(5);

/// Whether the claims of a reader's last reads reached the replicas in time; says so in the log
/// when that changes.
#[derive(Debug, Default)]
pub struct ReplicationWatch {
    /// Since the last WAIT fell short: how many replicas answered, and until when to ask for
    /// only that many.
    short: Option<(u32, tokio::time::Instant)>,
}

impl ReplicationWatch {
    /// `WAIT` on the reader's own connection (it counts that connection's writes), on the node
    /// of `slot`; `give_up_after`: how long to wait for its reply, if not as long as fred takes
    /// (see [`super::read_connection::ReadConnection::give_up_after`]).
    pub async fn wait(
        &mut self,
        client: &Client,
        slot: u16,
        replication: &Replication,
        give_up_after: Option<Duration>,
    ) -> Result<(), RedisError> {
        let now = tokio::time::Instant::now();
        let wanted = match self.short {
            Some((answered, until)) if now < until => answered,
            _ => replication.replicas,
        };
        if wanted == 0 {
            return Ok(());
        }
        let args = vec![
            Value::Integer(wanted.into()),
            Value::Integer(replication.timeout.as_millis().max(1) as i64),
        ];
        // Never resent: a WAIT that reached a new primary after the old one died would count
        // the new primary's replicas, which never had this read's claims.
        let once = fred::types::config::Options {
            max_attempts: Some(1),
            fail_fast: true,
            timeout: give_up_after,
            cluster_hash: Some(ClusterHash::Custom(slot)),
            ..Default::default()
        };
        let command = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot), true);
        let acked = client
            .with_options(&once)
            .custom::<Value, _>(command, args)
            .await
            .map_err(|e| RedisError::from_fred("WAIT", &e))?
            .as_i64()
            .unwrap_or(0)
            .clamp(0, i64::from(u32::MAX)) as u32;
        if wanted < replication.replicas {
            return Ok(());
        }
        match (acked < wanted, self.short.is_some()) {
            (true, was_short) => {
                if !was_short {
                    tracing::warn!(
                        acked,
                        wanted,
                        "reads are delivered before enough replicas have them; a failover now may deliver them twice"
                    );
                }
                self.short = Some((acked, now + REPLICATION_PROBE));
            }
            (false, true) => {
                tracing::info!("reads reach their replicas again");
                self.short = None;
            }
            (false, false) => {}
        }
        Ok(())
    }
}
