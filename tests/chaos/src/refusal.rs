//! Redis refusing the sidecars' writes: the nemesis's faults that make Redis answer a write with
//! an error instead of taking it (out of memory, an ACL without the command, a key of the wrong
//! type, scripts gone, writes paused), each for a moment and then undone. On a cluster each is
//! applied to every primary by its port, so whichever node holds the keys refuses; a key's wrong
//! type only to the node that holds it.
//!
//! The sidecars connect as a user of their own ([`SIDECAR_USER`]), so an ACL flip hits them
//! alone: the campaign's own clients (the checker, the audit group's reader, the nemesis) stay
//! on `default`.

use std::time::Duration;

use window_sidecar_harness::resp;

/// The sidecars' Redis user, with every right until the nemesis takes some away.
pub(crate) const SIDECAR_USER: &str = "chaos-sidecar";
pub(crate) const SIDECAR_PASSWORD: &str = "chaos-sidecar-pw";
/// The user's rules at rest: every key, channel and command.
const RULES: [&str; 4] = ["~*", "&*", "+@all", "on"];

/// `redis-server` arguments that make the user at start-up (and at every restart, which a user
/// made with `ACL SETUSER` would not survive).
pub(crate) fn user_args() -> Vec<String> {
    let mut args = vec![
        "--user".to_owned(),
        SIDECAR_USER.to_owned(),
        format!(">{SIDECAR_PASSWORD}"),
    ];
    args.extend(RULES.iter().map(|r| r.to_string()));
    args
}

/// Makes the sidecars' user on the node on `port` (a cluster node, which has no start-up
/// arguments of the campaign's; or one restarted, which forgot it).
pub(crate) fn create_user(port: u16) -> Result<(), String> {
    let mut args = vec![
        "ACL".to_owned(),
        "SETUSER".to_owned(),
        SIDECAR_USER.to_owned(),
        "reset".to_owned(),
        format!(">{SIDECAR_PASSWORD}"),
    ];
    args.extend(RULES.iter().map(|r| r.to_string()));
    resp::call(port, &args).map(drop)
}

/// The commands the `acl-writes` flip takes from the sidecars: every requeue write (a copy, a
/// delay-set member, a dead letter) and the producers' publishes. `acl-scripts` takes the
/// scripts too, so the requeue step is refused whole.
const ACL_WRITES: [&str; 4] = ["-xadd", "-zadd", "-lpush", "-rpush"];
const ACL_SCRIPTS: [&str; 2] = ["-evalsha", "-eval"];

/// One kind of refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `maxmemory 1` under `noeviction`: every write that may grow memory is refused (`OOM`).
    Oom,
    /// The sidecars' user loses XADD, ZADD, LPUSH and RPUSH (`NOPERM` inside the scripts).
    AclWrites,
    /// ... and EVAL and EVALSHA (`NOPERM` for the script itself).
    AclScripts,
    /// The dead-letter key holds a string (`WRONGTYPE` for every dead letter).
    WrongTypeDead,
    /// The delay set holds a string (`WRONGTYPE` for every retry_after and promotion).
    WrongTypeDelayed,
    /// `SCRIPT FLUSH`: the next EVALSHA of each script gets `NOSCRIPT`.
    ScriptFlush,
    /// `CLIENT PAUSE <ms> WRITE`: writes (and scripts that write) are held, reads go on.
    PauseWrite,
}

impl Refusal {
    /// The kinds, for the report (each is the first word of its fault's name).
    pub(crate) const KINDS: [&'static str; 7] = [
        "oom",
        "acl-writes",
        "acl-scripts",
        "wrongtype-dead",
        "wrongtype-delayed",
        "script-flush",
        "pause-write",
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::Oom => Self::KINDS[0],
            Refusal::AclWrites => Self::KINDS[1],
            Refusal::AclScripts => Self::KINDS[2],
            Refusal::WrongTypeDead => Self::KINDS[3],
            Refusal::WrongTypeDelayed => Self::KINDS[4],
            Refusal::ScriptFlush => Self::KINDS[5],
            Refusal::PauseWrite => Self::KINDS[6],
        }
    }
}

/// Moves `key` aside to `aside` (when it exists) and writes a string in its place.
/// Refused while an earlier clobber's contents still wait aside.
const CLOBBER: &str = "if redis.call('EXISTS', KEYS[2]) == 1 then \
     return redis.error_reply('ERR the aside key is taken') end \
     if redis.call('EXISTS', KEYS[1]) == 1 then \
     redis.call('RENAME', KEYS[1], KEYS[2]) end \
     redis.call('SET', KEYS[1], 'clobbered by the fault campaign') return 1";
/// Deletes the string and moves what was there back: exactly what was there, and nothing the
/// sidecars could have written meanwhile (every write to a string of theirs was refused).
const RESTORE: &str = "if redis.call('TYPE', KEYS[1])['ok'] == 'string' then \
     redis.call('DEL', KEYS[1]) end \
     if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 1 then \
     redis.call('RENAME', KEYS[2], KEYS[1]) end \
     return 1";

