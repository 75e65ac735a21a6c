//! One dead letter as it reads: where it came from, how often it was delivered, why, and its
//! body, decoded from the fields of a dead-letter stream entry or from a dead-letter list's
//! value (a frame, else raw bytes: shown, never dropped). Also which dead letters a selection
//! chooses ([`Choice`]: one dead letter per id, even among identical list values), where a
//! redrive sends one ([`Destination`]: a stream dead letter back into its own consumer group, or
//! a copy), the fields of a redriven copy, where dead letters are kept ([`Store`]) and what a
//! redrive did ([`Redrive`]).

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;

use super::entry::{
    ATTEMPTS_HEADER, DELIVERIES_HEADER, Entry, HEADER_PREFIX, ORIGINAL_ID_HEADER, PAYLOAD_FIELD,
    REASON_HEADER, RUSTSTREAM_RETRY_HEADER, SUBSCRIPTION_HEADER,
};
use super::frame;
use super::pattern::Patterns;

/// Header on redriven copies: `<times redriven>;<unix ms of the last redrive>`.
pub const REDRIVEN_HEADER: &str = "x-window-redriven";

/// How a redrive's `skipped` begins when Redis refused the write (the dead letter stayed), so
/// that the command can tell a refusal, which it exits 1 for, from a dead letter that names no
/// origin or was gone.
pub const REDRIVE_REFUSED: &str = "Redis refused the redrive";

/// How a redrive's `skipped` begins when a stream dead letter cannot re-enter its group by
/// itself (its entry is no longer in the stream, or it does not record which entry or group it
/// was), so that the command can say which of its flags redrives it anyway.
pub const REDRIVE_NOT_REENTERED: &str = "it cannot re-enter its consumer group";

/// The headers a redriven copy leaves behind: its counts restart, its origin and reason were
/// about the delivery that gave up.
const RESET: [&str; 5] = [
    ATTEMPTS_HEADER,
    DELIVERIES_HEADER,
    RUSTSTREAM_RETRY_HEADER,
    REASON_HEADER,
    SUBSCRIPTION_HEADER,
];

/// A dead letter, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Letter {
    /// A stream entry id, or `<index from the oldest>:<digest>` for a list value.
    pub id: String,
    /// The fields: a stream entry's, a frame's (`_payload`, `h:<name>`), or for a raw list
    /// value only `_payload`.
    pub fields: Vec<(Bytes, Bytes)>,
    /// A list value as stored (what LREM must name); empty for stream entries.
    pub stored: Bytes,
    /// A list value that is not a frame.
    pub raw: bool,
    /// When it was written (the stream id's time), in Unix ms.
    pub written_ms: Option<u64>,
}

impl Letter {
    /// A dead-letter stream entry.
    pub fn from_entry(entry: Entry) -> Self {
        let id = String::from_utf8_lossy(&entry.id).into_owned();
        let written_ms = id.split('-').next().and_then(|ms| ms.parse().ok());
        Self {
            id,
            fields: entry.fields,
            stored: Bytes::new(),
            raw: false,
            written_ms,
        }
    }

    /// A dead-letter list value, `index` places from the oldest.
    pub fn from_value(index: usize, value: Bytes) -> Self {
        let id = list_id(index, &value);
        match frame::decode(&value) {
            Some(fields) => Self {
                id,
                fields,
                stored: value,
                raw: false,
                written_ms: None,
            },
            None => Self {
                id,
                fields: vec![(Bytes::from_static(PAYLOAD_FIELD), value.clone())],
                stored: value,
                raw: true,
                written_ms: None,
            },
        }
    }

    fn entry(&self) -> Entry {
        Entry {
            fields: self.fields.clone(),
            ..Default::default()
        }
    }

    fn header_text(&self, name: &str) -> Option<String> {
        let entry = self.entry();
        let value = entry.header(name)?;
        Some(String::from_utf8_lossy(value).into_owned())
    }

    /// Where it came from: the key (and a stream's group) its `x-window-subscription` names.
    pub fn origin(&self, stream: bool) -> Option<(String, Option<String>)> {
        let subscription = self.header_text(SUBSCRIPTION_HEADER)?;
        if stream && let Some((key, group)) = subscription.rsplit_once('/') {
            return Some((key.to_owned(), Some(group.to_owned())));
        }
        Some((subscription, None))
    }

