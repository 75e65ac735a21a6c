//! Cluster redirections of a flush. A flush's pipeline follows no redirection itself (it goes
//! out on [`crate::redis::Redis::flush_client`], whose pool is built without redirections): fred
//! follows `-ASK` and `-MOVED` command by command, which inside a `MULTI` would run the
//! redirected command on its own, outside the transaction, while the rest of it is discarded
//! (`EXECABORT`), so a settle could run without its copy or a side effect twice. Instead, what
//! a redirection refused is run again where its keys now live, once the pipeline is answered:
//! a command alone (fred follows the redirection), a transaction whole (fred's transaction
//! sends `ASKING`, then `MULTI` … `EXEC`, to the node that imports the slot). A redirection
//! means the command did not run, so running it again runs it once. A multi-key command whose
//! keys are half migrated (`TRYAGAIN`) is tried again until the migration has moved them, for
//! as long as a flush may take.

use std::ops::RangeInclusive;
use std::time::Duration;

use fred::prelude::*;
use tokio::time::Instant;

use super::plan::{FlushPlan, Planned, Role};
use super::wire::{FAIL_FAST, custom};

/// The wait between tries of a command refused with `TRYAGAIN`.
const TRY_AGAIN_EVERY: Duration = Duration::from_millis(50);

/// A part of a plan that runs or fails as one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Unit {
    Single(usize),
    /// `MULTI` … `EXEC`, by index.
    Transaction(RangeInclusive<usize>),
}

/// The plan's units, in order.
fn units(commands: &[Planned]) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut begin = None;
    for (i, planned) in commands.iter().enumerate() {
        match (planned.role, begin) {
            (Role::Begin, _) => begin = Some(i),
            (Role::Commit { .. }, Some(start)) => {
                units.push(Unit::Transaction(start..=i));
                begin = None;
            }
            (_, None) => units.push(Unit::Single(i)),
            (_, Some(_)) => {}
        }
    }
    units
}

/// The reply says the command did not run here and may elsewhere, or later: a redirection
/// (the reply itself, which fred hands back when a command has no redirections left, or
/// fred's own refusal) or `TRYAGAIN`.
pub(super) fn refused_by_migration(reply: &Result<Value, Error>) -> bool {
    let Err(err) = reply else { return false };
    let details = err.details();
    *err.kind() == ErrorKind::Routing
        || ["MOVED ", "ASK ", "TRYAGAIN"]
            .iter()
            .any(|prefix| details.starts_with(prefix))
}

/// Runs again on `client` (one that follows redirections) what a slot migration refused in
/// `replies` (one per command of `plan`, as `flush_client` got them), where it lives now, and
/// puts the new replies in their place. Gives up on `TRYAGAIN` at `deadline`, leaving that
/// reply.
pub(super) async fn follow(
    flush_client: &Client,
    client: &Client,
    plan: &FlushPlan,
    replies: &mut [Result<Value, Error>],
    deadline: Instant,
) {
    if !replies.iter().any(refused_by_migration) {
        return;
    }
    tracing::debug!(
        "a slot migration refused part of a flush; running it again where its keys are"
    );
    if replies
        .iter()
        .any(|r| matches!(r, Err(e) if e.details().starts_with("MOVED ")))
    {
        // The slot moved for good: the flush client's routing learns it (fred syncs only when
        // it follows MOVED itself).
        if let Err(err) = flush_client.sync_cluster().await {
            tracing::debug!(error = %err, "syncing the flush client's cluster state failed");
        }
    }
    for unit in units(&plan.commands) {
        match unit {
            Unit::Single(i) if i < replies.len() && refused_by_migration(&replies[i]) => {
                let planned = &plan.commands[i];
                replies[i] = until_moved(deadline, || single(client, planned)).await;
            }
            Unit::Transaction(range) if *range.end() < replies.len() => {
                let (begin, commit) = (*range.start(), *range.end());
                let inner = begin + 1..commit;
                // EXECABORT: refused while queuing, none of it ran.
                if !replies[inner.clone()].iter().any(refused_by_migration) {
                    continue;
                }
                let commands = &plan.commands[inner.clone()];
                let result = until_moved(deadline, || transaction(client, commands)).await;
                replies[begin] = Ok(Value::from("OK"));
                for reply in &mut replies[inner] {
                    *reply = Ok(Value::from("QUEUED"));
                }
                replies[commit] = result;
            }
            _ => {}
        }
    }
}

/// Tries `run` until it is not refused with `TRYAGAIN` or the deadline passes.
async fn until_moved<F, Fut>(deadline: Instant, run: F) -> Result<Value, Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Value, Error>>,
{
    loop {
        let reply = run().await;
        let again = matches!(&reply, Err(err) if err.details().starts_with("TRYAGAIN"));
        if !again || Instant::now() + TRY_AGAIN_EVERY >= deadline {
            return reply;
        }
        tokio::time::sleep(TRY_AGAIN_EVERY).await;
    }
}

async fn single(client: &Client, planned: &Planned) -> Result<Value, Error> {
    let (command, args) = custom(planned);
    client
        .with_options(&FAIL_FAST)
        .custom::<Value, _>(command, args)
        .await
}

/// The commands between `MULTI` and `EXEC`, as one transaction of fred's, which follows the
/// redirections of the transaction as a whole.
async fn transaction(client: &Client, commands: &[Planned]) -> Result<Value, Error> {
    let trx = client.multi();
    for planned in commands {
        let (command, args) = custom(planned);
        let _: Value = trx.custom(command, args).await?;
    }
    trx.exec(true).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(role: Role) -> Planned {
        Planned::new("X", vec![], role)
    }

    #[test]
    fn a_plan_runs_again_in_singles_and_whole_transactions() {
        let commands = [
            planned(Role::SideEffect),
            planned(Role::Begin),
            planned(Role::SideEffect),
            planned(Role::Settle),
            planned(Role::Commit { settles: true }),
            planned(Role::Settle),
        ];
        assert_eq!(
            units(&commands),
            [Unit::Single(0), Unit::Transaction(1..=4), Unit::Single(5)]
        );
    }

    #[test]
    fn redirections_and_tryagain_are_refusals_by_a_migration() {
        let refused =
            |kind, msg: &str| refused_by_migration(&Err(Error::new(kind, msg.to_owned())));
        assert!(refused(ErrorKind::Routing, "Too many redirections."));
        assert!(refused(ErrorKind::Unknown, "ASK 3999 127.0.0.1:7002"));
        assert!(refused(ErrorKind::Unknown, "MOVED 3999 127.0.0.1:7002"));
        assert!(refused(
            ErrorKind::Unknown,
            "TRYAGAIN Multiple keys request during rehashing of slot"
        ));
        assert!(!refused(
            ErrorKind::Unknown,
            "EXECABORT Transaction discarded because of previous errors."
        ));
        assert!(!refused(ErrorKind::IO, "connection closed"));
        assert!(!refused_by_migration(&Ok(Value::from("OK"))));
    }
}
