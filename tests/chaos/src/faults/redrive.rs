//! A redrive through the dead-letter service, as a fault: every dead letter at once, in the
//! middle of the run, recorded with what the service said it did.

use std::collections::HashMap;
use std::time::Duration;

use tonic::transport::Channel;
use window_sidecar::proto;
use window_sidecar::proto::dead_letter_service_client::DeadLetterServiceClient;

use crate::form::{self, Form};
use crate::history::Event;
use crate::log::Log;

/// Redrives the dead letters (up to 100) through the dead-letter service of the sidecar at
/// `addr`, and records what it said it did: each with the entry it is a dead letter of (from a
/// listing first) and its deliveries, logged at the moment the redrive was sent (its entry may
/// come back before the answer).
pub(crate) async fn redrive(form: Form, addr: &str, log: &Log) {
    let connect = DeadLetterServiceClient::connect(format!("http://{addr}"));
    let Ok(Ok(mut client)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
        log.push(Event::Fault(format!("redrive (no sidecar at {addr})")));
        return;
    };
    let target = Some(proto::DeadLetterTarget {
        kind: Some(proto::dead_letter_target::Kind::Stream(form::DEAD.into())),
    });
    let Some(listed) = list(&mut client, target.clone(), log).await else {
        return;
    };
    if listed.is_empty() {
        return;
    }
    let keys: HashMap<String, proto::DeadLetterEntry> =
        listed.iter().map(|d| (d.id.clone(), d.clone())).collect();
    let letters: HashMap<String, (String, u32)> = listed
        .iter()
        .map(|d| {
            let origin = named(form, d, &dead_letter_origin(d));
            (d.id.clone(), (origin, d.deliveries))
        })
        .collect();
    let request = proto::RedriveDeadLettersRequest {
        target,
        selection: Some(proto::DeadLetterSelection {
            ids: listed.into_iter().map(|d| d.id).collect(),
            ..Default::default()
        }),
        limit: 100,
        ..Default::default()
    };
    let sent_ms = log.now_ms();
    let call = client.redrive_dead_letters(request);
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(response)) => {
            let redriven: Vec<_> = response
                .into_inner()
                .redriven
                .into_iter()
                .filter(|r| r.skipped.is_empty())
                .collect();
            log.push(Event::Fault(format!(
                "redrive {} dead letters",
                redriven.len()
            )));
            for r in redriven {
                let (origin, deliveries) = letters.get(&r.id).cloned().unwrap_or_default();
                let copy = match keys.get(&r.id) {
                    Some(d) if !r.new_id.is_empty() => named(form, d, &r.new_id),
                    _ => r.new_id,
                };
                log.push_at(
                    sent_ms,
                    Event::Redriven {
                        dead: r.id,
                        origin,
                        deliveries,
                        copy,
                    },
                );
            }
        }
        // A redrive that failed half-way moved some: the end state still shows every copy.
        Ok(Err(status)) => log.push(Event::Fault(format!("redrive failed: {}", status.code()))),
        Err(_) => log.push(Event::Fault("redrive timed out".into())),
    }
}

/// How the history names entry `id` of the stream dead letter `dead` came from: on a
/// partitioned stream, qualified with the partition of the key it carries.
fn named(form: Form, dead: &proto::DeadLetterEntry, id: &str) -> String {
    if form != Form::Partitioned {
        return id.to_owned();
    }
    let key = dead
        .fields
        .iter()
        .chain(&dead.headers)
        .find(|f| f.name == form::KEY)
        .map(|f| String::from_utf8_lossy(&f.value).into_owned())
        .unwrap_or_default();
    form::in_partition(&key, id)
}

/// The entry a listed dead letter is a dead letter of (its `x-window-original-id`).
fn dead_letter_origin(dead: &proto::DeadLetterEntry) -> String {
    let name = form::ORIGINAL_ID.trim_start_matches("h:");
    dead.headers
        .iter()
        .chain(&dead.fields)
        .find(|h| h.name == name || h.name == form::ORIGINAL_ID)
        .map(|h| String::from_utf8_lossy(&h.value).into_owned())
        .unwrap_or_default()
}

/// The dead letters the service lists (up to 100); None when it could not list them (logged).
async fn list(
    client: &mut DeadLetterServiceClient<Channel>,
    target: Option<proto::DeadLetterTarget>,
    log: &Log,
) -> Option<Vec<proto::DeadLetterEntry>> {
    let list = client.list_dead_letters(proto::ListDeadLettersRequest {
        target,
        selection: None,
        limit: 100,
    });
    match tokio::time::timeout(Duration::from_secs(5), list).await {
        Ok(Ok(response)) => Some(response.into_inner().dead_letters),
        Ok(Err(status)) => {
            log.push(Event::Fault(format!(
                "redrive: listing failed: {}",
                status.code()
            )));
            None
        }
        Err(_) => {
            log.push(Event::Fault("redrive: listing timed out".into()));
            None
        }
    }
}
