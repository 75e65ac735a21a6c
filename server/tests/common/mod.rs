//! The real `window-sidecar` binary as a child process, shared by the tests that need a process
//! to kill, signal or measure.
#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_window-sidecar");

/// The binary running with the given flags; its stderr lines arrive on a channel.
pub struct Running {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("SIDECAR_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, lines }
    }

    /// Waits for a log line containing `text`; returns it.
    pub fn wait_for(&self, text: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("the sidecar never logged {text:?}");
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGKILL: no drain, no flush.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("the sidecar did not exit within 10 s");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the sidecar is running");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }
}

// ---------------------------------------------------------------------------------------------
// Added for the soak test (`soak.rs`): more of the process's own figures, and the log lines
// received so far. Additions only; nothing above is changed.
// ---------------------------------------------------------------------------------------------

impl Running {
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

    /// Threads of the process, from /proc/<pid>/status.
    pub fn thread_count(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the sidecar is running");
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("Threads in /proc/<pid>/status")
    }

    /// The stderr lines logged since the last `wait_for` or `logged_lines` (does not wait).
    pub fn logged_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Running {
    /// The binary serving gRPC on `listen` against `redis_url`, with extra flags; returns once
    /// it logged that Redis answers.
    pub fn serve(redis_url: &str, listen: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--redis-url", redis_url, "--listen", listen];
        args.extend_from_slice(extra);
        let running = Self::start(&args);
        running.wait_for("Redis answers: SERVING");
        running
    }
}

pub use worker::*;

/// A gRPC worker against the real binary: opens a subscription and answers deliveries with
/// side effects that can be counted in Redis afterwards.
mod worker {
    use std::collections::{HashMap, VecDeque};
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;
    use window_sidecar::proto::subscribe_request::Kind as Request;
    use window_sidecar::proto::subscribe_response::Kind as Response;
    use window_sidecar::proto::window_service_client::WindowServiceClient;
    use window_sidecar::proto::{self, OutcomeKind};

    /// How long a worker waits for one expected message before failing.
    pub const STEP: Duration = Duration::from_secs(15);

    /// A delivery's value: its payload (list values, and stream entries written with
    /// `_payload`), else its entry id.
    pub fn value(d: &proto::Delivery) -> String {
        if d.payload.is_empty() {
            d.entry_id.clone()
        } else {
            String::from_utf8_lossy(&d.payload).into_owned()
        }
    }

    /// The side effects a worker queues for one delivery: `SADD seen <value>`, `INCR count`
    /// and `HINCRBY applied <value> 1` (so an entry applied twice can be named).
    pub fn side_effects(d: &proto::Delivery) -> Vec<proto::QueuedCommand> {
        let v = value(d);
        let command = |name: &str, args: Vec<String>| proto::QueuedCommand {
            slot: d.slot,
            name: name.into(),
            args: args.into_iter().map(Into::into).collect(),
        };
        vec![
            command("SADD", vec!["seen".into(), v.clone()]),
            command("INCR", vec!["count".into()]),
            command("HINCRBY", vec!["applied".into(), v, "1".into()]),
        ]
    }

    /// A stream subscription on `key`, group `g`.
    pub fn stream_open(
        key: &str,
        consumer: &str,
        count: u32,
        max_in_flight: u32,
        min_idle: Option<Duration>,
    ) -> proto::Open {
        proto::Open {
            source: Some(proto::open::Source::Stream(proto::StreamSource {
                key: key.into(),
                group: "g".into(),
                consumer: consumer.into(),
                min_idle: min_idle.map(duration),
                ..Default::default()
            })),
            count,
            max_in_flight,
            block: Some(duration(Duration::from_millis(200))),
            ..Default::default()
        }
    }

    pub fn duration(d: Duration) -> prost_types::Duration {
        prost_types::Duration {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        }
    }

    /// What the next message was.
    #[derive(Debug)]
    pub enum Next {
        Read(proto::Read),
        Draining(proto::Draining),
        /// The stream ended: cleanly (`None`) or with a status.
        Ended(Option<tonic::Status>),
        /// Nothing came in time.
        Idle,
    }

    /// One subscription of a worker.
    pub struct Worker {
        pub tx: mpsc::Sender<proto::SubscribeRequest>,
        pub stream: tonic::Streaming<proto::SubscribeResponse>,
        pub opened: Option<proto::Opened>,
        /// Every flush report received, in order.
        pub reports: Vec<proto::FlushReport>,
        /// Every rejection received.
        pub rejections: Vec<proto::Rejection>,
        /// How often each value was delivered to this worker, and the highest delivery count
        /// the sidecar gave it.
        pub delivered: HashMap<String, (u32, u32)>,
        /// Values this worker acked, in order.
        pub acked: Vec<String>,
        /// The values of each read received, by read id.
        pub reads: HashMap<u64, Vec<String>>,
        /// Reads received while waiting for something else, handed out by `next_read` first.
        queued: VecDeque<proto::Read>,
    }

