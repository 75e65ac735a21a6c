//! Retention by acknowledgement on streams, its Redis side: the trim that cuts a stream below
//! what its consumer groups still need, and the walk of every primary's keyspace that finds the
//! streams to trim. When and how often they run is the session's retention job
//! (`crate::session::retention`).
//!
//! Two ways entries leave, chosen by what the server offers (see [`super::server`]): where
//! `XACKDEL` exists (Redis 8.2, Valkey 9.2) a settle is `XACKDEL … ACKED`, which deletes an
//! entry the moment the last group that references it acknowledges it; everywhere, the trim
//! ([`trim_acknowledged`]) cuts the stream's head below the lowest position any group still
//! needs, which also catches entries whose last acknowledgement came from a consumer that only
//! sends `XACK`.
//!
//! The trim reads the groups and trims in one script, which Redis runs alone: no `XREADGROUP`,
//! `XACK`, `XCLAIM` or `XGROUP CREATE` of any client can land between what it reads and what it
//! cuts, so trims sent by several sidecars at once are trims one after the other, each of them
//! exact for the stream as it is when it runs. A group's position only moves forward by
//! reading, and a read can only add pending entries at or above the group's last-delivered id,
//! which every floor keeps; a group created after a trim starts from what is left (it did not
//! exist when its entries went).
//!
//! When Redis refuses the trim nothing is lost, since the trim only ever deletes: the stream
//! keeps entries longer, until a later trim succeeds. Out of memory (`maxmemory` reached) does
//! not stop it: the script has no flags, so Redis checks each command it calls, and `XTRIM`
//! is not a `denyoom` command (it frees memory), nor are `XINFO` and `XPENDING`. `NOPERM` (an
//! ACL without `EVALSHA`, `XTRIM`, `XINFO`, `XPENDING` or the key) and `READONLY` (a replica
//! answering for a primary) are errors of the trim, as is an unreachable Redis: the job says
//! so, counts it and tries again at its next interval.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use bytes::Bytes;
use fred::interfaces::ClusterInterface;
use fred::prelude::*;
use fred::types::config::Server;
use fred::types::scripts::Script;

use super::entry::into_bytes;
use super::{Redis, RedisError, call, call_at, str_arg};

/// Keys each primary's walk looks at per step: a step costs about as much as reading this many
/// keys' types, and a walk of `n` keys takes `n / SCAN_COUNT` steps.
const SCAN_COUNT: u32 = 1_000;

/// Reads every group's position and trims below the lowest one, atomically.
///
/// A group needs its pending entries (the smallest pending id) and everything after its
/// last-delivered id (the trim keeps that entry itself, to compare ids as strings of two
/// numbers without carrying a sequence past 2^53). A group whose `lag` is absent (a Redis
/// that cannot tell how far it has read, or one older than 7.0) stops the trim altogether.
/// Replies `{"trimmed", n, floor}`, `{"unknown", group}`, `{"none"}` (no groups: nobody has
/// acknowledged anything, so nothing leaves) or `{"gone"}` (no stream at the key).
static TRIM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function lower(a, b)
  if a == nil then return b end
  local am, as = parse(a)
  local bm, bs = parse(b)
  if bm < am or (bm == am and bs < as) then return b end
  return a
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then return {'gone'} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {'none'} end
local floor = nil
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if not f['lag'] then return {'unknown', f['name']} end
  floor = lower(floor, f['last-delivered-id'])
  if tonumber(f['pending']) > 0 then
    floor = lower(floor, redis.call('XPENDING', KEYS[1], f['name'])[2])
  end
end
local n = redis.call('XTRIM', KEYS[1], 'MINID', floor)
return {'trimmed', n, floor}
"#,
    )
});

/// What one trim did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Trim {
    /// `entries` left the stream; every entry from `floor` on is still needed by some group.
    Trimmed { entries: u64, floor: String },
    /// This group's position is unknown (`XINFO GROUPS` has no `lag`): nothing was trimmed.
    Unknown { group: String },
    /// The stream has no group.
    NoGroups,
    /// No stream at the key (deleted, or replaced by another type).
    Gone,
}

/// Trims `key` below what its groups still need.
pub(crate) async fn trim_acknowledged(client: &Client, key: &Bytes) -> Result<Trim, RedisError> {
    let reply: Value = TRIM
        .evalsha_with_reload(client, vec![Key::from(key.clone())], Vec::<String>::new())
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    parse_trim(reply)
}

