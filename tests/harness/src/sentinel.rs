//! A real Sentinel setup: one primary, one replica (`--replicaof`) and N sentinels
//! (`redis-server <conf> --sentinel`, each with its own writable config file, since Sentinel
//! rewrites it), all on free loopback ports, SIGKILLed by pid and their dirs removed on drop.
//!
//! Sentinel settings: `down-after-milliseconds 1000`, `failover-timeout 3000`,
//! `parallel-syncs 1`, quorum `sentinels / 2 + 1`. A SIGKILLed primary is replaced after
//! ~2-5 s. Data nodes persist nothing and use `repl-diskless-sync-delay 0`.
//!
//! The synchronous methods block the calling thread while they poll (see the cluster module).

use std::time::{Duration, Instant};

use fred::prelude::*;

use crate::resp::{self, Reply};
use crate::util::{Probe, Proc, arg, info_field, wait_until};

const SERVICE: &str = "mymaster";

/// A primary, a replica and the sentinels watching them.
#[derive(Debug)]
pub struct Sentinels {
    data: Vec<Proc>,
    primary: u16,
    sentinels: Vec<Proc>,
}

fn data_args(replica_of: Option<u16>) -> impl FnMut(u16, &std::path::Path) -> Vec<String> {
    move |port, dir| {
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
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
            "--logfile".into(),
            arg(dir.join("redis.log")),
        ]);
        if let Some(primary) = replica_of {
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.to_string(),
            ]);
        }
        args
    }
}

