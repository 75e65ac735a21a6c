//! The producers: two tasks publishing numbered entries through the sidecars at a steady
//! rate, recording the numbers Redis certainly has.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::form::Form;
use crate::world::{Sidecars, client};

/// Publishes numbered entries through the sidecars until `stop`, going on to another sidecar
/// when one does not answer. Each attempt takes a new number: an unanswered publish may have
/// been written, and no two written entries share a number. Records the numbers Redis
/// certainly has.
pub(crate) async fn produce(
    id: usize,
    form: Form,
    rate: u64,
    sidecars: Arc<Sidecars>,
    stop: Arc<AtomicBool>,
    n: Arc<AtomicU64>,
    published: Arc<Mutex<BTreeSet<u64>>>,
) {
    let every = Duration::from_micros(1_000_000 / rate.max(1));
    let mut tick = tokio::time::interval(every);
    let mut target = id;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        loop {
            let number = n.fetch_add(1, Ordering::Relaxed);
            if let Some(mut client) = client(&sidecars.addr(target)).await {
                let answered =
                    tokio::time::timeout(Duration::from_secs(3), form.publish(&mut client, number))
                        .await;
                if let Ok(Ok(certain)) = answered {
                    if certain {
                        published.lock().insert(number);
                    }
                    break;
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            target += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