    impl Worker {
        /// Opens `open` on the sidecar at `addr` (retrying the connection until it is up).
        pub async fn open(addr: &str, open: proto::Open) -> Self {
            let mut client = loop {
                match WindowServiceClient::connect(format!("http://{addr}")).await {
                    Ok(client) => break client,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            let (tx, rx) = mpsc::channel(16);
            tx.send(proto::SubscribeRequest {
                kind: Some(Request::Open(open)),
            })
            .await
            .unwrap();
            let stream = client
                .subscribe(ReceiverStream::new(rx))
                .await
                .expect("the subscription opens")
                .into_inner();
            Self {
                tx,
                stream,
                opened: None,
                reports: Vec::new(),
                rejections: Vec::new(),
                delivered: HashMap::new(),
                acked: Vec::new(),
                reads: HashMap::new(),
                queued: VecDeque::new(),
            }
        }

        /// The next read, draining notice or end of stream within `wait`; flush reports,
        /// rejections and `opened` are recorded on the way. Cancel-safe.
        pub async fn next(&mut self, wait: Duration) -> Next {
            if let Some(read) = self.queued.pop_front() {
                return Next::Read(read);
            }
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let message = match tokio::time::timeout_at(deadline, self.stream.message()).await {
                    Err(_) => return Next::Idle,
                    Ok(Err(status)) => return Next::Ended(Some(status)),
                    Ok(Ok(None)) => return Next::Ended(None),
                    Ok(Ok(Some(message))) => message,
                };
                match message.kind {
                    Some(Response::Read(read)) => {
                        self.reads
                            .insert(read.read_id, read.deliveries.iter().map(value).collect());
                        for d in &read.deliveries {
                            let seen = self.delivered.entry(value(d)).or_default();
                            seen.0 += 1;
                            seen.1 = seen.1.max(d.delivery_count);
                        }
                        return Next::Read(read);
                    }
                    Some(Response::Draining(draining)) => return Next::Draining(draining),
                    Some(Response::Flush(report)) => self.reports.push(report),
                    Some(Response::Rejections(r)) => self.rejections.extend(r.rejections),
                    Some(Response::Opened(opened)) => self.opened = Some(opened),
                    None => {}
                }
            }
        }

        /// The next read; fails the test when none comes within [`STEP`] or the stream ends.
        pub async fn next_read(&mut self) -> proto::Read {
            match self.next(STEP).await {
                Next::Read(read) => read,
                other => panic!("expected a read, got {other:?}"),
            }
        }

        /// Waits up to `wait` for the flush report of `read_id`, keeping reads that arrive
        /// meanwhile for `next_read`.
        pub async fn report_for(
            &mut self,
            read_id: u64,
            wait: Duration,
        ) -> Option<proto::FlushReport> {
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                if let Some(report) = self.reports.iter().find(|r| r.read_id == read_id) {
                    return Some(report.clone());
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                // Reads queued earlier stay queued: only the stream is looked at here.
                let queued = std::mem::take(&mut self.queued);
                let next = self.next(left).await;
                self.queued = queued;
                match next {
                    Next::Read(read) => self.queued.push_back(read),
                    Next::Idle => {}
                    other => panic!("waiting for the flush of read {read_id}: {other:?}"),
                }
            }
        }

        /// Sends the side effects and an ack for each delivery, in one batch.
        pub async fn ack(&mut self, deliveries: &[proto::Delivery]) {
            let mut batch = proto::Batch::default();
            for d in deliveries {
                batch.commands.extend(side_effects(d));
                batch.outcomes.push(proto::Outcome {
                    slot: d.slot,
                    kind: OutcomeKind::Ack as i32,
                    ..Default::default()
                });
                self.acked.push(value(d));
            }
            self.send(batch).await;
        }

        pub async fn send(&mut self, batch: proto::Batch) {
            // The sidecar may have gone away (a fault test): nothing to send to then.
            let _ = self
                .tx
                .send(proto::SubscribeRequest {
                    kind: Some(Request::Batch(batch)),
                })
                .await;
        }

        /// Half-closes the request stream: the sidecar flushes what was settled and ends the
        /// stream.
        pub fn close(&mut self) {
            let (tx, _) = mpsc::channel(1);
            drop(std::mem::replace(&mut self.tx, tx));
        }

        /// Waits up to `wait` for a read and acks it whole; returns whether one came.
        pub async fn work_once(&mut self, wait: Duration) -> bool {
            match self.next(wait).await {
                Next::Read(read) => {
                    self.ack(&read.deliveries).await;
                    true
                }
                Next::Idle => false,
                other => panic!("the subscription ended: {other:?}"),
            }
        }

        /// Handles `reads` reads; settles only the first half of the deliveries of read
        /// number `partial` (1-based) and returns right after sending them. Returns the values
        /// acked.
        pub async fn work(&mut self, reads: usize, partial: Option<usize>) -> Vec<String> {
            let mut seen = Vec::new();
            for n in 1..=reads {
                let read = self.next_read().await;
                let take = if Some(n) == partial {
                    read.deliveries.len() / 2
                } else {
                    read.deliveries.len()
                };
                self.ack(&read.deliveries[..take]).await;
                seen.extend(read.deliveries[..take].iter().map(value));
            }
            seen
        }

        /// Deliveries handed to this worker beyond the first of each value.
        pub fn duplicate_deliveries(&self) -> u32 {
            self.delivered.values().map(|(n, _)| n - 1).sum()
        }
    }
}
