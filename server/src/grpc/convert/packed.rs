//! The packed form of a batch's commands (`Batch.packed_commands`): RESP arrays of bulk
//! strings, the form Redis reads, one per command. A client pays for one protobuf message per
//! `QueuedCommand`; a packed batch is one bytes field that a client builds by joining strings.
//! Each command comes out as its name and arguments, sliced from the message's own buffer (no
//! copy), for the same checks `Batch.commands` goes through.

use bytes::Bytes;
use thiserror::Error;

/// Why packed commands cannot be read: the stream ends with INVALID_ARGUMENT, naming the
/// command and the byte where reading stopped, so that whoever wrote the encoder can find it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PackedError {
    #[error(
        "batch.packed_commands: command {index}, at byte {at}: {what} (each command is a RESP \
         array of bulk strings, its name first: *2\\r\\n$4\\r\\nINCR\\r\\n$4\\r\\nhits\\r\\n)"
    )]
    Framing {
        index: usize,
        at: usize,
        what: &'static str,
    },
    #[error(
        "batch.packed_commands holds {commands} commands, but packed_command_slots names {slots} \
         slots: one slot per command"
    )]
    Count { commands: usize, slots: usize },
}

/// A command as the client packed it: its name (not yet checked) and its arguments.
pub(super) type Packed = (Bytes, Vec<Bytes>);

/// Every command of `packed`, in order, checked against one slot each in `slots`.
pub(super) fn unpack(packed: &Bytes, slots: usize) -> Result<Vec<Packed>, PackedError> {
    let mut reader = Reader { packed, at: 0 };
    let mut commands = Vec::with_capacity(slots.min(packed.len() / MIN_COMMAND));
    while reader.at < packed.len() {
        let index = commands.len();
        commands.push(
            reader
                .command()
                .map_err(|(at, what)| PackedError::Framing { index, at, what })?,
        );
    }
    if commands.len() != slots {
        return Err(PackedError::Count {
            commands: commands.len(),
            slots,
        });
    }
    Ok(commands)
}

/// The shortest command: `*1\r\n$1\r\nX\r\n`.
const MIN_COMMAND: usize = 11;
/// The shortest bulk string: `$0\r\n\r\n`.
const MIN_BULK: usize = 6;

