//! A subscription's flushes and reads ahead: the engine's batches turned into plans with their
//! spans and handed to the flusher, an ordered stream's reads handed to its read lane, and
//! what those answer handed back to the engine (which makes each flush's report of it).

use std::time::SystemTime;

use tokio::time::Instant;
use tracing::{debug, warn};

// Named through this module by the subscription's state, which holds one.
pub(super) use super::poison::PoisonReasons;
use super::{Item, Subscription, observe};
use crate::domain::Entry;
use crate::engine::{FlushId, FlushResult, LaneReadId, Read, ReadError, ReadFrom};
use crate::redis::flush::{PlanContext, entry_key, plan_dead_letters, plan_flush};
use crate::redis::form::{Form, read_error};
use crate::redis::stream;
use crate::session::io::flusher::FlushJob;
use crate::session::io::lane::LaneRead;
use crate::session::io::promoter::now_ms;
use crate::session::io::{Flushed, ReadAhead};

impl Subscription {
    pub(super) fn flush(
        &mut self,
        flush: FlushId,
        mut batch: crate::window::FlushBatch<Item>,
        read_ahead: Option<u32>,
    ) {
        let ctx = PlanContext {
            mode: self.request.mode,
            now_ms: now_ms(),
            max_deliveries: self.request.max_deliveries,
        };
        let mut plan = plan_flush(&self.form, &mut batch, &ctx);
        if let (Some(count), Form::Stream(keys)) = (read_ahead, &self.form) {
            plan.read_ahead = Some(stream::read_ahead(keys, count));
            self.reading_since = Some(SystemTime::now());
        }
        let span = self.shared.settings.tracing.then(|| {
            let client = batch
                .settles
                .iter()
                .filter_map(|s| self.client_spans.remove(&s.slot))
                .collect();
            // The read's later batch links to the read too.
            let read = if batch.early {
                self.read_spans.get(&batch.read_id).cloned()
            } else {
                self.read_spans.remove(&batch.read_id)
            };
            observe::flush_span(&self.view, &batch, read, client, plan.side_effects)
        });
        if self.form.pops() && !plan.requeue_step.is_empty() {
            // A delivered entry's slot is unique in its read.
            let entries = plan
                .requeue_step
                .iter()
                .map(|step| {
                    let settle = batch.settles.iter().find(|s| s.slot == step.slot);
                    settle.filter(|_| step.requeues).map(|s| s.entry.clone())
                })
                .collect();
            self.popped.insert(flush, entries);
        }
        self.submit(FlushJob {
            flush,
            read_id: batch.read_id,
            segments_kept: batch.kept.len(),
            plan,
            span,
        });
    }

    /// Reads new entries on the read lane, behind the reads handed to it before: they run in
    /// the order they were asked.
    pub(super) fn read_in_order(&mut self, id: LaneReadId, count: u32) {
        let (Form::Stream(keys), Some(lane)) = (&self.form, &self.lane_tx) else {
            // Only an ordered stream has a read lane; anything else reads on the reader, as if
            // this read had failed.
            let unread = ReadError::Retry { unknown: false };
            let now = Instant::now().into_std();
            self.engine
                .read_returned(now, ReadFrom::Lane(id), Err(unread));
            return;
        };
        let read = stream::read_ahead(keys, count);
        self.reading_since = Some(SystemTime::now());
        // The lane lives as long as this task holds its sender.
        let _ = lane.send(LaneRead { id, read });
    }

    /// Moves entries past the delivery cap to the dead letter with their settle, reported as a
    /// flush of read 0.
    pub(super) fn dead_letter(&mut self, flush: FlushId, entries: Vec<Item>) {
        let refs: Vec<&Entry> = entries.iter().map(|e| &**e).collect();
        let poison = &mut self.poison;
        let plan = plan_dead_letters(&self.form, &refs, |entry| {
            poison.take(&entry_key(entry)).unwrap_or_else(|| {
                "delivered more often than max_deliveries without an outcome".to_owned()
            })
        });
        warn!(
            entries = refs.len(),
            "entries past max_deliveries go to the dead letter"
        );
        if self.form.pops() {
            self.popped
                .insert(flush, entries.into_iter().map(Some).collect());
        }
        self.submit(FlushJob {
            flush,
            read_id: 0,
            segments_kept: 0,
            plan,
            span: None,
        });
    }

    fn submit(&mut self, job: FlushJob) {
        // The flusher lives as long as this task holds its sender.
        let _ = self.flush_tx.send(job);
    }

    pub(super) fn flushed(&mut self, flushed: Flushed) {
        let now = Instant::now().into_std();
        match flushed {
            Flushed::Report(flush, answer, read_ahead) => {
                let (counts, result) = *answer;
                self.view.counters.flushes += 1;
                if !result.ok() {
                    self.view.counters.failed_flushes += 1;
                }
                self.hold_refused(flush, &result);
                for failure in &result.side_effect_failures {
                    if !failure.settled {
                        let reason =
                            format!("side effect {} failed: {}", failure.command, failure.error);
                        self.poison.remember(failure.entry_key.clone(), reason);
                    }
                }
                let read_ahead = read_ahead.map(|read| self.read_ahead_result(read));
                self.engine.left_to_others(flush, &result.left_to_others);
                self.engine.not_kept(flush, &result.not_kept);
                self.engine
                    .flushed(now, flush, (counts, result), read_ahead);
            }
            Flushed::Settled(flush) => {
                debug!(flush, "the flush of unknown outcome can no longer run");
                self.engine.flush_settled(now, flush);
            }
            Flushed::Read(id, read) => {
                let read = self.read_ahead_result(read);
                self.engine.read_returned(now, ReadFrom::Lane(id), read);
            }
            Flushed::ReadSettled(id) => {
                debug!(
                    read = id,
                    "the read on the read lane whose reply never came can no longer run"
                );
                self.engine.read_settled(now, id);
            }
        }
    }

    /// A simple list's entries whose requeue Redis refused, or that never reached Redis: only
    /// this sidecar has them now, so it holds them until Redis takes them back.
    fn hold_refused(&mut self, flush: FlushId, result: &FlushResult) {
        let Some(mut step) = self.popped.remove(&flush) else {
            return;
        };
        let refused: Vec<Item> = if result.not_sent {
            step.into_iter().flatten().collect()
        } else {
            result
                .requeue_refused
                .iter()
                .filter_map(|refusal| step.get_mut(refusal.step)?.take())
                .collect()
        };
        self.held.hold(refused, true, Instant::now().into_std());
    }

    pub(super) fn read_ahead_result(&mut self, read: ReadAhead) -> Result<Read<Item>, ReadError> {
        match read {
            Ok(batch) => {
                self.shared
                    .metrics
                    .read_aheads
                    .get_or_create(&self.form_labels)
                    .inc();
                Ok(self.count_read(batch))
            }
            Err((error, unknown)) => {
                debug!(%error, unknown, "a read-ahead failed; the reader reads next");
                match read_error(&error) {
                    fatal @ ReadError::Fatal(_) => Err(fatal),
                    ReadError::Retry { .. } => Err(ReadError::Retry { unknown }),
                }
            }
        }
    }
}
