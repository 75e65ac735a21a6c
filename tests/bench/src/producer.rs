//! The latency phases' producer: XADDs at a fixed rate from a thread of its own, over a plain
//! socket, so that an entry leaves when it is due whatever the consumer in this process is
//! doing.
//!
//! On the bench's runtime the producer woke on tokio's millisecond timer and waited for the
//! in-process consumers' turns: every contender's latency carried up to a millisecond of the
//! producer's own lag, and its tail carried the consumer's busy moments. Here a thread sleeps
//! to each entry's due time (the kernel's high-resolution timer) and writes the command at
//! once; a second thread reads the replies, so a slow reply delays no send.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use window_sidecar_harness::resp::{self, Reply};

use crate::workload;

/// A producer running on its own threads; [`Producer::finish`] waits for its last reply.
pub(crate) struct Producer {
    sender: JoinHandle<Result<Vec<u64>, String>>,
    replies: JoinHandle<Result<(), String>>,
}

impl Producer {
    /// Starts sending `total` entries at `rate` per second to the Redis at `addr`, after
    /// `delay` (the consumer subscribes first: its set-up is not latency). Each entry is
    /// stamped with the time it was due, not the time it went: an entry held up counts the
    /// wait it had (no coordinated omission).
    pub(crate) fn start(
        addr: SocketAddr,
        rate: u64,
        total: u64,
        delay: Duration,
    ) -> Result<Self, String> {
        let socket = TcpStream::connect(addr).map_err(|e| format!("producer: connect: {e}"))?;
        socket
            .set_nodelay(true)
            .map_err(|e| format!("producer: TCP_NODELAY: {e}"))?;
        let reader = socket
            .try_clone()
            .map_err(|e| format!("producer: clone the socket: {e}"))?;
        let replies = std::thread::Builder::new()
            .name("bench-producer-replies".into())
            .spawn(move || read_replies(reader, total))
            .map_err(|e| format!("producer: start the reply thread: {e}"))?;
        let sender = std::thread::Builder::new()
            .name("bench-producer".into())
            .spawn(move || send(socket, rate, total, delay))
            .map_err(|e| format!("producer: start the thread: {e}"))?;
        Ok(Self { sender, replies })
    }

    /// Waits for every reply; returns how late each entry was sent after it was due
    /// (microseconds, sorted).
    pub(crate) async fn finish(self) -> Result<Vec<u64>, String> {
        tokio::task::spawn_blocking(move || {
            let late = self
                .sender
                .join()
                .map_err(|_| "the producer thread panicked".to_string())??;
            self.replies
                .join()
                .map_err(|_| "the producer's reply thread panicked".to_string())??;
            Ok(late)
        })
        .await
        .map_err(|e| format!("producer: {e}"))?
    }
}

fn send(mut socket: TcpStream, rate: u64, total: u64, delay: Duration) -> Result<Vec<u64>, String> {
    std::thread::sleep(delay);
    let period_us = 1_000_000 / rate.max(1);
    let start = Instant::now();
    let start_us = workload::now_us();
    let mut late = Vec::with_capacity(total as usize);
    let mut command = Vec::with_capacity(256);
    for id in 0..total {
        let due = Duration::from_micros(id * period_us);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let sent = start.elapsed();
        late.push(sent.saturating_sub(due).as_micros() as u64);
        command.clear();
        xadd(
            &mut command,
            &workload::payload(id, start_us + id * period_us),
        );
        socket
            .write_all(&command)
            .map_err(|e| format!("producer: write XADD {id}: {e}"))?;
    }
    late.sort_unstable();
    Ok(late)
}

/// `XADD <stream> * _payload <payload>` in RESP.
fn xadd(out: &mut Vec<u8>, payload: &[u8]) {
    let args: [&[u8]; 5] = [
        b"XADD",
        workload::STREAM.as_bytes(),
        b"*",
        b"_payload",
        payload,
    ];
    resp::encode(out, &args);
}

/// Reads `total` replies: an entry id each, or an error, which ends the run.
fn read_replies(socket: TcpStream, total: u64) -> Result<(), String> {
    let mut reader = BufReader::new(socket);
    for id in 0..total {
        match resp::read_reply(&mut reader) {
            Ok(Reply::Bulk(_)) => {}
            Ok(other) => return Err(format!("producer: XADD {id} answered {other:?}")),
            Err(e) => return Err(format!("producer: read the reply to XADD {id}: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::prelude::*;

    #[tokio::test]
    async fn every_entry_is_sent_once_and_said_how_late() {
        let redis = window_sidecar_harness::RedisServer::start();
        let producer = Producer::start(redis.addr(), 10_000, 200, Duration::ZERO).unwrap();
        let late = producer.finish().await.unwrap();
        assert_eq!(late.len(), 200);
        assert!(late.is_sorted());
        let client = workload::connect(&redis.url()).await.unwrap();
        assert_eq!(
            workload::xlen_on(&client, workload::STREAM).await.unwrap(),
            200
        );
    }

    #[tokio::test]
    async fn a_refused_xadd_ends_the_run_with_its_reply() {
        let redis = window_sidecar_harness::RedisServer::start();
        let client = workload::connect(&redis.url()).await.unwrap();
        let _: fred::types::Value = client
            .custom(fred::cmd!("SET"), vec![workload::STREAM, "not a stream"])
            .await
            .unwrap();
        let producer = Producer::start(redis.addr(), 10_000, 3, Duration::ZERO).unwrap();
        let err = producer.finish().await.unwrap_err();
        assert!(err.contains("XADD 0 answered Error(\"WRONGTYPE"), "{err}");
    }

    #[test]
    fn an_xadd_in_resp() {
        let mut out = Vec::new();
        xadd(&mut out, b"{}");
        let want = format!(
            "*5\r\n$4\r\nXADD\r\n${}\r\n{}\r\n$1\r\n*\r\n$8\r\n_payload\r\n$2\r\n{{}}\r\n",
            workload::STREAM.len(),
            workload::STREAM
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }
}