/// `SENTINEL replicas|sentinels` entries as field → value lists.
fn entries(reply: &Reply) -> Vec<Vec<(String, String)>> {
    reply
        .items()
        .iter()
        .map(|entry| {
            entry
                .items()
                .chunks(2)
                .filter(|kv| kv.len() == 2)
                .map(|kv| (kv[0].text(), kv[1].text()))
                .collect()
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entry
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl Sentinels {
    /// Starts a primary and a replica, waits for the replica to sync, then starts `sentinels`
    /// (≥ 1) sentinels and waits until each knows the primary, the replica (not down) and all
    /// other sentinels (so that a failover can be authorized at once).
    pub fn start(sentinels: usize) -> Self {
        assert!(sentinels >= 1, "need at least one sentinel");
        let primary = Proc::start("sentinel-data", Probe::Resp, data_args(None));
        let replica = Proc::start("sentinel-data", Probe::Resp, data_args(Some(primary.port)));
        let primary_port = primary.port;
        let mut this = Self {
            data: vec![primary, replica],
            primary: primary_port,
            sentinels: Vec::new(),
        };
        this.wait_replica_synced(this.data[1].port, Duration::from_secs(15));

        let quorum = sentinels / 2 + 1;
        for _ in 0..sentinels {
            let sentinel = Proc::start("sentinel", Probe::Resp, |port, dir| {
                let conf = dir.join("sentinel.conf");
                let text = format!(
                    "port {port}\n\
                     bind 127.0.0.1\n\
                     daemonize no\n\
                     dir {dir}\n\
                     logfile {log}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 3000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = dir.display(),
                    log = dir.join("redis.log").display(),
                );
                std::fs::write(&conf, text).expect("write sentinel.conf");
                vec![arg(&conf), "--sentinel".into()]
            });
            this.sentinels.push(sentinel);
        }
        this.wait_sentinels_settled(Duration::from_secs(30));
        this
    }

    /// The monitored service's name: `"mymaster"`.
    pub fn service_name(&self) -> &str {
        SERVICE
    }

    /// Fred's URL: `redis-sentinel://127.0.0.1:<s1>?sentinelServiceName=mymaster&node=127.0.0.1:<s2>&...`
    /// (running sentinels).
    pub fn url(&self) -> String {
        let ports = self.sentinel_ports();
        let (first, rest) = ports.split_first().expect("a running sentinel");
        let mut url = format!("redis-sentinel://127.0.0.1:{first}?sentinelServiceName={SERVICE}");
        for port in rest {
            url.push_str(&format!("&node=127.0.0.1:{port}"));
        }
        url
    }

    /// Port of the current primary (as of start or the last [`Self::wait_for_failover`]).
    pub fn primary_port(&self) -> u16 {
        self.primary
    }

    /// Ports of the running data nodes other than the current primary.
    pub fn replica_ports(&self) -> Vec<u16> {
        self.data
            .iter()
            .filter(|n| n.is_running() && n.port != self.primary)
            .map(|n| n.port)
            .collect()
    }

    /// Ports of the running sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .map(|s| s.port)
            .collect()
    }

    /// SIGKILLs the current primary (by pid); returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary;
        self.data_node_mut(port).kill();
        port
    }

    /// SIGKILLs the sentinel on `port` (by pid).
    pub fn kill_sentinel(&mut self, port: u16) {
        self.sentinels
            .iter_mut()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no sentinel on port {port}"))
            .kill();
    }

    /// Waits until every running sentinel reports a primary other than the current one (see
    /// [`Self::primary_port`]) and that node answers `ROLE` as master; records and returns its
    /// port. Panics after `timeout`.
    pub fn wait_for_failover(&mut self, timeout: Duration) -> u16 {
        let old = self.primary;
        let deadline = Instant::now() + timeout;
        loop {
            match self.failover_done(old) {
                Ok(port) => {
                    self.primary = port;
                    return port;
                }
                Err(why) if Instant::now() >= deadline => {
                    panic!(
                        "no sentinel failover away from {old} within {timeout:?}: {why}\n{}",
                        self.logs()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn failover_done(&self, old: u16) -> Result<u16, String> {
        let mut agreed = None;
        for port in self.sentinel_ports() {
            let reply = resp::call(port, &["SENTINEL", "get-master-addr-by-name", SERVICE])?;
            let reported: u16 = reply
                .items()
                .get(1)
                .and_then(Reply::as_int)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("sentinel {port}: no primary address in {reply:?}"))?;
            if reported == old {
                return Err(format!("sentinel {port} still reports {old}"));
            }
            if agreed.replace(reported).is_some_and(|p| p != reported) {
                return Err("sentinels disagree on the primary".into());
            }
        }
        let port = agreed.ok_or("no running sentinel")?;
        let role = resp::call(port, &["ROLE"])?;
        match role.items().first().map(Reply::text).as_deref() {
            Some("master") => Ok(port),
            other => Err(format!("reported primary {port} has role {other:?}")),
        }
    }

    /// Starts the data node on `port` again (killing it first if it runs), empty, as a replica
    /// of the current primary (what Sentinel would make of it anyway), and waits until it has
    /// synced and every sentinel sees it as a healthy replica.
    pub fn restart(&mut self, port: u16) {
        let primary = self.primary;
        assert_ne!(
            port, primary,
            "the current primary cannot be restarted as a replica"
        );
        let node = self.data_node_mut(port);
        let args = data_args(Some(primary))(port, node.dir.path());
        node.set_args(args);
        let started = (0..20).any(|_| {
            node.spawn() || {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        });
        assert!(started, "data node {port} did not restart");
        self.wait_replica_synced(port, Duration::from_secs(15));
        self.wait_sentinels_settled(Duration::from_secs(30));
    }

    /// A connected fred client built from [`Self::url`] (reconnecting every 100 ms without
    /// limit), i.e. discovering the primary through the sentinels.
    pub async fn primary_client(&self) -> Client {
        let config = Config::from_url(&self.url()).expect("valid sentinel url");
        let client = crate::reconnecting_builder(config).build().expect("client");
        client
            .init()
            .await
            .expect("connect to the primary through the sentinels");
        client
    }

    /// Log tails of all data nodes and sentinels, for panic messages.
    pub fn logs(&self) -> String {
        self.data
            .iter()
            .map(|n| (n, "data node"))
            .chain(self.sentinels.iter().map(|s| (s, "sentinel")))
            .map(|(p, kind)| format!("--- log of {kind} {}:\n{}\n", p.port, p.log_tail()))
            .collect()
    }

    fn data_node_mut(&mut self, port: u16) -> &mut Proc {
        self.data
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    fn wait_replica_synced(&self, port: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(info) = resp::call_text(port, &["INFO", "replication"])
                && info_field(&info, "master_link_status") == Some("up")
            {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "replica {port} did not sync within {timeout:?}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_sentinels_settled(&self, timeout: Duration) {
        wait_until(
            timeout,
            Duration::from_millis(50),
            "sentinels did not settle",
            || self.settled(),
            || self.logs(),
        );
    }

    fn settled(&self) -> Result<(), String> {
        let replicas = self.replica_ports();
        let others = self.sentinel_ports().len() - 1;
        for port in self.sentinel_ports() {
            let addr = resp::call(port, &["SENTINEL", "get-master-addr-by-name", SERVICE])?;
            if addr.items().get(1).and_then(Reply::as_int) != Some(i64::from(self.primary)) {
                return Err(format!("sentinel {port} reports primary {addr:?}"));
            }
            let known = entries(&resp::call(port, &["SENTINEL", "replicas", SERVICE])?);
            for replica in &replicas {
                let entry = known
                    .iter()
                    .find(|e| field(e, "port") == Some(&replica.to_string()))
                    .ok_or_else(|| format!("sentinel {port} does not know replica {replica}"))?;
                let flags = field(entry, "flags").unwrap_or_default();
                if flags.contains("down") || flags.contains("disconnected") {
                    return Err(format!("sentinel {port} sees replica {replica} as {flags}"));
                }
            }
            let peers = entries(&resp::call(port, &["SENTINEL", "sentinels", SERVICE])?);
            if peers.len() < others {
                return Err(format!(
                    "sentinel {port} knows {} of {others} other sentinels",
                    peers.len()
                ));
            }
        }
        Ok(())
    }
}
