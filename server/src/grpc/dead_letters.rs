//! The `DeadLetterService`: the wire side of inspecting, redriving and purging dead letters.
//! Requests become a [`Store`] and a [`Selection`] here (failing with a [`RequestError`]),
//! every key is checked against `--allow-keys` before anything is read or written, and the
//! Redis work is `redis::dead_letters`'.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tonic::{Request, Response, Status};

use super::{policy_status, redis_status};
use crate::domain::letter::{
    Destination, Letter, REDRIVE_NOT_REENTERED, REDRIVE_REFUSED, Redrive, Selection, Store,
    Unplaced,
};
use crate::policy::Patterns;
use crate::proto;
use crate::proto::dead_letter_service_server::DeadLetterService;
use crate::proto::dead_letter_target::Kind as TargetKind;
use crate::redis::RedisError;
use crate::redis::dead_letters;
use crate::session::Shared;

/// Dead letters listed when a request sets no limit.
const DEFAULT_LIST: usize = 100;
/// The most one List returns.
const MAX_LIST: usize = 10_000;
/// The most one Redrive or Purge works on when it sets no limit.
const DEFAULT_BATCH: usize = 10_000;

/// A request that cannot be carried out as sent.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("target: name a dead-letter stream (`stream`) or list (`list`)")]
    NoTarget,
    #[error(
        "selection: choose the dead letters by `ids`, `reason`, `older_than`, or `all: true` for every one"
    )]
    NoSelection,
    #[error("limit: at most {MAX_LIST} dead letters per List, got {0}")]
    LimitTooLarge(u32),
}

impl From<RequestError> for Status {
    fn from(err: RequestError) -> Self {
        Status::invalid_argument(err.to_string())
    }
}

/// The store a request names.
fn store(target: Option<proto::DeadLetterTarget>) -> Result<Store, RequestError> {
    match target.and_then(|t| t.kind) {
        Some(TargetKind::Stream(key)) if !key.is_empty() => Ok(Store::Stream(key)),
        Some(TargetKind::List(key)) if !key.is_empty() => Ok(Store::List(key)),
        _ => Err(RequestError::NoTarget),
    }
}

impl From<proto::DeadLetterSelection> for Selection {
    fn from(s: proto::DeadLetterSelection) -> Self {
        Selection {
            ids: s.ids,
            reason: (!s.reason.is_empty()).then(|| Patterns::new(&[s.reason])),
            older_than_ms: s
                .older_than
                .map(|d| (d.seconds.max(0) as u64) * 1000 + (d.nanos.max(0) as u64) / 1_000_000),
            all: s.all,
        }
    }
}

/// A selection a redrive or purge must give.
fn required(selection: Option<proto::DeadLetterSelection>) -> Result<Selection, RequestError> {
    selection
        .map(Selection::from)
        .filter(Selection::is_given)
        .ok_or(RequestError::NoSelection)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The DeadLetterService implementation.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    shared: Arc<Shared>,
}

impl DeadLetters {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn check_key(&self, key: &str) -> Result<(), Status> {
        self.shared
            .settings
            .policy
            .check_key(key.as_bytes())
            .map_err(|e| policy_status(&e, e.to_string()))
    }

    fn failed(&self, err: RedisError, keys: &[&str]) -> Status {
        if let RedisError::Refused { message, .. } = &err
            && crossslot(message)
        {
            return Status::failed_precondition(format!(
                "on a cluster a dead letter is redriven atomically only to a key in its own hash slot, and {} are in different slots; give them one hash tag, such as \"{{orders}}\" and \"{{orders}}:dead\", or redrive with `to` naming a key in the dead letter's slot",
                keys.join(" and ")
            ));
        }
        redis_status(&self.shared.redis.explain(err))
    }

    async fn select(
        &self,
        store: &Store,
        selection: &Selection,
        limit: usize,
    ) -> Result<Vec<Letter>, Status> {
        self.check_key(store.key())?;
        dead_letters::select(self.shared.redis.pool(), store, selection, now_ms(), limit)
            .await
            .map_err(|e| self.failed(e, &[store.key()]))
    }
}

fn crossslot(message: &str) -> bool {
    message.starts_with("CROSSSLOT")
}

