//! An entry as a subscription holds it (a stream entry, a list value, a message), its
//! payload-and-headers layout, the headers the sidecar itself writes on retried copies and dead
//! letters, and what one read returned ([`ReadBatch`]). How an entry is parsed from a Redis
//! reply is the Redis adapter's business.

use bytes::Bytes;

use super::frame::{self, Framing};
pub use super::layout::{HEADER_PREFIX, PAYLOAD_FIELD};
/// Header on retried copies: deliveries of the entry before this copy was written.
pub const ATTEMPTS_HEADER: &str = "x-window-attempts";
/// Header on retried copies: the id of the entry first written by the producer.
pub const ORIGINAL_ID_HEADER: &str = "x-window-original-id";
/// Header on retried copies: the reason the client gave with its retry.
pub const REASON_HEADER: &str = "x-window-reason";
/// Header on dead letters: the subscription (`key/group`) that gave up on the entry.
pub const SUBSCRIPTION_HEADER: &str = "x-window-subscription";
/// Header on dead letters: how many times the entry was delivered.
pub const DELIVERIES_HEADER: &str = "x-window-deliveries";
/// ruststream-fred's count, on its retried copies (deliveries before the copy) and dead letters
/// (all deliveries). Read and written beside the sidecar's own, so that a cap holds whichever
/// side retried an entry last.
pub const RUSTSTREAM_RETRY_HEADER: &str = "x-ruststream-retry-count";

/// The headers the sidecar writes afresh on copies and dead letters.
const OURS: [&str; 4] = [
    ATTEMPTS_HEADER,
    ORIGINAL_ID_HEADER,
    REASON_HEADER,
    RUSTSTREAM_RETRY_HEADER,
];

/// One entry as read: a stream entry, a list value (as its payload) or a pub/sub message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The entry id, for example `1700000000000-0`.
    pub id: Bytes,
    /// The fields as stored, in order.
    pub fields: Vec<(Bytes, Bytes)>,
    /// Deliveries of this entry, this one included, counting earlier copies.
    pub delivery_count: u32,
    /// Pub/sub: the channel the message arrived on.
    pub channel: Option<Bytes>,
    /// A list value or message whose fields were decoded from a frame, as stored: settling a
    /// list value and its delivery count need it verbatim. Empty otherwise.
    pub stored: Bytes,
    /// On an ordered subscription, the entry's ordering key (see
    /// [`super::source::OrderingKey`]), found when it was read.
    pub ordering_key: Option<super::Key>,
}

/// An entry's body as the client sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// `_payload` and `h:<name>` fields only.
    Layout {
        payload: &'a Bytes,
        headers: Vec<(&'a [u8], &'a Bytes)>,
    },
    /// Anything else: the raw fields.
    Fields,
}

/// What a stream entry parked past the waiting bound keeps of itself: its id and counts, 24
/// bytes, without its fields or the read's buffer they point into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parked {
    pub ms: u64,
    pub seq: u64,
    pub delivery_count: u32,
    /// Deliveries of earlier copies (see [`Entry::earlier_attempts`]).
    pub earlier_attempts: u32,
}

impl Parked {
    /// The entry's id as Redis writes it.
    pub fn id(&self) -> Bytes {
        Bytes::from(format!("{}-{}", self.ms, self.seq))
    }
}

/// The value of header `name` (without `h:`, in any case) among `fields`, if there.
pub fn header_in<'a>(fields: &'a [(Bytes, Bytes)], name: &str) -> Option<&'a Bytes> {
    fields.iter().find_map(|(field, value)| {
        let rest = field.strip_prefix(HEADER_PREFIX)?;
        rest.eq_ignore_ascii_case(name.as_bytes()).then_some(value)
    })
}

impl Entry {
    /// A list value or message as an entry: its payload and headers when it is a frame and
    /// the subscription reads frames, else the value as its payload.
    pub fn of_value(value: Bytes, framing: Framing) -> Entry {
        let decoded = match framing {
            Framing::Frames => frame::decode(&value),
            Framing::Raw => None,
        };
        match decoded {
            Some(fields) => Entry {
                fields,
                stored: value,
                delivery_count: 1,
                ..Default::default()
            },
            None => Entry {
                fields: vec![(Bytes::from_static(PAYLOAD_FIELD), value)],
                delivery_count: 1,
                ..Default::default()
            },
        }
    }

