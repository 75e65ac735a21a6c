//! The sidecar once every subscription closed: what its metrics and admin view still show,
//! its connections, file descriptors and threads, and the commands it sends Redis while idle.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fred::prelude::*;

use crate::observe::{Rest, at_rest, commands_run, leftovers};
use crate::plan::DEADLINE;
use crate::world::Rig;

/// How long the idle sidecar is watched for commands after every subscription closed: more
/// than two of its 5 s gauge samples, its promote and reclaim intervals and health checks.
pub(crate) const IDLE_LOOK: Duration = Duration::from_secs(12);

/// The sidecar once every subscription closed: what the metrics and admin view still show,
/// its connections, fds and threads, and what it sends to Redis.
pub(crate) struct AfterRest {
    pub(crate) leftover: Vec<String>,
    pub(crate) rest: Rest,
    pub(crate) idle_commands: BTreeMap<String, u64>,
    pub(crate) rss: u64,
}

impl AfterRest {
    /// Waits (up to `DEADLINE`) for the admin view and gauges to empty and for the sidecar to
    /// be back to its baseline, then watches the commands it sends for `IDLE_LOOK`.
    pub(crate) async fn observe(rig: &Rig) -> AfterRest {
        let deadline = Instant::now() + DEADLINE;
        let leftover = loop {
            let leftover = leftovers(&rig.metrics_addr).await;
            if leftover.is_empty() || Instant::now() >= deadline {
                break leftover;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let deadline = Instant::now() + DEADLINE;
        let rest = loop {
            let now = at_rest(&rig.sidecar, &rig.inspect).await;
            if now == rig.baseline || Instant::now() >= deadline {
                break now;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        // A task left running (a reader or promoter) would go on sending commands: with no
        // subscription open, the sidecar only pings and samples the backlog.
        let _: Value = rig
            .inspect
            .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
            .await
            .expect("CONFIG RESETSTAT");
        tokio::time::sleep(IDLE_LOOK).await;
        let idle_commands = commands_run(&rig.inspect).await;
        AfterRest {
            leftover,
            rest,
            idle_commands,
            rss: rig.sidecar.rss_kib(),
        }
    }
}