    /// The id of the stream entry it was (`x-window-original-id`), when it records one that is a
    /// stream id.
    pub fn original_id(&self) -> Option<String> {
        let id = self.header_text(ORIGINAL_ID_HEADER)?;
        let (ms, seq) = id.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits(ms) && digits(seq)).then_some(id)
    }

    /// Where a redrive sends it. `to`, when given, is where a copy goes, whichever key it
    /// names (its own origin included: an explicit target is always a copy, which every group
    /// of a stream reads). Without it a stream dead letter goes back into the consumer group it
    /// came from as the entry it was, and a list dead letter's copy onto the list it came from.
    pub fn destination(&self, store: &Store, to: Option<&str>) -> Result<Destination, Unplaced> {
        if let Some(to) = to.filter(|to| !to.is_empty()) {
            return Ok(Destination::Copy(to.to_owned()));
        }
        match self.origin(store.is_stream()) {
            None => Err(Unplaced::NoOrigin),
            Some((key, _)) if !store.is_stream() => Ok(Destination::Copy(key)),
            Some((stream, Some(group))) => match self.original_id() {
                Some(entry_id) => Ok(Destination::Group {
                    stream,
                    group,
                    entry_id,
                }),
                None => Err(Unplaced::NoEntry { stream }),
            },
            Some((stream, None)) => Err(Unplaced::NoEntry { stream }),
        }
    }

    /// Deliveries before it gave up: the sidecar's count, else ruststream-fred's.
    pub fn deliveries(&self) -> u32 {
        [DELIVERIES_HEADER, RUSTSTREAM_RETRY_HEADER]
            .iter()
            .find_map(|h| self.header_text(h)?.parse().ok())
            .unwrap_or(0)
    }

    pub fn reason(&self) -> Option<String> {
        self.header_text(REASON_HEADER)
    }

    /// Times it was redriven before.
    pub fn redriven(&self) -> u32 {
        self.header_text(REDRIVEN_HEADER)
            .and_then(|v| v.split(';').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// The payload, when the fields are in the payload-and-headers layout.
    pub fn payload(&self) -> Option<&Bytes> {
        self.layout().then(|| &self.fields[0].1)
    }

    /// `_payload` and `h:<name>` fields only.
    fn layout(&self) -> bool {
        matches!(self.fields.first(), Some((f, _)) if f.as_ref() == PAYLOAD_FIELD)
            && self.fields[1..]
                .iter()
                .all(|(f, _)| f.starts_with(HEADER_PREFIX))
    }

    /// The headers (names without `h:`), when in the layout.
    pub fn headers(&self) -> Vec<(String, Bytes)> {
        if !self.layout() {
            return Vec::new();
        }
        self.fields[1..]
            .iter()
            .map(|(f, v)| {
                let name = String::from_utf8_lossy(&f[HEADER_PREFIX.len()..]).into_owned();
                (name, v.clone())
            })
            .collect()
    }

    /// The fields of the copy a redrive writes: the letter's own without the counts, origin
    /// and reason of the delivery that gave up, and `x-window-redriven` raised. A stream
    /// entry's, or a frame's for a list; a raw list value goes back as it is.
    pub fn redriven_fields(&self, now_ms: u64) -> Vec<(Bytes, Bytes)> {
        let reset = |f: &Bytes| {
            f.strip_prefix(HEADER_PREFIX).is_some_and(|name| {
                RESET
                    .iter()
                    .chain([&REDRIVEN_HEADER])
                    .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
            })
        };
        let mut fields: Vec<_> = self
            .fields
            .iter()
            .filter(|(f, _)| !reset(f))
            .cloned()
            .collect();
        fields.push((
            Bytes::from(format!("h:{REDRIVEN_HEADER}")),
            Bytes::from(format!("{};{now_ms}", self.redriven() + 1)),
        ));
        fields
    }

    /// A list value's copy: a frame of [`Letter::redriven_fields`], or the raw value.
    pub fn redriven_value(&self, now_ms: u64) -> Bytes {
        if self.raw {
            self.stored.clone()
        } else {
            frame::encode(&self.redriven_fields(now_ms))
        }
    }
}

/// A list value's id: its place from the oldest and a digest of its bytes (FNV-1a, 64 bits):
/// stable across processes, and a value that moved is still found by its digest.
pub fn list_id(index: usize, value: &[u8]) -> String {
    format!("{index}:{:016x}", digest(value))
}

/// The digest part of a list id.
pub fn list_digest(id: &str) -> Option<(usize, u64)> {
    let (index, digest) = id.split_once(':')?;
    Some((index.parse().ok()?, u64::from_str_radix(digest, 16).ok()?))
}

pub fn digest(value: &[u8]) -> u64 {
    value.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Which dead letters a call chooses: those matching every criterion given.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    pub ids: Vec<String>,
    pub reason: Option<Patterns>,
    pub older_than_ms: Option<u64>,
    pub all: bool,
}

impl Selection {
    /// Whether it names anything at all (a redrive or purge must).
    pub fn is_given(&self) -> bool {
        self.all || !self.ids.is_empty() || self.reason.is_some() || self.older_than_ms.is_some()
    }

    /// Whether `letter` is one the selection may choose. A list id matches every value with
    /// its digest, so identical values all match it: [`Choice`] picks one per id.
    pub fn chooses(&self, letter: &Letter, now_ms: u64) -> bool {
        let by_id = self.ids.is_empty() || self.ids.iter().any(|id| same_id(id, &letter.id));
        let by_reason = self.reason.as_ref().is_none_or(|p| {
            letter
                .reason()
                .is_some_and(|reason| p.allows(reason.as_bytes()))
        });
        let by_age = self.older_than_ms.is_none_or(|age| {
            letter
                .written_ms
                .is_some_and(|written| now_ms.saturating_sub(written) >= age)
        });
        by_id && by_reason && by_age
    }
}

/// Whether `id` names the dead letter `asked` names. A list id names a value by its digest:
/// the index may have moved since it was listed.
pub fn same_id(asked: &str, id: &str) -> bool {
    match (list_digest(asked), list_digest(id)) {
        (Some((_, a)), Some((_, b))) => a == b,
        _ => asked == id,
    }
}

/// The dead letters a selection chooses, picked as a store is read oldest first.
///
/// Identical list values share a digest, so a list id matches all of them; acting on each
/// would purge or redrive every copy when one was asked for. Each list id asked picks one
/// value: the one at the place it names when that still holds its digest (so the id
/// reported is the one asked), else one of the others with that digest (it moved; identical
/// values are interchangeable). A place is read once, so no value is picked twice.
#[derive(Debug)]
pub struct Choice<'a> {
    selection: &'a Selection,
    now_ms: u64,
    limit: usize,
    /// Per digest a list id asked for: the places asked and what the read found.
    asked: HashMap<u64, Asked>,
    /// Every id asked is a list id: once each is found at its place, nothing else can match.
    list_ids_only: bool,
    /// Picked, in the order read, each with the digest it stands in for when it is a spare.
    picked: Vec<(Letter, Option<u64>)>,
}

