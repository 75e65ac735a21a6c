//! What passes between a subscription and its client: reads (with their metrics and spans)
//! and the client's batches (admitted, then applied by the engine).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Item, Lookup, Subscription, observe};
use crate::domain::{Entry, ReadBatch};
use crate::engine::FlushReport;
use crate::engine::{self, Read, ReadError};
use crate::metrics::{OutcomeLabels, ReasonLabels, RoundTripLabels};
use crate::redis::RedisError;
use crate::redis::form::read_error;
use crate::redis::keys::admit::Admission;
use crate::session::{ClientBatch, Event};
use crate::telemetry::{LogIds, format_traceparent};

impl Subscription {
    /// A reader answer, with its metrics, as the engine sees it.
    pub(super) fn read_result(
        &mut self,
        batch: Result<ReadBatch, RedisError>,
    ) -> Result<Read<Item>, ReadError> {
        match batch {
            Ok(batch) => Ok(self.count_read(batch)),
            Err(err) => {
                warn!(error = %err, "read failed");
                Err(read_error(&err))
            }
        }
    }

    /// What a fetch of parked entries or a count of due retries (`kind`) found, with its
    /// round trip counted, as the engine sees it: the entries with their ordering keys.
    pub(super) fn fetch_result(
        &mut self,
        kind: Lookup,
        found: Result<Vec<Option<Entry>>, RedisError>,
    ) -> Result<Vec<Option<Item>>, ReadError> {
        self.shared
            .metrics
            .round_trips
            .get_or_create(&RoundTripLabels {
                form: self.form_labels.form,
                kind: match kind {
                    Lookup::Fetch => "fetch",
                    Lookup::Count => "count",
                },
            })
            .inc();
        let ordering = self.request.ordering_key.as_ref();
        match found {
            Ok(found) => Ok(found
                .into_iter()
                .map(|entry| {
                    entry.map(|mut entry| {
                        entry.ordering_key = ordering.and_then(|key| key.of(&entry));
                        Arc::new(entry)
                    })
                })
                .collect()),
            Err(err) => {
                match kind {
                    Lookup::Fetch => {
                        warn!(error = %err, "fetching entries parked for their ordering key failed; trying again")
                    }
                    Lookup::Count => {
                        warn!(error = %err, "counting the delivery of due retries failed; trying again")
                    }
                }
                Err(read_error(&err))
            }
        }
    }

    pub(super) fn count_read(&mut self, batch: ReadBatch) -> Read<Item> {
        let form = self.form_labels.form;
        let metrics = &self.shared.metrics;
        for (kind, n) in [
            ("read", batch.reads),
            ("claim", batch.claims),
            ("pending_counts", batch.count_lookups),
        ] {
            if n > 0 {
                metrics
                    .round_trips
                    .get_or_create(&RoundTripLabels { form, kind })
                    .inc_by(n.into());
            }
        }
        metrics
            .reclaimed
            .get_or_create(&self.form_labels)
            .inc_by(batch.claimed as u64);
        let ordering = self.request.ordering_key.as_ref();
        let item = |mut entry: Entry| {
            if let Some(key) = ordering {
                entry.ordering_key = key.of(&entry);
            }
            Arc::new(entry)
        };
        Read {
            entries: batch.entries.into_iter().map(item).collect(),
            redelivery: batch.redelivery,
            lost: batch.lost,
            delayed: batch
                .delayed
                .into_iter()
                .map(|(entry, wait)| (item(entry), wait))
                .collect(),
        }
    }

    pub(super) async fn deliver(
        &mut self,
        read: crate::window::OpenedRead,
        entries: Vec<Item>,
        redelivery: bool,
        lost: u64,
        flushed: Option<FlushReport>,
    ) {
        let n = entries.len() as u64;
        let metrics = &self.shared.metrics;
        metrics.reads.get_or_create(&self.form_labels).inc();
        metrics
            .deliveries
            .get_or_create(&self.form_labels)
            .inc_by(n);
        self.view.counters.reads += 1;
        self.view.counters.deliveries += n;
        if redelivery {
            metrics
                .redeliveries
                .get_or_create(&self.form_labels)
                .inc_by(n);
            self.view.counters.redeliveries += n;
        }
        let started = self.reading_since.take().unwrap_or_else(SystemTime::now);
        let read_span =
            self.shared.settings.tracing.then(|| {
                observe::read_span(&self.view, read.read_id, &entries, redelivery, started)
            });
        if let Ok(took) = SystemTime::now().duration_since(started) {
            metrics
                .read_duration
                .get_or_create(&self.form_labels)
                .observe(
                    took.as_secs_f64(),
                    crate::metrics::exemplar::of_context(read_span.as_ref()),
                    None,
                );
        }
        let ids = LogIds::of(read_span.as_ref());
        debug!(
            trace_id = ids.trace_id.as_deref(),
            span_id = ids.span_id.as_deref(),
            read_id = read.read_id,
            deliveries = n,
            first_slot = read.first_slot,
            "read"
        );
        let read_trace = read_span.and_then(|context| {
            let traceparent = format_traceparent(&context);
            self.read_spans.insert(read.read_id, context);
            traceparent
        });
        self.send(Event::Read {
            read_id: read.read_id,
            first_slot: read.first_slot,
            entries,
            lost,
            read_trace,
            flushed,
            partition: self.view.partition.as_ref().map(|p| p.partition),
        })
        .await;
    }

    pub(super) async fn apply(&mut self, batch: ClientBatch) {
        let admission = Admission {
            key_specs: &self.key_specs,
            policy: &self.shared.settings.policy,
            cluster: self.shared.redis.is_cluster(),
            mode: self.request.mode,
            form: &self.form,
            source: &self.source,
        };
        let commands = batch
            .commands
            .into_iter()
            .map(|(slot, command)| (slot, command.and_then(|c| admission.admit(c))))
            .collect();
        let mut traces = HashMap::new();
        let outcomes = batch
            .outcomes
            .into_iter()
            .map(|outcome| {
                outcome.map(|settle| {
                    if let Some(trace) = settle.trace {
                        traces.insert(settle.slot, trace);
                    }
                    engine::SettleRequest {
                        slot: settle.slot,
                        outcome: settle.outcome,
                        reason: settle.reason,
                    }
                })
            })
            .collect();
        let form = &self.form;
        let now = Instant::now().into_std();
        let extend_refused = self.engine.extend(now, &batch.extend);
        let mut applied = self
            .engine
            .apply(now, commands, outcomes, |entry, outcome| {
                form.refuses(entry, outcome)
            });
        applied.rejected.splice(0..0, extend_refused);
        let metrics = &self.shared.metrics;
        for (slot, outcome) in applied.settled {
            let kind = outcome.as_str();
            metrics
                .outcomes
                .get_or_create(&OutcomeLabels {
                    form: self.form_labels.form,
                    outcome: kind,
                })
                .inc();
            *self.view.counters.outcomes.entry(kind).or_default() += 1;
            if let Some(trace) = traces
                .remove(&slot)
                .filter(|_| self.shared.settings.tracing)
            {
                self.client_spans.insert(slot, trace);
            }
        }
        if !applied.rejected.is_empty() {
            for err in &applied.rejected {
                let reason = err.reason().label();
                metrics
                    .rejections
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
            self.view.counters.rejections += applied.rejected.len() as u64;
            self.send(Event::Rejected(applied.rejected)).await;
        }
    }
}
