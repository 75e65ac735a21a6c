//! The real `window-sidecar` binary as a child process, for tests that need a process to kill,
//! signal or measure: its stderr (and, when asked, stdout) lines arrive on a channel and are
//! kept; its figures come from `/proc`.
//!
//! The binary is `WINDOW_SIDECAR_BIN` when set (CI builds it once and sets it). Otherwise the
//! first handle started builds it with `cargo build -p window-sidecar` (a no-op when it is up to
//! date), so a test never runs a stale binary.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// The `window-sidecar` binary: `WINDOW_SIDECAR_BIN`, else built once by cargo (a debug
/// build, in the target directory cargo uses here).
pub fn sidecar_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("WINDOW_SIDECAR_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => {
            build_sidecar(false, None).unwrap_or_else(|e| panic!("{e} (or set WINDOW_SIDECAR_BIN)"))
        }
    })
}

/// `cargo build [--release] -p window-sidecar --bin window-sidecar` in this workspace (a no-op
/// when it is fresh), into `target_dir` when given; the executable cargo reports.
pub fn build_sidecar(release: bool, target_dir: Option<&Path>) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let mut command = Command::new(&cargo);
    command
        .args(["build", "-p", "window-sidecar", "--bin", "window-sidecar"])
        .args(release.then_some("--release"))
        .args([
            "--message-format",
            "json-render-diagnostics",
            "--manifest-path",
        ])
        .arg(&manifest)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(dir) = target_dir {
        command.env("CARGO_TARGET_DIR", dir);
    }
    // Without the variables `cargo run` and `cargo test` set for the program running this:
    // cargo compares the variables build scripts watch (`rerun-if-env-changed`) with its own
    // environment, so they would rebuild half the tree here, and again on the next plain
    // `cargo build`.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
    let out = command
        .output()
        .map_err(|e| format!("run {}: {e}", cargo.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!("cargo build -p window-sidecar: {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "window-sidecar")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo build -p window-sidecar reported no executable".into())
}

/// How to start the binary: its path, flags and environment. `RUST_LOG` is `SIDECAR_LOG` (or
/// `info`) unless set here.
#[derive(Debug, Clone)]
pub struct Launch {
    bin: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    stdout: bool,
}

impl Launch {
    /// The binary of [`sidecar_bin`], no flags.
    pub fn new() -> Self {
        Self::with_bin(sidecar_bin())
    }

    /// Another binary (a baseline build, say).
    pub fn with_bin(bin: &Path) -> Self {
        Self {
            bin: bin.to_owned(),
            args: Vec::new(),
            envs: vec![(
                "RUST_LOG".into(),
                Some(std::env::var_os("SIDECAR_LOG").unwrap_or_else(|| "info".into())),
            )],
            stdout: false,
        }
    }

    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.envs.push((name.into(), Some(value.into())));
        self
    }

    pub fn env_remove(mut self, name: &str) -> Self {
        self.envs.push((name.into(), None));
        self
    }

    /// Collects stdout lines with the stderr ones (else stdout goes nowhere).
    pub fn capture_stdout(mut self) -> Self {
        self.stdout = true;
        self
    }

    /// The command this launch runs (for runs that only want its exit status or output).
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.bin);
        command.args(&self.args);
        for (name, value) in &self.envs {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        command
    }

    pub fn try_start(&self) -> Result<SidecarProcess, String> {
        let mut child = self
            .command()
            .stdin(Stdio::null())
            .stdout(if self.stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.bin.display()))?;
        let (tx, lines) = mpsc::channel();
        let history = Arc::new(Mutex::new(Vec::new()));
        let collect = |pipe: Box<dyn std::io::Read + Send>| {
            let (tx, history) = (tx.clone(), Arc::clone(&history));
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    history.lock().expect("history").push(line.clone());
                    let _ = tx.send(line);
                }
            });
        };
        collect(Box::new(child.stderr.take().expect("piped")));
        if let Some(stdout) = child.stdout.take() {
            collect(Box::new(stdout));
        }
        Ok(SidecarProcess {
            child,
            lines: Mutex::new(lines),
            history,
        })
    }

    pub fn start(&self) -> SidecarProcess {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Default for Launch {
    fn default() -> Self {
        Self::new()
    }
}

/// The binary running; SIGKILLed (by pid) when dropped.
pub struct SidecarProcess {
    pub child: Child,
    /// Behind a lock so that the handle can be shared between tasks.
    lines: Mutex<mpsc::Receiver<String>>,
    history: Arc<Mutex<Vec<String>>>,
}

impl SidecarProcess {
    /// The binary running with the given flags.
    pub fn start(args: &[&str]) -> Self {
        Launch::new().args(args).start()
    }

    /// The binary serving gRPC on `listen` against `redis_url`, with extra flags; returns once
    /// it logged that Redis answers.
    pub fn serve(redis_url: &str, listen: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--redis-url", redis_url, "--listen", listen];
        args.extend_from_slice(extra);
        let running = Self::start(&args);
        running.wait_for("Redis answers: SERVING");
        running
    }

    /// Waits for a log line containing `text`; returns it.
    pub fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let lines = self.lines.lock().expect("lines");
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("the sidecar never logged {text:?}");
    }

    /// The lines logged since the last `wait_for` or `logged_lines` (does not wait).
    pub fn logged_lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").try_iter().collect()
    }

    /// Every line logged so far.
    pub fn lines(&self) -> Vec<String> {
        self.history.lock().expect("history").clone()
    }

    /// The last `n` lines logged, for error messages.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.history.lock().expect("history");
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`TERM`, `INT`…) to the process, by pid.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGKILL: no drain, no flush.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether it exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits up to 10 s for the process to exit; kills it and fails the test otherwise.
    pub fn wait_exit(&mut self) -> ExitStatus {
        for _ in 0..200 {
            if let Some(status) = self.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("the sidecar did not exit within 10 s");
    }

    pub fn wait(mut self) -> ExitStatus {
        self.wait_exit()
    }

    /// SIGTERM, then [`Self::wait_exit`]; the lines stay readable.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit()
    }

    /// Resident set size in KiB.
    pub fn rss_kib(&self) -> u64 {
        status_kb(self.pid(), "VmRSS").expect("VmRSS in /proc/<pid>/status")
    }

    /// Threads of the process.
    pub fn thread_count(&self) -> u64 {
        status_kb(self.pid(), "Threads").expect("Threads in /proc/<pid>/status")
    }

    /// Open file descriptors (sockets, pipes, epoll…), from /proc/<pid>/fd.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the sidecar is running")
            .count()
    }

    /// What each open file descriptor points at (`socket:[inode]`, `pipe:[…]`…), for
    /// diagnosing a descriptor leak.
    pub fn fd_targets(&self) -> Vec<String> {
        let mut targets: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the sidecar is running")
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.display().to_string())
            .collect();
        targets.sort();
        targets
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

/// A numeric line of `/proc/<pid>/status`: `VmRSS`, `VmHWM` (in kB), `Threads`.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}