fn parse_trim(reply: Value) -> Result<Trim, RedisError> {
    let protocol = |detail: &str| RedisError::Protocol {
        command: "EVALSHA",
        detail: format!("retention trim: {detail}"),
    };
    let Value::Array(parts) = reply else {
        return Err(protocol("not an array"));
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_string);
    match text(parts.first()).as_deref() {
        Some("none") => Ok(Trim::NoGroups),
        Some("gone") => Ok(Trim::Gone),
        Some("unknown") => Ok(Trim::Unknown {
            group: text(parts.get(1)).unwrap_or_default(),
        }),
        Some("trimmed") => Ok(Trim::Trimmed {
            entries: parts
                .get(1)
                .and_then(Value::as_u64)
                .ok_or_else(|| protocol("no count"))?,
            floor: text(parts.get(2)).ok_or_else(|| protocol("no floor"))?,
        }),
        _ => Err(protocol("unknown reply")),
    }
}

/// The `SCAN … MATCH` glob that finds every key `patterns` allow (the `--ack-retention`
/// patterns, read as [`crate::policy::Patterns`] reads them), or `None` when only a walk without
/// `MATCH` does. It may find more: what it finds is filtered with the patterns themselves.
///
/// The patterns know `*` and `?` and nothing else: `[`, `]` and `\` are literal there and
/// escaped here. Their `?` is one character, Redis's one byte, so it becomes `?*` (a character
/// of several bytes stays matched). Of several patterns, only their common literal start can
/// be a glob (`orders:*` and `orders:dead` give `orders:*`; `a:*` and `b:*` none): one walk
/// finds them all, where a walk per pattern would read the keyspace once per pattern.
pub(crate) fn scan_glob<S: AsRef<str>>(patterns: &[S]) -> Option<String> {
    let mut list: Vec<&str> = patterns
        .iter()
        .map(|p| p.as_ref().trim())
        .filter(|p| !p.is_empty())
        .collect();
    list.sort_unstable();
    list.dedup();
    if list.is_empty() || list.contains(&"*") {
        return None;
    }
    if let [only] = list[..] {
        return Some(escape(only));
    }
    let literal =
        |p: &str| -> String { p.chars().take_while(|c| !matches!(c, '*' | '?')).collect() };
    let mut common = literal(list[0]);
    for pattern in &list[1..] {
        let other = literal(pattern);
        let shared = common
            .chars()
            .zip(other.chars())
            .take_while(|(a, b)| a == b)
            .count();
        common = common.chars().take(shared).collect();
    }
    (!common.is_empty()).then(|| format!("{}*", escape(&common)))
}

/// A pattern of `*`, `?` and literals as a Redis glob that matches at least what it matches.
fn escape(pattern: &str) -> String {
    let mut glob = String::with_capacity(pattern.len() + 4);
    for c in pattern.chars() {
        match c {
            '[' | ']' | '\\' => {
                glob.push('\\');
                glob.push(c);
            }
            '?' => glob.push_str("?*"),
            c => glob.push(c),
        }
    }
    glob
}

/// Where a walk of the keyspace runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    /// The deployment as configured: one node, or the primary its sentinels name.
    Deployment,
    /// One primary of a cluster: each holds its own part of the keyspace.
    Primary(Server),
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Node::Deployment => f.write_str("redis"),
            Node::Primary(server) => write!(f, "{server}"),
        }
    }
}

/// What one step of the walk found, and how each node's part of it went (by node, for logs).
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub streams: Vec<Bytes>,
    pub nodes: Vec<(String, Result<(), RedisError>)>,
}

/// The walk of every primary's keyspace for streams (`SCAN cursor [MATCH glob] COUNT n TYPE
/// stream`), one `SCAN` per primary per step, each primary's cursor kept from one step to the
/// next: the work per step is bounded whatever the keyspace's size, and a stream that exists
/// for a whole walk is found at least once per walk (what `SCAN` guarantees). On a cluster the
/// primaries are those of the pool's slot map, read again after a step failed on one; a
/// primary that is new starts its walk from the beginning.
#[derive(Debug)]
pub(crate) struct Discovery {
    glob: Option<String>,
    /// Each walk under way, by node; a node without one starts at cursor 0.
    cursors: BTreeMap<Node, String>,
}

