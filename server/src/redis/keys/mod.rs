//! What Redis says about its commands (`COMMAND`): which arguments are keys (the key
//! specifications of Redis 7, with the legacy first/last/step triple as a fallback) and the ACL
//! categories of each command. Used to route side effects on a cluster, to check that every key
//! of an atomic segment lives in the subscription's hash slot, and to apply the operator's
//! policy (key patterns, command rules) when a command is queued ([`admit`]); and the names
//! of keys that live beside a subscription's key in its hash slot ([`companion_key`]); and what
//! a key holds ([`key_type`]).

pub(crate) mod admit;

use std::collections::HashMap;

use bytes::Bytes;
use fred::prelude::*;
use thiserror::Error;

use super::entry::into_bytes;
use super::{RedisError, arg, call, call_at};
use crate::window::{Arity, CommandError};

/// Where the keys of a command begin.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Begin {
    /// At this argv index (argv[0] is the command name).
    Index(usize),
    /// After this keyword, searched from `startfrom` (negative: from the end, backwards).
    Keyword { keyword: Vec<u8>, startfrom: i64 },
}

/// How many keys follow the beginning.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Find {
    /// Up to `lastkey` (relative to the beginning; negative: from the end), every `step`;
    /// with `lastkey` -1, `limit` > 1 keeps only the first 1/limit of the rest.
    Range {
        lastkey: i64,
        step: usize,
        limit: usize,
    },
    /// argv[begin + keynumidx] holds the number of keys, which start at begin + firstkey.
    Keynum {
        keynumidx: usize,
        firstkey: usize,
        step: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Spec {
    begin: Begin,
    find: Find,
}

/// A command whose keys cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("Redis does not know the command {0}")]
    UnknownCommand(String),
}

