//! A flush, one direction: [`plan`] turns what the window decided into the exact commands
//! (pure), this module sends them together on a pool connection (together with the
//! flushes queued behind it, each keeping its own replies) and reads what the replies mean
//! for the read's entries, [`redirect`] runs again what a cluster slot migration refused,
//! and [`wire`] is how a planned command goes to fred. Each file uses only those after it in
//! that order: plan ← wire ← redirect ← here.

pub(crate) mod plan;
mod redirect;
pub(crate) mod wire;

use fred::prelude::*;

use super::Redis;
use crate::engine::{FlushResult, RequeueRefused, SideEffectFailure};

pub(crate) use plan::{
    FlushPlan, PlanContext, Planned, Requeued, Role, SegmentSpan, Settling, StepEntry, entry_key,
    owned_step, owned_step_lua, plan_dead_letters, plan_flush,
};
pub(crate) use wire::unanswered;

/// Why Redis refused a write, as the `reason` label of the refusal counters: one word per
/// class an operator acts on differently, found by how Redis's error begins.
pub fn refusal_reason(error: &str) -> &'static str {
    const REASONS: &[(&str, &str)] = &[
        ("OOM ", "oom"),
        ("NOPERM ", "noperm"),
        // Inside a script, the user's ACL refusing a command: Redis 7.0's words, then Redis
        // 7.2+'s and Valkey's.
        ("ERR The user executing the script can't run", "noperm"),
        ("ERR ACL failure in script", "noperm"),
        ("WRONGTYPE ", "wrongtype"),
        ("READONLY ", "readonly"),
        ("NOSCRIPT ", "noscript"),
        ("BUSY ", "busy"),
        ("MOVED ", "moved"),
        ("ASK ", "moved"),
        ("TRYAGAIN ", "moved"),
        ("CLUSTERDOWN ", "clusterdown"),
        ("MASTERDOWN ", "masterdown"),
        ("NOGROUP ", "nogroup"),
    ];
    REASONS
        .iter()
        .find(|(prefix, _)| error.starts_with(prefix))
        .map_or("other", |(_, reason)| reason)
}

/// Interprets the replies of `plan`'s commands, one per command.
pub(crate) fn result_of(plan: &FlushPlan, replies: Vec<Result<Value, Error>>) -> FlushResult {
    let mut result = FlushResult::default();
    let answered = replies.len();
    let mut in_place = plan.in_place.iter();
    for (index, (planned, reply)) in plan.commands.iter().zip(replies).enumerate() {
        let kept = (planned.role == Role::KeepInPlace).then(|| in_place.next());
        let err = match reply {
            Ok(reply) if planned.role == Role::KeepInPlace => {
                if reply.as_u64() == Some(0)
                    && let Some(Some((_, id))) = kept
                {
                    result.skipped += 1;
                    result.left_to_others.push(id.clone());
                }
                continue;
            }
            Ok(reply) if planned.role == Role::SettleOwned => {
                owned(&mut result, reply, &plan.requeue_step);
                continue;
            }
            Ok(Value::Array(failures)) if matches!(planned.role, Role::Segments { .. }) => {
                for failure in failures {
                    if let Value::Array(failure) = failure {
                        segment_failed(&mut result, plan, index, failure);
                    }
                }
                continue;
            }
            Ok(_) => continue,
            Err(err) => err,
        };
        let message = err.details().to_owned();
        if unanswered(&err) {
            // No answer is not a refusal: whether it ran is unknown.
            result.unknown = true;
            result.failed += 1;
            result.first_error.get_or_insert(message);
            continue;
        }
        let aborted = message.starts_with("EXECABORT");
        result.failed += 1;
        match planned.role {
            Role::Settle => result.settle_failed = true,
            // Refused whole: nothing of it ran, every entry in it is still pending.
            Role::SettleOwned => {
                result.settle_failed = true;
                refuse(&mut result, plan.requeue_step.iter().enumerate(), &message);
            }
            Role::Commit { settles } if aborted => {
                result.aborted += 1;
                result.settle_failed |= settles;
            }
            Role::Segments { settles } => {
                // A runtime error names the script ("user_script:…"): its settle was
                // refused after its commands ran. Anything else refused it whole.
                if !message.contains("user_script") {
                    result.aborted += 1;
                }
                result.settle_failed |= settles;
            }
            // Refused: the entry stays pending as its delivery left it, and is delivered
            // again (from memory, or by the re-read or reclaim that finds it).
            Role::KeepInPlace => {
                if let Some(Some((slot, id))) = kept {
                    result.not_kept.push(id.clone());
                    result.requeue_refused.push(RequeueRefused {
                        slot: *slot,
                        entry_id: id.clone(),
                        error: message.clone(),
                        step: usize::MAX,
                    });
                }
            }
            Role::SideEffect => {
                if let Some(segment) = segment_of(plan, index) {
                    result.side_effect_failures.push(SideEffectFailure {
                        slot: segment.slot,
                        entry_id: segment.id.clone(),
                        command: planned.name.to_string(),
                        error: message.clone(),
                        settled: true,
                        entry_key: segment.key.clone(),
                    });
                }
            }
            // Redis has no rollback: an error inside EXEC leaves the other commands
            // applied, the settle among them.
            _ => {}
        }
        if result.first_error.is_none() {
            result.first_error = Some(message);
        }
    }
    if answered < plan.commands.len() {
        result.failed += plan.commands.len() - answered;
        result.unknown = true;
        result
            .first_error
            .get_or_insert_with(|| "the connection closed before every reply".to_owned());
    }
    result
}