#[derive(Debug, Default)]
struct Asked {
    places: BTreeSet<usize>,
    /// Values found at a place asked.
    at_place: usize,
    /// Values with the digest elsewhere, kept until the read shows whether they are needed.
    spares: usize,
}

impl Asked {
    fn wanted(&self) -> usize {
        self.places.len()
    }
}

impl<'a> Choice<'a> {
    /// At most `limit` of the dead letters `selection` chooses.
    pub fn new(selection: &'a Selection, now_ms: u64, limit: usize) -> Self {
        let mut asked: HashMap<u64, Asked> = HashMap::new();
        let mut list_ids_only = true;
        for id in &selection.ids {
            match list_digest(id) {
                Some((place, digest)) => {
                    asked.entry(digest).or_default().places.insert(place);
                }
                None => list_ids_only = false,
            }
        }
        Self {
            selection,
            now_ms,
            limit,
            asked,
            list_ids_only,
            picked: Vec::new(),
        }
    }

    /// Offers the next dead letter read; returns whether the choice is made (read no more).
    pub fn offer(&mut self, letter: Letter) -> bool {
        if self.selection.chooses(&letter, self.now_ms) {
            match list_digest(&letter.id) {
                Some((place, digest)) if self.asked.contains_key(&digest) => {
                    let asked = self.asked.get_mut(&digest).expect("checked");
                    if asked.places.contains(&place) {
                        asked.at_place += 1;
                        self.picked.push((letter, None));
                    } else if asked.spares < asked.wanted() {
                        asked.spares += 1;
                        self.picked.push((letter, Some(digest)));
                    }
                }
                _ => self.picked.push((letter, None)),
            }
        }
        self.made()
    }

