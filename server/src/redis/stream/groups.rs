//! What `XINFO GROUPS <key>` says of one consumer group: its pending count, its lag and its
//! last delivered id, taken apart from the reply (the sampler sends the command, in
//! `super::super::sample`). A reply is a list of groups, each a list of field and value pairs
//! over RESP2 (the sidecar's protocol) or a map over RESP3; both are read.

use bytes::Bytes;
use fred::prelude::*;

use super::super::entry::into_bytes;

/// What XINFO GROUPS says of one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupInfo {
    /// Entries delivered to its consumers and not acknowledged.
    pub pending: i64,
    /// Entries not yet delivered to it; `None` (nil) where Redis cannot tell: after XDEL or
    /// trimming past the group, or on a group created at an arbitrary id.
    pub lag: Option<i64>,
    /// The id of the last entry delivered to it.
    pub last_delivered: Option<Bytes>,
}

/// The group named `group` in an XINFO GROUPS reply; `None` when the reply lists no such
/// group, or is not a list of groups.
pub(crate) fn find_group(reply: Value, group: &[u8]) -> Option<GroupInfo> {
    let Value::Array(groups) = reply else {
        return None;
    };
    for fields in groups {
        let fields: Vec<Value> = match fields {
            Value::Array(fields) => fields,
            Value::Map(map) => map
                .inner()
                .into_iter()
                .flat_map(|(k, v)| [Value::from(k), v])
                .collect(),
            _ => continue,
        };
        let mut name = None;
        let mut info = GroupInfo::default();
        for pair in fields.chunks(2) {
            let [field, value] = pair else { continue };
            match field.as_str().as_deref() {
                Some("name") => name = into_bytes(value.clone()),
                Some("pending") => info.pending = value.as_i64().unwrap_or(0),
                Some("lag") => info.lag = value.as_i64(),
                Some("last-delivered-id") => info.last_delivered = into_bytes(value.clone()),
                _ => {}
            }
        }
        if name.as_deref() == Some(group) {
            return Some(info);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::types::Resp3Frame;

    /// `XINFO GROUPS s` as Redis 7.0 sent it, over RESP2 (`HELLO 2`), for a stream of three
    /// entries (1000-0, 2000-0, 3000-0): `g` created at 0 with one entry read and pending,
    /// `other` created at `$`, then 3000-0 deleted (XDEL: `g`'s lag is unknown from then on),
    /// then `atid` created at 1500-0 (an arbitrary id: its lag is unknown too).
    const RESP2: &[u8] = b"*3\r\n\
        *12\r\n$4\r\nname\r\n$4\r\natid\r\n$9\r\nconsumers\r\n:0\r\n$7\r\npending\r\n:0\r\n\
        $17\r\nlast-delivered-id\r\n$6\r\n1500-0\r\n$12\r\nentries-read\r\n$-1\r\n\
        $3\r\nlag\r\n$-1\r\n\
        *12\r\n$4\r\nname\r\n$1\r\ng\r\n$9\r\nconsumers\r\n:1\r\n$7\r\npending\r\n:1\r\n\
        $17\r\nlast-delivered-id\r\n$6\r\n1000-0\r\n$12\r\nentries-read\r\n:1\r\n\
        $3\r\nlag\r\n$-1\r\n\
        *12\r\n$4\r\nname\r\n$5\r\nother\r\n$9\r\nconsumers\r\n:0\r\n$7\r\npending\r\n:0\r\n\
        $17\r\nlast-delivered-id\r\n$6\r\n3000-0\r\n$12\r\nentries-read\r\n$-1\r\n\
        $3\r\nlag\r\n:0\r\n";

    /// The same over RESP3 (`HELLO 3`): each group a map, nil as `_`.
    const RESP3: &[u8] = b"*3\r\n\
        %6\r\n$4\r\nname\r\n$4\r\natid\r\n$9\r\nconsumers\r\n:0\r\n$7\r\npending\r\n:0\r\n\
        $17\r\nlast-delivered-id\r\n$6\r\n1500-0\r\n$12\r\nentries-read\r\n_\r\n\
        $3\r\nlag\r\n_\r\n\
        %6\r\n$4\r\nname\r\n$1\r\ng\r\n$9\r\nconsumers\r\n:1\r\n$7\r\npending\r\n:1\r\n\
        $17\r\nlast-delivered-id\r\n$6\r\n1000-0\r\n$12\r\nentries-read\r\n:1\r\n\
        $3\r\nlag\r\n_\r\n\
        %6\r\n$4\r\nname\r\n$5\r\nother\r\n$9\r\nconsumers\r\n:0\r\n$7\r\npending\r\n:0\r\n\
        $17\r\nlast-delivered-id\r\n$6\r\n3000-0\r\n$12\r\nentries-read\r\n_\r\n\
        $3\r\nlag\r\n:0\r\n";

    /// The frame fred hands over for `wire` (the types these replies use: arrays, maps, bulk
    /// strings, integers and nil, RESP2's `$-1` becoming RESP3's null as fred converts it).
    fn frame(wire: &mut &[u8]) -> Resp3Frame {
        let end = wire.windows(2).position(|w| w == b"\r\n").expect("a line");
        let (kind, line) = (
            wire[0],
            std::str::from_utf8(&wire[1..end]).unwrap().to_owned(),
        );
        *wire = &wire[end + 2..];
        let n = |line: &str| line.parse::<i64>().expect("a number");
        match kind {
            b'*' => Resp3Frame::Array {
                data: (0..n(&line)).map(|_| frame(wire)).collect(),
                attributes: None,
            },
            b'%' => Resp3Frame::Map {
                data: (0..n(&line)).map(|_| (frame(wire), frame(wire))).collect(),
                attributes: None,
            },
            b'$' if n(&line) < 0 => Resp3Frame::Null,
            b'$' => {
                let len = n(&line) as usize;
                let data = Bytes::copy_from_slice(&wire[..len]);
                *wire = &wire[len + 2..];
                Resp3Frame::BlobString {
                    data,
                    attributes: None,
                }
            }
            b':' => Resp3Frame::Number {
                data: n(&line),
                attributes: None,
            },
            b'_' => Resp3Frame::Null,
            other => panic!("no such frame in these replies: {}", other as char),
        }
    }

    /// The reply as the sampler gets it: the frame converted to fred's value, as `call_at`
    /// converts it.
    fn reply(mut wire: &[u8]) -> Value {
        let frame = frame(&mut wire);
        assert!(wire.is_empty(), "one reply");
        Value::try_from(frame).unwrap()
    }

    #[test]
    fn each_group_of_a_recorded_reply_is_found_in_either_protocol() {
        for (protocol, wire) in [("RESP2", RESP2), ("RESP3", RESP3)] {
            let find = |group: &[u8]| find_group(reply(wire), group);
            assert_eq!(
                find(b"g"),
                Some(GroupInfo {
                    pending: 1,
                    lag: None,
                    last_delivered: Some(Bytes::from_static(b"1000-0")),
                }),
                "{protocol}"
            );
            assert_eq!(
                find(b"other"),
                Some(GroupInfo {
                    pending: 0,
                    lag: Some(0),
                    last_delivered: Some(Bytes::from_static(b"3000-0")),
                }),
                "{protocol}"
            );
            assert_eq!(
                find(b"atid"),
                Some(GroupInfo {
                    pending: 0,
                    lag: None,
                    last_delivered: Some(Bytes::from_static(b"1500-0")),
                }),
                "{protocol}"
            );
            assert_eq!(find(b"gone"), None, "{protocol}");
        }
    }

    #[test]
    fn a_stream_without_groups_lists_none() {
        assert_eq!(find_group(reply(b"*0\r\n"), b"g"), None);
        assert_eq!(find_group(Value::Null, b"g"), None);
    }
}
