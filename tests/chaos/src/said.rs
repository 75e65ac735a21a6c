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
    let worker = workers::of_consumer(line["span"]["consumer"].as_str()?)?;
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
            ]
        );
    }
}