/// Reads the reply of a [`Role::SettleOwned`] script: `[skipped, skipped dead letters,
/// the first write's error or nil, [positions of the entries a refusal left unsettled]]`.
fn owned(result: &mut FlushResult, reply: Value, step: &[StepEntry]) {
    let Value::Array(parts) = reply else { return };
    let mut parts = parts.into_iter();
    let mut count = || parts.next().and_then(|v| v.as_u64()).unwrap_or_default() as usize;
    result.skipped += count();
    result.skipped_dead_letters += count();
    let error = parts.next().filter(|v| !v.is_null()).map(|error| {
        error
            .as_string()
            .unwrap_or_else(|| "a requeue write failed".into())
    });
    let refused: Vec<(usize, &StepEntry)> = match parts.next() {
        Some(Value::Array(positions)) => positions
            .iter()
            .filter_map(|p| p.as_u64())
            .filter_map(|p| {
                let at = (p as usize).checked_sub(1)?;
                Some((at, step.get(at)?))
            })
            .collect(),
        _ => Vec::new(),
    };
    if let Some(error) = error {
        result.failed += 1;
        if !refused.is_empty() {
            // Still pending on this consumer: read them again.
            result.settle_failed = true;
            refuse(result, refused.into_iter(), &error);
        }
        result.first_error.get_or_insert(error);
    }
}

/// Reads one failure of a [`Role::Segments`] call, a segment that stopped at a failed
/// command: `[the segment, the command's position, Redis's error, how many commands ran
/// before it]`. Its entry was not settled: it is read again. One that ran none of its
/// commands counts as aborted, as a transaction refused while queuing does.
fn segment_failed(result: &mut FlushResult, plan: &FlushPlan, index: usize, failure: Vec<Value>) {
    let mut failure = failure.into_iter();
    let mut number = || failure.next().and_then(|v| v.as_u64()).unwrap_or_default() as usize;
    let (nth, position) = (number(), number());
    let error = failure
        .next()
        .and_then(|v| v.as_string())
        .unwrap_or_else(|| "a side effect failed".into());
    if failure.next().and_then(|v| v.as_u64()) == Some(0) {
        result.aborted += 1;
    }
    result.failed += 1;
    result.settle_failed = true;
    let segment = plan
        .segments
        .iter()
        .find(|s| s.first == index && s.nth == nth);
    if let Some(segment) = segment {
        let command = plan::segment_command(&plan.commands[index], nth, position);
        result.side_effect_failures.push(SideEffectFailure {
            slot: segment.slot,
            entry_id: segment.id.clone(),
            command: command.unwrap_or_default(),
            error: error.clone(),
            settled: false,
            entry_key: segment.key.clone(),
        });
    }
    result.first_error.get_or_insert(error);
}

