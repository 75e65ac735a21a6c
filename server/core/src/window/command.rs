//! What a client may queue into a segment: the checks every command passes before it joins
//! the window. Pure; the cluster-slot rule and the operator's policy (`crate::policy`) are
//! applied by the subscription, which knows the server's command table.

use bytes::Bytes;
use thiserror::Error;

/// The longest command name Redis has is well under this; anything longer is a mistake.
const MAX_NAME_LEN: usize = 64;

/// A Redis command queued into a slot's segment. `name` is upper-case ASCII.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub name: String,
    pub args: Vec<Bytes>,
    /// On a cluster, the hash slot the command must be sent to (its keys'); `None`: route by
    /// its first argument.
    pub hash_slot: Option<u16>,
    /// On a cluster in atomic mode, the keys it touches: the script that runs its segment
    /// declares them, so that while the slot migrates Redis refuses the script whole (`ASK`,
    /// `TRYAGAIN`) before any of it runs, rather than failing it midway. Empty otherwise.
    pub keys: Vec<Bytes>,
}

/// Why a command cannot be queued.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CommandError {
    #[error("the command name is empty")]
    EmptyName,
    #[error(
        "the command name {0:?} is not a Redis command name (letters, digits, '.', '_', '-', '|', at most 64)"
    )]
    InvalidName(String),
    #[error("{name} {why}; it can never run inside a window")]
    Forbidden { name: String, why: &'static str },
    #[error("Redis does not know the command {0}")]
    Unknown(String),
    /// Redis would refuse it for its number of arguments (in atomic mode, aborting the whole
    /// transaction): refused before it joins the segment. `command` is the full name (`OBJECT
    /// FREQ` for a subcommand); `expected` and `given` count the arguments after it.
    #[error("wrong number of arguments: {command} takes {expected}, {given} given")]
    Arity {
        command: String,
        expected: Arity,
        given: usize,
    },
    /// The operator's policy refuses it (or one of its keys, or an argument's size).
    #[error("{source}")]
    Policy {
        command: String,
        #[source]
        source: crate::policy::PolicyError,
    },
    #[error(
        "key {key:?} is in hash slot {key_slot}, but this subscription's key {subscription_key:?} is in slot {subscription_slot}: in atomic mode on a cluster every key of a segment must share the subscription's slot; put the same hash tag in both, for example \"{{{tag}}}:…\""
    )]
    CrossSlot {
        command: String,
        key: String,
        key_slot: u16,
        subscription_key: String,
        subscription_slot: u16,
        tag: String,
    },
}

/// How many arguments a command takes after its name, as Redis's command table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    AtLeast(usize),
}

impl Arity {
    /// From the command table's arity, which counts the name's `words` too (two for a
    /// subcommand): `n` is exactly `n`, `-n` at least `n`.
    pub fn from_table(arity: i64, words: usize) -> Self {
        let count = (arity.unsigned_abs() as usize).saturating_sub(words);
        if arity < 0 {
            Arity::AtLeast(count)
        } else {
            Arity::Exactly(count)
        }
    }

    pub fn admits(self, given: usize) -> bool {
        match self {
            Arity::Exactly(n) => given == n,
            Arity::AtLeast(n) => given >= n,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (how, n) = match *self {
            Arity::Exactly(n) => ("exactly", n),
            Arity::AtLeast(n) => ("at least", n),
        };
        let noun = if n == 1 { "argument" } else { "arguments" };
        write!(f, "{how} {n} {noun}")
    }
}

impl Command {
    /// Checks a client's command and normalises its name.
    pub fn new(name: &str, args: Vec<Bytes>) -> Result<Self, CommandError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(CommandError::EmptyName);
        }
        let valid = name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'|'));
        if !valid {
            return Err(CommandError::InvalidName(name.to_owned()));
        }
        let name = name.to_ascii_uppercase();
        if let Some(why) = forbidden(&name) {
            return Err(CommandError::Forbidden { name, why });
        }
        Ok(Self {
            name,
            args,
            hash_slot: None,
            keys: Vec::new(),
        })
    }
}

