//! What the sidecars logged about entries, read back from their JSON logs as history events:
//! the entries a failed flush settled without the side effect Redis refused, and retries kept
//! in place that another consumer claimed. A worker that left before its flush report came
//! knows neither; without them the checker would take the first for lost entries and the
//! second for a key that passed its retry.

use serde_json::Value;

use crate::history::{Event, Said};
use crate::workers;

/// The sidecar's messages, and the field that names the entries in each.
const SAID: [(&str, &str, Said); 3] = [
    ("flush failed", "effects_refused", Said::EffectsRefused),
    (
        "due retries claimed by another consumer",
        "entries",
        Said::ClaimedAway,
    ),
    (
        "entries left to the consumer that claimed them",
        "retries",
        Said::ClaimedAway,
    ),
];

/// The events of the sidecars' log lines that name entries of a worker's consumer.
pub(crate) fn events(lines: &[String]) -> Vec<Event> {
    lines.iter().filter_map(|line| said(line)).collect()
}

fn said(line: &str) -> Option<Event> {
    let line: Value = serde_json::from_str(line).ok()?;
    let message = line["message"].as_str()?;
    let (_, field, said) = SAID.iter().find(|(m, ..)| message.starts_with(m))?;
    let entries: Vec<String> = line[field]
        .as_str()?
        .split(',')
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect();
    // A partition's subscription logs under a span of its own, inside its replica's: the
    // consumer is the replica's, and the entries are the partition's (named as the history
    // names them, with the partition).
    let spans =
        std::iter::once(&line["span"]).chain(line["spans"].as_array().into_iter().flatten());
    let consumer = spans.clone().find_map(|s| s["consumer"].as_str())?;
    let worker = workers::of_consumer(consumer)?;
    let partition = spans
        .filter(|s| s["name"].as_str() == Some("partition"))
        .find_map(|s| s["partition"].as_u64());
    let entries = match partition {
        Some(p) => entries.iter().map(|id| format!("{p}/{id}")).collect(),
        None => entries,
    };
    (!entries.is_empty()).then_some(Event::Said {
        worker,
        said: *said,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_that_name_a_workers_entries_become_events() {
        let span = r#""span":{"consumer":"w3","group":"chaos","id":"7","name":"subscription"}"#;
        let lines = [
            format!(
                r#"{{"level":"WARN","message":"flush failed","error":"OOM …","effects_refused":"1-0,2-0",{span}}}"#
            ),
            format!(
                r#"{{"level":"WARN","message":"due retries claimed by another consumer: it delivers them, and their keys move on here","entries":"3-0",{span}}}"#
            ),
            // A failed flush that settled nothing without its side effect, and a skipped
            // settle without retries, name none.
            format!(
                r#"{{"level":"WARN","message":"flush failed","error":"OOM …","effects_refused":"",{span}}}"#
            ),
            format!(
                r#"{{"level":"WARN","message":"entries left to the consumer that claimed them: …","entries":2,"retries":"",{span}}}"#
            ),
            format!(
                r#"{{"level":"WARN","message":"entries left to the consumer that claimed them: …","entries":2,"retries":"4-0",{span}}}"#
            ),
            // A partition's subscription: the replica's consumer, the partition's entries.
            r#"{"level":"WARN","message":"flush failed","effects_refused":"5-0","span":{"name":"partition","partition":2,"number":1},"spans":[{"consumer":"w3","name":"subscription"},{"name":"partition","partition":2,"number":1}]}"#.to_owned(),
            r#"{"level":"INFO","message":"Redis answers: SERVING"}"#.to_owned(),
            "not json".to_owned(),
        ];
        let said = |said, entries: &[&str]| Event::Said {
            worker: 3,
            said,
            entries: entries.iter().map(|e| e.to_string()).collect(),
        };
        assert_eq!(
            events(&lines),
            vec![
                said(Said::EffectsRefused, &["1-0", "2-0"]),
                said(Said::ClaimedAway, &["3-0"]),
                said(Said::ClaimedAway, &["4-0"]),
                said(Said::EffectsRefused, &["2/5-0"]),
            ]
        );
    }
}