/// Records the entries of `step` that had requeue writes as refused with `error`.
fn refuse<'a>(
    result: &mut FlushResult,
    step: impl Iterator<Item = (usize, &'a StepEntry)>,
    error: &str,
) {
    result
        .requeue_refused
        .extend(
            step.filter(|(_, entry)| entry.requeues)
                .map(|(at, entry)| RequeueRefused {
                    slot: entry.slot,
                    entry_id: entry.id.clone(),
                    error: error.to_owned(),
                    step: at,
                }),
        );
}

/// The kept segment the plan's `index`th command belongs to.
fn segment_of(plan: &FlushPlan, index: usize) -> Option<&SegmentSpan> {
    let after = plan.segments.partition_point(|s| s.first <= index);
    plan.segments.get(after.checked_sub(1)?)
}

/// The reply of a plan's read-ahead, as the frame it came in: `None` when the plan had none.
pub(crate) type ReadAheadReply = Option<wire::Reply>;

/// One connection of the flush pool, held on to: what is written on one connection runs in the
/// order it was written (an ordered stream's read lane keeps its reads in order so), and a
/// flush whose replies never came is settled on the connection it went on. It follows no
/// cluster redirection: what a slot migration refused runs again on the shared pool (see
/// [`redirect`]).
#[derive(Clone)]
pub(crate) struct FlushConnection(Client);

impl FlushConnection {
    /// The flush pool's next connection that is up (the next one when none is).
    pub(crate) fn next(redis: &Redis) -> Self {
        Self(redis.flush_client().clone())
    }

    /// Whether the connection is up now.
    pub(crate) fn is_connected(&self) -> bool {
        self.0.is_connected()
    }

    /// Sends the plans as one pipeline, in order (each plan's commands, then its read-ahead),
    /// and interprets each plan's replies apart: one round trip for flushes that queued behind
    /// one another. A flush whose connection is not up waits for it up to Redis's timeout (the
    /// sidecar just started, or Redis is coming back), then fails as not sent: its entries stay
    /// pending and come back. What a slot migration refused runs again on `redis`'s pool,
    /// which follows redirections (see [`redirect`]).
    pub(crate) async fn execute(
        &self,
        redis: &Redis,
        plans: &[&FlushPlan],
    ) -> Vec<(FlushResult, ReadAheadReply)> {
        execute(&self.0, redis.pool(), plans, redis.timeout()).await
    }

    /// Sends a read alone (an ordered stream's read lane), and returns its reply as it came.
    /// Like a flush, it waits for a connection that is not up until Redis's timeout, then
    /// fails unsent. Written when first polled: reads sent on one connection run, and take
    /// entries, in the order they were written.
    pub(crate) async fn read(&self, redis: &Redis, read: &Planned) -> wire::Reply {
        let timeout = redis.timeout();
        if !self.0.is_connected()
            && tokio::time::timeout(timeout, self.0.wait_for_connect())
                .await
                .is_err()
        {
            let not_sent = format!("not sent: no connection to Redis within {timeout:?}");
            return Err(Error::new(ErrorKind::Unknown, not_sent));
        }
        let reply = wire::send(&self.0, &[read]).await.pop();
        reply.unwrap_or_else(|| {
            Err(Error::new(
                ErrorKind::IO,
                "the connection closed before the reply",
            ))
        })
    }

    /// After a flush on this connection whose replies never came: waits (up to `bound`) until
    /// nothing of it can still run. fred keeps the commands of a pipeline that reached it while
    /// its connection was down and writes them once it reconnects, even after the caller gave
    /// up on them (it marks a single command abandoned on a timeout, not a pipeline's). Those
    /// are written before anything sent after the reconnection, so a PING answered on the same
    /// client means the stale flush has run or never will; only then may its entries be read
    /// again (a transaction of the stale flush running after its entry was handled again would
    /// apply side effects twice).
    pub(crate) async fn settle_unknown(&self, bound: std::time::Duration) {
        settle_unknown(&self.0, bound).await;
    }
}

