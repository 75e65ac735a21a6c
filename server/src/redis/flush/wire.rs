//! How planned commands go to fred: a flush's as RESP the sidecar encodes itself, one raw
//! command of fred's per node they go to; a single one as a custom command routed by its slot
//! or first key; both on a client that fails fast. And what a fred error says about whether a
//! command ran.

use bytes::{BufMut, BytesMut};
use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Resp3Frame};
use fred::util::redis_keyslot;

use super::plan::Planned;
use crate::redis::call::refused;

/// A command's reply: the frame it came in, or the error Redis answered (as fred makes it of
/// an error reply) or that stood for the whole (no connection, a timeout). Frames, so that a
/// read's entries are taken apart once, by the sidecar; `Value::try_from` gives any other
/// reply as fred would have.
pub(crate) type Reply = Result<Resp3Frame, Error>;

/// The error says no reply came (a timeout, a broken connection), not that Redis refused:
/// the command may have run, or may still run.
pub(crate) fn unanswered(err: &Error) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Timeout | ErrorKind::IO | ErrorKind::Canceled
    )
}

/// Options of writes whose failure is reported rather than retried (flushes, Publish). Fail
/// fast: when the connection breaks or is down, the write fails now instead of being written
/// again (or late) after a reconnect, when its entries may already have been reported failed
/// and read again, which would apply side effects twice.
pub(crate) static FAIL_FAST: std::sync::LazyLock<Options> = std::sync::LazyLock::new(|| Options {
    fail_fast: true,
    ..Default::default()
});

/// The fred command and arguments of a planned command.
pub(crate) fn custom(planned: &Planned) -> (CustomCommand, Vec<Value>) {
    let hash = planned
        .hash_slot
        .map_or(ClusterHash::FirstKey, ClusterHash::Custom);
    let command = CustomCommand::new(planned.name.clone(), hash, false);
    let args = planned.args.iter().cloned().map(Value::Bytes).collect();
    (command, args)
}

/// Sends `commands` in order and returns one [`Reply`] per command, in the same order. Their RESP
/// is built here into one buffer per node and written by fred as it is (a raw command, fred as
/// patched in server/vendor): one write, one responder and one reply conversion per command,
/// instead of a fred `Command`, its argument values and its frames per command. On a cluster,
/// the commands are grouped by the node fred's routing table gives their slot (a command that
/// moved meanwhile is answered `-MOVED` in its place, as in a pipeline); the groups go out
/// together. A group that fails as a whole (no connection, a timeout) gives that error to each
/// of its commands.
pub(crate) async fn send(client: &Client, commands: &[&Planned]) -> Vec<Reply> {
    let client = client.with_options(&FAIL_FAST);
    let routing = if client.is_clustered() {
        client.cached_cluster_state()
    } else {
        None
    };
    let Some(routing) = routing else {
        // A single node; or a cluster whose routing table fred has not synced yet: the whole
        // flush goes where its first command's slot lives (fred routes by that slot once it
        // knows it), and any other node's command comes back `-MOVED` in its place.
        let hash = commands.first().map_or(ClusterHash::FirstKey, |first| {
            ClusterHash::Custom(slot_of(first))
        });
        let encoded = encode(commands.iter().copied());
        return expand(
            client.raw_commands(encoded, commands.len(), hash).await,
            commands.len(),
        );
    };
    // Each node's commands by their index, in order, and a slot of that node to route them by.
    let mut groups: Vec<(Option<&Server>, u16, Vec<usize>)> = Vec::new();
    for (index, planned) in commands.iter().enumerate() {
        let slot = slot_of(planned);
        let node = routing.get_server(slot);
        match groups.iter_mut().find(|(owner, ..)| *owner == node) {
            Some((.., members)) => members.push(index),
            None => groups.push((node, slot, vec![index])),
        }
    }
    let sends = groups.iter().map(|(_, slot, members)| {
        let encoded = encode(members.iter().map(|&index| commands[index]));
        client.raw_commands(encoded, members.len(), ClusterHash::Custom(*slot))
    });
    let answers = futures::future::join_all(sends).await;
    let mut replies: Vec<Option<Reply>> = (0..commands.len()).map(|_| None).collect();
    for ((.., members), answer) in groups.iter().zip(answers) {
        for (&index, reply) in members.iter().zip(expand(answer, members.len())) {
            replies[index] = Some(reply);
        }
    }
    replies
        .into_iter()
        .map(|reply| reply.expect("every command belongs to one group"))
        .collect()
}