/// A command Redis does not know is refused for its slot as an invalid command.
impl From<KeyError> for CommandError {
    fn from(err: KeyError) -> Self {
        match err {
            KeyError::UnknownCommand(name) => CommandError::Unknown(name),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Info {
    /// As the table gives it: the arguments with the name (a subcommand's with both words),
    /// negative for "at least".
    arity: i64,
    specs: Vec<Spec>,
    /// As Redis spells them: `@write`.
    categories: Vec<String>,
    /// A container command (`CONFIG`, `XINFO`): its first argument names a subcommand.
    subcommands: bool,
}

/// The key specifications and categories of every command a server knows.
#[derive(Debug, Default)]
pub struct KeySpecs {
    /// By upper-case name, and `NAME|SUBCOMMAND` for container commands.
    commands: HashMap<String, Info>,
}

impl KeySpecs {
    /// Loads the specifications with `COMMAND` (once per sidecar: they do not change while a
    /// server runs).
    pub async fn load(client: &Client) -> Result<Self, RedisError> {
        let reply = call(client, "COMMAND", vec![], false).await?;
        Ok(Self::parse(reply))
    }

    /// Parses a `COMMAND` reply.
    pub fn parse(reply: Value) -> Self {
        let mut specs = Self::default();
        if let Value::Array(commands) = reply {
            for command in commands {
                specs.add(command, None);
            }
        }
        specs
    }

    fn add(&mut self, command: Value, parent: Option<&str>) {
        let Value::Array(fields) = command else {
            return;
        };
        let name = fields
            .first()
            .cloned()
            .and_then(into_bytes)
            .map(|b| String::from_utf8_lossy(&b).to_ascii_uppercase());
        let Some(name) = name else { return };
        // Subcommands are named "parent|sub" by Redis itself.
        let name = match parent {
            Some(parent) if !name.contains('|') => format!("{parent}|{name}"),
            _ => name,
        };
        let int = |i: usize| fields.get(i).and_then(Value::as_i64).unwrap_or(0);
        let mut specs: Vec<Spec> = match fields.get(8) {
            Some(Value::Array(key_specs)) => key_specs.iter().filter_map(parse_spec).collect(),
            _ => Vec::new(),
        };
        let (first, last, step) = (int(3), int(4), int(5));
        if specs.is_empty() && first > 0 {
            specs.push(Spec {
                begin: Begin::Index(first as usize),
                find: Find::Range {
                    lastkey: if last < 0 { last } else { last - first },
                    step: step.max(1) as usize,
                    limit: 0,
                },
            });
        }
        let categories = match fields.get(6) {
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_string).collect(),
            _ => Vec::new(),
        };
        let mut container = false;
        if let Some(Value::Array(subcommands)) = fields.get(9) {
            container = !subcommands.is_empty();
            for sub in subcommands.clone() {
                self.add(sub, Some(&name));
            }
        }
        self.commands.insert(
            name,
            Info {
                arity: int(1),
                specs,
                categories,
                subcommands: container,
            },
        );
    }

    /// Whether some command is in this ACL category (`write`, without the `@`).
    pub fn knows_category(&self, category: &str) -> bool {
        self.commands.values().any(|info| {
            info.categories.iter().any(|c| {
                c.strip_prefix('@')
                    .unwrap_or(c)
                    .eq_ignore_ascii_case(category)
            })
        })
    }

    /// Whether the server knows a command of this name.
    pub fn knows(&self, name: &str) -> bool {
        self.commands.contains_key(&name.to_ascii_uppercase())
    }

    /// The entry of `name args…`: its subcommand's when it has one, looked up once for
    /// everything admission asks of it. Returns the full name (`NAME|SUB` for a subcommand).
    /// A container's first argument is always its subcommand (Redis refuses one it does not
    /// know, `OBJECT NOPE`, as it refuses an unknown command).
    pub(crate) fn lookup(&self, name: &str, args: &[Bytes]) -> Result<(String, &Info), KeyError> {
        let upper = name.to_ascii_uppercase();
        let Some(info) = self.commands.get(&upper) else {
            return Err(KeyError::UnknownCommand(upper));
        };
        // Only a container's first argument can name a subcommand: for every other command
        // (the side effects of nearly every flush) it is a key or a value, not worth a lookup.
        if info.subcommands
            && let Some(sub) = args.first()
        {
            let sub = String::from_utf8_lossy(sub).to_ascii_uppercase();
            let full = format!("{upper}|{sub}");
            return match self.commands.get(&full) {
                Some(info) => Ok((full, info)),
                None => Err(KeyError::UnknownCommand(format!("{upper} {sub}"))),
            };
        }
        Ok((upper, info))
    }

    /// The full name (`NAME|SUB` for a subcommand) and ACL categories of `name args…`.
    pub fn categories(&self, name: &str, args: &[Bytes]) -> Result<(String, &[String]), KeyError> {
        self.lookup(name, args)
            .map(|(full, info)| (full, info.categories.as_slice()))
    }

    /// Refuses `name args…` when Redis would refuse its number of arguments.
    pub fn check_arity(&self, name: &str, args: &[Bytes]) -> Result<(), CommandError> {
        let (full, info) = self.lookup(name, args)?;
        info.check_arity(name, &full, args)
    }

    /// The key arguments of `name args…`.
    pub fn keys<'a>(&self, name: &str, args: &'a [Bytes]) -> Result<Vec<&'a Bytes>, KeyError> {
        Ok(self.lookup(name, args)?.1.keys(args))
    }
}

impl Info {
    /// Refuses `name args…` when Redis would refuse its number of arguments. `full_name` is
    /// what [`KeySpecs::lookup`] returned for it (`OBJECT|FREQ` for `OBJECT freq k`).
    pub(crate) fn check_arity(
        &self,
        name: &str,
        full_name: &str,
        args: &[Bytes],
    ) -> Result<(), CommandError> {
        let words = |name: &str| 1 + name.matches('|').count();
        let expected = Arity::from_table(self.arity, words(full_name));
        // A subcommand is the first of the arguments unless the name already carries it.
        let given = args.len() - (words(full_name) - words(name)).min(args.len());
        if self.arity == 0 || expected.admits(given) {
            return Ok(());
        }
        Err(CommandError::Arity {
            command: full_name.replace('|', " "),
            expected,
            given,
        })
    }

    /// As Redis spells them: `@write`.
    pub(crate) fn categories(&self) -> &[String] {
        &self.categories
    }