impl Discovery {
    pub(crate) fn new(glob: Option<String>) -> Self {
        Self {
            glob,
            cursors: BTreeMap::new(),
        }
    }

    /// One step on every primary.
    pub(crate) async fn step(&mut self, redis: &Redis) -> Found {
        let client = redis.pool().clone();
        let nodes: Vec<Node> = if redis.is_cluster() {
            client
                .cached_cluster_state()
                .map(|state| {
                    state
                        .unique_primary_nodes()
                        .into_iter()
                        .map(Node::Primary)
                        .collect()
                })
                .unwrap_or_default()
        } else {
            vec![Node::Deployment]
        };
        self.cursors.retain(|node, _| nodes.contains(node));
        let steps = nodes.iter().map(|node| {
            let cursor = self.cursors.get(node).map_or("0", String::as_str);
            scan(&client, node, cursor, self.glob.as_deref())
        });
        let replies = futures::future::join_all(steps).await;
        let mut found = Found::default();
        let mut failed = false;
        for (node, reply) in nodes.into_iter().zip(replies) {
            let result = match reply {
                Ok((cursor, streams)) => {
                    found.streams.extend(streams);
                    if cursor == "0" {
                        self.cursors.remove(&node);
                    } else {
                        self.cursors.insert(node.clone(), cursor);
                    }
                    Ok(())
                }
                Err(err) => {
                    failed = true;
                    Err(err)
                }
            };
            found.nodes.push((node.to_string(), result));
        }
        if failed && redis.is_cluster() {
            // A primary that fails may be one no longer: the next step walks the primaries of
            // the slot map as the cluster gives it now.
            let _ = tokio::time::timeout(redis.timeout(), client.sync_cluster()).await;
        }
        found
    }
}

/// One `SCAN` on `node`: the next cursor and the streams found.
async fn scan(
    client: &Client,
    node: &Node,
    cursor: &str,
    glob: Option<&str>,
) -> Result<(String, Vec<Bytes>), RedisError> {
    let mut args = vec![str_arg(cursor)];
    if let Some(glob) = glob {
        args.extend([str_arg("MATCH"), str_arg(glob)]);
    }
    args.extend([
        str_arg("COUNT"),
        Value::Integer(i64::from(SCAN_COUNT)),
        str_arg("TYPE"),
        str_arg("stream"),
    ]);
    let reply = match node {
        Node::Deployment => call(client, "SCAN", args, false).await?,
        Node::Primary(server) => {
            call_at(
                &client.with_cluster_node(server.clone()),
                "SCAN",
                args,
                false,
                None,
            )
            .await?
        }
    };
    parse_scan(reply)
}