/// One command on each of `ports` (on a fresh connection, off the runtime's threads); the
/// first error, if any.
async fn on_each(ports: &[u16], args: Vec<String>) -> Result<(), String> {
    let ports = ports.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut first = Ok(());
        for port in ports {
            if let Err(e) = resp::call(port, &args) {
                first = first.and(Err(format!("{port}: {e}")));
            }
        }
        first
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
}

fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Injects `refusal` on `ports` (the keys' owner for a key's type): what it did, or why not.
/// `key` and `aside`: the key whose type a `WrongType…` changes, and where its contents wait.
pub(crate) async fn inject(
    refusal: Refusal,
    ports: &[u16],
    (key, aside): (&str, &str),
    pause: Duration,
) -> Result<(), String> {
    match refusal {
        Refusal::Oom => {
            on_each(
                ports,
                words(&[
                    "CONFIG",
                    "SET",
                    "maxmemory-policy",
                    "noeviction",
                    "maxmemory",
                    "1",
                ]),
            )
            .await
        }
        Refusal::AclWrites | Refusal::AclScripts => {
            let mut args = words(&["ACL", "SETUSER", SIDECAR_USER]);
            args.extend(words(&ACL_WRITES));
            if refusal == Refusal::AclScripts {
                args.extend(words(&ACL_SCRIPTS));
            }
            on_each(ports, args).await
        }
        Refusal::WrongTypeDead | Refusal::WrongTypeDelayed => {
            on_each(ports, words(&["EVAL", CLOBBER, "2", key, aside])).await
        }
        Refusal::ScriptFlush => on_each(ports, words(&["SCRIPT", "FLUSH"])).await,
        Refusal::PauseWrite => {
            let ms = pause.as_millis().to_string();
            on_each(ports, words(&["CLIENT", "PAUSE", &ms, "WRITE"])).await
        }
    }
}

/// Undoes `refusal` on `ports`, trying again (30 s at most) while a node does not answer: an
/// undo that never happened would leave Redis refusing through the quiesce, or a dead letter
/// aside.
pub(crate) async fn undo(
    refusal: Refusal,
    ports: &[u16],
    (key, aside): (&str, &str),
) -> Result<(), String> {
    let args = match refusal {
        Refusal::Oom => words(&["CONFIG", "SET", "maxmemory", "0"]),
        Refusal::AclWrites | Refusal::AclScripts => {
            words(&["ACL", "SETUSER", SIDECAR_USER, "+@all"])
        }
        Refusal::WrongTypeDead | Refusal::WrongTypeDelayed => {
            words(&["EVAL", RESTORE, "2", key, aside])
        }
        // Nothing to undo: the sidecars load their scripts again; the pause ends by itself.
        Refusal::ScriptFlush | Refusal::PauseWrite => return Ok(()),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match on_each(ports, args.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The class of a refusal Redis worded as `error`: the sidecar's own classification, the one
/// its `window_sidecar_requeue_refused_total` labels.
pub(crate) use window_sidecar::redis::refusal_reason as reason;

/// What a sidecar's `/metrics` says of refusals since it last started: requeued entries
/// refused, by reason, and flushes that failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counted {
    pub requeue_refused: std::collections::BTreeMap<String, u64>,
    pub flushes_failed: u64,
}

impl Counted {
    /// Adds the series of one `/metrics` answer.
    pub(crate) fn add(&mut self, body: &str) {
        for line in body.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if let Some(labels) = series.strip_prefix("window_sidecar_requeue_refused_total{") {
                let reason = labels
                    .split("reason=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("other");
                *self.requeue_refused.entry(reason.to_owned()).or_default() += value as u64;
            } else if series.starts_with("window_sidecar_flushes_total{")
                && series.contains("result=\"failed\"")
            {
                self.flushes_failed += value as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sidecars_counters_are_read_by_reason() {
        let body = "\
# HELP window_sidecar_requeue_refused_total Entries ...
window_sidecar_requeue_refused_total{subscription=\"{chaos}:orders/chaos\",reason=\"oom\"} 3
window_sidecar_requeue_refused_total{subscription=\"{chaos}:dead\",reason=\"oom\"} 1
window_sidecar_requeue_refused_total{subscription=\"{chaos}:orders/chaos\",reason=\"noperm\"} 2
window_sidecar_flushes_total{form=\"stream\",mode=\"pipeline\",result=\"failed\"} 4
window_sidecar_flushes_total{form=\"stream\",mode=\"pipeline\",result=\"ok\"} 40
";
        let mut counted = Counted::default();
        counted.add(body);
        counted.add(body);
        assert_eq!(counted.requeue_refused["oom"], 8);
        assert_eq!(counted.requeue_refused["noperm"], 4);
        assert_eq!(counted.flushes_failed, 8);
    }

    #[test]
    fn a_refusal_is_classed_as_the_sidecar_classes_it() {
        assert_eq!(
            reason("OOM command not allowed when used memory > 'maxmemory'."),
            "oom"
        );
        assert_eq!(
            reason("ERR ACL failure in script: this user has no permissions to run the 'xadd'"),
            "noperm"
        );
        assert_eq!(
            reason("WRONGTYPE Operation against a key holding the wrong kind of value"),
            "wrongtype"
        );
        assert_eq!(reason("something else"), "other");
    }
}