    /// The key arguments of this command called with `args`.
    pub(crate) fn keys<'a>(&self, args: &'a [Bytes]) -> Vec<&'a Bytes> {
        let specs = &self.specs;
        // argv[0] is the command name; args[i] is argv[i + 1].
        let argv = |i: usize| -> Option<&'a Bytes> { i.checked_sub(1).and_then(|i| args.get(i)) };
        let argc = args.len() + 1;
        let mut keys = Vec::new();
        for spec in specs {
            let Some(begin) = begin_index(&spec.begin, args) else {
                continue;
            };
            match spec.find {
                Find::Range {
                    lastkey,
                    step,
                    limit,
                } => {
                    let last = if lastkey >= 0 {
                        begin + lastkey as usize
                    } else {
                        let from_end = (argc as i64 + lastkey).max(0) as usize;
                        if lastkey == -1 && limit > 1 {
                            begin + (from_end.saturating_sub(begin) + 1) / limit - 1
                        } else {
                            from_end
                        }
                    };
                    let mut i = begin;
                    while i <= last && i < argc {
                        keys.extend(argv(i));
                        i += step.max(1);
                    }
                }
                Find::Keynum {
                    keynumidx,
                    firstkey,
                    step,
                } => {
                    let count = argv(begin + keynumidx)
                        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut i = begin + firstkey;
                    for _ in 0..count {
                        keys.extend(argv(i));
                        i += step.max(1);
                    }
                }
            }
        }
        keys
    }
}

/// The argv index where a spec's keys begin, if the arguments have it.
fn begin_index(begin: &Begin, args: &[Bytes]) -> Option<usize> {
    match begin {
        Begin::Index(i) => Some(*i),
        Begin::Keyword { keyword, startfrom } => {
            let matches = |a: &Bytes| a.eq_ignore_ascii_case(keyword);
            let argc = args.len() + 1;
            if *startfrom >= 0 {
                let start = *startfrom as usize;
                (start.max(1)..argc)
                    .find(|&i| matches(&args[i - 1]))
                    .map(|i| i + 1)
            } else {
                let start = (argc as i64 + startfrom).max(1) as usize;
                (1..=start.min(argc - 1))
                    .rev()
                    .find(|&i| matches(&args[i - 1]))
                    .map(|i| i + 1)
            }
        }
    }
}

