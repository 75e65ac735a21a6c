//! The sidecar's configuration: every flag, its environment variable and its default, parsed
//! and validated once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use thiserror::Error;

use crate::policy::{self, CommandRules, Limits, Patterns, Policy};

/// The sidecar's settings. Every flag can also be set by the environment variable named in
/// `--help`; a flag wins over its variable.
#[derive(Clone, Parser)]
#[command(name = "window-sidecar", version, about)]
pub struct Config {
    /// Where the gRPC service listens: `host:port`, or `unix:/path/to.sock` for a Unix domain
    /// socket (the usual choice for a sidecar: only processes that can open the file connect).
    /// Loopback by default: a sidecar serves its own pod.
    #[arg(long, env = "WINDOW_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: Listen,

    /// A file holding the bearer token every call must carry (`authorization: Bearer <token>`);
    /// the health service stays open for probes. Off when neither this nor --auth-token is set.
    #[arg(long, env = "WINDOW_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// PEM certificate chain for TLS on the gRPC listener (with --tls-key). Off when unset.
    #[arg(long, env = "WINDOW_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "WINDOW_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA whose client certificates are required (mutual TLS); needs --tls-cert.
    #[arg(long, env = "WINDOW_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,

    /// The bearer token itself (prefer --auth-token-file).
    #[arg(long, env = "WINDOW_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<Secret>,

    /// Where a second gRPC listener serves only `grpc.health.v1`, for Kubernetes probes that
    /// must reach the pod IP while the main listener stays on loopback. Off when unset.
    #[arg(long, env = "WINDOW_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,

    /// Where Prometheus metrics (`/metrics`), HTTP probes (`/livez`, `/readyz`) and the admin
    /// view (`/subscriptions`, see --admin-view) are served. Off when unset.
    #[arg(long, env = "WINDOW_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Who may read the admin view, `/subscriptions` on --metrics-listen (every open
    /// subscription's key, group and consumer, unauthenticated): `loopback` answers only peers
    /// on this host or pod (`kubectl port-forward` included) and refuses others with 403, as
    /// the metrics port usually binds every address behind a Service; `open` answers anyone
    /// who reaches the port; `off` answers nobody (404).
    #[arg(long, env = "WINDOW_ADMIN_VIEW", value_enum, default_value_t = AdminView::Loopback)]
    pub admin_view: AdminView,

    /// The Redis deployment, as a URL: `redis://` (standalone), `redis-cluster://host:port?node=…`
    /// (a cluster: any nodes), `redis-sentinel://sentinel:port?sentinelServiceName=…&node=…`
    /// (a Sentinel-managed primary); `rediss…` for TLS. User and password may be in the URL.
    #[arg(
        long,
        env = "WINDOW_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,

    /// Redis ACL user; overrides the URL's.
    #[arg(long, env = "WINDOW_REDIS_USERNAME")]
    pub redis_username: Option<String>,

    /// Redis password; overrides the URL's. Prefer --redis-password-file.
    #[arg(long, env = "WINDOW_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<Secret>,

    /// A file holding the Redis password (trailing newline ignored), for example a mounted
    /// Kubernetes Secret.
    #[arg(long, env = "WINDOW_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// PEM file of the CA that signed the Redis server's certificate (TLS; needs a rediss URL).
    /// Unset with a rediss URL: the system's trust roots.
    #[arg(long, env = "WINDOW_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,

    /// PEM client certificate for Redis servers that require one (with --redis-tls-key).
    #[arg(long, env = "WINDOW_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,

    /// PEM private key of --redis-tls-cert.
    #[arg(long, env = "WINDOW_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,

    /// The consumer name used when a client does not name one. Must be unique per replica;
    /// defaults to the pod name (POD_NAME) or the host name.
    #[arg(long, env = "WINDOW_CONSUMER_NAME")]
    pub consumer_name: Option<String>,

    /// Connections in the pool that carries flushes and Publish.
    #[arg(long, env = "WINDOW_POOL_SIZE", default_value_t = 4)]
    pub pool_size: usize,

    /// Threads that run subscriptions and I/O. 1 (the default): one thread, as a sidecar
    /// shares its pod's CPU with the application and Redis, and a message that crosses no
    /// thread is cheaper (Performance in docs/development.md); more for many busy
    /// subscriptions; 0: one per CPU the process may use.
    #[arg(long, env = "WINDOW_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,