/// Why a dead letter was not redriven when Redis refused its script (WRONGTYPE, OOM, NOPERM,
/// READONLY, NOGROUP): the script writes nothing before Redis could refuse it, so the dead
/// letter is still there. `to` names the destination ([`destination_text`]); `first` is the
/// dead letter whose refusal this one was not tried after.
fn refusal(to: &str, message: &str, first: Option<&str>) -> String {
    match first {
        None => format!("{REDRIVE_REFUSED} to {to}, so it is still a dead letter: {message}"),
        Some(first) => format!(
            "{REDRIVE_REFUSED} of {first} to {to}, so this one was not tried and is still a dead letter: {message}"
        ),
    }
}

/// A destination as messages name it: `orders (group billing)` for a redrive back into a
/// group, the key for a copy. What refuses one redrive refuses the next to the same one.
fn destination_text(destination: &Destination) -> String {
    match destination {
        Destination::Group { stream, group, .. } => format!("{stream} (group {group})"),
        Destination::Copy(key) => key.clone(),
    }
}

/// What to do with a stream dead letter that cannot re-enter its group by itself, in the
/// message's field names (the command puts its flag in their place).
fn not_reentered_hint(stream: &str) -> String {
    format!(
        "redrive it with `to` naming a stream to append a copy of it there instead, which every group of that stream reads ({stream} itself included), or purge it"
    )
}

/// Why a stream dead letter did not go back into its group: its entry is no longer in the
/// stream. It stays a dead letter.
fn not_in_stream(stream: &str, entry_id: &str, group: &str) -> String {
    format!(
        "{REDRIVE_NOT_REENTERED} alone: its entry {entry_id} is no longer in {stream} (trimmed by retention, or deleted), so it is still a dead letter and group {group} gets nothing; {}",
        not_reentered_hint(stream)
    )
}

/// Why a dead letter has nowhere to go by itself.
fn unplaced(why: &Unplaced) -> String {
    match why {
        Unplaced::NoOrigin => "it does not say where it came from (no x-window-subscription header, as ruststream-fred's dead letters); redrive it with `to`".into(),
        Unplaced::NoEntry { stream } => format!(
            "{REDRIVE_NOT_REENTERED} alone: it does not record the group and the entry of {stream} it came from (x-window-subscription `stream/group` and x-window-original-id), so it is still a dead letter; {}",
            not_reentered_hint(stream)
        ),
    }
}

/// A dead letter on the wire.
fn letter_message(letter: &Letter, store: &Store, now_ms: u64) -> proto::DeadLetterEntry {
    let (origin, origin_group) = letter.origin(store.is_stream()).unwrap_or_default();
    let pair = |(name, value): (String, bytes::Bytes)| proto::DeadLetterHeader { name, value };
    let in_layout = letter.payload().is_some();
    proto::DeadLetterEntry {
        id: letter.id.clone(),
        origin,
        origin_group: origin_group.unwrap_or_default(),
        deliveries: letter.deliveries(),
        reason: letter.reason().unwrap_or_default(),
        age: letter.written_ms.map(|written| {
            let age = Duration::from_millis(now_ms.saturating_sub(written));
            prost_types::Duration {
                seconds: age.as_secs() as i64,
                nanos: age.subsec_nanos() as i32,
            }
        }),
        payload: letter.payload().cloned().unwrap_or_default(),
        headers: letter.headers().into_iter().map(pair).collect(),
        fields: if in_layout {
            Vec::new()
        } else {
            letter
                .fields
                .iter()
                .map(|(f, v)| pair((String::from_utf8_lossy(f).into_owned(), v.clone())))
                .collect()
        },
        raw: letter.raw,
        redriven: letter.redriven(),
    }
}

