//! ruststream-fred's binary frame: how a list value or a pub/sub message, which is one opaque
//! value, carries headers beside its payload.
//!
//! ```text
//! [u32 header_count] then header_count times [u32 name_len][name][u32 value_len][value],
//! then the payload to the end; every length big-endian, names UTF-8
//! ```
//!
//! The frame has no magic number. A value is read as a frame when it parses as one completely
//! (ruststream-fred's own rule), anything else is a raw payload. Text and JSON never parse (their
//! first four bytes make a header count far beyond the value's length); a binary payload whose
//! first byte is zero might, which is why a subscription can opt out with [`Framing::Raw`].
//!
//! Decoded, a frame is the payload-and-headers layout every form shares (`_payload`,
//! `h:<name>`), so deliveries, retried copies and dead letters treat it like a stream entry's
//! fields.

use bytes::{BufMut, Bytes, BytesMut};

use super::layout::{HEADER_PREFIX, PAYLOAD_FIELD};

/// How a subscription reads list values or messages, and how its copies are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Framing {
    /// A value that parses as a frame is delivered as payload and headers, and copies of it are
    /// framed; dead letters are framed, so they carry their reason and counts.
    #[default]
    Frames,
    /// Values are opaque: delivered, copied and dead-lettered exactly as stored.
    Raw,
}

/// The payload-and-headers fields of a frame, or `None` when the value is not one. The fields
/// share the value's memory.
pub fn decode(value: &Bytes) -> Option<Vec<(Bytes, Bytes)>> {
    let mut cursor = Cursor { value, pos: 0 };
    let count = cursor.length()?;
    // Each header takes at least 8 bytes: a count the value cannot hold is not a frame, and
    // nothing is allocated for it.
    if count > value.len() / 8 {
        return None;
    }
    let mut fields = Vec::with_capacity(count + 1);
    fields.push((Bytes::from_static(PAYLOAD_FIELD), Bytes::new()));
    for _ in 0..count {
        let name = cursor.prefixed()?;
        std::str::from_utf8(&name).ok()?;
        let header = cursor.prefixed()?;
        let mut field = BytesMut::with_capacity(HEADER_PREFIX.len() + name.len());
        field.put_slice(HEADER_PREFIX);
        field.put_slice(&name);
        fields.push((field.freeze(), header));
    }
    fields[0].1 = value.slice(cursor.pos..);
    Some(fields)
}

/// Reads a frame front to back.
struct Cursor<'a> {
    value: &'a Bytes,
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, len: usize) -> Option<Bytes> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|end| *end <= self.value.len())?;
        let slice = self.value.slice(self.pos..end);
        self.pos = end;
        Some(slice)
    }

    fn length(&mut self) -> Option<usize> {
        let raw = self.take(4)?;
        Some(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize)
    }

    /// A length-prefixed part.
    fn prefixed(&mut self) -> Option<Bytes> {
        let len = self.length()?;
        self.take(len)
    }
}

/// The frame of payload-and-headers fields (`_payload` first, then `h:<name>` fields); other
/// fields are not part of the layout and are left out.
pub fn encode(fields: &[(Bytes, Bytes)]) -> Bytes {
    let payload = fields
        .iter()
        .find(|(field, _)| field.as_ref() == PAYLOAD_FIELD)
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    let headers: Vec<(&[u8], &Bytes)> = fields
        .iter()
        .filter_map(|(field, value)| Some((field.strip_prefix(HEADER_PREFIX)?, value)))
        .collect();
    let size = 4
        + headers
            .iter()
            .map(|(name, value)| 8 + name.len() + value.len())
            .sum::<usize>()
        + payload.len();
    let mut frame = BytesMut::with_capacity(size);
    frame.put_u32(headers.len() as u32);
    for (name, value) in headers {
        frame.put_u32(name.len() as u32);
        frame.put_slice(name);
        frame.put_u32(value.len() as u32);
        frame.put_slice(value);
    }
    frame.put_slice(&payload);
    frame.freeze()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// The bytes ruststream-fred writes for payload `{}` and one header, spelled out.
    #[test]
    fn reads_and_writes_the_frame_byte_for_byte() {
        let mut wire = vec![0, 0, 0, 1, 0, 0, 0, 12];
        wire.extend_from_slice(b"content-type");
        wire.extend_from_slice(&[0, 0, 0, 16]);
        wire.extend_from_slice(b"application/json");
        wire.extend_from_slice(b"{}");
        let wire = Bytes::from(wire);
        let fields = decode(&wire).expect("a frame");
        assert_eq!(
            fields,
            [
                (b("_payload"), b("{}")),
                (b("h:content-type"), b("application/json"))
            ]
        );
        assert_eq!(encode(&fields), wire);
    }

    #[test]
    fn values_that_are_not_frames_stay_raw() {
        for raw in [
            "",
            "hi",
            "{\"id\":1}",
            "plain text of some length",
            "\0\0\0\x02ab",
        ] {
            assert_eq!(decode(&b(raw)), None, "{raw:?}");
        }
        // An empty frame is four zero bytes; anything after them is the payload.
        assert_eq!(
            decode(&b("\0\0\0\0pay")),
            Some(vec![(b("_payload"), b("pay"))])
        );
        // A header name must be text.
        assert_eq!(
            decode(&Bytes::from_static(b"\0\0\0\x01\0\0\0\x01\xff\0\0\0\0")),
            None
        );
    }

    proptest! {
        #[test]
        fn every_layout_survives_the_round_trip(
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            headers in proptest::collection::vec(("[a-z-]{1,12}", proptest::collection::vec(any::<u8>(), 0..24)), 0..6),
        ) {
            let mut fields = vec![(b("_payload"), Bytes::from(payload))];
            fields.extend(headers.into_iter().map(|(n, v)| (Bytes::from(format!("h:{n}")), Bytes::from(v))));
            let frame = encode(&fields);
            prop_assert_eq!(decode(&frame), Some(fields));
        }

        #[test]
        fn decoding_any_value_never_panics_and_what_parses_writes_back_the_same(
            value in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let value = Bytes::from(value);
            if let Some(fields) = decode(&value) {
                prop_assert_eq!(encode(&fields), value);
            }
        }
    }
}
