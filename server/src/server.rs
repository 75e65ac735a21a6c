//! Wires the process together: Redis connections, the gRPC services (window, health,
//! reflection), the health watcher, and the ordered shutdown (stop reading, drain windows,
//! flush what is owed, close).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use std::path::PathBuf;
use thiserror::Error;

use tokio::net::{TcpListener, UnixListener};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{error, info, warn};

use crate::config::{Config, Listen, Secret, Watch, redact_url};
use crate::domain::{ListSource, Source, StreamSource};
use crate::grpc::{self, Numbered, convert::OpenLimits};
use crate::proto::dead_letter_service_server::DeadLetterServiceServer;
use crate::proto::window_service_server::WindowServiceServer;
use crate::redis::form::Form;
use crate::redis::{ConnectOptions, Redis, RedisError, Replication, TlsFiles};
use crate::session::{Settings, Shared};

/// How often the health watcher pings Redis.
const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// The service name whose health is readiness.
pub const SERVICE: &str = "window_sidecar.v1.WindowService";

/// Why the sidecar could not run.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Redis(#[from] RedisError),
    #[error("cannot listen on unix:{path}: {source}")]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A kept key of the wrong type: a configuration error (exit 64).
    #[error(transparent)]
    Keep(#[from] crate::scale::keeper::KeepError),
}

/// How to reach Redis, from the configuration (reads the password file, if any).
pub fn connect_options(config: &Config) -> Result<ConnectOptions, ServeError> {
    let password = config.redis_password()?;
    let tls =
        (config.redis_tls_ca.is_some() || config.redis_tls_cert.is_some()).then(|| TlsFiles {
            ca: config.redis_tls_ca.clone(),
            client: config
                .redis_tls_cert
                .clone()
                .zip(config.redis_tls_key.clone()),
        });
    Ok(ConnectOptions {
        url: config.redis_url.clone(),
        username: config.redis_username.clone(),
        password,
        tls,
        pool_size: config.pool_size,
        timeout: config.redis_timeout,
    })
}

/// A bound gRPC listener.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    /// A Unix socket and its path (removed when the server stops).
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `listen`. A Unix socket's stale file is replaced and the new one is made
    /// readable and writable by its owner and group only.
    pub async fn bind(listen: &Listen) -> Result<Self, ServeError> {
        match listen {
            Listen::Tcp(addr) => bind(*addr).await.map(Listener::Tcp),
            Listen::Unix(path) => {
                let error = |source| ServeError::BindUnix {
                    path: path.clone(),
                    source,
                };
                match std::fs::remove_file(path) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                        return Err(error(err));
                    }
                    _ => {}
                }
                let listener = UnixListener::bind(path).map_err(error)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
                    .map_err(error)?;
                Ok(Listener::Unix(listener, path.clone()))
            }
        }
    }

    /// The TCP address, when it is a TCP listener.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(listener) => listener.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Listener::Tcp(listener) => listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            Listener::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }
}

/// TLS for the gRPC listener, from the configuration (reads the PEM files).
fn listener_tls(config: &Config) -> Result<Option<ServerTlsConfig>, ServeError> {
    let Some(pem) = config.listener_pem()? else {
        return Ok(None);
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(pem.cert, pem.key));
    if let Some(ca) = pem.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(Some(tls))
}

/// Accepted connections with TCP_NODELAY. tonic ignores its own `tcp_nodelay` setting when
/// given incoming connections, and without it every small message (a read, a flush report)
/// waits on Nagle's algorithm and delayed ACKs: about 40 ms each (the benchmark measured 4.2k
/// deliveries/s with, and 109k without, that wait).
fn nodelay(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    })
}

/// Checks `authorization: Bearer <token>` on every call, comparing in constant time.
#[derive(Clone, Debug)]
pub struct BearerAuth {
    token: Option<Arc<Secret>>,
}

impl BearerAuth {
    pub fn new(token: Option<Secret>) -> Self {
        Self {
            token: token.map(Arc::new),
        }
    }

    fn enabled(&self) -> bool {
        self.token.is_some()
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        use subtle::ConstantTimeEq;
        let Some(expected) = &self.token else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(token) if bool::from(token.as_bytes().ct_eq(expected.expose().as_bytes())) => {
                Ok(request)
            }
            Some(_) => Err(tonic::Status::unauthenticated(
                "the bearer token is not the one this sidecar was given",
            )),
            None => Err(tonic::Status::unauthenticated(
                "this sidecar requires `authorization: Bearer <token>` metadata on every call",
            )),
        }
    }
}

