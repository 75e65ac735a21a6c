//! The nemesis: what is injected and when. Every 1 to 3 s, from a generator seeded by the
//! run's seed, it picks one fault: a sidecar killed or terminated and restarted, a worker
//! killed, a sidecar's connections cut, and the faults on Redis ([`redis`]) and through the
//! dead-letter service ([`mod@redrive`]).

mod redis;
mod redrive;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use self::redis::{client_kill, client_pause, primary_kill, redis_restart, refuse, slot_migrate};
use self::redrive::redrive;
use crate::form::Form;
use crate::history::Event;
use crate::log::Log;
use crate::refusal::Refusal;
use crate::workers::Shared;
use crate::world::{Backend, Sidecars};

/// The faults, one every 1 to 3 s until `stop`.
pub(crate) async fn nemesis(
    shared: Arc<Shared>,
    redis: Arc<Mutex<Backend>>,
    workers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    respawn: impl Fn(u32) -> tokio::task::JoinHandle<()>,
) {
    let Shared {
        sidecars,
        log,
        stop,
        ..
    } = &*shared;
    let cluster = shared.run.cluster;
    let mut rng = StdRng::seed_from_u64(shared.run.seed ^ 0x6e656d65);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let sidecar = rng.random_range(0..sidecars.ports.len());
        let down_for = Duration::from_millis(rng.random_range(200..1_500));
        match rng.random_range(0..130) {
            0..20 => bounce_sidecar(sidecars, log, sidecar, false, down_for).await,
            20..32 => bounce_sidecar(sidecars, log, sidecar, true, down_for).await,
            32..48 => {
                let mut handles = workers.lock();
                let w = rng.random_range(0..handles.len());
                log.push(Event::Fault(format!("kill worker-{w}")));
                handles[w].abort();
                handles[w] = respawn(w as u32);
            }
            48..60 => {
                let cut = sidecars.proxies[sidecar].cut();
                log.push(Event::Fault(format!(
                    "tcp-cut sidecar-{sidecar} ({cut} connections)"
                )));
            }
            60..72 => client_kill(&redis, log).await,
            72..84 => {
                let ms = rng.random_range(200..1_500u64);
                client_pause(&redis, log, ms).await;
            }
            84..90 if shared.run.form.streams() => {
                redrive(shared.run.form, &sidecars.addr(sidecar), log).await;
            }
            84..92 if cluster => slot_migrate(&redis, log, &mut rng).await,
            // Redis refusing the sidecars' writes for a moment.
            100..130 => {
                let refusal = match rng.random_range(100..130) {
                    100..106 => Refusal::Oom,
                    106..109 => Refusal::AclWrites,
                    109..112 => Refusal::AclScripts,
                    // Pub/sub has no dead letter.
                    112..115 if shared.run.form != Form::Pubsub => Refusal::WrongTypeDead,
                    112..118 => Refusal::WrongTypeDelayed,
                    118..123 => Refusal::ScriptFlush,
                    _ => Refusal::PauseWrite,
                };
                refuse(&redis, log, shared.run.form, refusal, &mut rng).await;
            }
            _ if cluster => primary_kill(&redis, log).await,
            _ => redis_restart(&redis, log, down_for).await,
        }
    }
}

/// Takes sidecar `i` out for `down_for` (SIGTERM and its drain when `graceful`, else SIGKILL)
/// and starts it again.
async fn bounce_sidecar(
    sidecars: &Arc<Sidecars>,
    log: &Log,
    i: usize,
    graceful: bool,
    down_for: Duration,
) {
    let signal = if graceful { "sigterm" } else { "sigkill" };
    log.push(Event::Fault(format!("{signal} sidecar-{i}")));
    let s = Arc::clone(sidecars);
    tokio::task::spawn_blocking(move || s.bounce(i, graceful, down_for))
        .await
        .expect("bounce");
}
