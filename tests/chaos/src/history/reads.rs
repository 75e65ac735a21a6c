//! Reads and their flush reports on each subscription stream: read ids increase, and the flush
//! reports come in the order the worker received (and finished) its reads.

use std::collections::{BTreeSet, HashMap};

use super::event::{Event, Stamped, reading};
use super::verdict::{Anomaly, anomaly};

/// The worker finishes its reads in the order they came, so their flushes must be reported in
/// that order on each subscription stream. Not on an ordered one: there a read's settled
/// deliveries whose key has a successor waiting are flushed ahead of the read, each part
/// reported with the read's id, so a later read's part may be reported before an earlier
/// read whose slow delivery is still out, and one read may be reported more than once.
pub(super) fn flushes_follow_reads(history: &[Stamped]) -> Vec<Anomaly> {
    let ordered: BTreeSet<(u32, u32)> = history
        .iter()
        .filter_map(|s| match &s.event {
            Event::InOrder { worker, stream, .. } => Some((*worker, *stream)),
            _ => None,
        })
        .collect();
    let mut anomalies = Vec::new();
    let mut arrived: HashMap<(u32, u32), Vec<u64>> = HashMap::new();
    let mut flushed: HashMap<(u32, u32), Option<(usize, u64)>> = HashMap::new();
    for stamped in history {
        match &stamped.event {
            Event::Read {
                worker,
                stream,
                read_id,
            } => arrived
                .entry((*worker, *stream))
                .or_default()
                .push(*read_id),
            Event::Flushed {
                worker,
                stream,
                read_id,
                ..
            } if !ordered.contains(&(*worker, *stream)) => {
                let key = (*worker, *stream);
                let at = arrived
                    .get(&key)
                    .and_then(|reads| reads.iter().position(|r| r == read_id));
                let last = flushed.entry(key).or_default();
                match at {
                    // A read that delivered nothing (its entries went straight to the dead
                    // letter) is flushed all the same.
                    None => {}
                    Some(at) if last.is_some_and(|(last_at, _)| at <= last_at) => {
                        let (_, before) = last.expect("checked");
                        anomalies.push(anomaly(
                            None,
                            format!(
                                "worker {worker} got the flush report of read {read_id} after \
                                 that of read {before}, which came later, on its \
                                 subscription stream {stream}"
                            ),
                        ));
                    }
                    Some(at) => *last = Some((at, *read_id)),
                }
            }
            _ => {}
        }
    }
    anomalies
}

/// Read ids increase within a subscription (the proto's promise), and on a partitioned stream
/// within each partition's reading (its range, [`reading`]): one stream carries the reads of
/// several partitions side by side.
pub(super) fn reads_in_order(history: &[Stamped]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    let mut last_read: HashMap<(u32, u32, u64), u64> = HashMap::new();
    for stamped in history {
        let Event::Read {
            worker,
            stream,
            read_id,
        } = &stamped.event
        else {
            continue;
        };
        if let Some(last) = last_read
            .insert((*worker, *stream, reading(*read_id)), *read_id)
            .filter(|last| read_id <= last)
        {
            anomalies.push(anomaly(
                None,
                format!(
                    "worker {worker} got read {read_id} after read {last} on its subscription \
                     stream {stream}"
                ),
            ));
        }
    }
    anomalies
}
