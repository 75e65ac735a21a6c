//! The Python contenders: the virtualenv (created on first use), the generated code of
//! client-examples/python, and one `bench_worker.py` process per run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::Instant;

use crate::client::ClientOutcome;
use crate::procs::tail;

const IMPORTS: &str = "import redis, hiredis, grpc, grpc_tools, google.protobuf";

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The Python interpreter to use, ready: `explicit`, or `tests/bench/python/.venv` (created and
/// filled from `requirements.txt` when missing); and the generated gRPC code of
/// client-examples/python (its `generate.sh`, when missing or older than the proto).
pub(crate) fn prepare(root: &Path, explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let bench = root.join("tests/bench/python");
    let python = match explicit {
        Some(python) => python,
        None => {
            let venv = bench.join(".venv");
            let python = venv.join("bin/python");
            if !python.exists() {
                println!("bench: creating {}", venv.display());
                run(
                    Command::new("python3").args(["-m", "venv"]).arg(&venv),
                    "python3 -m venv",
                )?;
            }
            python
        }
    };
    if run(Command::new(&python).args(["-c", IMPORTS]), "imports").is_err() {
        println!(
            "bench: installing {} into {}",
            bench.join("requirements.txt").display(),
            python.display()
        );
        run(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .arg("-r")
                .arg(bench.join("requirements.txt")),
            "pip install",
        )?;
        run(Command::new(&python).args(["-c", IMPORTS]), "imports")?;
    }
    let examples = root.join("client-examples/python");
    let generated = examples.join("window_client/_generated/window_pb2_grpc.py");
    let proto = root.join("proto/window_sidecar/v1/window.proto");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (modified(&generated), modified(&proto)) {
        (Some(generated), Some(proto)) => generated < proto,
        _ => true,
    };
    if stale {
        println!("bench: generating the Python gRPC code (client-examples/python/generate.sh)");
        run(
            Command::new("bash")
                .arg(examples.join("generate.sh"))
                .env("PYTHON", &python),
            "generate.sh",
        )?;
    }
    Ok(python)
}

/// One `bench_worker.py` process, started and waiting for `go`.
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    log: PathBuf,
}

impl Worker {
    /// Starts `bench_worker.py MODE args…` and waits until it says `ready`.
    pub(crate) async fn start(
        python: &Path,
        root: &Path,
        mode: &str,
        args: &[String],
    ) -> Result<Self, String> {
        let log = std::env::temp_dir().join(format!(
            "window-sidecar-bench-py-{}-{mode}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(python)
            .arg(root.join("tests/bench/python/bench_worker.py"))
            .arg(mode)
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start {}: {e}", python.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut worker = Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            log,
        };
        match tokio::time::timeout(Duration::from_secs(60), worker.lines.next_line()).await {
            Ok(Ok(Some(line))) if line == "ready" => Ok(worker),
            other => Err(format!(
                "{mode} did not get ready ({other:?}): {}",
                tail(&worker.log, 15)
            )),
        }
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends `go`, notes when `done` arrives, then reads the `result` line.
    pub(crate) async fn run(mut self) -> Result<ClientOutcome, String> {
        let failed = |worker: &Self, what: String| format!("{what}: {}", tail(&worker.log, 15));
        self.stdin
            .write_all(b"go\n")
            .await
            .map_err(|e| failed(&self, format!("write go: {e}")))?;
        self.stdin.flush().await.map_err(|e| e.to_string())?;
        let mut done_at = None;
        let result = loop {
            match self.lines.next_line().await {
                Ok(Some(line)) if line == "done" => done_at = Some(Instant::now()),
                Ok(Some(line)) => {
                    if let Some(json) = line.strip_prefix("result ") {
                        break json.to_owned();
                    }
                }
                Ok(None) => return Err(failed(&self, "the worker ended without a result".into())),
                Err(e) => return Err(failed(&self, format!("read the worker: {e}"))),
            }
        };
        let value: serde_json::Value =
            serde_json::from_str(&result).map_err(|e| format!("bad result line: {e}"))?;
        let number = |key: &str| {
            value
                .get(key)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        };
        let lat_us = value
            .get("lat_us")
            .and_then(serde_json::Value::as_array)
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        let outcome = ClientOutcome {
            done_at: Some(done_at.ok_or("the worker never said done")?),
            acked: number("acked"),
            reads: number("reads"),
            round_trips: number("round_trips"),
            lat_us,
            cpu_s: value.get("cpu_s").and_then(serde_json::Value::as_f64),
            ..ClientOutcome::default()
        };
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                return Err(failed(&self, format!("the worker exited with {status}")));
            }
            _ => {
                let _ = self.child.start_kill();
                return Err("the worker did not exit after its result".into());
            }
        }
        let _ = std::fs::remove_file(&self.log);
        Ok(outcome)
    }
}