    /// A list value or message as stored (a list entry is its payload unless it was framed).
    pub fn value(&self) -> &Bytes {
        if self.stored.is_empty() {
            &self.fields[0].1
        } else {
            &self.stored
        }
    }

    /// The id of the entry first written by the producer, which copies carry along; list
    /// values and messages have none.
    fn original_id(&self) -> Option<Bytes> {
        self.header(ORIGINAL_ID_HEADER)
            .cloned()
            .or_else(|| (!self.id.is_empty()).then(|| self.id.clone()))
    }

    /// The value of header `name` (without `h:`, in any case), if the entry has it.
    pub fn header(&self, name: &str) -> Option<&Bytes> {
        header_in(&self.fields, name)
    }

    /// Deliveries of earlier copies: the sidecar's attempts header or ruststream-fred's retry
    /// count, whichever says more (each side raises its own and carries the other's).
    pub fn earlier_attempts(&self) -> u32 {
        let count = |name| {
            self.header(name)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                .unwrap_or(0)
        };
        count(ATTEMPTS_HEADER).max(count(RUSTSTREAM_RETRY_HEADER))
    }

    /// Whether a field is one of the headers the sidecar writes afresh.
    fn is_ours(field: &Bytes) -> bool {
        field
            .strip_prefix(HEADER_PREFIX)
            .is_some_and(|name| OURS.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes())))
    }

    /// Splits payload and headers when the entry is in that layout.
    pub fn body(&self) -> Body<'_> {
        let mut payload = None;
        let mut headers = Vec::new();
        for (field, value) in &self.fields {
            if field.as_ref() == PAYLOAD_FIELD && payload.is_none() {
                payload = Some(value);
            } else if let Some(name) = field.strip_prefix(HEADER_PREFIX) {
                headers.push((name, value));
            } else {
                return Body::Fields;
            }
        }
        match payload {
            Some(payload) => Body::Layout { payload, headers },
            None => Body::Fields,
        }
    }

    /// The fields of a copy written for a retry: the entry's own fields without the sidecar's
    /// headers, then fresh ones.
    pub fn retry_fields(&self, reason: Option<&str>) -> Vec<(Bytes, Bytes)> {
        let mut fields: Vec<_> = self
            .fields
            .iter()
            .filter(|(f, _)| !Self::is_ours(f))
            .cloned()
            .collect();
        let header = |name: &str| Bytes::from(format!("h:{name}"));
        let deliveries = Bytes::from(self.delivery_count.to_string());
        fields.push((header(ATTEMPTS_HEADER), deliveries.clone()));
        fields.push((header(RUSTSTREAM_RETRY_HEADER), deliveries));
        if let Some(original) = self.original_id() {
            fields.push((header(ORIGINAL_ID_HEADER), original));
        }
        if let Some(reason) = reason.filter(|r| !r.is_empty()) {
            fields.push((header(REASON_HEADER), Bytes::from(reason.to_owned())));
        }
        fields
    }

    /// The fields of a dead letter: the entry's own, then where it came from and why.
    pub fn dead_letter_fields(
        &self,
        subscription: &str,
        reason: Option<&str>,
    ) -> Vec<(Bytes, Bytes)> {
        let header = |name: &str| Bytes::from(format!("h:{name}"));
        let mut fields: Vec<_> = self
            .fields
            .iter()
            .filter(|(f, _)| !Self::is_ours(f))
            .cloned()
            .collect();
        let deliveries = Bytes::from(self.delivery_count.to_string());
        if let Some(original) = self.original_id() {
            fields.push((header(ORIGINAL_ID_HEADER), original));
        }
        fields.push((
            header(SUBSCRIPTION_HEADER),
            Bytes::from(subscription.to_owned()),
        ));
        fields.push((header(DELIVERIES_HEADER), deliveries.clone()));
        // ruststream-fred's dead letters say all deliveries in its count.
        fields.push((header(RUSTSTREAM_RETRY_HEADER), deliveries));
        if let Some(reason) = reason.filter(|r| !r.is_empty()) {
            fields.push((header(REASON_HEADER), Bytes::from(reason.to_owned())));
        }
        fields
    }
}

