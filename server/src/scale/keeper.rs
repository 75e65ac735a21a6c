//! The keeper: `--keep stream:<key>:<group>` / `--keep list:<key>` (repeatable) makes this
//! sidecar promote the due `retry_after` entries of those keys and sample their backlog and
//! work gauges from startup, whether or not a subscription is open on them; a kept stream under
//! `--ack-retention` is trimmed from startup too. Run without an application, as one small
//! always-on replica, it keeps delayed retries moving, the backlog visible and acknowledged
//! entries leaving while every worker is scaled to zero; it holds no consumer and no lease.
//! Promotion is the delay set's script, which runs alone on the server: keepers and workers'
//! sidecars promoting the same set move each due entry back exactly once.
//!
//! A kept key must be allowed by `--allow-keys` (checked with the configuration, so
//! `--check-config` refuses it too) and, once Redis answers at startup, hold the right type or
//! nothing yet: the stream or list itself, and its delay set a sorted set. Otherwise the
//! sidecar exits with 64 and names the key.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Watch;
use crate::domain::{DEFAULT_DEAD_AFTER, ListSource, Source, StreamSource};
use crate::metrics::FormLabels;
use crate::redis::form::Form;
use crate::redis::{Redis, RedisError, keys};
use crate::session::Shared;
use crate::session::retention::Why;

/// Delayed entries promoted per script call; a full batch is followed by another at once.
const PROMOTE_LIMIT: u32 = 256;
/// How often startup retries the type check while Redis does not answer.
const RETRY: Duration = Duration::from_secs(1);

/// Why a kept key cannot be kept.
#[derive(Debug, Error)]
pub enum KeepError {
    #[error("--keep {spec}: {key:?} holds a {found}, not a {expected} (nor nothing yet)")]
    WrongType {
        spec: String,
        key: String,
        found: String,
        expected: &'static str,
    },
}

/// The source a kept key is promoted and sampled as; `min_idle` decides which pending entries
/// count as reclaimable work.
pub fn source(keep: &Watch, min_idle: Duration) -> Source {
    match keep {
        Watch::Stream { key, group } => Source::Stream(StreamSource {
            key: key.clone(),
            group: group.clone(),
            consumer: String::new(),
            start_id: "0".into(),
            min_idle,
        }),
        Watch::List { key } => Source::List(ListSource {
            key: key.clone(),
            consumer: String::new(),
            dead_after: DEFAULT_DEAD_AFTER,
            reliable: true,
            framing: Default::default(),
        }),
    }
}

/// Checks every kept key's type once Redis answers (retrying every second until then, or
/// until `shutdown`).
pub async fn check_types(
    redis: &Redis,
    keep: &[Watch],
    shutdown: &CancellationToken,
) -> Result<(), KeepError> {
    if keep.is_empty() {
        return Ok(());
    }
    let mut logged = false;
    loop {
        match types_now(redis, keep).await {
            Ok(result) => return result,
            Err(err) => {
                if !logged {
                    warn!(error = %err, "--keep: Redis does not answer yet; the kept keys' types are checked once it does");
                    logged = true;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// Ok(Err(_)): Redis answered and a key is wrong; Err(_): Redis did not answer.
async fn types_now(redis: &Redis, keep: &[Watch]) -> Result<Result<(), KeepError>, RedisError> {
    for kept in keep {
        let source = source(kept, Duration::ZERO);
        let form = Form::new(&source, None);
        let (key, expected, delayed, slot) = match &form {
            Form::Stream(keys) => (&keys.key, "stream", &keys.delayed, keys.slot),
            Form::List(keys) => (&keys.key, "list", &keys.delayed, keys.slot),
            Form::PubSub(_) => continue,
        };
        for (name, expected) in [(key, expected), (delayed, "zset")] {
            let found = keys::key_type(redis.pool(), name, slot).await?;
            if found != "none" && found != expected {
                return Ok(Err(KeepError::WrongType {
                    spec: kept.spec(),
                    key: String::from_utf8_lossy(name).into_owned(),
                    found,
                    expected,
                }));
            }
        }
    }
    Ok(Ok(()))
}

/// Starts keeping `keep`: their gauges are sampled from now on and a task per key promotes its
/// due delayed entries every `every` until the process ends.
pub fn start(shared: &Arc<Shared>, keep: &[Watch], min_idle: Duration, every: Duration) {
    for kept in keep {
        let source = source(kept, min_idle);
        let form = Form::new(&source, None);
        shared.watched.watch(&source, &form);
        if let Watch::Stream { key, .. } = kept {
            shared.retention.register(key, Why::Kept);
        }
        info!(keep = %kept.spec(), "keeping: promoting due delayed entries and sampling the backlog");
        tokio::spawn(promote(Arc::clone(shared), source, form, every));
    }
}

async fn promote(shared: Arc<Shared>, source: Source, form: Form, every: Duration) {
    let labels = FormLabels {
        form: source.form(),
    };
    let promoted = shared.metrics.scale.promoted.get_or_create(&labels).clone();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            match form
                .promote_due(&shared.redis, now_ms(), PROMOTE_LIMIT)
                .await
            {
                Ok(n) => {
                    promoted.inc_by(n);
                    if n > 0 {
                        debug!(promoted = n, "keeper: retry_after entries are due again");
                    }
                    if n < u64::from(PROMOTE_LIMIT) {
                        break;
                    }
                }
                Err(err) => {
                    debug!(error = %err, "keeper: promoting delayed entries failed; will try again");
                    break;
                }
            }
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