    /// The largest COUNT a subscription may ask for.
    #[arg(long, env = "WINDOW_MAX_COUNT", default_value_t = 4096)]
    pub max_count: u32,

    /// The largest in-flight limit a subscription may ask for.
    #[arg(long, env = "WINDOW_MAX_IN_FLIGHT", default_value_t = 65536)]
    pub max_in_flight: u32,

    /// The most commands one delivery's segment may hold.
    #[arg(long, env = "WINDOW_MAX_COMMANDS_PER_SLOT", default_value_t = 1024)]
    pub max_commands_per_slot: usize,

    /// On an ordered stream subscription, the most entries waiting for their ordering key that
    /// are parked as ids (24 bytes each; still pending in Redis, fetched by id when their turn
    /// comes): a hot key's, past the COUNT already waiting for it in memory. Reads stop once
    /// this many are parked; 0: none are, and reads stop at max_in_flight entries waiting.
    #[arg(long, env = "WINDOW_MAX_PARKED", default_value_t = 100_000)]
    pub max_parked: u32,

    /// Key patterns (Redis glob: `*`, `?`; braces are literal) of the keys clients may open
    /// (streams, lists, dead letters, Publish) and touch with queued commands, comma-separated.
    /// `*`: every key.
    #[arg(
        long,
        env = "WINDOW_ALLOW_KEYS",
        value_delimiter = ',',
        default_value = "*"
    )]
    pub allow_keys: Vec<String>,

    /// Channel patterns clients may subscribe to (pub/sub), comma-separated. `*`: every channel.
    #[arg(
        long,
        env = "WINDOW_ALLOW_CHANNELS",
        value_delimiter = ',',
        default_value = "*"
    )]
    pub allow_channels: Vec<String>,

    /// Which commands clients may queue, as Redis ACL rules applied left to right: `+@write`,
    /// `-@dangerous`, `+evalsha`, `+@all`. Commands that break a window are refused whatever
    /// these say.
    #[arg(long, env = "WINDOW_ALLOW_COMMANDS", default_value = policy::DEFAULT_COMMAND_RULES)]
    pub allow_commands: String,

    /// The largest message a client may send (bytes; KiB and MiB suffixes allowed).
    #[arg(long, env = "WINDOW_MAX_MESSAGE_SIZE", default_value = "4MiB", value_parser = parse_size)]
    pub max_message_size: usize,

    /// The largest argument of a queued command (bytes; KiB and MiB suffixes allowed).
    #[arg(long, env = "WINDOW_MAX_ARG_SIZE", default_value = "1MiB", value_parser = parse_size)]
    pub max_arg_size: usize,

    /// The most subscriptions one gRPC connection may hold open at once.
    #[arg(
        long,
        env = "WINDOW_MAX_SUBSCRIPTIONS_PER_CONNECTION",
        default_value_t = 256
    )]
    pub max_subscriptions_per_connection: usize,

    /// How often an idle client connection is pinged (HTTP/2 PING); a client that does not
    /// answer within the same time is gone (its network was cut): its subscriptions close and
    /// their deliveries stay pending for another consumer.
    #[arg(long, env = "WINDOW_CLIENT_KEEPALIVE", default_value = "20s", value_parser = humantime::parse_duration)]
    pub client_keepalive: Duration,

    /// Before delivering what a read claimed (stream entries, list entries moved to a
    /// processing list), wait until this many replicas have the claim (Redis `WAIT`), so a
    /// failover cannot hand the same entries out again. 0: do not wait. With atomic mode this
    /// makes side effects run once per entry across a failover.
    #[arg(long, env = "WINDOW_WAIT_REPLICAS", default_value_t = 0)]
    pub wait_replicas: u32,

    /// How long a read waits for --wait-replicas; entries are delivered after it either way
    /// (and a warning is logged while replicas fall behind).
    #[arg(long, env = "WINDOW_WAIT_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub wait_timeout: Duration,

    /// On SIGTERM or SIGINT, how long subscriptions wait for outstanding outcomes before
    /// flushing what is owed and closing.
    #[arg(long, env = "WINDOW_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Timeout of one flush, Publish or other non-blocking Redis command.
    #[arg(long, env = "WINDOW_REDIS_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub redis_timeout: Duration,

    /// How often due retry_after entries are moved back into their stream.
    #[arg(long, env = "WINDOW_PROMOTE_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub promote_interval: Duration,

    /// How often a subscription claims entries idle longer than its min_idle (XAUTOCLAIM).
    #[arg(long, env = "WINDOW_RECLAIM_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub reclaim_interval: Duration,

    /// Streams (Redis glob patterns, comma-separated) whose entries leave once every consumer
    /// group of the stream has acknowledged them (retention by acknowledgement): an entry no
    /// group still has unread or pending is deleted, whoever consumes the other groups. With
    /// `XACKDEL` (Redis 8.2, Valkey 9.2) at the settle, and on every server by a background trim
    /// every --retention-interval of every matching stream, whether or not a subscription of it
    /// is open here (streams are found with SCAN on every primary). Off (nothing matches) by
    /// default.
    #[arg(long, env = "WINDOW_ACK_RETENTION", value_delimiter = ',')]
    pub ack_retention: Vec<String>,

    /// How often each stream under --ack-retention is trimmed below what its groups still need,
    /// and the keyspace walked a step further for such streams (one SCAN of 1000 keys a primary).
    #[arg(long, env = "WINDOW_RETENTION_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,

    /// Stream groups and lists whose backlog gauges are sampled from startup, before (and
    /// whether or not) a subscription opens on them: `stream:<key>:<group>` (the group after
    /// the last colon) or `list:<key>`. Repeatable; comma-separated in the variable. Everything
    /// a subscription opened on is sampled from then on anyway.
    #[arg(long = "watch", env = "WINDOW_WATCH", value_delimiter = ',', value_parser = parse_watch)]
    pub watch: Vec<Watch>,

    /// How often the backlog gauges (group pending and lag, list lengths, delay sets) are
    /// sampled.
    #[arg(long, env = "WINDOW_SAMPLE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub sample_interval: Duration,

    /// How long a stream consumer's lease lives unrenewed: a subscription renews it while it is
    /// open; a sidecar that died frees its consumer names after this.
    #[arg(long, env = "WINDOW_CONSUMER_LEASE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub consumer_lease: Duration,

    /// Log format.
    #[arg(long, env = "WINDOW_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    /// For trying it out: when no Redis answers at --redis-url, start a throwaway
    /// `redis-server` on a free local port and use it.
    #[arg(long, env = "WINDOW_DEV")]
    pub dev: bool,

    /// Validate the configuration and exit without connecting anywhere (0: valid, 64: not).
    #[arg(long)]
    pub check_config: bool,

    /// Stream groups and lists this sidecar keeps whether or not anything subscribes to them:
    /// it promotes their due retry_after entries every --promote-interval and samples their
    /// backlog and work-waiting gauges from startup, holding no consumer. `stream:<key>:<group>`
    /// or `list:<key>`, repeatable; comma-separated in the variable. Run without an application
    /// this is the keeper that lets workers scale to zero. Each key must be allowed by
    /// --allow-keys and, once Redis answers, hold its type or nothing (else exit 64).
    #[arg(long = "keep", env = "WINDOW_KEEP", value_delimiter = ',', value_parser = parse_watch)]
    pub keep: Vec<Watch>,

    /// A kept stream group's pending entries idle longer than this count as work waiting (they
    /// can be reclaimed): the min_idle its workers subscribe with.
    #[arg(long, env = "WINDOW_KEEP_MIN_IDLE", default_value = "60s", value_parser = humantime::parse_duration)]
    pub keep_min_idle: Duration,
}