/// A flat `[name, value, …]` map (RESP2) or a map (RESP3) as pairs.
fn pairs(value: &Value) -> Vec<(String, Value)> {
    match value {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((k.as_string()?, v.clone())),
                _ => None,
            })
            .collect(),
        Value::Map(map) => map
            .clone()
            .inner()
            .into_iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn field(map: &[(String, Value)], name: &str) -> Option<Value> {
    map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn parse_spec(spec: &Value) -> Option<Spec> {
    let spec = pairs(spec);
    let begin = pairs(&field(&spec, "begin_search")?);
    let find = pairs(&field(&spec, "find_keys")?);
    let int = |m: &[(String, Value)], k: &str| field(m, k).and_then(|v| v.as_i64()).unwrap_or(0);
    let begin_spec = pairs(&field(&begin, "spec")?);
    let begin = match field(&begin, "type")?.as_string()?.as_str() {
        "index" => Begin::Index(int(&begin_spec, "index").max(0) as usize),
        "keyword" => Begin::Keyword {
            keyword: field(&begin_spec, "keyword")?.as_string()?.into_bytes(),
            startfrom: int(&begin_spec, "startfrom"),
        },
        _ => return None,
    };
    let find_spec = pairs(&field(&find, "spec")?);
    let find = match field(&find, "type")?.as_string()?.as_str() {
        "range" => Find::Range {
            lastkey: int(&find_spec, "lastkey"),
            step: int(&find_spec, "keystep").max(1) as usize,
            limit: int(&find_spec, "limit").max(0) as usize,
        },
        "keynum" => Find::Keynum {
            keynumidx: int(&find_spec, "keynumidx").max(0) as usize,
            firstkey: int(&find_spec, "firstkey").max(0) as usize,
            step: int(&find_spec, "keystep").max(1) as usize,
        },
        _ => return None,
    };
    Some(Spec { begin, find })
}

/// The name of a key that lives beside `key` and, on a cluster, in the same hash slot: the
/// key's own hash tag is reused, or the whole key becomes the tag.
pub fn companion_key(key: &str, suffix: &str) -> String {
    if hash_tag(key).is_some() {
        format!("{key}:{suffix}")
    } else {
        format!("{{{key}}}:{suffix}")
    }
}

/// What `key` holds, as `TYPE` names it (`list`, `zset`, `stream`, …; `none` when nothing),
/// asked of the node that owns `slot`; empty when the reply is not a name.
pub(crate) async fn key_type(
    client: &Client,
    key: &Bytes,
    slot: u16,
) -> Result<String, RedisError> {
    let reply = call_at(client, "TYPE", vec![arg(key)], false, Some(slot)).await?;
    Ok(into_bytes(reply)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default())
}

/// A key's hash tag: the content of its first `{…}` when non-empty, which is all Redis hashes.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    rest.find('}')
        .filter(|&len| len > 0)
        .map(|len| &rest[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Value {
        Value::from(v)
    }

    fn i(v: i64) -> Value {
        Value::Integer(v)
    }

    fn a(v: Vec<Value>) -> Value {
        Value::Array(v)
    }

    fn spec(begin: Value, find: Value) -> Value {
        a(vec![
            s("flags"),
            a(vec![]),
            s("begin_search"),
            begin,
            s("find_keys"),
            find,
        ])
    }

    fn index(n: i64) -> Value {
        a(vec![
            s("type"),
            s("index"),
            s("spec"),
            a(vec![s("index"), i(n)]),
        ])
    }

    fn range(last: i64, step: i64, limit: i64) -> Value {
        a(vec![
            s("type"),
            s("range"),
            s("spec"),
            a(vec![
                s("lastkey"),
                i(last),
                s("keystep"),
                i(step),
                s("limit"),
                i(limit),
            ]),
        ])
    }

    fn command(name: &str, first: i64, last: i64, step: i64, specs: Vec<Value>) -> Value {
        a(vec![
            s(name),
            i(-2),
            a(vec![]),
            i(first),
            i(last),
            i(step),
            a(vec![]),
            a(vec![]),
            a(specs),
            a(vec![]),
        ])
    }

    /// A `COMMAND` reply for a few commands, shaped as Redis 7 sends it.
    fn table() -> KeySpecs {
        let keynum = |idx: i64| {
            a(vec![
                s("type"),
                s("keynum"),
                s("spec"),
                a(vec![
                    s("keynumidx"),
                    i(idx),
                    s("firstkey"),
                    i(1),
                    s("keystep"),
                    i(1),
                ]),
            ])
        };
        let keyword = a(vec![
            s("type"),
            s("keyword"),
            s("spec"),
            a(vec![s("keyword"), s("STREAMS"), s("startfrom"), i(1)]),
        ]);
        KeySpecs::parse(a(vec![
            command("incr", 1, 1, 1, vec![spec(index(1), range(0, 1, 0))]),
            command("mset", 1, -1, 2, vec![spec(index(1), range(-1, 2, 0))]),
            command("eval", 0, 0, 0, vec![spec(index(2), keynum(0))]),
            command("xread", 0, 0, 0, vec![spec(keyword, range(-1, 1, 2))]),
            command("ping", 0, 0, 0, vec![]),
            // No key specs: the legacy triple is used.
            command("legacy", 1, 2, 1, vec![]),
        ]))
    }

    fn keys(specs: &KeySpecs, name: &str, args: &[&str]) -> Vec<String> {
        let args: Vec<Bytes> = args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        specs
            .keys(name, &args)
            .unwrap()
            .into_iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    #[test]
    fn finds_keys_the_way_redis_describes_them() {
        let t = table();
        assert_eq!(keys(&t, "INCR", &["a"]), ["a"]);
        assert_eq!(keys(&t, "mset", &["a", "1", "b", "2"]), ["a", "b"]);
        assert_eq!(
            keys(&t, "EVAL", &["return 1", "2", "k1", "k2", "arg"]),
            ["k1", "k2"]
        );
        assert_eq!(
            keys(
                &t,
                "XREAD",
                &["COUNT", "1", "STREAMS", "s1", "s2", "0", "0"]
            ),
            ["s1", "s2"]
        );
        assert!(keys(&t, "PING", &[]).is_empty());
        assert_eq!(keys(&t, "legacy", &["x", "y", "z"]), ["x", "y"]);
        assert_eq!(
            t.keys("NOPE", &[]),
            Err(KeyError::UnknownCommand("NOPE".into()))
        );
    }

    #[test]
    fn keeps_the_acl_categories_of_commands_and_subcommands() {
        let mut get = match command("get", 1, 1, 1, vec![]) {
            Value::Array(fields) => fields,
            _ => unreachable!(),
        };
        get[6] = a(vec![s("@read"), s("@string")]);
        let mut object = match command("object", 0, 0, 0, vec![]) {
            Value::Array(fields) => fields,
            _ => unreachable!(),
        };
        let mut freq = match command("object|freq", 2, 2, 1, vec![]) {
            Value::Array(fields) => fields,
            _ => unreachable!(),
        };
        freq[6] = a(vec![s("@keyspace"), s("@read")]);
        object[9] = a(vec![Value::Array(freq)]);
        let t = KeySpecs::parse(a(vec![Value::Array(get), Value::Array(object)]));
        let (name, categories) = t.categories("get", &[Bytes::from_static(b"k")]).unwrap();
        assert_eq!(
            (name.as_str(), categories),
            ("GET", &["@read".to_string(), "@string".into()][..])
        );
        let (name, categories) = t
            .categories("OBJECT", &[Bytes::from_static(b"freq")])
            .unwrap();
        assert_eq!(name, "OBJECT|FREQ");
        assert!(categories.contains(&"@keyspace".to_string()));
    }

    #[test]
    fn refuses_what_redis_would_refuse_for_its_arguments() {
        let with_arity = |command: Value, arity: i64| match command {
            Value::Array(mut fields) => {
                fields[1] = i(arity);
                fields
            }
            _ => unreachable!(),
        };
        let incr = with_arity(command("incr", 1, 1, 1, vec![]), 2);
        let set = with_arity(command("set", 1, 1, 1, vec![]), -3);
        let mut object = with_arity(command("object", 0, 0, 0, vec![]), -2);
        let freq = with_arity(command("object|freq", 2, 2, 1, vec![]), 3);
        object[9] = a(vec![Value::Array(freq)]);
        let t = KeySpecs::parse(a(vec![
            Value::Array(incr),
            Value::Array(set),
            Value::Array(object),
        ]));
        let check = |name: &str, args: &[&str]| {
            let args: Vec<Bytes> = args
                .iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect();
            let (full, info) = t.lookup(name, &args).map_err(|e| e.to_string())?;
            info.check_arity(name, &full, &args)
                .map_err(|e| e.to_string())
        };
        assert_eq!(check("INCR", &["k"]), Ok(()));
        assert_eq!(
            check("INCR", &[]),
            Err("wrong number of arguments: INCR takes exactly 1 argument, 0 given".into())
        );
        assert_eq!(
            check("INCR", &["k", "1"]),
            Err("wrong number of arguments: INCR takes exactly 1 argument, 2 given".into())
        );
        assert_eq!(check("SET", &["k", "v", "EX", "10"]), Ok(()));
        assert_eq!(
            check("SET", &["k"]),
            Err("wrong number of arguments: SET takes at least 2 arguments, 1 given".into())
        );
        // A subcommand's arguments are counted after it.
        assert_eq!(check("OBJECT", &["freq", "k"]), Ok(()));
        assert_eq!(
            check("OBJECT", &["FREQ"]),
            Err("wrong number of arguments: OBJECT FREQ takes exactly 1 argument, 0 given".into())
        );
        assert_eq!(
            check("OBJECT", &[]),
            Err("wrong number of arguments: OBJECT takes at least 1 argument, 0 given".into())
        );
        assert_eq!(check("OBJECT|FREQ", &["k"]), Ok(()));
        assert_eq!(
            check("OBJECT", &["nope", "k"]),
            Err("Redis does not know the command OBJECT NOPE".into())
        );
    }

    #[test]
    fn companion_keys_share_the_slot_of_their_key() {
        use fred::util::redis_keyslot;
        for key in ["orders", "{orders}", "{orders}:stream", "a{b}c"] {
            let companion = companion_key(key, "window:delayed");
            assert_eq!(
                redis_keyslot(companion.as_bytes()),
                redis_keyslot(key.as_bytes()),
                "{key} -> {companion}"
            );
        }
        assert_eq!(companion_key("orders", "x"), "{orders}:x");
        assert_eq!(hash_tag("{orders}:dead"), Some("orders"));
        assert_eq!(hash_tag("a{b}c{d}"), Some("b"));
        assert_eq!(hash_tag("orders"), None);
        assert_eq!(hash_tag("{}x"), None, "an empty tag hashes the whole key");
        assert_eq!(companion_key("{o}:s", "x"), "{o}:s:x");
    }
}
