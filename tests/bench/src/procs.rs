//! Processes the bench starts (the sidecar binary) and what it reads about processes from
//! `/proc`: CPU time (utime + stime) and memory (VmRSS, VmHWM).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`, 100 on Linux).
fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU seconds (user + system) a process has used so far, all its threads.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields start after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clk_tck())
}

/// A `Vm…` line of `/proc/<pid>/status`, in kB (`VmRSS`, `VmHWM`).
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The last lines of a log file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `GET path` on a local HTTP endpoint: the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("not an HTTP response")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status code")?;
    Ok((status, body.to_owned()))
}

/// The sum of every sample of a Prometheus metric whose labels contain `label` (for example
/// `kind="flush"`; empty: all samples).
pub fn metric_sum(exposition: &str, name: &str, label: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((metric, labels)) => (metric, labels),
                None => (series, ""),
            };
            (metric == name && labels.contains(label))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// A `window-sidecar` process on free loopback ports, killed (by pid) when dropped.
pub struct SidecarProcess {
    child: Child,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    log: PathBuf,
}

impl SidecarProcess {
    /// Starts the binary against `redis_url` and waits until `/readyz` answers 200.
    pub async fn start(bin: &Path, redis_url: &str) -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let grpc = SocketAddr::from(([127, 0, 0, 1], window_sidecar_harness::free_port()));
            let metrics = SocketAddr::from(([127, 0, 0, 1], window_sidecar_harness::free_port()));
            let log = std::env::temp_dir().join(format!(
                "window-sidecar-bench-{}-{}.log",
                std::process::id(),
                grpc.port()
            ));
            let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
            let child = Command::new(bin)
                .args(["--redis-url", redis_url])
                .args(["--listen", &grpc.to_string()])
                .args(["--metrics-listen", &metrics.to_string()])
                .args(["--consumer-name", "bench"])
                .env("RUST_LOG", "warn")
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(file)
                .spawn()
                .map_err(|e| format!("start {}: {e}", bin.display()))?;
            let mut sidecar = Self {
                child,
                grpc,
                metrics,
                log,
            };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(status)) = sidecar.child.try_wait() {
                    last = format!("the sidecar exited ({status}): {}", tail(&sidecar.log, 10));
                    break;
                }
                if let Ok((200, _)) = http_get(metrics, "/readyz").await {
                    return Ok(sidecar);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if last.is_empty() {
                last = format!(
                    "the sidecar was not ready in 15 s: {}",
                    tail(&sidecar.log, 10)
                );
            }
        }
        Err(last)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn scrape(&self) -> Result<String, String> {
        match http_get(self.metrics, "/metrics").await? {
            (200, body) => Ok(body),
            (status, _) => Err(format!("/metrics answered {status}")),
        }
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
