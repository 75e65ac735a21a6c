//! A real Redis Cluster: `redis-server --cluster-enabled yes` nodes on free loopback ports,
//! joined with `redis-cli --cluster create`, each node in its own temp dir (with its
//! `nodes.conf` and `redis.log`), SIGKILLed by pid and its dir removed on drop.
//!
//! Node settings worth knowing:
//! * `cluster-node-timeout 1000`: a killed primary is flagged FAIL after ~1 s and its replica
//!   promoted ~1-3 s after that.
//! * `cluster-replica-validity-factor 0`: a replica always attempts failover, however long it
//!   was disconnected.
//! * `cluster-allow-replica-migration no`: replicas stay where they were put, and a primary that
//!   loses all its slots (e.g. through [`RedisCluster::migrate_slot`]) stays an empty primary.
//! * `cluster-require-full-coverage` is left at its default (`yes`): while a slot has no live
//!   owner, the whole cluster reports `CLUSTERDOWN`, as in production.
//! * `repl-diskless-sync-delay 0`: replicas sync right away instead of after 5 s.
//! * Nothing is persisted (`save ""`, `appendonly no`).
//! * Each node's cluster bus gets its own free port (`cluster-port`), not port + 10000.
//!
//! The synchronous methods block the calling thread while they poll (every ~50 ms); call them
//! from `#[tokio::test]` freely, but fred clients on a current-thread runtime make no progress
//! meanwhile (they catch up afterwards).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fred::prelude::*;

use crate::resp;
use crate::util::{Probe, Proc, arg, info_field, wait_until};

/// The cluster hash slot of a key (its `{tag}` when it has one).
pub fn slot_of(key: &str) -> u16 {
    fred::util::redis_keyslot(key.as_bytes())
}

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// A running Redis Cluster (see the module docs).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Proc>,
}

/// A slot being moved between primaries; see [`RedisCluster::begin_slot_migration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMigration {
    pub slot: u16,
    /// Port of the primary giving the slot away (`MIGRATING`).
    pub from: u16,
    /// Port of the primary receiving it (`IMPORTING`).
    pub to: u16,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    master_id: Option<String>,
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn is_master(&self) -> bool {
        self.has("master")
    }

    fn failing(&self) -> bool {
        self.has("fail") || self.has("fail?")
    }

    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let id = parts.next()?.to_owned();
            // ip:port@cport[,hostname]
            let addr = parts.next()?;
            let addr = addr.split([',', '@']).next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags = parts.next()?.split(',').map(str::to_owned).collect();
            let master = parts.next()?;
            let master_id = (master != "-").then(|| master.to_owned());
            // ping-sent pong-recv config-epoch link-state
            let rest: Vec<&str> = parts.skip(4).collect();
            let slots = rest
                .iter()
                .filter(|s| !s.starts_with('[')) // [slot->-id] / [slot-<-id]: migration markers
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let n = s.parse().ok()?;
                        Some((n, n))
                    }
                })
                .collect();
            Some(NodeLine {
                id,
                port,
                flags,
                master_id,
                slots,
            })
        })
        .collect()
}

fn node_args(port: u16, dir: &std::path::Path) -> Vec<String> {
    let bus_port = crate::free_port();
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--cluster-enabled",
        "yes",
        "--cluster-port",
        &bus_port.to_string(),
        "--cluster-node-timeout",
        "1000",
        "--cluster-allow-replica-migration",
        "no",
        "--cluster-replica-validity-factor",
        "0",
        "--save",
        "",
        "--appendonly",
        "no",
        "--repl-diskless-sync-delay",
        "0",
        "--daemonize",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--dir".into(),
        arg(dir),
        "--cluster-config-file".into(),
        arg(dir.join("nodes.conf")),
        "--logfile".into(),
        arg(dir.join("redis.log")),
    ]);
    args
}