/// A group's replies, one per command: an error of the whole stands for each.
fn expand(replies: Result<Vec<Resp3Frame>, Error>, count: usize) -> Vec<Reply> {
    match replies {
        Ok(frames) => frames.into_iter().map(refused).collect(),
        Err(err) => vec![Err(err); count],
    }
}

/// The slot whose node runs the command: its own, else its first argument's.
fn slot_of(planned: &Planned) -> u16 {
    planned
        .hash_slot
        .unwrap_or_else(|| planned.args.first().map_or(0, |key| redis_keyslot(key)))
}

/// The commands as RESP: each an array of bulk strings, its name split into words as fred
/// splits a custom command's name (`CLIENT KILL` is two).
pub(crate) fn encode<'a>(commands: impl Iterator<Item = &'a Planned> + Clone) -> bytes::Bytes {
    let size: usize = commands
        .clone()
        .map(|planned| {
            let args: usize = planned.args.iter().map(|arg| arg.len() + 16).sum();
            planned.name.len() + 32 + args
        })
        .sum();
    let mut buf = BytesMut::with_capacity(size);
    for planned in commands {
        let words = planned.name.trim().split(' ');
        header(&mut buf, b'*', words.clone().count() + planned.args.len());
        for word in words {
            bulk(&mut buf, word.as_bytes());
        }
        for arg in &planned.args {
            bulk(&mut buf, arg);
        }
    }
    buf.freeze()
}

fn bulk(buf: &mut BytesMut, data: &[u8]) {
    header(buf, b'$', data.len());
    buf.put_slice(data);
    buf.put_slice(b"\r\n");
}

fn header(buf: &mut BytesMut, kind: u8, len: usize) {
    buf.put_u8(kind);
    buf.put_slice(itoa::Buffer::new().format(len).as_bytes());
    buf.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::flush::plan::Role;
    use bytes::Bytes;

    #[test]
    fn commands_are_encoded_as_resp_arrays_of_bulk_strings() {
        let incr = Planned::new("INCR", vec![Bytes::from_static(b"k")], Role::SideEffect);
        let kill = Planned::new(
            "CLIENT KILL",
            vec![Bytes::from_static(b"ID"), Bytes::from_static(b"")],
            Role::SideEffect,
        );
        let exec = Planned::new("EXEC", vec![], Role::SideEffect);
        let encoded = encode([&incr, &kill, &exec].into_iter());
        assert_eq!(
            &encoded[..],
            b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n\
              *4\r\n$6\r\nCLIENT\r\n$4\r\nKILL\r\n$2\r\nID\r\n$0\r\n\r\n\
              *1\r\n$4\r\nEXEC\r\n"
        );
    }

    #[test]
    fn an_error_of_the_whole_group_stands_for_each_command() {
        let err = Error::new(ErrorKind::Timeout, "timed out");
        let replies = expand(Err(err), 3);
        assert_eq!(replies.len(), 3);
        assert!(replies.iter().all(|r| r.as_ref().is_err_and(unanswered)));
    }

    #[test]
    fn an_error_reply_is_an_error_in_its_place_and_the_rest_come_as_they_are() {
        let one = Resp3Frame::Number {
            data: 1,
            attributes: None,
        };
        let wrongtype = Resp3Frame::SimpleError {
            data: "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
            attributes: None,
        };
        let replies = expand(Ok(vec![one.clone(), wrongtype]), 2);
        assert_eq!(replies[0].as_ref().ok(), Some(&one));
        let err = replies[1].as_ref().unwrap_err();
        assert!(err.details().starts_with("WRONGTYPE"), "{err:?}");
        assert!(!unanswered(err));
    }
}
