//! What an operator lets clients do: which keys and channels they may open and touch, which
//! commands they may queue, and how large what they send may be. Pure: the categories of a
//! command come from Redis's own `COMMAND` metadata (`redis::keys`), and the checks are called
//! by the gRPC layer (opens, Publish) and by a subscription (each queued command).
//!
//! The command rules read like Redis ACL rules, applied left to right: `+@write` allows a
//! category, `-flushall` refuses a command, `+@all` everything. The fixed list of commands that
//! can never run inside a window (`window::command`) applies whatever the rules say.

use std::fmt;

use thiserror::Error;

// The patterns are the domain's (a dead-letter selection matches reasons with them too); the
// policy applies them to keys and channels, and its users name them from here as before.
pub use crate::domain::Patterns;

/// The command rules in effect unless the operator sets `--allow-commands`: reads and writes
/// of data, and publishing, but nothing dangerous, blocking, administrative or scripted (a
/// script can touch keys it does not declare, which the key patterns could not see).
pub const DEFAULT_COMMAND_RULES: &str =
    "+@read +@write +publish +spublish -@dangerous -@blocking -@admin -@scripting";

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    All,
    /// Lower-case, without the `@`.
    Category(String),
    /// Upper-case; `NAME|SUB` for a subcommand.
    Command(String),
}

/// Which commands may be queued: ACL-style rules, the last one that matches wins.
#[derive(Clone, Debug)]
pub struct CommandRules {
    text: String,
    rules: Vec<(bool, Target)>,
}

impl CommandRules {
    /// Parses rules separated by spaces or commas: `+@write -flushall +client|id`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for word in text.split([' ', ',']).filter(|w| !w.is_empty()) {
            let (allow, rest) = match (word.strip_prefix('+'), word.strip_prefix('-')) {
                (Some(rest), _) => (true, rest),
                (_, Some(rest)) => (false, rest),
                _ => {
                    return Err(format!(
                        "{word:?} must start with + (allow) or - (refuse), as in +@write or -flushall"
                    ));
                }
            };
            let target = match rest.strip_prefix('@') {
                _ if rest.is_empty() || rest == "@" => {
                    return Err(format!("{word:?} names no command or category"));
                }
                Some("all") => Target::All,
                Some(category) => Target::Category(category.to_ascii_lowercase()),
                None => Target::Command(rest.to_ascii_uppercase()),
            };
            rules.push((allow, target));
        }
        if rules.is_empty() {
            return Err("no rules: allow something, for example +@write".into());
        }
        Ok(Self {
            text: text
                .split([' ', ','])
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
            rules,
        })
    }

    /// The rules that name a category or command Redis does not know (a typo allows or
    /// refuses nothing), given what it knows.
    pub fn unknown_targets(
        &self,
        knows_category: impl Fn(&str) -> bool,
        knows_command: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        self.rules
            .iter()
            .filter_map(|(allow, target)| {
                let sign = if *allow { '+' } else { '-' };
                match target {
                    Target::All => None,
                    Target::Category(c) if !knows_category(c) => Some(format!("{sign}@{c}")),
                    Target::Command(c) if !knows_command(c) => {
                        Some(format!("{sign}{}", c.to_ascii_lowercase()))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Whether `name` (upper-case; `NAME|SUB` for a subcommand) with Redis's ACL `categories`
    /// (as Redis spells them: `@write`) may be queued.
    pub fn allows(&self, name: &str, categories: &[String]) -> bool {
        let parent = name.split('|').next().unwrap_or(name);
        let mut allowed = false;
        for (allow, target) in &self.rules {
            let hit = match target {
                Target::All => true,
                Target::Category(c) => categories.iter().any(|have| {
                    have.strip_prefix('@')
                        .unwrap_or(have)
                        .eq_ignore_ascii_case(c)
                }),
                Target::Command(c) => c == name || (c == parent && !c.contains('|')),
            };
            if hit {
                allowed = *allow;
            }
        }
        allowed
    }
}

impl fmt::Display for CommandRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Sizes a client may not exceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest gRPC message a client may send, in bytes.
    pub max_message_size: usize,
    /// The largest argument of a queued command, in bytes.
    pub max_arg_size: usize,
    /// The most subscriptions one gRPC connection may hold open at once.
    pub max_subscriptions_per_connection: usize,
}

/// The operator's policy.
#[derive(Clone, Debug)]
pub struct Policy {
    pub keys: Patterns,
    pub channels: Patterns,
    pub commands: CommandRules,
    pub limits: Limits,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            keys: Patterns::any(),
            channels: Patterns::any(),
            commands: CommandRules::parse(DEFAULT_COMMAND_RULES).expect("the default parses"),
            limits: Limits {
                max_message_size: 4 << 20,
                max_arg_size: 1 << 20,
                max_subscriptions_per_connection: 256,
            },
        }
    }
}

/// What the policy refuses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    #[error(
        "key {key:?} is outside this sidecar's allowed keys ({patterns}); the operator can allow it with --allow-keys"
    )]
    Key { key: String, patterns: String },
    #[error(
        "channel {channel:?} is outside this sidecar's allowed channels ({patterns}); the operator can allow it with --allow-channels"
    )]
    Channel { channel: String, patterns: String },
    #[error(
        "{command} is not allowed by this sidecar's command rules ({rules}); the operator can allow it with --allow-commands, for example \"{rules} +{lower}\""
    )]
    Command {
        command: String,
        lower: String,
        rules: String,
    },
    #[error(
        "argument {index} of {command} is {len} bytes, more than this sidecar's --max-arg-size of {max} bytes"
    )]
    ArgTooLarge {
        command: String,
        index: usize,
        len: usize,
        max: usize,
    },
    #[error(
        "this connection already has {max} open subscriptions, the most --max-subscriptions-per-connection allows; close one or open the next on another connection"
    )]
    TooManySubscriptions { max: usize },
}