/// Where a command stopped being readable: the byte, and what was wrong there.
type Stop = (usize, &'static str);

struct Reader<'a> {
    packed: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn command(&mut self) -> Result<Packed, Stop> {
        let elements = self.header(b'*', "expected '*', the start of a command's array")?;
        if elements == 0 {
            return Err((self.at, "an empty array: a command needs its name"));
        }
        // Counted against what is left, not trusted: a huge count cannot allocate.
        let left = (self.packed.len() - self.at) / MIN_BULK;
        if elements > left {
            return Err((
                self.at,
                "the array counts more strings than the bytes left hold",
            ));
        }
        let name = self.bulk()?;
        let mut args = Vec::with_capacity(elements - 1);
        for _ in 1..elements {
            args.push(self.bulk()?);
        }
        Ok((name, args))
    }

    fn bulk(&mut self) -> Result<Bytes, Stop> {
        let len = self.header(b'$', "expected '$', the start of a bulk string")?;
        let start = self.at;
        let end = start
            .checked_add(len)
            .filter(|end| end + 2 <= self.packed.len())
            .ok_or((start, "a bulk string longer than the bytes left"))?;
        if &self.packed[end..end + 2] != b"\r\n" {
            return Err((end, "a bulk string not followed by \\r\\n"));
        }
        self.at = end + 2;
        Ok(self.packed.slice(start..end))
    }

    /// `<kind><digits>\r\n`, the digits as a length.
    fn header(&mut self, kind: u8, expected: &'static str) -> Result<usize, Stop> {
        let bytes = &self.packed[self.at..];
        if bytes.first() != Some(&kind) {
            return Err((self.at, expected));
        }
        let digits = bytes[1..].iter().take_while(|b| b.is_ascii_digit()).count();
        // Nine digits hold any length a message may have; more would overflow on 32 bits.
        if digits == 0 || digits > 9 {
            return Err((self.at + 1, "expected a length of 1 to 9 decimal digits"));
        }
        if bytes.get(1 + digits..3 + digits) != Some(b"\r\n".as_slice()) {
            return Err((self.at + 1 + digits, "a length not followed by \\r\\n"));
        }
        let len = bytes[1..1 + digits]
            .iter()
            .fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
        self.at += 3 + digits;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unpacked(packed: &[u8], slots: usize) -> Result<Vec<(String, Vec<String>)>, PackedError> {
        let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
        unpack(&Bytes::copy_from_slice(packed), slots).map(|commands| {
            commands
                .iter()
                .map(|(name, args)| (text(name), args.iter().map(text).collect()))
                .collect()
        })
    }

    fn framing(packed: &[u8]) -> (usize, usize, &'static str) {
        match unpack(&Bytes::copy_from_slice(packed), 1) {
            Err(PackedError::Framing { index, at, what }) => (index, at, what),
            other => panic!("expected a framing error, got {other:?}"),
        }
    }

    #[test]
    fn commands_come_out_in_order_binary_safe() {
        let packed = b"*2\r\n$4\r\nINCR\r\n$4\r\nhits\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n*1\r\n$4\r\nPING\r\n";
        assert_eq!(
            unpacked(packed, 3).unwrap(),
            [
                ("INCR".into(), vec!["hits".into()]),
                ("SET".into(), vec!["k".into(), "a\r\nb".into()]),
                ("PING".into(), vec![]),
            ]
        );
    }

    #[test]
    fn an_empty_string_is_an_argument_and_nothing_is_no_command() {
        assert_eq!(
            unpacked(b"*2\r\n$3\r\nDEL\r\n$0\r\n\r\n", 1).unwrap(),
            [("DEL".into(), vec![String::new()])]
        );
        assert_eq!(unpacked(b"", 0).unwrap(), []);
    }

    #[test]
    fn the_count_must_match_the_slots() {
        assert_eq!(
            unpacked(b"*1\r\n$4\r\nPING\r\n", 2),
            Err(PackedError::Count {
                commands: 1,
                slots: 2
            })
        );
        assert_eq!(
            unpacked(b"", 1),
            Err(PackedError::Count {
                commands: 0,
                slots: 1
            })
        );
    }

    #[test]
    fn bad_framing_names_the_command_and_the_byte() {
        assert_eq!(framing(b"$4\r\nINCR\r\n").0, 0);
        assert_eq!(
            framing(b"*1\r\n$4\r\nPING\r\n+OK\r\n"),
            (1, 14, "expected '*', the start of a command's array")
        );
        assert_eq!(
            framing(b"*0\r\n").2,
            "an empty array: a command needs its name"
        );
        assert_eq!(framing(b"*-1\r\n").1, 1);
        assert_eq!(
            framing(b"*1\r\n$9\r\nPING\r\n").2,
            "a bulk string longer than the bytes left"
        );
        assert_eq!(framing(b"*1\r\n$2\r\nPING\r\n").1, 10);
        assert_eq!(
            framing(b"*1\r\n$4\r\nPING").2,
            "a bulk string longer than the bytes left"
        );
        assert_eq!(
            framing(b"*1\n$4\r\nPING\r\n").2,
            "a length not followed by \\r\\n"
        );
        assert_eq!(
            framing(b"*1\r\n:4\r\nPING\r\n").2,
            "expected '$', the start of a bulk string"
        );
        assert_eq!(
            framing(b"*1234567890\r\n").2,
            "expected a length of 1 to 9 decimal digits"
        );
    }

    #[test]
    fn a_huge_count_is_refused_before_anything_is_allocated() {
        assert_eq!(
            framing(b"*999999999\r\n$4\r\nPING\r\n").2,
            "the array counts more strings than the bytes left hold"
        );
        assert_eq!(
            framing(b"*1\r\n$999999999\r\nPING\r\n").2,
            "a bulk string longer than the bytes left"
        );
    }

    #[test]
    fn the_arguments_share_the_message_buffer() {
        let packed = Bytes::from_static(b"*2\r\n$4\r\nINCR\r\n$4\r\nhits\r\n");
        let commands = unpack(&packed, 1).unwrap();
        let arg = &commands[0].1[0];
        assert_eq!(arg.as_ptr(), packed[18..].as_ptr());
    }
}
