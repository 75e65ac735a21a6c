//! How a planned command goes to fred: as a custom command routed by its slot or first key,
//! on a client that fails fast, and what a fred error says about whether it ran.

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand};

use super::plan::Planned;

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