    fn made(&self) -> bool {
        if self.asked.is_empty() {
            return self.picked.len() >= self.limit;
        }
        self.list_ids_only && self.asked.values().all(|a| a.at_place == a.wanted())
    }

    /// The dead letters chosen, oldest first: spares only as many as the places asked that
    /// held no value of their digest.
    pub fn into_letters(self) -> Vec<Letter> {
        let mut missing: HashMap<u64, usize> = self
            .asked
            .iter()
            .map(|(digest, a)| (*digest, a.wanted() - a.at_place))
            .collect();
        self.picked
            .into_iter()
            .filter(|(_, spare)| match spare {
                None => true,
                Some(digest) => match missing.get_mut(digest) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    _ => false,
                },
            })
            .map(|(letter, _)| letter)
            .take(self.limit)
            .collect()
    }
}

/// Where dead letters are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    Stream(String),
    List(String),
}

impl Store {
    pub fn key(&self) -> &str {
        match self {
            Store::Stream(key) | Store::List(key) => key,
        }
    }

    pub fn is_stream(&self) -> bool {
        matches!(self, Store::Stream(_))
    }
}

/// Where a redrive sends a dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// Back into the consumer group of the stream it came from, as the entry it was: pending
    /// in that group again under its original id, with its delivery count reset, for a live
    /// subscriber of the group to reclaim. No other group of the stream sees it again.
    Group {
        stream: String,
        group: String,
        /// The stream entry it was (`x-window-original-id`).
        entry_id: String,
    },
    /// A copy appended to this stream or pushed onto this list: every group of a stream reads
    /// it.
    Copy(String),
}

impl Destination {
    /// The key a redrive writes (checked against `--allow-keys`).
    pub fn key(&self) -> &str {
        match self {
            Destination::Group { stream, .. } => stream,
            Destination::Copy(key) => key,
        }
    }

    /// The consumer group it re-enters, for a redrive back into its group.
    pub fn group(&self) -> Option<&str> {
        match self {
            Destination::Group { group, .. } => Some(group),
            Destination::Copy(_) => None,
        }
    }

    /// The stream entry it puts back, for a redrive back into its group.
    pub fn entry_id(&self) -> Option<&str> {
        match self {
            Destination::Group { entry_id, .. } => Some(entry_id),
            Destination::Copy(_) => None,
        }
    }
}

/// Why a dead letter has nowhere to go unless the redrive names a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// It does not say where it came from (ruststream-fred's, or one a producer pushed).
    NoOrigin,
    /// A stream dead letter that names its stream but not the group or the stream entry it came
    /// from (written by something other than the sidecar): it cannot re-enter one group.
    NoEntry { stream: String },
}

