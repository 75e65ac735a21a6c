//! The faults on Redis itself: the keys' node's connections killed or paused, the single node
//! restarted from its AOF, a cluster primary killed for its replica to take over, the keys'
//! slot migrated, and writes refused for a moment ([`crate::refusal`]).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use parking_lot::Mutex;
use rand::Rng;
use rand::rngs::StdRng;
use window_sidecar_harness::slot_of;

use crate::form::{self, Form};
use crate::history::Event;
use crate::log::Log;
use crate::refusal::{self, Refusal};
use crate::world::Backend;

/// A connection to one Redis node (for CLIENT KILL and CLIENT PAUSE, which act on a node).
async fn node_client(port: u16) -> Option<Client> {
    let config = Config::from_url(&format!("redis://127.0.0.1:{port}")).ok()?;
    let client = Builder::from_config(config).build().ok()?;
    tokio::time::timeout(Duration::from_secs(2), client.init())
        .await
        .ok()?
        .ok()?;
    Some(client)
}

/// Has Redis refuse the sidecars' writes for a moment (a refusal on every primary; a key's
/// wrong type on the node that holds it), then undoes it. Logged with its moments, so that the
/// flush reports it touched are counted.
pub(crate) async fn refuse(
    redis: &Arc<Mutex<Backend>>,
    log: &Log,
    form: Form,
    refusal: Refusal,
    rng: &mut StdRng,
) {
    let (primaries, owner) = {
        let redis = redis.lock();
        (redis.primaries(), redis.primary())
    };
    let (key, ports) = match refusal {
        Refusal::WrongTypeDead => (form::DEAD.to_owned(), vec![owner]),
        Refusal::WrongTypeDelayed => (form.delayed_key(), vec![owner]),
        _ => (String::new(), primaries),
    };
    let aside = format!("{key}:aside");
    // Shorter than a consumer lease (2 s) where the sidecars' own bookkeeping is refused too
    // (out of memory, scripts taken away): a lease lost to a refusal would let two sidecars
    // serve one consumer, which no client can tell from a double delivery. A key's type stops
    // only requeue writes, so it may last longer.
    let lasts = Duration::from_millis(match refusal {
        Refusal::WrongTypeDead | Refusal::WrongTypeDelayed => rng.random_range(1_000..3_000),
        Refusal::ScriptFlush => 1_000,
        _ => rng.random_range(500..1_800),
    });
    let name = refusal.name();
    if let Err(e) = refusal::inject(refusal, &ports, (&key, &aside), lasts).await {
        log.push(Event::Fault(format!(
            "refusal-failed {name} on {ports:?}: {e}"
        )));
        return;
    }
    let what = if key.is_empty() {
        format!("{ports:?}")
    } else {
        format!("{key} on {ports:?}")
    };
    log.push(Event::Fault(format!(
        "{name} {what} for {} ms",
        lasts.as_millis()
    )));
    tokio::time::sleep(lasts).await;
    if let Err(e) = refusal::undo(refusal, &ports, (&key, &aside)).await {
        println!("   the nemesis could not undo {name} on {ports:?}: {e}");
        log.push(Event::Fault(format!(
            "undo-failed {name} on {ports:?}: {e}"
        )));
    }
    log.push(Event::Undone(name.to_owned()));
}

/// Kills every normal client connection of the node that owns the campaign's keys.
pub(crate) async fn client_kill(redis: &Arc<Mutex<Backend>>, log: &Log) {
    let port = redis.lock().primary();
    log.push(Event::Fault(format!("client-kill normal on {port}")));
    if let Some(node) = node_client(port).await {
        let _: Result<Value, _> = node
            .custom(
                fred::cmd!("CLIENT"),
                vec!["KILL", "TYPE", "normal", "SKIPME", "yes"],
            )
            .await;
        let _ = node.quit().await;
    }
}

/// Pauses the clients of the node that owns the campaign's keys for `ms`.
pub(crate) async fn client_pause(redis: &Arc<Mutex<Backend>>, log: &Log, ms: u64) {
    let port = redis.lock().primary();
    log.push(Event::Fault(format!("client-pause {ms}ms on {port}")));
    if let Some(node) = node_client(port).await {
        let _: Result<Value, _> = node
            .custom(
                fred::cmd!("CLIENT"),
                vec!["PAUSE".to_owned(), ms.to_string()],
            )
            .await;
        let _ = node.quit().await;
    }
}

/// Migrates the stream's slot to another primary, picked at random (a cluster run).
pub(crate) async fn slot_migrate(redis: &Arc<Mutex<Backend>>, log: &Log, rng: &mut StdRng) {
    let slot = slot_of(form::STREAM);
    let r = Arc::clone(redis);
    let to = {
        let redis = r.lock();
        let Backend::Cluster(c) = &*redis else {
            unreachable!("a cluster run")
        };
        let owner = c.primary_for_slot(slot);
        let others: Vec<u16> = c.primaries().into_iter().filter(|p| *p != owner).collect();
        others[rng.random_range(0..others.len())]
    };
    log.push(Event::Fault(format!("slot-migrate {slot} to {to}")));
    tokio::task::spawn_blocking(move || {
        let redis = r.lock();
        let Backend::Cluster(c) = &*redis else {
            unreachable!("a cluster run")
        };
        c.migrate_slot(slot, to);
    })
    .await
    .expect("migrate");
}

/// Kills the stream's primary, waits for its replica to take over, and restarts it (a cluster
/// run).
pub(crate) async fn primary_kill(redis: &Arc<Mutex<Backend>>, log: &Log) {
    let slot = slot_of(form::STREAM);
    let r = Arc::clone(redis);
    let old = r.lock().primary();
    log.push(Event::Fault(format!(
        "primary-kill {old} (replica takes over)"
    )));
    tokio::task::spawn_blocking(move || {
        let mut redis = r.lock();
        let Backend::Cluster(c) = &mut *redis else {
            unreachable!("a cluster run")
        };
        c.kill(old);
        c.wait_for_failover(slot, old, Duration::from_secs(30));
        c.restart(old);
        // A user made with ACL SETUSER does not survive a restart.
        refusal::create_user(old)
    })
    .await
    .expect("failover")
    .unwrap_or_else(|e| panic!("the sidecars' user on the restarted {old}: {e}"));
}

/// SIGKILLs the single node and restarts it from its AOF after `down_for`.
pub(crate) async fn redis_restart(redis: &Arc<Mutex<Backend>>, log: &Log, down_for: Duration) {
    log.push(Event::Fault("redis-restart (SIGKILL, AOF)".into()));
    let r = Arc::clone(redis);
    tokio::task::spawn_blocking(move || {
        let mut redis = r.lock();
        let Backend::Single(redis) = &mut *redis else {
            unreachable!("a single-node run")
        };
        redis.kill();
        std::thread::sleep(down_for);
        redis.restart();
    })
    .await
    .expect("restart");
}
