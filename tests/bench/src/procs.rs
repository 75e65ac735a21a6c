//! The sidecar binary the bench measures, started with the harness's binary handle on free
//! loopback ports and ready once `/readyz` answers 200; what it reads about processes from
//! `/proc` (CPU time, VmRSS, VmHWM) is the harness's too.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use window_sidecar_harness::{Launch, free_port, try_http_get};
pub(crate) use window_sidecar_harness::{cpu_seconds, metric_sum, status_kb, tail_file as tail};

/// A `window-sidecar` process on free loopback ports, killed (by pid) when dropped.
pub(crate) struct SidecarProcess {
    process: window_sidecar_harness::SidecarProcess,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
}

impl SidecarProcess {
    /// Starts the binary against `redis_url`, with `extra` arguments, and waits until
    /// `/readyz` answers 200.
    pub(crate) async fn start(bin: &Path, redis_url: &str, extra: &[&str]) -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let process = Launch::with_bin(bin)
                .args(["--redis-url", redis_url])
                .args(["--listen", &grpc.to_string()])
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