fn parse_scan(reply: Value) -> Result<(String, Vec<Bytes>), RedisError> {
    let protocol = |detail: &str| RedisError::Protocol {
        command: "SCAN",
        detail: detail.to_owned(),
    };
    let Value::Array(mut parts) = reply else {
        return Err(protocol("not an array"));
    };
    let (Some(Value::Array(keys)), Some(cursor)) = (parts.pop(), parts.pop()) else {
        return Err(protocol("no cursor and keys"));
    };
    let cursor = cursor.as_string().ok_or_else(|| protocol("no cursor"))?;
    Ok((cursor, keys.into_iter().filter_map(into_bytes).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> Value {
        Value::String(text.into())
    }

    #[test]
    fn replies_parse() {
        assert_eq!(
            parse_trim(Value::Array(vec![
                s("trimmed"),
                Value::Integer(3),
                s("5-0")
            ]))
            .unwrap(),
            Trim::Trimmed {
                entries: 3,
                floor: "5-0".into()
            }
        );
        assert_eq!(
            parse_trim(Value::Array(vec![s("unknown"), s("late")])).unwrap(),
            Trim::Unknown {
                group: "late".into()
            }
        );
        assert_eq!(
            parse_trim(Value::Array(vec![s("none")])).unwrap(),
            Trim::NoGroups
        );
        assert_eq!(
            parse_trim(Value::Array(vec![s("gone")])).unwrap(),
            Trim::Gone
        );
        assert!(parse_trim(Value::Integer(1)).is_err());
    }

    #[test]
    fn one_pattern_is_its_own_glob_with_what_redis_reads_otherwise_escaped() {
        assert_eq!(scan_glob(&["orders:*"]).as_deref(), Some("orders:*"));
        // Braces are literal in both.
        assert_eq!(scan_glob(&["{orders}:*"]).as_deref(), Some("{orders}:*"));
        assert_eq!(scan_glob(&["a[1]\\b"]).as_deref(), Some("a\\[1\\]\\\\b"));
        assert_eq!(scan_glob(&["exact"]).as_deref(), Some("exact"));
        // One character may be several bytes: Redis's `?` is one byte.
        assert_eq!(scan_glob(&["count:?"]).as_deref(), Some("count:?*"));
        assert_eq!(scan_glob(&[" ret:* ", ""]).as_deref(), Some("ret:*"));
        assert_eq!(scan_glob(&["ret:*", "ret:*"]).as_deref(), Some("ret:*"));
    }

    #[test]
    fn several_patterns_share_their_common_literal_start() {
        assert_eq!(
            scan_glob(&["orders:*", "orders:dead"]).as_deref(),
            Some("orders:*")
        );
        assert_eq!(
            scan_glob(&["orders", "orders:*"]).as_deref(),
            Some("orders*")
        );
        assert_eq!(
            scan_glob(&["q[1]:a?", "q[1]:b*"]).as_deref(),
            Some("q\\[1\\]:*")
        );
        assert_eq!(scan_glob(&["a:*", "b:*"]), None);
        assert_eq!(scan_glob(&["*x", "x"]), None);
    }

    #[test]
    fn every_stream_is_a_walk_without_match() {
        assert_eq!(scan_glob::<&str>(&[]), None);
        assert_eq!(scan_glob(&["*"]), None);
        assert_eq!(scan_glob(&["ret:*", "*"]), None);
    }

    /// The glob matches every name the patterns allow, checked with a glob matcher of Redis's
    /// rules (`*`, `?` one byte, `\` escapes; no classes are made) on names with characters of
    /// several bytes and with what Redis reads as syntax.
    #[test]
    fn the_glob_finds_whatever_the_patterns_allow() {
        fn redis_glob(glob: &[u8], name: &[u8]) -> bool {
            match glob.split_first() {
                None => name.is_empty(),
                Some((b'*', rest)) => (0..=name.len()).any(|i| redis_glob(rest, &name[i..])),
                Some((b'?', rest)) => !name.is_empty() && redis_glob(rest, &name[1..]),
                Some((b'\\', rest)) if !rest.is_empty() => {
                    name.first() == Some(&rest[0]) && redis_glob(&rest[1..], &name[1..])
                }
                Some((c, rest)) => name.first() == Some(c) && redis_glob(rest, &name[1..]),
            }
        }
        let sets: &[&[&str]] = &[
            &["ret:*"],
            &["ret:?"],
            &["odd:[1]?", "odd:[2]*"],
            &["a\\b*"],
            &["é?:*", "é?x"],
        ];
        let names = [
            "ret:",
            "ret:a",
            "ret:é",
            "ret:ab",
            "odd:[1]é",
            "odd:[1]",
            "odd:[2]",
            "odd:[2]xyz",
            "a\\b",
            "a\\bc",
            "éé:",
            "éz:1",
            "éax",
            "other",
        ];
        for patterns in sets {
            let allowed = crate::policy::Patterns::new(patterns);
            let glob = scan_glob(patterns);
            for name in names {
                if allowed.allows(name.as_bytes()) {
                    assert!(
                        glob.as_ref()
                            .is_none_or(|g| redis_glob(g.as_bytes(), name.as_bytes())),
                        "{patterns:?} allow {name:?}, their glob {glob:?} does not find it"
                    );
                }
            }
        }
    }

    #[test]
    fn a_scan_reply_parses() {
        let reply = Value::Array(vec![
            s("17"),
            Value::Array(vec![s("ret:a"), Value::Bytes(Bytes::from_static(b"ret:b"))]),
        ]);
        assert_eq!(
            parse_scan(reply).unwrap(),
            (
                "17".to_owned(),
                vec![Bytes::from_static(b"ret:a"), Bytes::from_static(b"ret:b")]
            )
        );
        assert!(parse_scan(Value::Array(vec![s("0")])).is_err());
        assert!(parse_scan(Value::Integer(0)).is_err());
    }
}
