//! Entries as Redis replies carry them: the entry lists of XREADGROUP and XAUTOCLAIM, and
//! reply values as bytes.

use bytes::Bytes;
use fred::prelude::Value;

use super::RedisError;
use crate::domain::Entry;

/// The entries of an XREADGROUP or XAUTOCLAIM entry list: `[[id, [field, value, ...]], ...]`.
/// Entries deleted while pending come back with no fields; their ids go to `deleted`.
pub(crate) fn parse_entries(
    command: &'static str,
    list: Value,
    deleted: &mut Vec<Bytes>,
) -> Result<Vec<Entry>, RedisError> {
    let protocol = |detail: &str| RedisError::Protocol {
        command,
        detail: detail.to_owned(),
    };
    let Value::Array(items) = list else {
        return Err(protocol("entry list is not an array"));
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(pair) = item else {
            return Err(protocol("entry is not an array"));
        };
        let mut pair = pair.into_iter();
        let id = pair
            .next()
            .and_then(into_bytes)
            .ok_or_else(|| protocol("entry without id"))?;
        let fields = match pair.next() {
            Some(Value::Array(flat)) => {
                let mut fields = Vec::with_capacity(flat.len() / 2);
                let mut flat = flat.into_iter();
                while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                    let name = into_bytes(name).ok_or_else(|| protocol("field name"))?;
                    let value = into_bytes(value).ok_or_else(|| protocol("field value"))?;
                    fields.push((name, value));
                }
                fields
            }
            Some(Value::Null) | None => {
                deleted.push(id);
                continue;
            }
            Some(_) => return Err(protocol("entry fields are not an array")),
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
}