/// What a read returned and where it came from.
#[derive(Debug, Default)]
pub struct ReadBatch {
    pub entries: Vec<Entry>,
    /// Whether the entries may already be outstanding in this window (pending or claimed).
    pub redelivery: bool,
    /// Redelivered stream entries whose `retry_after` is not due yet, with the time left:
    /// held until then.
    pub delayed: Vec<(Entry, std::time::Duration)>,
    /// Entries claimed from idle consumers (or recovered from dead ones).
    pub claimed: usize,
    /// Pub/sub: messages dropped for a slow client since the previous read.
    pub lost: u64,
    /// Round trips this read made: XREADGROUP calls, XAUTOCLAIM calls, XPENDING look-ups.
    pub reads: u32,
    pub claims: u32,
    pub count_lookups: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn entry(fields: &[(&str, &str)]) -> Entry {
        Entry {
            id: b("1-0"),
            fields: fields.iter().map(|(f, v)| (b(f), b(v))).collect(),
            delivery_count: 2,
            ..Default::default()
        }
    }

    #[test]
    fn splits_the_payload_layout() {
        let e = entry(&[("_payload", "{}"), ("h:traceparent", "00-x"), ("h:k", "v")]);
        let Body::Layout { payload, headers } = e.body() else {
            panic!("not the layout")
        };
        assert_eq!(payload, &b("{}"));
        assert_eq!(headers.len(), 2);
        assert_eq!(e.header("traceparent"), Some(&b("00-x")));
        assert_eq!(entry(&[("a", "1")]).body(), Body::Fields);
        assert_eq!(entry(&[("_payload", "x"), ("a", "1")]).body(), Body::Fields);
        assert_eq!(entry(&[("h:only", "headers")]).body(), Body::Fields);
    }

    #[test]
    fn retry_copies_carry_attempts_and_the_original_id() {
        let first = entry(&[("a", "1")]);
        let copy = Entry {
            id: b("9-0"),
            fields: first.retry_fields(Some("flaky")),
            delivery_count: 1,
            ..Default::default()
        };
        assert_eq!(copy.earlier_attempts(), 2);
        assert_eq!(copy.header(ORIGINAL_ID_HEADER), Some(&b("1-0")));
        assert_eq!(copy.header(REASON_HEADER), Some(&b("flaky")));
        // A copy of a copy keeps one set of headers and the first id.
        let again = Entry {
            delivery_count: 3,
            ..copy
        }
        .retry_fields(None);
        assert_eq!(
            again
                .iter()
                .filter(|(f, _)| f.starts_with(b"h:x-window-"))
                .count(),
            2
        );
        assert!(again.contains(&(b("h:x-window-original-id"), b("1-0"))));
        assert!(again.contains(&(b("h:x-window-attempts"), b("3"))));
        assert!(again.contains(&(b("h:x-ruststream-retry-count"), b("3"))));
    }

    #[test]
    fn ruststream_fred_retry_counts_are_read_and_raised() {
        // A copy ruststream-fred retried twice: its count says two deliveries before it.
        let theirs = entry(&[("_payload", "p"), ("h:x-ruststream-retry-count", "2")]);
        assert_eq!(theirs.earlier_attempts(), 2);
        // Whichever side counted more wins (each carries the other's header along).
        let both = entry(&[
            ("_payload", "p"),
            ("h:x-window-attempts", "1"),
            ("h:X-Ruststream-Retry-Count", "4"),
        ]);
        assert_eq!(both.earlier_attempts(), 4);
        // Our copy of its third delivery says 3 in both counts, once each.
        let copy = Entry {
            delivery_count: 3,
            ..theirs
        }
        .retry_fields(None);
        let counts: Vec<_> = copy
            .iter()
            .filter(|(f, _)| f.ends_with(b"retry-count") || f.ends_with(b"attempts"))
            .collect();
        assert_eq!(
            counts,
            [
                &(b("h:x-window-attempts"), b("3")),
                &(b("h:x-ruststream-retry-count"), b("3"))
            ]
        );
        // A dead letter says all deliveries in ruststream-fred's count too.
        let dead = Entry {
            delivery_count: 5,
            ..entry(&[("_payload", "p"), ("h:x-ruststream-retry-count", "4")])
        }
        .dead_letter_fields("orders/g", Some("boom"));
        assert!(dead.contains(&(b("h:x-ruststream-retry-count"), b("5"))));
        assert!(dead.contains(&(b("h:x-window-deliveries"), b("5"))));
        assert_eq!(
            dead.iter()
                .filter(|(f, _)| f.as_ref() == b"h:x-ruststream-retry-count")
                .count(),
            1
        );
    }
}