impl RedisCluster {
    /// Starts `primaries` (≥ 3, as `redis-cli --cluster create` requires) primaries with
    /// `replicas_per_primary` replicas each, and waits until every node reports
    /// `cluster_state:ok`, all 16384 slots are covered, all nodes agree on who owns what and
    /// every replica's link to its primary is up.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Self {
        assert!(
            primaries >= 3,
            "redis-cli --cluster create needs at least 3 primaries"
        );
        let total = primaries * (1 + replicas_per_primary);
        let nodes: Vec<Proc> = (0..total)
            .map(|_| Proc::start("cluster", Probe::Resp, node_args))
            .collect();
        let cluster = Self { nodes };

        let mut create = std::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create
            .args(["--cluster-replicas", &replicas_per_primary.to_string()])
            .arg("--cluster-yes")
            .stdin(std::process::Stdio::null());
        let out = create
            .output()
            .expect("redis-cli is installed and runnable");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Ports of all nodes (primaries and replicas, running or killed), in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Ports of the current primaries (as seen by the first running node), sorted; killed or
    /// failed nodes are left out.
    pub fn primaries(&self) -> Vec<u16> {
        let view = self.view();
        let mut ports: Vec<u16> = view
            .iter()
            .filter(|l| l.is_master() && !l.failing() && self.is_running(l.port))
            .map(|l| l.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Fred's URL for the cluster: `redis-cluster://127.0.0.1:<p1>?node=127.0.0.1:<p2>&...`,
    /// listing the current primaries.
    pub fn url(&self) -> String {
        let primaries = self.primaries();
        let (first, rest) = primaries.split_first().expect("a running primary");
        let mut url = format!("redis-cluster://127.0.0.1:{first}");
        for (i, port) in rest.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{port}"));
        }
        url
    }

    /// The process id of the node on `port`, while it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.node(port).pid()
    }