#[tonic::async_trait]
impl DeadLetterService for DeadLetters {
    async fn list_dead_letters(
        &self,
        request: Request<proto::ListDeadLettersRequest>,
    ) -> Result<Response<proto::ListDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let store = store(request.target)?;
        let limit = match request.limit as usize {
            0 => DEFAULT_LIST,
            n if n > MAX_LIST => return Err(RequestError::LimitTooLarge(request.limit).into()),
            n => n,
        };
        let selection = request.selection.map(Selection::from).unwrap_or_default();
        let letters = self.select(&store, &selection, limit).await?;
        let total = dead_letters::count(self.shared.redis.pool(), &store)
            .await
            .map_err(|e| self.failed(e, &[store.key()]))?;
        let now = now_ms();
        Ok(Response::new(proto::ListDeadLettersResponse {
            dead_letters: letters
                .iter()
                .map(|l| letter_message(l, &store, now))
                .collect(),
            total,
        }))
    }

    async fn redrive_dead_letters(
        &self,
        request: Request<proto::RedriveDeadLettersRequest>,
    ) -> Result<Response<proto::RedriveDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let store = store(request.target)?;
        let selection = required(request.selection)?;
        let limit = match request.limit as usize {
            0 => DEFAULT_BATCH,
            n => n,
        };
        let letters = self.select(&store, &selection, limit).await?;
        let to = (!request.to.is_empty()).then_some(request.to.as_str());
        let destinations: Vec<_> = letters
            .iter()
            .map(|letter| letter.destination(&store, to))
            .collect();
        // Every destination is checked before anything moves: a refused key refuses the call.
        for destination in destinations.iter().flatten() {
            self.check_key(destination.key())?;
        }
        let mut pace = (request.per_second > 0).then(|| {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / request.per_second);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        let mut redriven = Vec::with_capacity(letters.len());
        // Per destination, the first dead letter Redis refused and why. What refuses one
        // (a key of another type, no memory, no permission, a replica, no such group) refuses
        // the next to the same destination as well: those are reported without a round trip
        // each.
        let mut refused: HashMap<String, (String, String)> = HashMap::new();
        for (letter, destination) in letters.iter().zip(destinations) {
            let destination = match destination {
                Ok(destination) => destination,
                Err(why) => {
                    redriven.push(proto::Redriven {
                        id: letter.id.clone(),
                        to: match &why {
                            Unplaced::NoOrigin => String::new(),
                            Unplaced::NoEntry { stream } => stream.clone(),
                        },
                        skipped: unplaced(&why),
                        ..Default::default()
                    });
                    continue;
                }
            };
            let to = destination.key().to_owned();
            let group = destination.group().unwrap_or_default().to_owned();
            let named = destination_text(&destination);
            if request.dry_run {
                redriven.push(proto::Redriven {
                    id: letter.id.clone(),
                    to,
                    group,
                    ..Default::default()
                });
                continue;
            }
            if let Some((first, message)) = refused.get(&named) {
                redriven.push(proto::Redriven {
                    id: letter.id.clone(),
                    skipped: refusal(&named, message, Some(first)),
                    to,
                    group,
                    ..Default::default()
                });
                continue;
            }
            if let Some(tick) = &mut pace {
                tick.tick().await;
            }
            let done = dead_letters::redrive(
                self.shared.redis.pool(),
                &store,
                letter,
                &destination,
                now_ms(),
            )
            .await;
            let done = match done {
                // Redis said no and nothing was written: the other dead letters may still
                // go, and the answer says which did. A timeout or a lost connection says
                // nothing of what happened, so it fails the call; so does CROSSSLOT, which
                // is the deployment's to fix.
                Err(RedisError::Refused { message, .. }) if !crossslot(&message) => {
                    redriven.push(proto::Redriven {
                        id: letter.id.clone(),
                        to,
                        group,
                        skipped: refusal(&named, &message, None),
                        ..Default::default()
                    });
                    refused.insert(named, (letter.id.clone(), message));
                    continue;
                }
                done => done.map_err(|e| self.failed(e, &[store.key(), &to]))?,
            };
            redriven.push(match done {
                Redrive::Written(new_id) => proto::Redriven {
                    id: letter.id.clone(),
                    to,
                    new_id: new_id.unwrap_or_default(),
                    ..Default::default()
                },
                Redrive::Reentered(entry_id) => proto::Redriven {
                    id: letter.id.clone(),
                    to,
                    new_id: entry_id,
                    group,
                    ..Default::default()
                },
                Redrive::NotInStream => proto::Redriven {
                    id: letter.id.clone(),
                    skipped: not_in_stream(&to, destination.entry_id().unwrap_or_default(), &group),
                    to,
                    group,
                    ..Default::default()
                },
                Redrive::Gone => proto::Redriven {
                    id: letter.id.clone(),
                    to,
                    group,
                    skipped: "it was no longer there (redriven or purged meanwhile)".into(),
                    ..Default::default()
                },
            });
        }
        let moved = redriven.iter().filter(|r| r.skipped.is_empty()).count();
        if !refused.is_empty() {
            tracing::warn!(
                dead_letter = store.key(),
                refused = redriven
                    .iter()
                    .filter(|r| r.skipped.starts_with(REDRIVE_REFUSED))
                    .count(),
                errors = ?refused.values().map(|(_, m)| m).collect::<Vec<_>>(),
                "Redis refused redrives; those dead letters are still there"
            );
        }
        tracing::info!(
            dead_letter = store.key(),
            redriven = moved,
            chosen = letters.len(),
            dry_run = request.dry_run,
            "dead letters redriven"
        );
        Ok(Response::new(proto::RedriveDeadLettersResponse {
            redriven,
            dry_run: request.dry_run,
        }))
    }

    async fn purge_dead_letters(
        &self,
        request: Request<proto::PurgeDeadLettersRequest>,
    ) -> Result<Response<proto::PurgeDeadLettersResponse>, Status> {
        let request = request.into_inner();
        let store = store(request.target)?;
        let selection = required(request.selection)?;
        let limit = match request.limit as usize {
            0 => DEFAULT_BATCH,
            n => n,
        };
        let letters = self.select(&store, &selection, limit).await?;
        let mut ids = Vec::with_capacity(letters.len());
        for letter in &letters {
            let removed = request.dry_run
                || match dead_letters::purge(self.shared.redis.pool(), &store, letter).await {
                    Ok(removed) => removed,
                    // Redis refused it (READONLY, NOPERM) or did not answer: the call fails,
                    // as what stops one purge of a key stops the next, but it says how far it
                    // got, so that only the rest need another look.
                    Err(err) => {
                        let status = self.failed(err, &[store.key()]);
                        let before = if ids.is_empty() {
                            "none".to_owned()
                        } else {
                            ids.join(", ")
                        };
                        return Err(Status::new(
                            status.code(),
                            format!(
                                "{}; the purge stopped at {}: {} of the {} dead letters chosen were purged before it ({before}), the rest were not tried",
                                status.message(),
                                letter.id,
                                ids.len(),
                                letters.len(),
                            ),
                        ));
                    }
                };
            if removed {
                ids.push(letter.id.clone());
            }
        }
        tracing::info!(
            dead_letter = store.key(),
            purged = ids.len(),
            dry_run = request.dry_run,
            "dead letters purged"
        );
        Ok(Response::new(proto::PurgeDeadLettersResponse {
            ids,
            dry_run: request.dry_run,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_its_target_and_a_redrive_its_selection() {
        assert_eq!(store(None), Err(RequestError::NoTarget));
        let target = |kind| Some(proto::DeadLetterTarget { kind: Some(kind) });
        assert_eq!(
            store(target(TargetKind::Stream(String::new()))),
            Err(RequestError::NoTarget)
        );
        assert_eq!(
            store(target(TargetKind::List("jobs:dead".into()))),
            Ok(Store::List("jobs:dead".into()))
        );
        assert_eq!(required(None).unwrap_err(), RequestError::NoSelection);
        assert_eq!(
            required(Some(proto::DeadLetterSelection::default())).unwrap_err(),
            RequestError::NoSelection
        );
        let by_age = required(Some(proto::DeadLetterSelection {
            older_than: Some(prost_types::Duration {
                seconds: 90,
                nanos: 500_000_000,
            }),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(by_age.older_than_ms, Some(90_500));
        let status = Status::from(RequestError::NoSelection);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_refused_redrive_says_so_as_the_command_reads_it() {
        let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
        let first = refusal("totals", wrongtype, None);
        let next = refusal("totals", wrongtype, Some("1-0"));
        for skipped in [&first, &next] {
            assert!(skipped.starts_with(REDRIVE_REFUSED), "{skipped}");
            assert!(skipped.contains("still a dead letter") && skipped.ends_with(wrongtype));
        }
        assert!(next.contains("of 1-0 to totals"), "{next}");
    }

    #[test]
    fn a_stream_dead_letter_that_cannot_reenter_its_group_says_what_to_do() {
        let trimmed = not_in_stream("orders", "5-0", "billing");
        let unrecorded = unplaced(&Unplaced::NoEntry {
            stream: "orders".into(),
        });
        for said in [&trimmed, &unrecorded] {
            // The command recognises these by their start and names its flag for `to`.
            assert!(said.starts_with(REDRIVE_NOT_REENTERED), "{said}");
            assert!(said.contains("still a dead letter"), "{said}");
            assert!(said.contains("redrive it with `to`"), "{said}");
            assert!(said.contains("every group of that stream reads"), "{said}");
        }
        assert!(
            trimmed.contains("its entry 5-0 is no longer in orders")
                && trimmed.contains("group billing gets nothing"),
            "{trimmed}"
        );
        let group = Destination::Group {
            stream: "orders".into(),
            group: "billing".into(),
            entry_id: "5-0".into(),
        };
        assert_eq!(destination_text(&group), "orders (group billing)");
        assert_eq!(
            destination_text(&Destination::Copy("totals".into())),
            "totals"
        );
    }
}