// By hand so the Redis URL is printed without its credentials.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field("admin_view", &self.admin_view)
            .field("redis_url", &redact_url(&self.redis_url))
            .field("redis_username", &self.redis_username)
            .field("redis_password", &self.redis_password)
            .field("redis_tls_ca", &self.redis_tls_ca)
            .field("pool_size", &self.pool_size)
            .field("worker_threads", &self.worker_threads)
            .finish_non_exhaustive()
    }
}

/// Where the gRPC service listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    /// A Unix domain socket at this path.
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("unix:") {
            Some("") => Err("a Unix socket needs a path: unix:/path/to.sock".into()),
            Some(path) => Ok(Listen::Unix(PathBuf::from(path))),
            None => s.parse().map(Listen::Tcp).map_err(|_| {
                format!("{s:?} is neither host:port (an IP address and a port) nor unix:/path")
            }),
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Who may read the admin view (`/subscriptions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AdminView {
    /// Peers on a loopback address only.
    Loopback,
    /// Anyone who reaches the metrics port.
    Open,
    /// Nobody.
    Off,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// A configuration that parses but cannot work.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("--redis-url {url:?} is not usable: {reason}")]
    RedisUrl { url: String, reason: String },
    #[error("--redis-tls-* needs a TLS URL (rediss://, rediss-cluster:// or rediss-sentinel://)")]
    TlsWithoutRediss,
    #[error("--redis-tls-cert and --redis-tls-key go together")]
    CertWithoutKey,
    #[error(
        "give the Redis password either by --redis-password or by --redis-password-file, not both"
    )]
    TwoPasswords,
    #[error("--tls-cert and --tls-key go together")]
    ListenerCertWithoutKey,
    #[error("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")]
    ClientCaWithoutTls,
    #[error("give the bearer token either by --auth-token or by --auth-token-file, not both")]
    TwoTokens,
    #[error("--auth-token must not be empty")]
    EmptyToken,
    #[error("cannot read the {what} {path}: {source}")]
    SecretFile {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the token file {path} is empty")]
    EmptyTokenFile { path: std::path::PathBuf },
    #[error("--{flag} must be at least {min}{unit}, got {value}{unit}")]
    TooSmall {
        flag: &'static str,
        min: u64,
        value: u64,
        /// "" for counts, " ms" for durations, " bytes" for sizes.
        unit: &'static str,
    },
    #[error("--{0} names no pattern; use * for every name")]
    NoPattern(&'static str),
    #[error("--consumer-name must not be empty")]
    EmptyConsumerName,
    #[error("--allow-commands: {0}")]
    CommandRules(String),
    #[error("{0}")]
    Keep(String),
}

impl Config {
    /// Checks what clap's types cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.redis_url.as_str();
        let invalid = |reason: String| ConfigError::RedisUrl {
            url: redact_url(url),
            reason,
        };
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme)
            .unwrap_or_default();
        if !REDIS_SCHEMES.contains(&scheme) {
            return Err(invalid(format!(
                "the scheme must be one of {}",
                REDIS_SCHEMES.join(", ")
            )));
        }
        if let Err(err) = fred::types::config::Config::from_url(url) {
            // fred's message does not include the URL, so it cannot leak the password.
            return Err(invalid(err.details().to_owned()));
        }
        let tls_files = self.redis_tls_ca.is_some()
            || self.redis_tls_cert.is_some()
            || self.redis_tls_key.is_some();
        if tls_files && !scheme.starts_with("rediss") {
            return Err(ConfigError::TlsWithoutRediss);
        }
        if self.redis_tls_cert.is_some() != self.redis_tls_key.is_some() {
            return Err(ConfigError::CertWithoutKey);
        }
        if self.redis_password.is_some() && self.redis_password_file.is_some() {
            return Err(ConfigError::TwoPasswords);
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::ListenerCertWithoutKey);
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return Err(ConfigError::ClientCaWithoutTls);
        }
        if self.auth_token.is_some() && self.auth_token_file.is_some() {
            return Err(ConfigError::TwoTokens);
        }
        if self
            .auth_token
            .as_ref()
            .is_some_and(|t| t.expose().trim().is_empty())
        {
            return Err(ConfigError::EmptyToken);
        }
        let at_least_in = |flag, value: u64, min: u64, unit| {
            if value < min {
                Err(ConfigError::TooSmall {
                    flag,
                    min,
                    value,
                    unit,
                })
            } else {
                Ok(())
            }
        };
        let at_least = |flag, value, min| at_least_in(flag, value, min, "");
        let ms = |d: Duration| d.as_millis() as u64;
        at_least("pool-size", self.pool_size as u64, 1)?;
        at_least("max-count", self.max_count.into(), 1)?;
        at_least("max-in-flight", self.max_in_flight.into(), 1)?;
        at_least(
            "max-commands-per-slot",
            self.max_commands_per_slot as u64,
            1,
        )?;
        at_least_in("redis-timeout", ms(self.redis_timeout), 1, " ms")?;
        at_least_in("client-keepalive", ms(self.client_keepalive), 100, " ms")?;
        at_least_in(
            "max-message-size",
            self.max_message_size as u64,
            1024,
            " bytes",
        )?;
        at_least_in("max-arg-size", self.max_arg_size as u64, 1, " bytes")?;
        for (flag, patterns) in [
            ("allow-keys", &self.allow_keys),
            ("allow-channels", &self.allow_channels),
        ] {
            if patterns.iter().all(|p| p.trim().is_empty()) {
                return Err(ConfigError::NoPattern(flag));
            }
        }
        at_least(
            "max-subscriptions-per-connection",
            self.max_subscriptions_per_connection as u64,
            1,
        )?;
        self.policy()?;
        at_least_in("promote-interval", ms(self.promote_interval), 1, " ms")?;
        at_least_in("reclaim-interval", ms(self.reclaim_interval), 1, " ms")?;
        at_least_in("retention-interval", ms(self.retention_interval), 10, " ms")?;
        at_least_in("sample-interval", ms(self.sample_interval), 10, " ms")?;
        at_least_in("consumer-lease", ms(self.consumer_lease), 300, " ms")?;
        if self
            .consumer_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(ConfigError::EmptyConsumerName);
        }
        check_kept_allowed(&self.keep, &Patterns::new(&self.allow_keys))
            .map_err(ConfigError::Keep)?;
        Ok(())
    }

    /// What clients may do.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        Ok(Policy {
            keys: Patterns::new(&self.allow_keys),
            channels: Patterns::new(&self.allow_channels),
            commands: CommandRules::parse(&self.allow_commands)
                .map_err(ConfigError::CommandRules)?,
            limits: Limits {
                max_message_size: self.max_message_size,
                max_arg_size: self.max_arg_size,
                max_subscriptions_per_connection: self.max_subscriptions_per_connection,
            },
        })
    }

    /// The consumer name for clients that do not name one: the flag, else the pod name, else
    /// the host name.
    pub fn default_consumer(&self) -> String {
        self.consumer_name
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(host_name)
    }
}

/// A stream group or a list whose backlog is sampled whether or not it is subscribed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watch {
    Stream { key: String, group: String },
    List { key: String },
}

impl Watch {
    /// How `--keep` names a stream group or list, for messages.
    pub fn spec(&self) -> String {
        match self {
            Watch::Stream { key, group } => format!("stream:{key}:{group}"),
            Watch::List { key } => format!("list:{key}"),
        }
    }
}

/// Refuses a kept key that `--allow-keys` does not allow: the keeper would promote into a key
/// no client of this sidecar may touch. Part of the configuration's validation, so that
/// `--check-config` refuses it too.
fn check_kept_allowed(keep: &[Watch], keys: &Patterns) -> Result<(), String> {
    for kept in keep {
        let key = match kept {
            Watch::Stream { key, .. } | Watch::List { key } => key,
        };
        if !keys.allows(key.as_bytes()) {
            return Err(format!(
                "--keep {}: the key {key:?} is outside --allow-keys",
                kept.spec()
            ));
        }
    }
    Ok(())
}

fn parse_watch(spec: &str) -> Result<Watch, String> {
    let usage = || {
        format!("{spec:?} names no stream group or list: write stream:<key>:<group> or list:<key>")
    };
    match spec.split_once(':') {
        Some(("stream", rest)) => match rest.rsplit_once(':') {
            Some((key, group)) if !key.is_empty() && !group.is_empty() => Ok(Watch::Stream {
                key: key.to_owned(),
                group: group.to_owned(),
            }),
            _ => Err(usage()),
        },
        Some(("list", key)) if !key.is_empty() => Ok(Watch::List {
            key: key.to_owned(),
        }),
        _ => Err(usage()),
    }
}

/// The URL schemes the sidecar accepts.
pub const REDIS_SCHEMES: [&str; 6] = [
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
];

/// A secret value (a password): never printed by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: &str) -> Self {
        Self(secret.to_owned())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

/// A size in bytes, with an optional KiB or MiB suffix.
fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (number, unit) = match (s.strip_suffix("MiB"), s.strip_suffix("KiB")) {
        (Some(n), _) => (n, 1 << 20),
        (_, Some(n)) => (n, 1 << 10),
        _ => (s, 1),
    };
    number
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("{s:?} is not a size: bytes, or a number with KiB or MiB"))
}

/// A URL with its password (and user) replaced, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// This machine's host name (a pod's name on Kubernetes).
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "window-sidecar".to_owned())
}

mod secrets;

pub use secrets::ListenerPem;

#[cfg(test)]
mod tests;
