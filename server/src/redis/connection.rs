//! Connections to one Redis deployment: the URL, credentials and TLS made into a fred
//! configuration, the shared pool (Publish and the sidecar's own commands), the flush pool
//! (no cluster redirections: see [`super::flush`]), a dedicated client per subscription for
//! its blocking reads, and their supervision (reconnection, the last connection error, a
//! pool client that stopped started again).

use std::path::PathBuf;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::{Config as FredConfig, ReconnectPolicy, Server, ServerConfig};

use super::error::RedisError;
use crate::config::{Secret, redact_url};

/// Connections to one Redis deployment.
#[derive(Clone)]
pub struct Redis {
    config: FredConfig,
    cluster: bool,
    /// Set by [`Redis::quit`]: a pool client that stops now is not brought back.
    closing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The last connection error the pool saw, to say why Redis does not answer; cleared
    /// when a connection is made.
    last_error: LastError,
    /// The ACL user the sidecar logs in as (`default` when none is given), named when Redis
    /// refuses the credentials.
    user: String,
    /// Publish and the sidecar's own commands (promoter, sampler, leases, give-backs).
    pool: Pool,
    /// Flushes only: they follow no cluster redirection (see [`redirect`]).
    flush_pool: Pool,
    timeout: Duration,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The fred config holds the password: never print it.
        f.debug_struct("Redis")
            .field("pool_size", &self.pool.size())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why the pool's connections last failed.
#[derive(Clone, Debug)]
enum ConnectionFailure {
    /// Redis refused the credentials: its reply.
    Auth(String),
    /// Anything else (refused, reset, a TLS handshake): where, and fred's reason.
    Other(String),
}

type LastError = std::sync::Arc<parking_lot::Mutex<Option<ConnectionFailure>>>;

fn reconnect_policy() -> ReconnectPolicy {
    // Unlimited attempts, 100 ms doubling to 2 s: a sidecar outlives Redis restarts.
    ReconnectPolicy::new_exponential(0, 100, 2_000, 2)
}

/// How to reach Redis: the URL and what overrides or completes it.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    pub url: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub tls: Option<TlsFiles>,
    pub pool_size: usize,
    pub timeout: Duration,
}

/// PEM files for TLS to Redis.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// The CA to trust; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The host and port of the one server a Redis URL names; `None` when it names several (a
/// cluster) or a Sentinel deployment.
pub fn single_server(url: &str) -> Result<Option<(String, u16)>, RedisError> {
    let config = FredConfig::from_url(url).map_err(|e| RedisError::Url {
        url: redact_url(url),
        reason: e.details().to_owned(),
    })?;
    Ok(match config.server {
        ServerConfig::Centralized { server } => Some((server.host.to_string(), server.port)),
        _ => None,
    })
}

impl ConnectOptions {
    /// The fred configuration: the URL's, with credentials and TLS applied.
    fn fred_config(&self) -> Result<FredConfig, RedisError> {
        let url_error = |reason: String| RedisError::Url {
            url: redact_url(&self.url),
            reason,
        };
        let mut config =
            FredConfig::from_url(&self.url).map_err(|e| url_error(e.details().to_owned()))?;
        if let Some(username) = &self.username {
            config.username = Some(username.clone());
        }
        if let Some(password) = &self.password {
            config.password = Some(password.expose().to_owned());
        }
        if self.url.starts_with("rediss") {
            let tls = self.tls.clone().unwrap_or_default();
            config.tls = Some(
                tls.client_config()
                    .map_err(|reason| RedisError::Tls { reason })?
                    .into(),
            );
        }
        config.fail_fast = false;
        Ok(config)
    }
}