/// [`FlushConnection::execute`] on `client`, redirections followed on `follower`.
async fn execute(
    client: &Client,
    follower: &Client,
    plans: &[&FlushPlan],
    timeout: std::time::Duration,
) -> Vec<(FlushResult, ReadAheadReply)> {
    if !client.is_connected()
        && tokio::time::timeout(timeout, client.wait_for_connect())
            .await
            .is_err()
    {
        let not_sent = format!("not sent: no connection to Redis within {timeout:?}");
        return plans
            .iter()
            .map(|plan| {
                let result = FlushResult {
                    failed: plan.commands.len(),
                    first_error: Some(not_sent.clone()),
                    settle_failed: plan.settles > 0,
                    not_sent: true,
                    ..Default::default()
                };
                let read = plan
                    .read_ahead
                    .as_ref()
                    .map(|_| Err(Error::new(ErrorKind::Unknown, not_sent.clone())));
                (result, read)
            })
            .collect();
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let commands: Vec<&Planned> = plans
        .iter()
        .flat_map(|plan| plan.commands.iter().chain(&plan.read_ahead))
        .collect();
    let replies = wire::send(client, &commands).await;
    let mut results = Vec::with_capacity(plans.len());
    for (plan, (mut mine, read)) in plans.iter().zip(split_replies(plans, replies)) {
        // What a slot migration refused runs again where its keys live now.
        redirect::follow(client, follower, plan, &mut mine, deadline).await;
        results.push((result_of(plan, mine), read));
    }
    results
}

/// Each plan's replies, in the order the plans were sent, as fred's values, and its
/// read-ahead's as it came.
fn split_replies(
    plans: &[&FlushPlan],
    replies: Vec<wire::Reply>,
) -> Vec<(Vec<Result<Value, Error>>, ReadAheadReply)> {
    let mut replies = replies.into_iter();
    plans
        .iter()
        .map(|plan| {
            let mine: Vec<_> = replies
                .by_ref()
                .take(plan.commands.len())
                .map(|reply| reply.and_then(Value::try_from))
                .collect();
            let read = plan.read_ahead.as_ref().map(|_| {
                // Fewer replies than commands: the connection closed before the rest.
                replies.next().unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorKind::IO,
                        "the connection closed before every reply",
                    ))
                })
            });
            (mine, read)
        })
        .collect()
}

