//! How a stream subscription settles, requeues and dead-letters: its part of every flush
//! plan (XACK or XACKDEL, retry copies, the delay set, the dead-letter stream).

use bytes::Bytes;

use crate::redis::delay;
use crate::redis::flush::{FlushPlan, Role, Settling};

use super::StreamKeys;
use crate::domain::Entry;

impl Settling for StreamKeys {
    fn slot(&self) -> Option<u16> {
        Some(self.slot)
    }

    fn settles_in_redis(&self) -> bool {
        true
    }

    /// One XACK for all of them; under retention with `XACKDEL`, one `XACKDEL … ACKED`, which
    /// also deletes each entry no other group still needs.
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        let mut args = vec![self.key.clone(), self.group.clone()];
        let name = if self.ack_delete {
            args.extend([
                Bytes::from_static(b"ACKED"),
                Bytes::from_static(b"IDS"),
                Bytes::from(entries.len().to_string()),
            ]);
            "XACKDEL"
        } else {
            "XACK"
        };
        args.extend(entries.iter().map(|e| e.id.clone()));
        plan.push(name, args, Role::Settle, Some(self.slot));
    }

    /// The entry stays pending on this consumer, its delivery count set to its next delivery's
    /// and its idle time reset (`XCLAIM … RETRYCOUNT n JUSTID`, which alone does not count).
    fn keep_in_place(&self, entry: &Entry, plan: &mut FlushPlan) {
        let args = vec![
            self.key.clone(),
            self.group.clone(),
            self.consumer.clone(),
            Bytes::from_static(b"0"),
            entry.id.clone(),
            Bytes::from_static(b"RETRYCOUNT"),
            Bytes::from((entry.delivery_count + 1).to_string()),
            Bytes::from_static(b"JUSTID"),
        ];
        plan.push("XCLAIM", args, Role::Bookkeeping, Some(self.slot));
    }

    /// A copy at the end of the stream.
    fn retry(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        let mut args = vec![self.key.clone(), Bytes::from_static(b"*")];
        args.extend(
            entry
                .retry_fields(reason)
                .into_iter()
                .flat_map(|(f, v)| [f, v]),
        );
        plan.push("XADD", args, Role::Requeue, Some(self.slot));
    }

    /// A copy in the delay set, keyed by the entry id.
    fn retry_after(&self, entry: &Entry, reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan) {
        let parts = entry
            .retry_fields(reason)
            .into_iter()
            .flat_map(|(f, v)| [f, v]);
        let member = delay::encode(&entry.id, parts);
        let args = vec![
            self.delayed.clone(),
            Bytes::from(due_ms.to_string()),
            member,
        ];
        plan.push("ZADD", args, Role::Requeue, Some(self.slot));
    }

    /// The entry's fields with where it came from, appended to the dead-letter stream.
    fn dead_letter(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        let Some(target) = &self.dead_letter else {
            return;
        };
        let mut args = vec![target.clone(), Bytes::from_static(b"*")];
        let fields = entry.dead_letter_fields(&self.subscription, reason);
        args.extend(fields.into_iter().flat_map(|(f, v)| [f, v]));
        plan.push("XADD", args, Role::Requeue, Some(self.slot));
    }
}
