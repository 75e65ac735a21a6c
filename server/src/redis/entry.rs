//! Entries as Redis replies carry them: the entry lists of XREADGROUP, XAUTOCLAIM and XRANGE,
//! and reply values as bytes. An entry list is read from fred's values, or from the frames a
//! reply came in where the sidecar asked for those (a read, the largest reply it gets: no
//! value per field, no UTF-8 check of every field it only passes on).

use bytes::Bytes;
use fred::prelude::Value;
use fred::types::Resp3Frame;

use super::RedisError;
use crate::domain::Entry;

/// A node of a reply, as fred converted it ([`Value`]) or as it came ([`Resp3Frame`]).
pub(crate) trait Reply: Sized {
    /// The elements of an array; `Err(self)` when it is not one.
    fn into_array(self) -> Result<Vec<Self>, Self>;
    /// A bulk or simple string, or a number, as bytes.
    fn into_bytes(self) -> Option<Bytes>;
    fn is_null(&self) -> bool;
}

impl Reply for Value {
    fn into_array(self) -> Result<Vec<Self>, Self> {
        match self {
            Value::Array(items) => Ok(items),
            other => Err(other),
        }
    }

    fn into_bytes(self) -> Option<Bytes> {
        into_bytes(self)
    }

    fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

impl Reply for Resp3Frame {
    fn into_array(self) -> Result<Vec<Self>, Self> {
        match self {
            Resp3Frame::Array { data, .. } => Ok(data),
            other => Err(other),
        }
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Resp3Frame::BlobString { data, .. } | Resp3Frame::SimpleString { data, .. } => {
                Some(data)
            }
            Resp3Frame::Number { data, .. } => Some(Bytes::from(data.to_string())),
            Resp3Frame::Double { data, .. } => Some(Bytes::from(data.to_string())),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        matches!(self, Resp3Frame::Null)
    }
}

/// The entries of an XREADGROUP, XAUTOCLAIM or XRANGE entry list: `[[id, [field, value, ...]],
/// ...]`. Entries deleted while pending come back with no fields; their ids go to `deleted`.
pub(crate) fn parse_entries<R: Reply>(
    command: &'static str,
    list: R,
    deleted: &mut Vec<Bytes>,
) -> Result<Vec<Entry>, RedisError> {
    let protocol = |detail: &str| RedisError::Protocol {
        command,
        detail: detail.to_owned(),
    };
    let items = list
        .into_array()
        .map_err(|_| protocol("entry list is not an array"))?;
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let pair = item
            .into_array()
            .map_err(|_| protocol("entry is not an array"))?;
        let mut pair = pair.into_iter();
        let id = pair
            .next()
            .and_then(R::into_bytes)
            .ok_or_else(|| protocol("entry without id"))?;
        let fields = match pair.next().map(R::into_array) {
            Some(Ok(flat)) => {
                let mut fields = Vec::with_capacity(flat.len() / 2);
                let mut flat = flat.into_iter();
                while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                    let name = name.into_bytes().ok_or_else(|| protocol("field name"))?;
                    let value = value.into_bytes().ok_or_else(|| protocol("field value"))?;
                    fields.push((name, value));
                }
                fields
            }
            None => {
                deleted.push(id);
                continue;
            }
            Some(Err(other)) if other.is_null() => {
                deleted.push(id);
                continue;
            }
            Some(Err(_)) => return Err(protocol("entry fields are not an array")),
        };
        entries.push(Entry {
            id,
            fields,
            delivery_count: 1,
            ..Default::default()
        });
    }
    Ok(entries)
}

/// A bulk or simple string, or an integer, as bytes.
pub(crate) fn into_bytes(value: Value) -> Option<Bytes> {
    match value {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        Value::Integer(i) => Some(Bytes::from(i.to_string())),
        Value::Double(d) => Some(Bytes::from(d.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn parses_entries_and_collects_deleted_ones() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Bytes(b("1-0")),
                Value::Array(vec![Value::Bytes(b("f")), Value::Bytes(b("v"))]),
            ]),
            Value::Array(vec![Value::Bytes(b("2-0")), Value::Null]),
        ]);
        let mut deleted = Vec::new();
        let entries = parse_entries("XREADGROUP", reply, &mut deleted).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].fields, vec![(b("f"), b("v"))]);
        assert_eq!(deleted, vec![b("2-0")]);
        assert!(parse_entries("XREADGROUP", Value::Integer(1), &mut deleted).is_err());
    }

    #[test]
    fn parses_the_same_entries_from_the_frames_a_reply_came_in() {
        let bytes = |data: Bytes| Resp3Frame::BlobString {
            data,
            attributes: None,
        };
        let blob = |s: &str| bytes(b(s));
        // Not UTF-8: passed on as it is.
        let binary = Bytes::from_static(b"\xff\x00");
        let array = |data| Resp3Frame::Array {
            data,
            attributes: None,
        };
        let reply = array(vec![
            array(vec![
                blob("1-0"),
                array(vec![blob("f"), bytes(binary.clone())]),
            ]),
            array(vec![blob("2-0"), Resp3Frame::Null]),
        ]);
        let mut deleted = Vec::new();
        let entries = parse_entries("XREADGROUP", reply, &mut deleted).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id, b("1-0"));
        assert_eq!(entries[0].fields, vec![(b("f"), binary)]);
        assert_eq!(deleted, vec![b("2-0")]);
        let number = Resp3Frame::Number {
            data: 1,
            attributes: None,
        };
        assert!(parse_entries("XREADGROUP", number, &mut deleted).is_err());
    }
}
