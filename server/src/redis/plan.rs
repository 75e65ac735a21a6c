//! The flush plan of a read, for every form: what the window decided (kept segments, settles
//! and their outcomes) turned into the exact commands to send. The forms supply their settle
//! and requeue commands through [`Settling`]; the shape is the same for all:
//!
//! Pipeline mode: the kept segments in commit order; then, when the read has retries, one
//! MULTI holding the requeue writes (copies, delay-set members, dead letters) and the settles,
//! so an entry is never settled without its copy; else the settles alone.
//!
//! Atomic mode: each kept segment with commands becomes MULTI, its commands, its own entry's
//! settle, EXEC; the rest of the read settles as in pipeline mode.

use std::borrow::Borrow;
use std::time::Duration;

use super::flush::{FlushPlan, Role};
use crate::domain::{Entry, Mode};
use crate::engine::exhausted;
use crate::window::{FlushBatch, Outcome};

/// What a form writes for settles and requeues.
pub trait Settling {
    /// The hash slot of the subscription's key, where its settles and transactions run.
    fn slot(&self) -> Option<u16>;
    /// Whether entries are settled in Redis at all (streams and reliable lists).
    fn settles_in_redis(&self) -> bool;
    /// Appends the settles of `entries` (one XACK for all, one LREM each, or nothing).
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan);
    /// Appends what makes the entry come back as soon as possible.
    fn retry(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan);
    /// Appends what makes the entry come back at `due_ms` (Unix ms).
    fn retry_after(&self, entry: &Entry, reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan);
    /// Appends the write of the entry to the dead-letter target.
    fn dead_letter(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan);
    /// Appends housekeeping for entries settled for good (acked, dropped, dead-lettered).
    fn finished(&self, _entries: &[&Entry], _plan: &mut FlushPlan) {}
}

/// What else a plan depends on.
#[derive(Clone, Copy, Debug)]
pub struct PlanContext {
    pub mode: Mode,
    /// Now, in Unix ms, for retry_after due times.
    pub now_ms: u64,
    /// Deliveries at which a retry becomes a dead letter; 0: no cap.
    pub max_deliveries: u32,
}

/// What a settle does besides settling.
enum Requeue<'a> {
    None,
    Retry(Option<&'a str>),
    RetryAfter(Option<&'a str>, Duration),
    DeadLetter(Option<&'a str>),
}

fn requeue<'a>(
    entry: &Entry,
    outcome: Outcome,
    reason: Option<&'a str>,
    ctx: &PlanContext,
) -> Requeue<'a> {
    let capped = exhausted(entry.delivery_count, ctx.max_deliveries);
    match outcome {
        Outcome::Ack | Outcome::Drop => Requeue::None,
        Outcome::Retry | Outcome::RetryAfter(_) if capped => Requeue::DeadLetter(reason),
        Outcome::Retry => Requeue::Retry(reason),
        Outcome::RetryAfter(delay) => Requeue::RetryAfter(reason, delay),
    }
}

/// Builds the exact commands of one flush.
pub fn plan_flush<E: Borrow<Entry>>(
    form: &impl Settling,
    batch: &FlushBatch<E>,
    ctx: &PlanContext,
) -> FlushPlan {
    let mut plan = FlushPlan::default();
    let slot = form.slot();
    let mut settled_inside = vec![false; batch.settles.len()];
    for segment in &batch.kept {
        let wrap = ctx.mode == Mode::Atomic && !segment.commands.is_empty();
        if wrap {
            plan.push("MULTI", vec![], Role::Begin, slot);
        }
        for command in &segment.commands {
            let hash_slot = if wrap { slot } else { command.hash_slot };
            plan.push(
                command.name.clone(),
                command.args.clone(),
                Role::SideEffect,
                hash_slot,
            );
        }
        if wrap {
            let entry: &Entry = batch.settles[segment.settle].entry.borrow();
            form.settle(&[entry], &mut plan);
            form.finished(&[entry], &mut plan);
            let settles = form.settles_in_redis();
            plan.push("EXEC", vec![], Role::Commit { settles }, slot);
            settled_inside[segment.settle] = true;
        }
    }

    let rest: Vec<_> = batch
        .settles
        .iter()
        .zip(&settled_inside)
        .filter(|(_, inside)| !**inside)
        .map(|(settle, _)| {
            (
                settle.entry.borrow(),
                requeue(
                    settle.entry.borrow(),
                    settle.outcome,
                    settle.reason.as_deref(),
                    ctx,
                ),
            )
        })
        .collect();
    let requeues = rest.iter().any(|(_, r)| !matches!(r, Requeue::None));
    if requeues {
        plan.push("MULTI", vec![], Role::Begin, slot);
    }
    for (entry, action) in &rest {
        match *action {
            Requeue::None => {}
            Requeue::Retry(reason) => form.retry(entry, reason, &mut plan),
            Requeue::RetryAfter(reason, delay) => {
                let due = ctx.now_ms.saturating_add(delay.as_millis() as u64);
                form.retry_after(entry, reason, due, &mut plan);
            }
            Requeue::DeadLetter(reason) => {
                form.dead_letter(entry, reason, &mut plan);
                plan.dead_lettered += 1;
            }
        }
    }
    let entries: Vec<&Entry> = rest.iter().map(|(entry, _)| *entry).collect();
    if !entries.is_empty() {
        form.settle(&entries, &mut plan);
        let done: Vec<&Entry> = rest
            .iter()
            .filter(|(_, r)| matches!(r, Requeue::None | Requeue::DeadLetter(_)))
            .map(|(entry, _)| *entry)
            .collect();
        form.finished(&done, &mut plan);
    }
    if requeues {
        let settles = form.settles_in_redis();
        plan.push("EXEC", vec![], Role::Commit { settles }, slot);
    }
    plan.settles = if form.settles_in_redis() {
        batch.settles.len()
    } else {
        0
    };
    plan
}

/// The plan that moves entries read beyond the delivery cap to the dead letter, atomically
/// with their settle, without delivering them.
pub fn plan_dead_letters(form: &impl Settling, entries: &[&Entry], reason: &str) -> FlushPlan {
    let mut plan = FlushPlan::default();
    let slot = form.slot();
    plan.push("MULTI", vec![], Role::Begin, slot);
    for entry in entries {
        form.dead_letter(entry, Some(reason), &mut plan);
    }
    form.settle(entries, &mut plan);
    form.finished(entries, &mut plan);
    plan.push(
        "EXEC",
        vec![],
        Role::Commit {
            settles: form.settles_in_redis(),
        },
        slot,
    );
    plan.dead_lettered = entries.len();
    plan.settles = if form.settles_in_redis() {
        entries.len()
    } else {
        0
    };
    plan
}
