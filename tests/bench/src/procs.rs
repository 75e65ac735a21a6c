//! The sidecar binary the bench measures, started with the harness's binary handle on free
//! loopback ports and ready once `/readyz` answers 200; what it reads about processes from
//! `/proc` (CPU time, VmRSS, VmHWM) is the harness's too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar_harness::{Launch, free_port, try_http_get};
pub(crate) use window_sidecar_harness::{cpu_seconds, metric_sum, status_kb, tail_file as tail};

/// A `window-sidecar` process on free loopback ports, killed (by pid) when dropped.
pub(crate) struct SidecarProcess {
    process: window_sidecar_harness::SidecarProcess,
    pub grpc: SocketAddr,
    /// The Unix socket it serves gRPC on instead of `grpc`, when started with one.
    pub unix: Option<PathBuf>,
    pub metrics: SocketAddr,
}

impl SidecarProcess {
    /// Starts the binary against `redis_url`, with `extra` arguments, and waits until
    /// `/readyz` answers 200.
    pub(crate) async fn start(bin: &Path, redis_url: &str, extra: &[&str]) -> Result<Self, String> {
        Self::start_on(bin, redis_url, false, extra).await
    }

    /// The same, serving gRPC on a Unix socket (`--listen unix:PATH`), as a pod's containers
    /// share one on a volume.
    pub(crate) async fn start_unix(
        bin: &Path,
        redis_url: &str,
        extra: &[&str],
    ) -> Result<Self, String> {
        Self::start_on(bin, redis_url, true, extra).await
    }

    async fn start_on(
        bin: &Path,
        redis_url: &str,
        unix: bool,
        extra: &[&str],
    ) -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let unix = unix.then(|| {
                std::env::temp_dir().join(format!("window-sidecar-bench-{}.sock", grpc.port()))
            });
            let listen = match &unix {
                Some(path) => format!("unix:{}", path.display()),
                None => grpc.to_string(),
            };
            let process = Launch::with_bin(bin)
                .args(["--redis-url", redis_url])
                .args(["--listen", &listen])
                .args(["--metrics-listen", &metrics.to_string()])
                .args(["--consumer-name", "bench"])
                .args(extra.iter().copied())
                .env("RUST_LOG", "warn")
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .try_start()?;
            let mut sidecar = Self {
                process,
                grpc,
                unix,
                metrics,
            };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Some(status) = sidecar.process.try_wait() {
                    last = format!(
                        "the sidecar exited ({status}): {}",
                        sidecar.process.tail(10)
                    );
                    break;
                }
                if let Ok((200, _)) = try_http_get(metrics, "/readyz").await {
                    return Ok(sidecar);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if last.is_empty() {
                last = format!(
                    "the sidecar was not ready in 15 s: {}",
                    sidecar.process.tail(10)
                );
            }
        }
        Err(last)
    }

    /// A client of its gRPC service, on whichever it listens on.
    pub(crate) async fn client(&self) -> Result<WindowServiceClient<Channel>, String> {
        match &self.unix {
            Some(path) => crate::client::connect_sidecar_unix(path.clone()).await,
            None => crate::client::connect_sidecar(self.grpc).await,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub(crate) async fn scrape(&self) -> Result<String, String> {
        match try_http_get(self.metrics, "/metrics").await? {
            (200, body) => Ok(body),
            (status, _) => Err(format!("/metrics answered {status}")),
        }
    }
}

impl Drop for SidecarProcess {
    /// A sidecar killed leaves its socket file behind.
    fn drop(&mut self) {
        if let Some(path) = &self.unix {
            let _ = std::fs::remove_file(path);
        }
    }
}
