//! What the dead-letter service's tests share: a client of the service and of the
//! `window-sidecar dead-letters` command, the targets and selections they name, and dead letters
//! made the way subscriptions make them: three on a stream ([`StreamDeadLetters`]), and on a
//! list, of both list forms and of the shapes other producers leave ([`ListDeadLetters`]).

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use tonic::transport::Channel;
use window_sidecar::domain::frame;
use window_sidecar::proto::dead_letter_service_client::DeadLetterServiceClient;
use window_sidecar::proto::dead_letter_target::Kind as TargetKind;
use window_sidecar::proto::{self, OutcomeKind};

use crate::{
    RedisServer, Sidecar, Worker, connect_client, duration, outcome, sidecar_bin, stream_open,
};

/// The reason every dead letter made here was given.
pub const REASON: &str = "card declined";

/// A client of the dead-letter service of the sidecar at `addr`, once the sidecar is up.
pub async fn admin(addr: &str) -> DeadLetterServiceClient<Channel> {
    // The same connection the window client waits for, so the sidecar is up.
    drop(connect_client(addr).await);
    DeadLetterServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// The stream `key`, as the service names what it works on.
pub fn stream(key: &str) -> Option<proto::DeadLetterTarget> {
    Some(proto::DeadLetterTarget {
        kind: Some(TargetKind::Stream(key.into())),
    })
}

/// The list `key`, as the service names what it works on.
pub fn list(key: &str) -> Option<proto::DeadLetterTarget> {
    Some(proto::DeadLetterTarget {
        kind: Some(TargetKind::List(key.into())),
    })
}

/// Every dead letter there is.
pub fn all() -> Option<proto::DeadLetterSelection> {
    Some(proto::DeadLetterSelection {
        all: true,
        ..Default::default()
    })
}

/// Opens `open` with a cap of one delivery and `dead` as its dead letter, publishes nothing,
/// and retries every delivery with REASON until `n` went to the dead letter.
pub async fn dead_letter_through(
    addr: &str,
    mut open: proto::Open,
    dead: proto::DeadLetter,
    n: usize,
) {
    open.max_deliveries = 1;
    open.dead_letter = Some(dead);
    let mut worker = Worker::open(addr, open).await;
    let mut handled = 0;
    while handled < n {
        let read = worker.next_read().await;
        let mut batch = proto::Batch::default();
        for d in &read.deliveries {
            batch.outcomes.push(proto::Outcome {
                reason: REASON.into(),
                ..outcome(d.slot, OutcomeKind::Retry)
            });
        }
        handled += read.deliveries.len();
        worker.send(batch).await;
        worker
            .report_for(read.read_id, Duration::from_secs(5))
            .await;
    }
    worker.close();
}

/// The stream `key` as the dead letter of a subscription.
pub fn stream_dead_letter(key: &str) -> proto::DeadLetter {
    proto::DeadLetter {
        target: Some(proto::dead_letter::Target::Stream(key.into())),
    }
}

/// The list `key` as the dead letter of a subscription.
pub fn list_dead_letter(key: &str) -> proto::DeadLetter {
    proto::DeadLetter {
        target: Some(proto::dead_letter::Target::List(key.into())),
    }
}

/// Runs `window-sidecar dead-letters ARGS` against the sidecar at `addr`: (exit code, stdout,
/// stderr).
pub fn cli(addr: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(sidecar_bin())
        .arg("dead-letters")
        .args(args)
        .env("WINDOW_SIDECAR_ADDR", addr)
        .env_remove("WINDOW_SIDECAR_TOKEN")
        .output()
        .expect("the sidecar binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Publishes `payloads` to `target`, which is a `PublishRequest` with its stream or list set.
pub async fn publish_payloads(addr: &str, target: proto::PublishRequest, payloads: &[&str]) {
    let mut client = connect_client(addr).await;
    let entries = payloads
        .iter()
        .map(|p| proto::PublishEntry {
            payload: Bytes::copy_from_slice(p.as_bytes()),
            ..Default::default()
        })
        .collect();
    client
        .publish(proto::PublishRequest { entries, ..target })
        .await
        .unwrap();
}

/// A sidecar whose subscription to `dl:orders` (group `billing`) retried "a", "b" and "c" past
/// their cap of one delivery: three dead letters on `dl:orders:dead`.
pub struct StreamDeadLetters {
    pub redis: RedisServer,
    pub client: Client,
    pub sidecar: Sidecar,
    pub addr: String,
}

impl StreamDeadLetters {
    pub async fn start() -> StreamDeadLetters {
        let redis = RedisServer::start();
        let client = redis.client().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let addr = sidecar.addr.to_string();
        let target = proto::PublishRequest {
            stream: "dl:orders".into(),
            ..Default::default()
        };
        publish_payloads(&addr, target, &["a", "b", "c"]).await;
        dead_letter_through(
            &addr,
            stream_open("dl:orders", "billing", "c1", 8),
            stream_dead_letter("dl:orders:dead"),
            3,
        )
        .await;
        StreamDeadLetters {
            redis,
            client,
            sidecar,
            addr,
        }
    }

    pub async fn listed(
        &self,
        admin: &mut DeadLetterServiceClient<Channel>,
    ) -> proto::ListDeadLettersResponse {
        admin
            .list_dead_letters(proto::ListDeadLettersRequest {
                target: stream("dl:orders:dead"),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
    }
}

/// `dl:jobs:dead` holding dead letters of both list forms, as frames (two of the reliable list
/// `dl:jobs`, one of the simple list `dl:mail`), then a value that is no frame (a producer's)
/// and a frame without the sidecar's origin header (the shape ruststream-fred's dead letters
/// have); and a sidecar with no list subscription to work on them.
pub struct ListDeadLetters {
    _redis: RedisServer,
    pub client: Client,
    pub sidecar: Sidecar,
    pub addr: String,
}

impl ListDeadLetters {
    pub async fn start() -> ListDeadLetters {
        let redis = RedisServer::start();
        let client = redis.client().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let addr = sidecar.addr.to_string();
        let reliable = proto::Open {
            source: Some(proto::open::Source::ReliableList(
                proto::ReliableListSource {
                    key: "dl:jobs".into(),
                    consumer: "w1".into(),
                    ..Default::default()
                },
            )),
            count: 4,
            block: Some(duration(Duration::from_millis(200))),
            ..Default::default()
        };
        let simple = proto::Open {
            source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
                key: "dl:mail".into(),
            })),
            ..reliable.clone()
        };
        let list_target = |k: &str| proto::PublishRequest {
            list: k.into(),
            ..Default::default()
        };
        publish_payloads(&addr, list_target("dl:jobs"), &["j1", "j2"]).await;
        dead_letter_through(&addr, reliable, list_dead_letter("dl:jobs:dead"), 2).await;
        publish_payloads(&addr, list_target("dl:mail"), &["m1"]).await;
        dead_letter_through(&addr, simple, list_dead_letter("dl:jobs:dead"), 1).await;
        // A closed list subscription still has its last blocking read under way, which would
        // take a redriven value as it arrives: the lists are worked on through a sidecar with
        // none.
        sidecar.stop().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let addr = sidecar.addr.to_string();
        let _: i64 = client.lpush("dl:jobs:dead", "plain bytes").await.unwrap();
        let foreign = frame::encode(&[
            (Bytes::from_static(b"_payload"), Bytes::from_static(b"r1")),
            (
                Bytes::from_static(b"h:x-ruststream-retry-count"),
                Bytes::from_static(b"3"),
            ),
        ]);
        let _: i64 = client
            .lpush("dl:jobs:dead", foreign.to_vec())
            .await
            .unwrap();
        ListDeadLetters {
            _redis: redis,
            client,
            sidecar,
            addr,
        }
    }
}

/// The ids of `listed`.
pub fn ids(letters: &[proto::DeadLetterEntry]) -> Vec<String> {
    letters.iter().map(|l| l.id.clone()).collect()
}

/// Appends `payload` to `key`; returns its id.
pub async fn append(client: &Client, key: &str, payload: &str) -> String {
    client
        .xadd(key, false, None, "*", vec![("_payload", payload)])
        .await
        .unwrap()
}