/// Binds a TCP listener.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Runs the sidecar on `listener` until `shutdown` is cancelled and every subscription has
/// drained.
/// `tracing` says whether spans are exported (see [`crate::telemetry::init`]).
pub async fn run(
    config: Config,
    listener: Listener,
    shutdown: CancellationToken,
    tracing: bool,
) -> Result<(), ServeError> {
    let redis = Redis::connect(&connect_options(&config)?)?;
    let auth = BearerAuth::new(config.auth_token()?);
    info!(
        listen = %listener.describe(),
        bearer_auth = auth.enabled(),
        redis = %redact_url(&config.redis_url),
        worker_threads = config.worker_threads,
        // What the runtime in effect runs, not what was asked for.
        runtime_workers = tokio::runtime::Handle::current().metrics().num_workers(),
        "window-sidecar starting"
    );
    let settings = Settings {
        // Stable across restarts of this sidecar (same host, same listener), unique among
        // sidecars running at once: a restarted sidecar takes its consumer leases back at
        // once, another one waits for them.
        instance: format!("{}@{}", crate::config::host_name(), listener.describe()),
        default_consumer: config.default_consumer(),
        max_commands_per_slot: config.max_commands_per_slot,
        max_parked: config.max_parked,
        shutdown_grace: config.shutdown_grace,
        promote_interval: config.promote_interval,
        reclaim_interval: config.reclaim_interval,
        consumer_lease: config.consumer_lease,
        tracing,
        policy: config.policy()?,
        replication: (config.wait_replicas > 0).then_some(Replication {
            replicas: config.wait_replicas,
            timeout: config.wait_timeout,
        }),
        retention: (!config.ack_retention.is_empty())
            .then(|| crate::policy::Patterns::new(&config.ack_retention)),
    };
    let shared = Arc::new(Shared::new(redis.clone(), settings, shutdown.clone()));
    for watch in &config.watch {
        let source = watched_source(watch);
        shared.watched.watch(&source, &Form::new(&source, None));
    }
    tokio::spawn(learn_server(Arc::clone(&shared)));
    // The jobs take the parts of the shared state they use; each task holds all of it.
    let sampler = Arc::clone(&shared);
    let every = config.sample_interval;
    tokio::spawn(async move {
        let s = &sampler;
        crate::session::sampler::run(&s.watched, &s.redis, &s.metrics, every).await
    });
    shared.metrics.scale.start_time.set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64),
    );
    if !config.ack_retention.is_empty() {
        let trimmer = Arc::clone(&shared);
        let (patterns, every) = (config.ack_retention.clone(), config.retention_interval);
        tokio::spawn(async move {
            let s = &trimmer;
            crate::session::retention::run(
                &s.retention,
                &s.redis,
                &s.metrics,
                &s.shutdown,
                patterns,
                every,
            )
            .await
        });
    }
    let metrics_server = match config.metrics_listen {
        Some(addr) => {
            let listener = bind(addr).await?;
            info!(
                %addr,
                admin_view = ?config.admin_view,
                "serving /metrics, /livez, /readyz and /subscriptions"
            );
            Some(tokio::spawn(crate::http::serve(
                listener,
                Arc::clone(&shared),
                config.admin_view,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    // The keeper: kept keys of the wrong type stop the sidecar before it serves.
    crate::scale::keeper::check_types(&redis, &config.keep, &shutdown).await?;
    crate::scale::keeper::start(
        &shared,
        &config.keep,
        config.keep_min_idle,
        config.promote_interval,
    );
    let sessions = TaskTracker::new();
    let limits = OpenLimits {
        max_count: config.max_count,
        max_in_flight: config.max_in_flight,
    };
    let service = grpc::Service::new(Arc::clone(&shared), limits, sessions.clone());

    let (reporter, health) = tonic_health::server::health_reporter();
    // The overall status ("") is liveness: SERVING while the process runs, so a probe does not
    // restart the sidecar during a Redis outage. The service's own status is readiness.
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(SERVICE, ServingStatus::NotServing)
        .await;
    let watcher = tokio::spawn(watch_health(Arc::clone(&shared), reporter.clone()));
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    // grpcurl 1.8 and many tools still speak only v1alpha.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let health_server = match config.health_listen {
        Some(addr) => {
            let listener = bind(addr).await?;
            let health = health.clone();
            let stop = shutdown.clone();
            Some(tokio::spawn(async move {
                Server::builder()
                    .add_service(health)
                    .serve_with_incoming_shutdown(nodelay(listener), stop.cancelled_owned())
                    .await
            }))
        }
        None => None,
    };

    let drained = drain(
        shutdown.clone(),
        sessions.clone(),
        config.shutdown_grace + config.redis_timeout,
    );
    // Health stays open for probes; everything else needs the token when one is set.
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(config.client_keepalive))
        .http2_keepalive_timeout(Some(config.client_keepalive));
    if let Some(tls) = listener_tls(&config)? {
        builder = builder.tls_config(tls)?;
    }
    let window = InterceptedService::new(
        WindowServiceServer::new(service).max_decoding_message_size(config.max_message_size),
        auth.clone(),
    );
    let dead_letters = InterceptedService::new(
        DeadLetterServiceServer::new(grpc::DeadLetters::new(Arc::clone(&shared))),
        auth.clone(),
    );
    let router = builder
        .layer(grpc::deadline::Deadlines::layer())
        .layer(tower::util::MapResponseLayer::new(
            grpc::too_large_is_resource_exhausted,
        ))
        .add_service(health)
        .add_service(InterceptedService::new(reflection_v1, auth.clone()))
        .add_service(InterceptedService::new(reflection_v1alpha, auth))
        .add_service(window)
        .add_service(dead_letters);
    match listener {
        Listener::Tcp(listener) => {
            let incoming = nodelay(listener).map(|accepted| accepted.map(Numbered::new));
            router
                .serve_with_incoming_shutdown(incoming, drained)
                .await?
        }
        Listener::Unix(listener, path) => {
            let incoming =
                UnixListenerStream::new(listener).map(|accepted| accepted.map(Numbered::new));
            let served = router.serve_with_incoming_shutdown(incoming, drained).await;
            let _ = std::fs::remove_file(&path);
            served?
        }
    }

    watcher.abort();
    if let Some(server) = health_server {
        let _ = server.await;
    }
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    redis.quit().await;
    info!("window-sidecar stopped");
    Ok(())
}

/// Resolves once shutdown was asked for and every session has flushed what it owed (or the
/// bound ran out), so the gRPC server only closes connections whose streams have ended.
async fn drain(shutdown: CancellationToken, sessions: TaskTracker, bound: Duration) {
    shutdown.cancelled().await;
    info!(
        open_subscriptions = sessions.len(),
        "shutdown: draining subscriptions"
    );
    sessions.close();
    // Past the grace period a session abandons what is outstanding and flushes; the flush
    // itself is bounded by the Redis timeout. Add a margin for the last messages.
    if tokio::time::timeout(bound + Duration::from_secs(1), sessions.wait())
        .await
        .is_err()
    {
        warn!(
            still_open = sessions.len(),
            "shutdown: subscriptions did not drain in time"
        );
    }
}

/// Reports the WindowService SERVING while Redis answers, NOT_SERVING while it does not and
/// once shutdown begins (then the overall status too). Says why in the log (a refused login
/// apart from an outage) and in `/readyz`; a health check carries no reason.
async fn watch_health(shared: Arc<Shared>, reporter: HealthReporter) {
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    let mut last: Option<Result<(), &str>> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.shutdown.cancelled() => {
                shared.ready.store(false, Ordering::Relaxed);
                *shared.unready.lock() = Some("the sidecar is draining".to_owned());
                reporter.set_service_status(SERVICE, ServingStatus::NotServing).await;
                reporter.set_service_status("", ServingStatus::NotServing).await;
                return;
            }
        }
        let answer = shared.redis.answers().await;
        // Logged when it changes between serving, a refused login and an outage; the detail
        // of an outage changes from one check to the next and is not a change of state.
        let now = answer.as_ref().map(|_| ()).map_err(|err| match err {
            RedisError::Auth { .. } => "auth",
            _ => "down",
        });
        *shared.unready.lock() = answer.as_ref().err().map(|err| err.to_string());
        shared.ready.store(answer.is_ok(), Ordering::Relaxed);
        shared
            .metrics
            .scale
            .redis_ready
            .set(i64::from(answer.is_ok()));
        if last.as_ref() == Some(&now) {
            continue;
        }
        match &answer {
            Ok(()) => info!("Redis answers: SERVING"),
            Err(err @ RedisError::Auth { .. }) => {
                error!(reason = %err, "Redis refuses the sidecar's credentials: NOT_SERVING")
            }
            Err(err) => warn!(reason = %err, "Redis does not answer: NOT_SERVING"),
        }
        let status = if answer.is_ok() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter.set_service_status(SERVICE, status).await;
        last = Some(now);
    }
}

/// A watched group or list as the source its gauges are sampled from; the fields a reader
/// would need and sampling does not take their defaults.
fn watched_source(watch: &Watch) -> Source {
    match watch {
        Watch::Stream { key, group } => Source::Stream(StreamSource {
            key: key.clone(),
            group: group.clone(),
            consumer: String::new(),
            start_id: "0".into(),
            min_idle: grpc::convert::DEFAULT_MIN_IDLE,
        }),
        Watch::List { key } => Source::List(ListSource {
            key: key.clone(),
            consumer: String::new(),
            dead_after: grpc::convert::DEFAULT_DEAD_AFTER,
            reliable: true,
            framing: Default::default(),
        }),
    }
}

/// Loads the command table and what the server offers as soon as Redis answers, so that the
/// server's product, version and commands are logged at start rather than at the first open.
async fn learn_server(shared: Arc<Shared>) {
    while shared.key_specs().await.is_err() {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}
