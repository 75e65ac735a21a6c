//! Pub/sub end to end, on channels, patterns and sharded channels: acked side effects kept, a
//! slow client losing the oldest messages and told how many, a retry republished (a retry_after
//! refused on a sharded channel), and a subscription that resubscribes after Redis restarts.

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, Drop, Retry};
use window_sidecar::proto::{self, RejectionReason};
use window_sidecar_harness::forms::{payload, pubsub};
use window_sidecar_harness::*;

#[tokio::test]
async fn pubsub_keeps_acked_side_effects_on_channels_patterns_and_sharded_channels() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["news".into()],
        patterns: vec!["alerts.*".into()],
        sharded_channels: vec!["orders-shard".into()],
        buffer: 0,
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 10, 10))
        .await
        .unwrap();
    // Subscribing happened before `opened`; give the server a moment to register it.
    let published = [
        ("PUBLISH", "news", "n1"),
        ("PUBLISH", "alerts.disk", "a1"),
        ("SPUBLISH", "orders-shard", "s1"),
        ("PUBLISH", "news", "n2"),
    ];
    for (cmd, channel, message) in published {
        let _: i64 = inspect
            .custom(
                fred::types::CustomCommand::new_static(
                    cmd,
                    fred::types::ClusterHash::FirstKey,
                    false,
                ),
                vec![channel, message],
            )
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 4 {
        let read = sub.read().await;
        let mut commands = Vec::new();
        let mut outcomes = Vec::new();
        for d in &read.deliveries {
            got.push((d.channel.clone(), payload(d)));
            commands.push(command(d.slot, "SADD", &["kept", &payload(d)]));
            // Drop n2; keep the rest.
            outcomes.push(outcome(d.slot, if payload(d) == "n2" { Drop } else { Ack }));
        }
        sub.send(commands, outcomes).await;
        let report = sub.flush().await;
        assert!(report.ok);
        assert_eq!(report.settles, 0, "pub/sub has nothing to settle");
    }
    let channels: HashSet<_> = got.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(channels, ["news", "alerts.disk", "orders-shard"].into());
    let kept: HashSet<String> = inspect.smembers("kept").await.unwrap();
    assert_eq!(kept, ["n1", "a1", "s1"].map(String::from).into());
    sidecar.stop().await;
}

#[tokio::test]
async fn a_slow_pubsub_client_loses_the_oldest_messages_and_is_told_how_many() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["ticks".into()],
        buffer: 5,
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 1, 1))
        .await
        .unwrap();
    let _: i64 = inspect.publish("ticks", "0").await.unwrap();
    let first = sub.read().await.deliveries.remove(0);
    // The client holds its one in-flight delivery while 20 more arrive: 5 fit the buffer.
    for n in 1..=20 {
        let _: i64 = inspect.publish("ticks", n.to_string()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sub.send(vec![], vec![outcome(first.slot, Ack)]).await;
    let read = sub.read().await;
    assert_eq!(read.lost, 15, "{read:?}");
    assert_eq!(
        payload(&read.deliveries[0]),
        "16",
        "the oldest were dropped"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn pubsub_retry_republishes_and_sharded_retry_after_is_refused() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["jobs".into()],
        sharded_channels: vec!["shard".into()],
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 1, 1))
        .await
        .unwrap();
    let _: i64 = inspect.publish("jobs", "j").await.unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![],
        vec![retry_after(d.slot, Duration::from_millis(200))],
    )
    .await;
    assert!(sub.flush().await.ok);
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(
        (again.channel.as_str(), payload(&again).as_str()),
        ("jobs", "j")
    );
    sub.send(vec![], vec![outcome(again.slot, Ack)]).await;
    assert!(sub.flush().await.ok);

    let _: i64 = inspect
        .custom(fred::cmd!("SPUBLISH"), vec!["shard", "s"])
        .await
        .unwrap();
    let s = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![],
        vec![retry_after(s.slot, Duration::from_millis(200))],
    )
    .await;
    let rejections = sub.rejections().await;
    assert_eq!(rejections[0].reason, RejectionReason::InvalidOutcome as i32);
    assert!(
        rejections[0].message.contains("sharded channels"),
        "{}",
        rejections[0].message
    );
    sub.send(vec![], vec![outcome(s.slot, Retry)]).await;
    assert!(sub.flush().await.ok);
    let s2 = sub.read().await.deliveries.remove(0);
    assert_eq!(
        payload(&s2),
        "s",
        "retry republished it on its sharded channel"
    );
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_resubscribes_after_redis_restarts() {
    let mut redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["news".into()],
        patterns: vec!["alerts.*".into()],
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 10, 10))
        .await
        .unwrap();
    redis.restart();
    let inspect = redis.client().await;
    // Publish until the resubscribed connection hears it (PUBLISH returns the receivers).
    let heard = eventually(Duration::from_secs(15), || async {
        let news: i64 = inspect.publish("news", "after-restart").await.unwrap_or(0);
        news > 0
    })
    .await;
    assert!(heard, "the channel was resubscribed");
    let pattern = eventually(Duration::from_secs(15), || async {
        inspect
            .publish::<i64, _, _>("alerts.cpu", "hot")
            .await
            .unwrap_or(0)
            > 0
    })
    .await;
    assert!(pattern, "the pattern was resubscribed");
    let mut payloads = HashSet::new();
    while !payloads.contains("hot") {
        let read = sub.read().await;
        for d in &read.deliveries {
            payloads.insert(payload(d));
        }
        sub.send(
            vec![],
            read.deliveries
                .iter()
                .map(|d| outcome(d.slot, Ack))
                .collect(),
        )
        .await;
    }
    assert!(payloads.contains("after-restart"));
    sidecar.stop().await;
}
