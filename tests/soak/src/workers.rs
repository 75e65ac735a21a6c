//! The application: one task per subscription, answering every read in one batch with a
//! choice fixed by each delivery's token (acked side effects counted in Redis, dropped and
//! retried ones writing a key that must never change), closing and reopening the churning
//! ones, and tallying what it did.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::subscribe_response::Kind as Response;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::{Subscription, connect_within, duration};

use crate::plan::{BLOCK, CHURN_EVERY, DEADLINE, RETRY_AFTER, Sub, Target};
use crate::stop::stopped;
use crate::tally::{Global, Tally};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Choice {
    Ack,
    Drop,
    Retry,
    RetryAfter,
}

/// A delivery's first outcome, fixed by its token: 80 % ack, 8 % drop, 7 % retry, 5 %
/// retry_after. A token that was deferred once is acked when it comes again.
fn first_choice(token: &str) -> Choice {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in token.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    match h % 100 {
        0..80 => Choice::Ack,
        80..88 => Choice::Drop,
        88..95 => Choice::Retry,
        _ => Choice::RetryAfter,
    }
}

enum End {
    Stop,
    Churn,
    Unexpected,
}

/// Opens the subscription (on a connection of its own); retries while the sidecar still holds
/// the consumer name of the previous stream (`ALREADY_EXISTS`).
async fn open(addr: &str, sub: &Sub, global: &Global) -> Subscription {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut client = connect_within(addr, DEADLINE).await;
        let status = match Subscription::start(&mut client, Request::Open(sub.open.clone())).await {
            Ok(mut stream) => match stream.message_within(DEADLINE).await {
                Some(Ok(Some(proto::SubscribeResponse {
                    kind: Some(Response::Opened(_)),
                }))) => return stream,
                Some(Err(status)) => status,
                other => panic!("{}: expected `opened`, got {other:?}", sub.label),
            },
            Err(status) => status,
        };
        assert_eq!(
            status.code(),
            tonic::Code::AlreadyExists,
            "{}: open failed: {status}",
            sub.label
        );
        assert!(
            Instant::now() < deadline,
            "{}: the consumer name stayed busy: {status}",
            sub.label
        );
        global.already_exists.fetch_add(1, Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one subscription until told to stop: answers every read in one message, closes and
/// reopens now and then when it churns.
pub(crate) async fn subscription(
    addr: String,
    sub: Sub,
    global: Arc<Global>,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = true;
    let mut churn_at = sub.churn.map(|d| tokio::time::Instant::now() + d);
    loop {
        let mut stream = open(&addr, &sub, &global).await;
        if first {
            global.opened.fetch_add(1, Relaxed);
            first = false;
        } else {
            global.reopened.fetch_add(1, Relaxed);
        }
        let end = serve(&sub, &mut stream, &mut stop, churn_at).await;
        drop(stream);
        match end {
            End::Stop => return,
            End::Churn => {
                churn_at = Some(tokio::time::Instant::now() + CHURN_EVERY);
                // Let the closed subscription's read under way (at most BLOCK) end before the
                // same consumer name reads again: a reliable list's entry that read moves after
                // the reopen would wait on the processing list until this consumer reopens
                // again or dies (a new subscription reads its processing list once, at open).
                tokio::select! {
                    () = tokio::time::sleep(3 * BLOCK) => {}
                    () = stopped(&mut stop) => return,
                }
            }
            End::Unexpected => {
                global.unexpected.fetch_add(1, Relaxed);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stopped(&mut stop) => return,
                }
            }
        }
    }
}

async fn serve(
    sub: &Sub,
    stream: &mut Subscription,
    stop: &mut watch::Receiver<bool>,
    churn_at: Option<tokio::time::Instant>,
) -> End {
    let churn = async {
        match churn_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(churn);
    loop {
        tokio::select! {
            // Cancel-safe: the decoder's state lives in the stream.
            message = stream.message_within(DEADLINE) => match message {
                None => {} // quiet: look again
                Some(Ok(Some(message))) => {
                    let Some((batch, sent)) = handle(sub, message, true) else { continue };
                    if !stream.try_send_kind(Request::Batch(batch)).await {
                        eprintln!("{}: the sidecar stopped reading the request stream", sub.label);
                        return End::Unexpected;
                    }
                    sent.commit(&sub.target.tally);
                }
                Some(Ok(None)) => {
                    eprintln!("{}: the stream ended unasked", sub.label);
                    return End::Unexpected;
                }
                Some(Err(status)) => {
                    eprintln!("{}: the stream failed: {status}", sub.label);
                    return End::Unexpected;
                }
            },
            () = stopped(stop) => {
                return if close(sub, stream).await { End::Stop } else { End::Unexpected };
            }
            () = &mut churn => {
                return if close(sub, stream).await { End::Churn } else { End::Unexpected };
            }
        }
    }
}

/// Half-closes the request stream and reads what is left (flush reports of what was settled)
/// until the sidecar ends the stream. Returns whether it ended cleanly.
async fn close(sub: &Sub, stream: &mut Subscription) -> bool {
    stream.close();
    let deadline = Instant::now() + DEADLINE;
    loop {
        match stream
            .message_within(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            Some(Ok(Some(message))) => {
                handle(sub, message, false);
            }
            Some(Ok(None)) => return true,
            Some(Err(status)) => {
                eprintln!("{}: closing, the stream failed: {status}", sub.label);
                return false;
            }
            None => {
                eprintln!("{}: the stream did not end after the half-close", sub.label);
                return false;
            }
        }
    }
}

/// What a batch will record once it was sent.
#[derive(Default)]
struct Pending {
    acked: Vec<String>,
    dropped: Vec<String>,
    retries: u64,
    retry_afters: u64,
}

impl Pending {
    fn commit(self, tally: &Tally) {
        tally.acks.fetch_add(self.acked.len() as u64, Relaxed);
        tally.drops.fetch_add(self.dropped.len() as u64, Relaxed);
        tally.retries.fetch_add(self.retries, Relaxed);
        tally.retry_afters.fetch_add(self.retry_afters, Relaxed);
        let mut settled = tally.settled.lock().expect("not poisoned");
        let mut duplicates = 0;
        for token in self.acked {
            if settled.dropped.contains(&token) || !settled.acked.insert(token) {
                duplicates += 1;
            }
        }
        for token in self.dropped {
            if settled.acked.contains(&token) || !settled.dropped.insert(token) {
                duplicates += 1;
            }
        }
        tally.duplicates.fetch_add(duplicates, Relaxed);
    }
}

/// Accounts for one message; for a read (when `answer`), the batch answering all of it.
fn handle(
    sub: &Sub,
    message: proto::SubscribeResponse,
    answer: bool,
) -> Option<(proto::Batch, Pending)> {
    let tally = &sub.target.tally;
    match message.kind {
        Some(Response::Read(read)) => {
            tally.lost.fetch_add(read.lost, Relaxed);
            tally
                .delivered
                .fetch_add(read.deliveries.len() as u64, Relaxed);
            if !answer {
                tally
                    .abandoned
                    .fetch_add(read.deliveries.len() as u64, Relaxed);
                return None;
            }
            Some(answer_read(sub, &read))
        }
        Some(Response::Flush(report)) => {
            if !report.ok {
                tally.failed_flushes.fetch_add(1, Relaxed);
                eprintln!("{}: flush failed: {report:?}", sub.label);
            }
            None
        }
        Some(Response::Rejections(rejections)) => {
            tally
                .rejections
                .fetch_add(rejections.rejections.len() as u64, Relaxed);
            eprintln!("{}: rejected: {rejections:?}", sub.label);
            None
        }
        other => {
            eprintln!("{}: unexpected message {other:?}", sub.label);
            None
        }
    }
}

/// The batch answering every delivery of a read, each with its choice: a token deferred once
/// is acked when it comes again.
fn answer_read(sub: &Sub, read: &proto::Read) -> (proto::Batch, Pending) {
    let target = &sub.target;
    let mut batch = proto::Batch::default();
    let mut pending = Pending::default();
    let mut settled = target.tally.settled.lock().expect("not poisoned");
    for d in &read.deliveries {
        let token = String::from_utf8_lossy(&d.payload).into_owned();
        assert!(
            token.starts_with(&target.produce_to),
            "{}: a delivery that is not one of ours: {d:?}",
            sub.label
        );
        let choice = if settled.deferred.contains(&token) {
            Choice::Ack
        } else {
            let choice = first_choice(&token);
            if choice != Choice::Ack {
                settled.deferred.insert(token.clone());
            }
            choice
        };
        answer(target, d.slot, token, choice, &mut batch, &mut pending);
    }
    (batch, pending)
}

/// Adds one delivery's outcome and side effects to the batch: an ack's run once, counted; a
/// drop's or retry's segment increments the key that must never change.
fn answer(
    target: &Target,
    slot: u64,
    token: String,
    choice: Choice,
    batch: &mut proto::Batch,
    pending: &mut Pending,
) {
    let command = |name: &str, args: Vec<String>| proto::QueuedCommand {
        slot,
        name: name.into(),
        args: args.into_iter().map(Into::into).collect(),
    };
    let (kind, delay) = match choice {
        Choice::Ack => {
            batch
                .commands
                .push(command("SADD", vec![target.seen_key(), token.clone()]));
            batch
                .commands
                .push(command("INCR", vec![target.acked_key()]));
            pending.acked.push(token);
            (OutcomeKind::Ack, None)
        }
        other => {
            batch
                .commands
                .push(command("INCR", vec![target.never_key()]));
            match other {
                Choice::Drop => {
                    pending.dropped.push(token);
                    (OutcomeKind::Drop, None)
                }
                Choice::Retry => {
                    pending.retries += 1;
                    (OutcomeKind::Retry, None)
                }
                _ => {
                    pending.retry_afters += 1;
                    (OutcomeKind::RetryAfter, Some(duration(RETRY_AFTER)))
                }
            }
        }
    };
    batch.outcomes.push(proto::Outcome {
        slot,
        kind: kind as i32,
        delay,
        ..Default::default()
    });
}