/// Commands that would break the window or the server if a client could queue them: the
/// reply is never read, the connection is shared by every flush, and the settle must follow.
fn forbidden(name: &str) -> Option<&'static str> {
    Some(match name {
        "BLPOP" | "BRPOP" | "BRPOPLPUSH" | "BLMOVE" | "BLMPOP" | "BZPOPMIN" | "BZPOPMAX"
        | "BZMPOP" | "XREAD" | "XREADGROUP" | "WAIT" | "WAITAOF" => {
            "blocks the connection that flushes run on"
        }
        "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "UNWATCH" => {
            "is a transaction command; the sidecar frames transactions itself (atomic mode)"
        }
        "SUBSCRIBE" | "PSUBSCRIBE" | "SSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE"
        | "SUNSUBSCRIBE" | "MONITOR" | "SYNC" | "PSYNC" | "REPLCONF" => {
            "turns the shared connection into a push channel"
        }
        "AUTH" | "HELLO" | "SELECT" | "QUIT" | "RESET" | "CLIENT" | "READONLY" | "READWRITE"
        | "ASKING" => "changes the state of the shared connection",
        "FLUSHALL" | "FLUSHDB" | "SWAPDB" | "CONFIG" | "SHUTDOWN" | "DEBUG" | "SAVE" | "BGSAVE"
        | "BGREWRITEAOF" | "REPLICAOF" | "SLAVEOF" | "FAILOVER" | "MIGRATE" | "MODULE" | "ACL"
        | "CLUSTER" | "SCRIPT" | "FUNCTION" | "LATENCY" | "SLOWLOG" | "KEYS" => {
            "is an administrative or server-wide command"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_counts_the_arguments_after_the_full_name() {
        assert_eq!(Arity::from_table(2, 1), Arity::Exactly(1));
        assert_eq!(Arity::from_table(-3, 1), Arity::AtLeast(2));
        assert_eq!(Arity::from_table(3, 2), Arity::Exactly(1));
        assert_eq!(Arity::from_table(-2, 2), Arity::AtLeast(0));
        assert!(Arity::Exactly(1).admits(1) && !Arity::Exactly(1).admits(0));
        assert!(!Arity::Exactly(1).admits(2));
        assert!(Arity::AtLeast(2).admits(2) && Arity::AtLeast(2).admits(9));
        assert!(!Arity::AtLeast(2).admits(1));
        let err = CommandError::Arity {
            command: "INCR".into(),
            expected: Arity::Exactly(1),
            given: 0,
        };
        assert_eq!(
            err.to_string(),
            "wrong number of arguments: INCR takes exactly 1 argument, 0 given"
        );
        assert_eq!(Arity::AtLeast(2).to_string(), "at least 2 arguments");
    }

    #[test]
    fn normalises_the_name() {
        let command = Command::new("incr", vec![Bytes::from_static(b"k")]).unwrap();
        assert_eq!(command.name, "INCR");
        assert_eq!(command.args, vec![Bytes::from_static(b"k")]);
    }

    #[test]
    fn refuses_empty_and_malformed_names() {
        assert_eq!(Command::new("  ", vec![]), Err(CommandError::EmptyName));
        assert!(matches!(
            Command::new("IN CR", vec![]),
            Err(CommandError::InvalidName(_))
        ));
        assert!(matches!(
            Command::new(&"A".repeat(65), vec![]),
            Err(CommandError::InvalidName(_))
        ));
    }

    #[test]
    fn refuses_what_must_never_run_in_a_window() {
        for name in [
            "blpop",
            "XREADGROUP",
            "multi",
            "exec",
            "watch",
            "subscribe",
            "psubscribe",
            "ssubscribe",
            "monitor",
            "flushall",
            "flushdb",
            "config",
            "shutdown",
            "debug",
            "script",
            "function",
            "client",
            "acl",
        ] {
            let err = Command::new(name, vec![]).unwrap_err();
            assert!(
                matches!(err, CommandError::Forbidden { .. }),
                "{name} was accepted"
            );
            assert!(err.to_string().contains("never run inside a window"));
        }
    }

    #[test]
    fn accepts_ordinary_side_effects() {
        for name in [
            "INCR", "HINCRBY", "LPUSH", "XADD", "EVALSHA", "FCALL", "JSON.SET",
        ] {
            assert!(Command::new(name, vec![]).is_ok(), "{name} was refused");
        }
    }
}
