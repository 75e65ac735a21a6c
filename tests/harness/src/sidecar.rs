//! The sidecar running in this process, on `127.0.0.1:0`: for tests that need no process to
//! kill, signal or measure.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use window_sidecar::config::Config;
use window_sidecar::proto::window_service_client::WindowServiceClient;

/// A sidecar running in this process.
pub struct Sidecar {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Sidecar {
    /// Starts a sidecar on a free port against `redis_url`, with extra flags.
    pub async fn start(redis_url: &str, flags: &[&str]) -> Self {
        let mut args = vec![
            "window-sidecar",
            "--redis-url",
            redis_url,
            "--listen",
            "127.0.0.1:0",
        ];
        // Short timers keep the tests quick; tests that need others pass their own.
        args.extend(["--promote-interval", "100ms", "--shutdown-grace", "2s"]);
        args.extend_from_slice(flags);
        let config = Config::try_parse_from(args).expect("valid flags");
        if std::env::var_os("RUST_LOG").is_some() {
            window_sidecar::telemetry::init_logs(config.log_format);
        }
        config.validate().expect("valid configuration");
        let listener = window_sidecar::server::Listener::bind(&config.listen)
            .await
            .expect("bind");
        let addr = listener.tcp_addr().expect("a TCP listener");
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            window_sidecar::server::run(config, listener, stop, false)
                .await
                .expect("sidecar runs");
        });
        Self {
            addr,
            shutdown,
            task,
        }
    }

    /// A gRPC client connected to this sidecar.
    pub async fn client(&self) -> WindowServiceClient<Channel> {
        WindowServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to the sidecar")
    }

    /// Begins the graceful shutdown (as SIGTERM does) without waiting for it.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Shuts down gracefully and waits until the sidecar has stopped.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the sidecar stops in time")
            .expect("the sidecar task did not panic");
    }
}