/// What one redrive did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redrive {
    /// The copy was written (with its stream id).
    Written(Option<String>),
    /// The entry is pending in its group again, under its original id (this one).
    Reentered(String),
    /// The entry is no longer in its stream (trimmed or deleted): it could not re-enter its
    /// group, and the dead letter stays.
    NotInStream,
    /// The dead letter was gone already (redriven or purged by someone else).
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn stream_letter() -> Letter {
        Letter::from_entry(Entry {
            id: b("1700000000000-0"),
            fields: vec![
                (b("_payload"), b("{\"order\":1}")),
                (b("h:tenant"), b("acme")),
                (b("h:x-window-original-id"), b("1699999999999-0")),
                (b("h:x-window-subscription"), b("orders/billing")),
                (b("h:x-window-deliveries"), b("5")),
                (b("h:x-ruststream-retry-count"), b("5")),
                (b("h:x-window-reason"), b("card declined")),
            ],
            ..Default::default()
        })
    }

    #[test]
    fn a_stream_dead_letter_says_where_it_came_from_and_why() {
        let letter = stream_letter();
        assert_eq!(
            letter.origin(true),
            Some(("orders".into(), Some("billing".into())))
        );
        assert_eq!(letter.deliveries(), 5);
        assert_eq!(letter.reason().as_deref(), Some("card declined"));
        assert_eq!(letter.payload(), Some(&b("{\"order\":1}")));
        assert_eq!(letter.headers()[0], ("tenant".into(), b("acme")));
        assert_eq!(letter.written_ms, Some(1_700_000_000_000));
        assert_eq!(letter.redriven(), 0);
    }

    #[test]
    fn a_stream_dead_letter_goes_back_into_its_group_unless_a_target_is_named() {
        let letter = stream_letter();
        let stream = Store::Stream("orders:dead".into());
        assert_eq!(
            letter.destination(&stream, None),
            Ok(Destination::Group {
                stream: "orders".into(),
                group: "billing".into(),
                entry_id: "1699999999999-0".into(),
            })
        );
        // A target named is a copy, even when it is the origin itself.
        for to in ["orders", "orders:replay"] {
            assert_eq!(
                letter.destination(&stream, Some(to)),
                Ok(Destination::Copy(to.into()))
            );
        }
        assert_eq!(
            letter.destination(&stream, Some("")),
            letter.destination(&stream, None)
        );
        // Without the entry it was, or the group, it has nowhere to go by itself.
        let without = |name: &str, value: Option<&str>| {
            let mut fields: Vec<_> = letter
                .fields
                .iter()
                .filter(|(f, _)| f.as_ref() != format!("h:{name}").as_bytes())
                .cloned()
                .collect();
            if let Some(value) = value {
                fields.push((Bytes::from(format!("h:{name}")), b(value)));
            }
            Letter::from_entry(Entry {
                id: b("1-0"),
                fields,
                ..Default::default()
            })
        };
        let no_entry = Err(Unplaced::NoEntry {
            stream: "orders".into(),
        });
        assert_eq!(
            without(ORIGINAL_ID_HEADER, None).destination(&stream, None),
            no_entry
        );
        assert_eq!(
            without(ORIGINAL_ID_HEADER, Some("not-an-id")).destination(&stream, None),
            no_entry
        );
        assert_eq!(
            without(SUBSCRIPTION_HEADER, Some("orders")).destination(&stream, None),
            no_entry
        );
        assert_eq!(
            without(SUBSCRIPTION_HEADER, None).destination(&stream, None),
            Err(Unplaced::NoOrigin)
        );
        // A list dead letter's copy goes onto its list.
        let framed = frame::encode(&[
            (b("_payload"), b("p")),
            (b("h:x-window-subscription"), b("jobs")),
        ]);
        let list = Store::List("jobs:dead".into());
        assert_eq!(
            Letter::from_value(0, framed).destination(&list, None),
            Ok(Destination::Copy("jobs".into()))
        );
    }

    #[test]
    fn a_redriven_copy_restarts_its_counts_and_says_it_was_redriven() {
        let copy = stream_letter().redriven_fields(42);
        let names: Vec<_> = copy.iter().map(|(f, _)| f.clone()).collect();
        assert_eq!(
            names,
            [
                b("_payload"),
                b("h:tenant"),
                b("h:x-window-original-id"),
                b("h:x-window-redriven")
            ]
        );
        assert_eq!(copy[3].1, b("1;42"));
        // Redriven again: the count goes on.
        let again = Letter::from_entry(Entry {
            id: b("1-0"),
            fields: copy,
            ..Default::default()
        });
        assert_eq!(again.redriven(), 1);
        assert_eq!(again.redriven_fields(50).last().unwrap().1, b("2;50"));
    }

    #[test]
    fn list_values_are_frames_or_shown_raw() {
        let framed = frame::encode(&[
            (b("_payload"), b("p")),
            (b("h:x-window-subscription"), b("jobs")),
            (b("h:x-ruststream-retry-count"), b("3")),
        ]);
        let letter = Letter::from_value(0, framed);
        assert!(!letter.raw);
        assert_eq!(letter.origin(false), Some(("jobs".into(), None)));
        assert_eq!(letter.deliveries(), 3);
        assert_eq!(letter.payload(), Some(&b("p")));
        let copy = Letter::from_value(0, letter.redriven_value(7));
        assert_eq!(copy.redriven(), 1);
        assert_eq!(copy.origin(false), None);

        let raw = Letter::from_value(3, b("not a frame"));
        assert!(raw.raw);
        assert_eq!(raw.payload(), Some(&b("not a frame")));
        assert_eq!(raw.redriven_value(7), b("not a frame"));
        assert!(raw.id.starts_with("3:"));
    }

    #[test]
    fn a_selection_matches_every_criterion_given() {
        let letter = stream_letter();
        let now = 1_700_000_060_000;
        let all = Selection {
            all: true,
            ..Default::default()
        };
        assert!(all.is_given() && all.chooses(&letter, now));
        assert!(!Selection::default().is_given());
        let by_reason = |p: &str| Selection {
            reason: Some(Patterns::new(&[p])),
            ..Default::default()
        };
        assert!(by_reason("card*").chooses(&letter, now));
        assert!(!by_reason("timeout*").chooses(&letter, now));
        let older = |ms| Selection {
            older_than_ms: Some(ms),
            ..Default::default()
        };
        assert!(older(60_000).chooses(&letter, now));
        assert!(!older(60_001).chooses(&letter, now));
        let ids = |id: &str| Selection {
            ids: vec![id.into()],
            ..Default::default()
        };
        assert!(ids("1700000000000-0").chooses(&letter, now));
        assert!(!ids("1700000000000-1").chooses(&letter, now));
        // A list id still names its value once the value moved.
        let value = Letter::from_value(2, b("v"));
        assert!(ids(&list_id(5, b"v")).chooses(&value, now));
        assert!(!ids(&list_id(2, b"w")).chooses(&value, now));
    }

    /// Reads `values` (oldest first) as a list store and returns the ids `ids` chooses.
    fn chosen(values: &[&str], ids: &[String], limit: usize) -> Vec<String> {
        let selection = Selection {
            ids: ids.to_vec(),
            ..Default::default()
        };
        let mut choice = Choice::new(&selection, 0, limit);
        for (place, value) in values.iter().enumerate() {
            if choice.offer(Letter::from_value(place, b(value))) {
                break;
            }
        }
        choice.into_letters().into_iter().map(|l| l.id).collect()
    }

    #[test]
    fn a_list_id_chooses_one_of_identical_values() {
        let twins = ["job-7", "job-7", "job-8", "job-7"];
        let id = |place, value: &str| list_id(place, value.as_bytes());
        // Each id one value, the one at its place.
        assert_eq!(chosen(&twins, &[id(1, "job-7")], 100), [id(1, "job-7")]);
        assert_eq!(
            chosen(&twins, &[id(0, "job-7"), id(3, "job-7")], 100),
            [id(0, "job-7"), id(3, "job-7")]
        );
        // An id given twice is one.
        assert_eq!(
            chosen(&twins, &[id(0, "job-7"), id(0, "job-7")], 100),
            [id(0, "job-7")]
        );
        // A value that moved is still found by its digest: the first not chosen otherwise.
        assert_eq!(
            chosen(&twins, &[id(2, "job-7"), id(0, "job-7")], 100),
            [id(0, "job-7"), id(1, "job-7")]
        );
        assert_eq!(chosen(&twins, &[id(9, "job-8")], 100), [id(2, "job-8")]);
        // More ids than copies: every copy, once.
        let asked: Vec<_> = (4..9).map(|place| id(place, "job-7")).collect();
        assert_eq!(
            chosen(&twins, &asked, 100),
            [id(0, "job-7"), id(1, "job-7"), id(3, "job-7")]
        );
        assert_eq!(chosen(&twins, &[id(0, "job-9")], 100), Vec::<String>::new());
        assert_eq!(chosen(&twins, &asked, 2), [id(0, "job-7"), id(1, "job-7")]);
    }

    #[test]
    fn a_choice_without_ids_takes_every_match_up_to_its_limit() {
        let values = ["a", "a", "b"];
        let all = Selection {
            all: true,
            ..Default::default()
        };
        let mut choice = Choice::new(&all, 0, 2);
        assert!(!choice.offer(Letter::from_value(0, b(values[0]))));
        assert!(
            choice.offer(Letter::from_value(1, b(values[1]))),
            "the limit is reached"
        );
        assert_eq!(choice.into_letters().len(), 2);
        // Stream ids name one entry each, however often they are given.
        let letter = stream_letter();
        let twice = Selection {
            ids: vec![letter.id.clone(), letter.id.clone()],
            ..Default::default()
        };
        let mut choice = Choice::new(&twice, 0, 100);
        assert!(!choice.offer(letter.clone()));
        assert_eq!(choice.into_letters(), [letter]);
    }
}