impl PolicyError {
    /// A limit was exceeded (RESOURCE_EXHAUSTED), rather than a permission refused.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            PolicyError::ArgTooLarge { .. } | PolicyError::TooManySubscriptions { .. }
        )
    }
}

impl Policy {
    /// Whether every key is allowed: no key of a command needs checking.
    pub fn allows_any_key(&self) -> bool {
        self.keys.is_any()
    }

    pub fn check_key(&self, key: &[u8]) -> Result<(), PolicyError> {
        if self.keys.allows(key) {
            return Ok(());
        }
        Err(PolicyError::Key {
            key: String::from_utf8_lossy(key).into_owned(),
            patterns: self.keys.to_string(),
        })
    }

    pub fn check_channel(&self, channel: &[u8]) -> Result<(), PolicyError> {
        if self.channels.allows(channel) {
            return Ok(());
        }
        Err(PolicyError::Channel {
            channel: String::from_utf8_lossy(channel).into_owned(),
            patterns: self.channels.to_string(),
        })
    }

    /// The command rules and the size of every argument. `name` is upper-case, `categories`
    /// as Redis's `COMMAND` reports them.
    pub fn check_command(
        &self,
        name: &str,
        categories: &[String],
        args: &[bytes::Bytes],
    ) -> Result<(), PolicyError> {
        if !self.commands.allows(name, categories) {
            return Err(PolicyError::Command {
                command: name.to_owned(),
                lower: name.to_ascii_lowercase(),
                rules: self.commands.to_string(),
            });
        }
        let max = self.limits.max_arg_size;
        match args.iter().position(|a| a.len() > max) {
            Some(i) => Err(PolicyError::ArgTooLarge {
                command: name.to_owned(),
                index: i + 1,
                len: args[i].len(),
                max,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn cats(list: &[&str]) -> Vec<String> {
        list.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn the_default_rules_allow_data_commands_and_refuse_dangerous_ones() {
        let rules = CommandRules::parse(DEFAULT_COMMAND_RULES).unwrap();
        assert!(rules.allows("INCR", &cats(&["@write", "@string", "@fast"])));
        assert!(rules.allows("GET", &cats(&["@read", "@string", "@fast"])));
        assert!(rules.allows("PUBLISH", &cats(&["@pubsub", "@fast"])));
        assert!(!rules.allows("FLUSHALL", &cats(&["@keyspace", "@write", "@dangerous"])));
        assert!(!rules.allows("EVALSHA", &cats(&["@slow", "@scripting"])));
        assert!(!rules.allows("BLPOP", &cats(&["@write", "@list", "@blocking"])));
        assert!(!rules.allows("PING", &cats(&["@fast", "@connection"])));
    }

    #[test]
    fn the_last_matching_rule_wins_and_subcommands_follow_their_parent() {
        let rules = CommandRules::parse("+@all -@dangerous +sort, -object|freq").unwrap();
        assert!(rules.allows("SORT", &cats(&["@write", "@dangerous"])));
        assert!(!rules.allows("KEYS", &cats(&["@read", "@dangerous"])));
        assert!(!rules.allows("OBJECT|FREQ", &cats(&["@read"])));
        assert!(rules.allows("OBJECT|ENCODING", &cats(&["@read"])));
        let rules = CommandRules::parse("+@write -set").unwrap();
        assert!(!rules.allows("SET", &cats(&["@write"])));
        assert!(rules.allows("HSET", &cats(&["@write"])));
        assert_eq!(rules.to_string(), "+@write -set");
    }

    #[test]
    fn rules_naming_nothing_redis_knows_are_found() {
        let rules = CommandRules::parse("+@write +@wirte -flushal +incr").unwrap();
        let unknown = rules.unknown_targets(|c| c == "write", |c| c == "INCR");
        assert_eq!(unknown, ["+@wirte", "-flushal"]);
    }

    #[test]
    fn malformed_rules_say_how_to_write_them() {
        assert!(
            CommandRules::parse("write")
                .unwrap_err()
                .contains("+@write")
        );
        assert!(CommandRules::parse("").unwrap_err().contains("no rules"));
        assert!(CommandRules::parse("+").unwrap_err().contains("names no"));
        assert!(CommandRules::parse("+@").unwrap_err().contains("names no"));
        assert!(
            CommandRules::parse("é")
                .unwrap_err()
                .contains("must start with")
        );
    }

    #[test]
    fn refusals_name_the_setting_that_would_allow_them() {
        let policy = Policy {
            keys: Patterns::new(&["orders*"]),
            ..Policy::default()
        };
        let err = policy.check_key(b"secrets").unwrap_err();
        assert!(err.to_string().contains("\"secrets\""));
        assert!(err.to_string().contains("--allow-keys"));
        assert!(!err.is_limit());
        let err = policy
            .check_command("EVALSHA", &cats(&["@scripting"]), &[])
            .unwrap_err();
        assert!(err.to_string().contains("+evalsha"), "{err}");
        let big = Bytes::from(vec![b'x'; policy.limits.max_arg_size + 1]);
        let err = policy
            .check_command("SET", &cats(&["@write"]), &[Bytes::from_static(b"k"), big])
            .unwrap_err();
        assert!(err.is_limit());
        assert!(err.to_string().contains("argument 2 of SET"), "{err}");
    }
}