impl TlsFiles {
    fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let read_certs = |path: &PathBuf| -> Result<Vec<CertificateDer<'static>>, String> {
            CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))
        };
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for cert in read_certs(ca)? {
                    roots.add(cert).map_err(|e| {
                        format!("{} holds an unusable CA certificate: {e}", ca.display())
                    })?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for cert in native.certs {
                    let _ = roots.add(cert);
                }
            }
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        match &self.client {
            Some((cert, key)) => {
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("cannot read the private key {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(read_certs(cert)?, key)
                    .map_err(|e| format!("the client certificate is unusable: {e}"))
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

impl Redis {
    /// Builds the pool and starts connecting in the background; commands wait for the
    /// connection (up to `timeout`), so the sidecar can start before Redis does.
    pub fn connect(options: &ConnectOptions) -> Result<Self, RedisError> {
        let config = options.fred_config()?;
        let timeout = options.timeout;
        let last_error = LastError::default();
        let user = config
            .username
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let closing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let start = |redirections| {
            let pool = build_pool(&config, timeout, options.pool_size, redirections)?;
            for client in pool.clients() {
                log_errors(client, &last_error, &user);
                tokio::spawn(supervise(client.clone(), std::sync::Arc::clone(&closing)));
            }
            Ok::<_, RedisError>(pool)
        };
        let pool = start(true)?;
        let flush_pool = start(false)?;
        Ok(Self {
            closing,
            last_error,
            user,
            cluster: matches!(config.server, ServerConfig::Clustered { .. }),
            config,
            pool,
            flush_pool,
            timeout,
        })
    }

    /// Says why Redis did not answer: a command waiting for a connection times out whatever
    /// kept the connection from being made, and "did not answer" alone does not tell a wrong
    /// password from a TLS handshake failure. A refused login becomes [`RedisError::Auth`]
    /// (with the user), anything else is added to the error.
    pub fn explain(&self, err: RedisError) -> RedisError {
        let last = self.last_error.lock().clone();
        match (err, last) {
            (
                RedisError::Timeout(_) | RedisError::Unavailable(_),
                Some(ConnectionFailure::Auth(reply)),
            )
            | (RedisError::Auth { reply, .. }, _) => self.auth_failed(reply),
            (RedisError::Timeout(what), Some(ConnectionFailure::Other(cause))) => {
                RedisError::Timeout(format!("{what}; last connection error: {cause}"))
            }
            (RedisError::Unavailable(what), Some(ConnectionFailure::Other(cause))) => {
                RedisError::Unavailable(format!("{what}; last connection error: {cause}"))
            }
            (err, _) => err,
        }
    }

    fn auth_failed(&self, reply: String) -> RedisError {
        RedisError::Auth {
            user: Some(self.user.clone()),
            reply,
        }
    }

    /// A dedicated connection's first attempt failed.
    fn connection_failed(&self, err: &Error) -> RedisError {
        match err.kind() {
            ErrorKind::Auth => self.auth_failed(err.details().to_owned()),
            _ => RedisError::Unavailable(err.details().to_owned()),
        }
    }

    /// Whether Redis is a cluster (commands are routed by hash slot).
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The next pool connection.
    pub fn pool(&self) -> &Client {
        self.pool.next_connected()
    }

    /// The next connection for flushes, which follows no cluster redirection: a flush's
    /// redirections are followed by [`redirect::follow`], on [`Redis::pool`].
    pub fn flush_client(&self) -> &Client {
        self.flush_pool.next_connected()
    }

    /// The timeout of non-blocking commands.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The configuration of a subscription's own connection. Its first connection is tried
    /// at once: fred sleeps a reconnection delay before the first attempt otherwise (100 to
    /// 200 ms with our policy, added to every subscription's open). When that attempt fails,
    /// the open fails with UNAVAILABLE and the client retries; later interruptions reconnect
    /// with the policy.
    fn subscription_config(&self) -> Config {
        Config {
            fail_fast: true,
            ..self.config.clone()
        }
    }

    /// A new dedicated client for one subscription's blocking reads, connected: to `node`
    /// alone when given (a cluster node that owns the subscription's slot, see
    /// [`super::read_connection`]), else to the deployment as configured.
    pub async fn dedicated_client(&self, node: Option<Server>) -> Result<Client, RedisError> {
        let mut config = self.subscription_config();
        if let Some(server) = node {
            config.server = ServerConfig::Centralized { server };
        }
        let client = Builder::from_config(config)
            .with_connection_config(|conn| {
                conn.connection_timeout = self.timeout;
                conn.internal_command_timeout = self.timeout;
            })
            // fred gives every client nine event channels of this many slots, written at
            // creation: 32 cost some 20 kB per reader. A reader only asks whether it
            // reconnected since its last read (a lagging receiver says so too) and waits for
            // its first connect.
            .with_performance_config(|perf| perf.broadcast_channel_capacity = 1)
            .set_policy(reconnect_policy())
            .build()
            .map_err(|e| RedisError::from_fred("connect", &e))?;
        client.connect();
        match tokio::time::timeout(self.timeout, client.wait_for_connect()).await {
            Ok(Ok(())) => Ok(client),
            Ok(Err(err)) => {
                let _ = client.quit().await;
                Err(self.connection_failed(&err))
            }
            Err(_) => {
                let _ = client.quit().await;
                Err(self.explain(RedisError::Timeout(format!(
                    "no connection within {:?}",
                    self.timeout
                ))))
            }
        }
    }

    /// A new dedicated pub/sub connection, connected.
    pub async fn subscriber_client(&self) -> Result<fred::clients::SubscriberClient, RedisError> {
        let client = Builder::from_config(self.subscription_config())
            .with_connection_config(|conn| {
                conn.connection_timeout = self.timeout;
                conn.internal_command_timeout = self.timeout;
            })
            // Messages wait here only until the forwarder moves them to the bounded buffer.
            .with_performance_config(|perf| perf.broadcast_channel_capacity = 4096)
            .set_policy(reconnect_policy())
            .build_subscriber_client()
            .map_err(|e| RedisError::from_fred("connect", &e))?;
        client.connect();
        match tokio::time::timeout(self.timeout, client.wait_for_connect()).await {
            Ok(Ok(())) => Ok(client),
            Ok(Err(err)) => Err(self.connection_failed(&err)),
            Err(_) => Err(self.explain(RedisError::Timeout(format!(
                "no connection within {:?}",
                self.timeout
            )))),
        }
    }

    /// Whether Redis answers a PING now.
    pub async fn ping(&self) -> bool {
        self.answers().await.is_ok()
    }

    /// Whether Redis answers a PING now, and why not (see [`Redis::explain`]).
    pub async fn answers(&self) -> Result<(), RedisError> {
        match self.pool().ping::<String>(None).await {
            Ok(reply) if reply == "PONG" => Ok(()),
            Ok(reply) => Err(RedisError::Protocol {
                command: "PING",
                detail: format!("{reply:?}"),
            }),
            Err(err) => Err(self.explain(RedisError::from_fred("PING", &err))),
        }
    }

    /// Closes every pool connection, waiting one Redis timeout at most in all: with Redis
    /// gone, each client's QUIT would wait out its own timeout, one pool after the other, and
    /// a stopping sidecar must not outlast its grace period on them. What is not closed by
    /// then closes with the process.
    pub async fn quit(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let all = futures::future::join_all(self.pool_clients().map(quit_client));
        if tokio::time::timeout(self.timeout, all).await.is_err() {
            tracing::warn!(timeout = ?self.timeout, "Redis did not answer QUIT in time; closing without it");
        }
    }

    /// Every pool client (for tests that stop one on purpose).
    pub fn pool_clients(&self) -> impl Iterator<Item = &Client> {
        self.pool.clients().iter().chain(self.flush_pool.clients())
    }
}

/// Closes one client. Only a connected client answers QUIT: one still connecting (fred sleeps
/// its reconnect delay before every connect, the first one too) or reconnecting stops its
/// attempts as the QUIT is sent, but the QUIT itself is never answered, and waiting for it
/// would hold a sidecar stopped right after it started for a whole command timeout.
async fn quit_client(client: &Client) {
    use futures::FutureExt;
    if client.is_connected() {
        let _ = client.quit().await;
    } else {
        // Polled once: far enough to send it; the answer that never comes is not awaited.
        let _ = client.quit().now_or_never();
    }
}

/// A pool of `size` clients. `redirections`: whether its commands follow `-MOVED` and `-ASK`
/// (flushes do not: fred follows them command by command, out of a MULTI).
fn build_pool(
    config: &FredConfig,
    timeout: Duration,
    size: usize,
    redirections: bool,
) -> Result<Pool, RedisError> {
    Builder::from_config(config.clone())
        .with_performance_config(|perf| perf.default_command_timeout = timeout)
        .with_connection_config(|conn| {
            conn.connection_timeout = timeout;
            conn.internal_command_timeout = timeout;
            // One write per command: a flush whose connection broke is reported, never resent
            // (a resent transaction whose first copy ran would apply its side effects twice).
            // Publish asks for more attempts itself.
            conn.max_command_attempts = 1;
            if !redirections {
                conn.max_redirections = 0;
            }
            // Nagle on: writes of the pool that follow each other closely (the flushes and
            // reads of many subscriptions) may leave in one segment. With a flush in one write
            // (fred as vendored) TCP_NODELAY measured no better (docs/development.md).
            conn.tcp.nodelay = Some(false);
        })
        .set_policy(reconnect_policy())
        .build_pool(size)
        .map_err(|e| RedisError::from_fred("connect", &e))
}

/// Logs a client's connection errors (refused, TLS handshake, AUTH) once per change and keeps
/// the last, so a timeout can say why; a connection made clears it.
fn log_errors(client: &Client, last_error: &LastError, user: &str) {
    let last = std::sync::Arc::clone(last_error);
    let user = user.to_owned();
    client.on_error(move |(err, server)| {
        let failure = match (err.kind(), server) {
            (ErrorKind::Auth, _) => ConnectionFailure::Auth(err.details().to_owned()),
            (_, Some(server)) => ConnectionFailure::Other(format!("{server}: {}", err.details())),
            (_, None) => ConnectionFailure::Other(err.details().to_owned()),
        };
        let mut last = last.lock();
        let changed = match (&*last, &failure) {
            (Some(ConnectionFailure::Auth(a)), ConnectionFailure::Auth(b))
            | (Some(ConnectionFailure::Other(a)), ConnectionFailure::Other(b)) => a != b,
            _ => true,
        };
        if changed {
            match &failure {
                ConnectionFailure::Auth(reply) => tracing::error!(
                    user = %user,
                    reply = %reply,
                    "authentication to Redis failed: check --redis-username and --redis-password-file (or the URL's user and password) against the Redis ACL; retrying"
                ),
                ConnectionFailure::Other(message) => {
                    tracing::warn!(error = %message, "Redis connection error")
                }
            }
            *last = Some(failure);
        }
        async { Ok(()) }
    });
    let last = std::sync::Arc::clone(last_error);
    client.on_reconnect(move |_| {
        *last.lock() = None;
        async { Ok(()) }
    });
}

/// Keeps one pool client running. fred's client stops for good when its routing task ends
/// (an error it does not recover from inside the task, or a quit): every command sent to it
/// then waits out its timeout, and nothing but a restart brought the sidecar back. Started
/// again, the client reconnects with its policy.
async fn supervise(client: Client, closing: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    const RESTART_AFTER: Duration = Duration::from_millis(200);
    loop {
        let ended = client.connect().await;
        if closing.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let why = match ended {
            Ok(Ok(())) => "it was stopped".to_owned(),
            Ok(Err(err)) => err.details().to_owned(),
            Err(err) => err.to_string(),
        };
        tracing::warn!(client = %client.id(), reason = %why, "a Redis pool client stopped; starting it again");
        tokio::time::sleep(RESTART_AFTER).await;
    }
}