/// [`FlushConnection::settle_unknown`] on `client`.
async fn settle_unknown(client: &Client, bound: std::time::Duration) {
    let barrier = async {
        loop {
            if client.wait_for_connect().await.is_ok() && client.ping::<Value>(None).await.is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(bound, barrier).await.is_err() {
        tracing::warn!(
            ?bound,
            "a flush with an unknown outcome may still be written after Redis comes back; its entries are read again now"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::types::Resp3Frame;

    fn planned(role: Role) -> Planned {
        Planned::new("X", vec![], role)
    }

    fn plan_of(commands: &[Planned]) -> FlushPlan {
        FlushPlan {
            commands: commands.to_vec(),
            ..Default::default()
        }
    }

    fn err(msg: &str) -> Result<Value, Error> {
        Err(Error::new(ErrorKind::Unknown, msg.to_owned()))
    }

    #[test]
    fn a_failed_side_effect_does_not_fail_the_settle() {
        let plan = [planned(Role::SideEffect), planned(Role::Settle)];
        let result = result_of(
            &plan_of(&plan),
            vec![err("WRONGTYPE"), Ok(Value::Integer(1))],
        );
        assert_eq!(result.failed, 1);
        assert!(!result.settle_failed);
        assert_eq!(result.first_error.as_deref(), Some("WRONGTYPE"));
    }

    #[test]
    fn an_aborted_transaction_leaves_its_settle_undone() {
        let plan = [
            planned(Role::Begin),
            planned(Role::SideEffect),
            planned(Role::Settle),
            planned(Role::Commit { settles: true }),
        ];
        let replies = vec![
            Ok(Value::Null),
            err("ERR wrong number of arguments"),
            Ok(Value::Queued),
            err("EXECABORT Transaction discarded"),
        ];
        let result = result_of(&plan_of(&plan), replies);
        assert!(result.settle_failed);
        assert_eq!(result.aborted, 1);
        assert_eq!(result.failed, 2);
    }

    #[test]
    fn a_runtime_error_inside_exec_still_settles() {
        let plan = [
            planned(Role::Begin),
            planned(Role::Commit { settles: true }),
        ];
        let result = result_of(&plan_of(&plan), vec![Ok(Value::Null), err("WRONGTYPE")]);
        assert!(!result.settle_failed);
        assert_eq!(result.aborted, 0);
    }

    #[test]
    fn plans_sent_together_get_their_own_replies_and_a_short_reply_list_fails_the_rest() {
        let first = FlushPlan {
            commands: vec![planned(Role::SideEffect), planned(Role::Settle)],
            read_ahead: Some(planned(Role::ReadAhead)),
            ..Default::default()
        };
        let second = FlushPlan {
            commands: vec![planned(Role::SideEffect), planned(Role::Settle)],
            ..Default::default()
        };
        let one = || {
            Ok(Resp3Frame::Number {
                data: 1,
                attributes: None,
            })
        };
        let failed = || Err(Error::new(ErrorKind::InvalidArgument, "WRONGTYPE"));
        let replies = vec![failed(), one(), Ok(Resp3Frame::Null), one(), one()];
        let plans = [&first, &second];
        let results = |replies| -> Vec<(FlushResult, ReadAheadReply)> {
            split_replies(&plans, replies)
                .into_iter()
                .zip(plans)
                .map(|((mine, read), plan)| (result_of(plan, mine), read))
                .collect()
        };
        let results_of = results;
        let results = results_of(replies);
        assert_eq!(results.len(), 2);
        let (result, read) = &results[0];
        assert_eq!((result.failed, result.settle_failed), (1, false));
        assert_eq!(read.as_ref().unwrap().as_ref().unwrap(), &Resp3Frame::Null);
        assert!(results[1].0.ok() && results[1].1.is_none());

        // The connection closed after the first plan's settle: its read-ahead and the second
        // plan have no reply, so whether they ran is unknown.
        let results = results_of(vec![one(), one()]);
        assert!(results[0].0.ok());
        let read_error = results[0].1.as_ref().unwrap().as_ref().unwrap_err();
        assert!(unanswered(read_error));
        assert!(results[1].0.unknown && results[1].0.failed == 2);
    }

    /// A stream's retries kept in place: one another consumer holds now (reply 0) is left to
    /// it, one kept (1) is nothing to report, one Redis refused is named as refused, and none
    /// of them fails the settle.
    #[test]
    fn retries_kept_in_place_report_what_was_left_to_others_or_refused() {
        let plan = FlushPlan {
            commands: vec![
                planned(Role::Settle),
                planned(Role::KeepInPlace),
                planned(Role::KeepInPlace),
                planned(Role::KeepInPlace),
            ],
            in_place: vec![
                (2, bytes::Bytes::from_static(b"2-0")),
                (3, bytes::Bytes::from_static(b"3-0")),
                (4, bytes::Bytes::from_static(b"4-0")),
            ],
            ..Default::default()
        };
        let replies = vec![
            Ok(Value::Integer(1)),
            Ok(Value::Integer(0)),
            Ok(Value::Integer(1)),
            err("OOM command not allowed when used memory > 'maxmemory'."),
        ];
        let result = result_of(&plan, replies);
        assert!(!result.settle_failed);
        assert_eq!(result.skipped, 1);
        assert_eq!(result.left_to_others, [bytes::Bytes::from_static(b"2-0")]);
        assert_eq!(result.failed, 1);
        let refused: Vec<_> = result
            .requeue_refused
            .iter()
            .map(|r| (r.slot, r.entry_id.clone(), refusal_reason(&r.error)))
            .collect();
        assert_eq!(refused, [(4, bytes::Bytes::from_static(b"4-0"), "oom")]);
        assert_eq!(result.not_kept, [bytes::Bytes::from_static(b"4-0")]);
    }

    #[test]
    fn a_requeue_step_reports_what_it_left_to_other_consumers_and_a_failed_write() {
        let plan = [planned(Role::SideEffect), planned(Role::SettleOwned)];
        let reply = |error: Value| {
            Ok(Value::Array(vec![
                Value::Integer(2),
                Value::Integer(1),
                error,
            ]))
        };
        let result = result_of(&plan_of(&plan), vec![Ok(Value::Null), reply(Value::Null)]);
        assert!(result.ok() && !result.settle_failed);
        assert_eq!((result.skipped, result.skipped_dead_letters), (2, 1));

        // A write refused inside the step: the settles and the other writes stand, as after
        // an error inside EXEC.
        let wrongtype = Value::String("WRONGTYPE Operation against a key".into());
        let result = result_of(&plan_of(&plan), vec![Ok(Value::Null), reply(wrongtype)]);
        assert_eq!((result.failed, result.settle_failed), (1, false));
        assert_eq!(
            result.first_error.as_deref(),
            Some("WRONGTYPE Operation against a key")
        );

        // The step refused as a whole (no group, say): nothing of it ran.
        let result = result_of(&plan_of(&plan), vec![Ok(Value::Null), err("NOGROUP")]);
        assert!(result.settle_failed);
    }

    #[test]
    fn missing_replies_and_timeouts_leave_the_outcome_unknown() {
        let plan = [planned(Role::SideEffect), planned(Role::Settle)];
        let result = result_of(&plan_of(&plan), vec![Ok(Value::Integer(1))]);
        assert!(result.unknown);
        assert!(!result.settle_failed, "nothing says the settle was refused");
        assert_eq!(result.failed, 1);
        let timeout = Err(Error::new(ErrorKind::Timeout, "Request timed out."));
        let result = result_of(&plan_of(&plan), vec![Ok(Value::Integer(1)), timeout]);
        assert!(result.unknown && !result.settle_failed);
    }

    #[test]
    fn a_refused_requeue_write_names_the_entries_it_left_pending() {
        let step = |slot, id: &'static str, requeues| StepEntry {
            slot,
            id: bytes::Bytes::from_static(id.as_bytes()),
            requeues,
        };
        let plan = FlushPlan {
            commands: vec![planned(Role::SettleOwned)],
            requeue_step: vec![
                step(1, "1-0", false),
                step(2, "2-0", true),
                step(3, "3-0", true),
            ],
            ..Default::default()
        };
        let reply = Value::Array(vec![
            Value::Integer(0),
            Value::Integer(0),
            Value::String(
                "NOPERM User default has no permissions to run the 'xadd' command".into(),
            ),
            Value::Array(vec![Value::Integer(2), Value::Integer(3)]),
        ]);
        let result = result_of(&plan, vec![Ok(reply)]);
        assert!(result.settle_failed, "the refused entries are read again");
        let refused: Vec<_> = result.requeue_refused.iter().map(|r| r.slot).collect();
        assert_eq!(refused, [2, 3]);
        assert!(result.requeue_refused[0].error.starts_with("NOPERM"));

        // Refused whole (out of memory): every entry with a requeue write is named.
        let oom = err("OOM command not allowed when used memory > 'maxmemory'.");
        let result = result_of(&plan, vec![oom]);
        assert!(result.settle_failed);
        let refused: Vec<_> = result.requeue_refused.iter().map(|r| r.slot).collect();
        assert_eq!(refused, [2, 3]);
        assert_eq!(refusal_reason(&result.requeue_refused[0].error), "oom");

        // A bookkeeping write refused after its requeue write: nothing left pending.
        let reply = Value::Array(vec![
            Value::Integer(0),
            Value::Integer(0),
            Value::String("WRONGTYPE Operation against a key".into()),
            Value::Array(vec![]),
        ]);
        let result = result_of(&plan, vec![Ok(reply)]);
        assert!(!result.settle_failed && result.requeue_refused.is_empty());
        assert_eq!(result.failed, 1);
    }

    #[test]
    fn refusals_are_classified_by_their_code() {
        for (error, reason) in [
            ("OOM command not allowed", "oom"),
            ("NOPERM User u has no permissions", "noperm"),
            ("WRONGTYPE Operation against a key", "wrongtype"),
            (
                "READONLY You can't write against a read only replica.",
                "readonly",
            ),
            ("BUSY Redis is busy running a script.", "busy"),
            ("MOVED 3999 127.0.0.1:6381", "moved"),
            (
                "ERR The user executing the script can't run this command or subcommand",
                "noperm",
            ),
            (
                "ERR ACL failure in script: User default has no permissions to run the 'xadd' command",
                "noperm",
            ),
            ("ERR something else", "other"),
        ] {
            assert_eq!(refusal_reason(error), reason, "{error}");
        }
    }

    #[test]
    fn a_failed_side_effect_is_named_with_its_entry_in_both_modes() {
        let span = |slot, id: &'static str, first| SegmentSpan {
            slot,
            id: bytes::Bytes::from_static(id.as_bytes()),
            first,
            nth: 0,
            key: bytes::Bytes::from_static(id.as_bytes()),
        };
        // Pipeline mode: two segments of two commands, then the XACK.
        let named = |name: &'static str| Planned::new(name, vec![], Role::SideEffect);
        let plan = FlushPlan {
            commands: vec![
                named("INCR"),
                named("HSET"),
                named("INCR"),
                named("LPUSH"),
                planned(Role::Settle),
            ],
            segments: vec![span(1, "1-0", 0), span(2, "2-0", 2)],
            ..Default::default()
        };
        let replies = vec![
            Ok(Value::Integer(1)),
            Ok(Value::Integer(1)),
            Ok(Value::Integer(1)),
            err("WRONGTYPE Operation against a key"),
            Ok(Value::Integer(2)),
        ];
        let result = result_of(&plan, replies);
        assert!(!result.settle_failed, "pipeline mode settles all the same");
        let failure = &result.side_effect_failures[..];
        assert_eq!(failure.len(), 1);
        assert_eq!((failure[0].slot, failure[0].command.as_str()), (2, "LPUSH"));
        assert!(failure[0].settled && failure[0].error.starts_with("WRONGTYPE"));

        // Atomic mode: the segments' script names the segment and the command it stopped at.
        let segments = |segments: &[&[&str]]| {
            let count = segments.len().to_string();
            let mut args = vec!["SHA", "1", "orders", count.as_str()];
            for commands in segments {
                args.extend(["1", "4", "XACK", "orders", "g", "1-0"]);
                args.push(["0", "1", "2", "3"][commands.len()]);
                for command in *commands {
                    args.extend(["2", command, "k"]);
                }
            }
            let args = args
                .into_iter()
                .map(|a| bytes::Bytes::copy_from_slice(a.as_bytes()));
            Planned::new("EVAL", args.collect(), Role::Segments { settles: true })
        };
        let plan = FlushPlan {
            commands: vec![segments(&[&["INCR"], &["INCR", "HINCRBY"]])],
            segments: vec![
                SegmentSpan {
                    nth: 1,
                    ..span(6, "1-0", 0)
                },
                SegmentSpan {
                    nth: 2,
                    ..span(7, "2-0", 0)
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            plan::segment_command(&plan.commands[0], 2, 2).as_deref(),
            Some("HINCRBY")
        );
        let stopped = Value::Array(vec![Value::Array(vec![
            Value::Integer(2),
            Value::Integer(2),
            Value::String("ERR hash value is not an integer".into()),
            Value::Integer(1),
        ])]);
        let result = result_of(&plan, vec![Ok(stopped)]);
        assert!(result.settle_failed, "its entry comes back");
        assert_eq!(result.aborted, 0);
        let failure = &result.side_effect_failures[..];
        assert_eq!(failure.len(), 1);
        assert_eq!(
            (failure[0].slot, failure[0].command.as_str()),
            (7, "HINCRBY")
        );
        assert_eq!(failure[0].entry_id, "2-0");
        assert!(!failure[0].settled);

        // Refused whole (an ACL without EVAL): nothing ran, like an aborted transaction.
        let refused = err("NOPERM this user has no permissions to run the 'eval' command");
        let result = result_of(&plan, vec![refused]);
        assert!(result.settle_failed && result.aborted == 1);
        assert!(result.side_effect_failures.is_empty());
        let ok = result_of(&plan, vec![Ok(Value::Array(vec![]))]);
        assert!(ok.ok() && !ok.settle_failed);
    }
}