    /// The cluster node id (`CLUSTER MYID`) of the running node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        resp::call_text(port, &["CLUSTER", "MYID"]).expect("CLUSTER MYID")
    }

    /// Port of the primary serving `slot`, as seen by the first running node that answers.
    pub fn primary_for_slot(&self, slot: u16) -> u16 {
        self.view()
            .iter()
            .find(|l| l.is_master() && l.owns(slot))
            .map(|l| l.port)
            .unwrap_or_else(|| panic!("no primary owns slot {slot}"))
    }

    /// Ports of the (not failed) replicas of the primary on `port`, sorted.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let view = self.view();
        let Some(id) = view.iter().find(|l| l.port == port).map(|l| l.id.clone()) else {
            return Vec::new();
        };
        let mut ports: Vec<u16> = view
            .iter()
            .filter(|l| l.has("slave") && !l.failing() && l.master_id.as_deref() == Some(&id))
            .map(|l| l.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// SIGKILLs the node on `port` (by pid). Its `nodes.conf` stays for [`Self::restart`].
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// Waits until every running node agrees that `slot` is served by a primary other than
    /// `old_primary`, that primary answers `ROLE` as master and every running node reports
    /// `cluster_state:ok`; returns the new primary's port. Panics after `timeout`.
    pub fn wait_for_failover(&self, slot: u16, old_primary: u16, timeout: Duration) -> u16 {
        let deadline = Instant::now() + timeout;
        loop {
            match self.failover_done(slot, old_primary) {
                Ok(port) => return port,
                Err(why) if Instant::now() >= deadline => {
                    panic!(
                        "no failover of slot {slot} away from {old_primary} within {timeout:?}: {why}\n{}",
                        self.diagnostics()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn failover_done(&self, slot: u16, old_primary: u16) -> Result<u16, String> {
        let mut owner = None;
        for node in self.running() {
            let info = resp::call_text(node.port, &["CLUSTER", "INFO"])?;
            if info_field(&info, "cluster_state") != Some("ok") {
                return Err(format!("{} reports cluster_state not ok", node.port));
            }
            let view = self.view_of(node.port)?;
            let port = view
                .iter()
                .find(|l| l.is_master() && l.owns(slot))
                .map(|l| l.port)
                .ok_or_else(|| format!("{} sees no owner of slot {slot}", node.port))?;
            if port == old_primary {
                return Err(format!("{} still sees {old_primary} as owner", node.port));
            }
            if owner.replace(port).is_some_and(|p| p != port) {
                return Err(format!("nodes disagree on the owner of slot {slot}"));
            }
        }
        let port = owner.ok_or("no running node")?;
        let role = resp::call(port, &["ROLE"])?;
        match role.items().first().map(resp::Reply::text).as_deref() {
            Some("master") => Ok(port),
            other => Err(format!("new owner {port} has role {other:?}")),
        }
    }

    /// Starts the node on `port` again (killing it first if it runs) with the same ports and its
    /// `nodes.conf`, and waits until the cluster is healthy again (see [`Self::wait_healthy`]).
    ///
    /// A primary killed and restarted *after* [`Self::wait_for_failover`] rejoins as a replica:
    /// normally Redis turns it into a replica of its successor by itself; if it stays an empty
    /// primary instead (possible when the successor also owns other slots, because of
    /// `cluster-allow-replica-migration no`), it is told `CLUSTER REPLICATE` the primary with the
    /// fewest replicas. Restarted *before* a failover happened, it comes back as the primary of
    /// its slots with an empty dataset (nothing is persisted).
    pub fn restart(&mut self, port: u16) {
        let node = self.node_mut(port);
        let mut started = false;
        for _ in 0..20 {
            if node.spawn() {
                started = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(started, "cluster node {port} did not restart");

        let deadline = Instant::now() + Duration::from_secs(15);
        let since = Instant::now();
        loop {
            if let Ok(view) = self.view_of(port)
                && let Some(me) = view.iter().find(|l| l.has("myself"))
            {
                if me.has("slave") {
                    break;
                }
                let others_agree = self.running().filter(|n| n.port != port).any(|n| {
                    self.view_of(n.port).is_ok_and(|v| {
                        v.iter()
                            .any(|l| l.port == port && l.is_master() && !l.slots.is_empty())
                    })
                });
                if others_agree {
                    break; // a legitimate primary (restarted before any failover)
                }
                if me.slots.is_empty() && since.elapsed() > Duration::from_secs(2) {
                    let target = self
                        .primaries()
                        .into_iter()
                        .filter(|&p| p != port)
                        .min_by_key(|&p| self.replicas_of(p).len())
                        .expect("another primary");
                    let id = self.node_id(target);
                    let _ = resp::call(port, &["CLUSTER", "REPLICATE", &id]);
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "restarted node {port} did not settle\n{}",
                    self.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_healthy(Duration::from_secs(20));
    }

    /// Waits until every running node reports `cluster_state:ok` with all slots ok, knows every
    /// node, no running node is flagged failing, all running nodes agree on slot ownership and
    /// every running replica's link to its primary is up. Panics after `timeout`.
    pub fn wait_healthy(&self, timeout: Duration) {
        wait_until(
            timeout,
            Duration::from_millis(50),
            "cluster not healthy",
            || self.healthy(),
            || self.diagnostics(),
        );
    }

    fn healthy(&self) -> Result<(), String> {
        let mut ownership: Option<Vec<(u16, u16, u16)>> = None;
        // Every node must also know every replica as one (gossip spreads it after the replica
        // links are up): a test asking `replicas_of` right after start must not get none.
        let mut replicas = 0;
        for node in self.running() {
            let repl = resp::call_text(node.port, &["INFO", "replication"])?;
            if info_field(&repl, "role") == Some("slave") {
                replicas += 1;
            }
        }
        for node in self.running() {
            let port = node.port;
            let info = resp::call_text(port, &["CLUSTER", "INFO"])?;
            for (field, want) in [
                ("cluster_state", "ok".to_owned()),
                ("cluster_slots_ok", SLOTS.to_string()),
                ("cluster_known_nodes", self.nodes.len().to_string()),
            ] {
                let got = info_field(&info, field);
                if got != Some(want.as_str()) {
                    return Err(format!("{port}: {field} is {got:?}, want {want}"));
                }
            }
            let view = self.view_of(port)?;
            for line in &view {
                if self.is_running(line.port) && (line.failing() || line.has("handshake")) {
                    return Err(format!("{port} flags {} as {:?}", line.port, line.flags));
                }
            }
            let known = view
                .iter()
                .filter(|l| l.has("slave") && l.master_id.is_some() && self.is_running(l.port))
                .count();
            if known != replicas {
                return Err(format!("{port} knows {known} of the {replicas} replicas"));
            }
            let mut owned: Vec<(u16, u16, u16)> = view
                .iter()
                .filter(|l| l.is_master())
                .flat_map(|l| l.slots.iter().map(move |&(a, b)| (a, b, l.port)))
                .collect();
            owned.sort_unstable();
            if ownership.get_or_insert_with(|| owned.clone()) != &owned {
                return Err(format!("{port} disagrees about slot ownership"));
            }
            let repl = resp::call_text(port, &["INFO", "replication"])?;
            if info_field(&repl, "role") == Some("slave")
                && info_field(&repl, "master_link_status") != Some("up")
            {
                return Err(format!("replica {port}: link to its primary is not up"));
            }
        }
        match ownership {
            Some(owned) if owned.iter().all(|&(_, _, p)| self.is_running(p)) => Ok(()),
            Some(_) => Err("a killed node still owns slots".into()),
            None => Err("no running node".into()),
        }
    }

    /// Moves `slot` (with all its keys) from its current primary to the primary on `to_port`:
    /// `CLUSTER SETSLOT IMPORTING/MIGRATING`, `MIGRATE ... KEYS` in batches of 100, then
    /// `CLUSTER SETSLOT <slot> NODE` on the target, the source and every other primary. Returns
    /// once every running node sees the new owner. Does nothing if `to_port` already owns it.
    pub fn migrate_slot(&self, slot: u16, to_port: u16) {
        if self.primary_for_slot(slot) == to_port {
            return;
        }
        let migration = self.begin_slot_migration(slot, to_port);
        self.finish_slot_migration(migration);
    }

    /// First half of [`Self::migrate_slot`]: marks `slot` `IMPORTING` on `to_port` and
    /// `MIGRATING` on its owner, moving no keys. From now on the owner answers `-ASK` for keys of
    /// the slot it no longer has; move some with [`Self::move_slot_keys`].
    pub fn begin_slot_migration(&self, slot: u16, to_port: u16) -> SlotMigration {
        let from = self.primary_for_slot(slot);
        assert_ne!(from, to_port, "slot {slot} is already on {to_port}");
        assert!(
            self.primaries().contains(&to_port),
            "{to_port} is not a running primary"
        );
        let from_id = self.node_id(from);
        let to_id = self.node_id(to_port);
        let slot_s = slot.to_string();
        resp::call(
            to_port,
            &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id],
        )
        .unwrap_or_else(|e| panic!("SETSLOT IMPORTING on {to_port}: {e}"));
        resp::call(from, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id])
            .unwrap_or_else(|e| panic!("SETSLOT MIGRATING on {from}: {e}"));
        SlotMigration {
            slot,
            from,
            to: to_port,
        }
    }

    /// Moves up to `max_keys` keys of the migrating slot (`CLUSTER GETKEYSINSLOT` + `MIGRATE`,
    /// batches of 100); returns how many were moved.
    pub fn move_slot_keys(&self, migration: &SlotMigration, max_keys: usize) -> usize {
        let SlotMigration { slot, from, to } = *migration;
        let mut moved = 0;
        while moved < max_keys {
            let batch = (max_keys - moved).min(100);
            let keys = resp::call(
                from,
                &[
                    "CLUSTER",
                    "GETKEYSINSLOT",
                    &slot.to_string(),
                    &batch.to_string(),
                ],
            )
            .unwrap_or_else(|e| panic!("GETKEYSINSLOT on {from}: {e}"));
            let keys: Vec<Vec<u8>> = keys
                .items()
                .iter()
                .filter_map(|k| match k {
                    resp::Reply::Bulk(b) => Some(b.clone()),
                    _ => None,
                })
                .collect();
            if keys.is_empty() {
                break;
            }
            let mut args: Vec<Vec<u8>> = [
                "MIGRATE",
                "127.0.0.1",
                &to.to_string(),
                "",
                "0",
                "10000",
                "KEYS",
            ]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
            moved += keys.len();
            args.extend(keys);
            resp::call(from, &args).unwrap_or_else(|e| panic!("MIGRATE {from} -> {to}: {e}"));
        }
        moved
    }

    /// Second half of [`Self::migrate_slot`]: moves the remaining keys, assigns the slot to the
    /// target on the target, the source and every other primary, and waits until every running
    /// node sees the new owner.
    pub fn finish_slot_migration(&self, migration: SlotMigration) {
        self.move_slot_keys(&migration, usize::MAX);
        let SlotMigration { slot, from, to } = migration;
        let to_id = self.node_id(to);
        let slot_s = slot.to_string();
        let mut order = vec![to, from];
        order.extend(
            self.primaries()
                .into_iter()
                .filter(|p| *p != to && *p != from),
        );
        for port in order {
            resp::call(port, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id])
                .unwrap_or_else(|e| panic!("SETSLOT NODE on {port}: {e}"));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.running().all(|n| {
            self.view_of(n.port).is_ok_and(|v| {
                v.iter()
                    .find(|l| l.is_master() && l.owns(slot))
                    .is_some_and(|l| l.port == to)
            })
        }) {
            if Instant::now() >= deadline {
                panic!(
                    "slot {slot} moved to {to}, but not every node sees it\n{}",
                    self.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A connected clustered fred client (reconnecting every 100 ms without limit, 1 s
    /// connection timeout, up to 20 attempts per command, 10 redirections).
    pub async fn client(&self) -> Client {
        let config = Config::from_url(&self.url()).expect("valid cluster url");
        let client = crate::reconnecting_builder(config).build().expect("client");
        client.init().await.expect("connect to the test cluster");
        client
    }

    /// Slot owners, roles and flags as seen by each running node, plus log tails of killed and
    /// unhealthy nodes: for panic messages.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            if node.is_running() {
                let nodes = resp::call_text(node.port, &["CLUSTER", "NODES"])
                    .unwrap_or_else(|e| format!("<{e}>"));
                out.push_str(&format!("--- CLUSTER NODES from {}:\n{nodes}", node.port));
            } else {
                out.push_str(&format!("--- {} is not running\n", node.port));
            }
        }
        out
    }

    /// Per-node log tails (`redis.log` in each node's dir).
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- log of {}:\n{}\n", n.port, n.log_tail()))
            .collect()
    }

    fn node(&self, port: u16) -> &Proc {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn node_mut(&mut self, port: u16) -> &mut Proc {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn is_running(&self, port: u16) -> bool {
        self.nodes.iter().any(|n| n.port == port && n.is_running())
    }

    fn running(&self) -> impl Iterator<Item = &Proc> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    fn view_of(&self, port: u16) -> Result<Vec<NodeLine>, String> {
        resp::call_text(port, &["CLUSTER", "NODES"]).map(|t| parse_nodes(&t))
    }

    /// `CLUSTER NODES` of the first running node that answers.
    fn view(&self) -> Vec<NodeLine> {
        self.running()
            .find_map(|n| self.view_of(n.port).ok())
            .expect("a running cluster node that answers CLUSTER NODES")
    }

    /// Slot ranges `(first, last)` → port of their primary, as seen by the first running node.
    pub fn slot_owners(&self) -> BTreeMap<(u16, u16), u16> {
        self.view()
            .iter()
            .filter(|l| l.is_master())
            .flat_map(|l| l.slots.iter().map(move |&r| (r, l.port)))
            .collect()
    }
}
