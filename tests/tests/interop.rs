//! Sharing keys with ruststream-fred services: the retry counts each side writes on its copies
//! count against the other side's cap.

use std::collections::HashMap;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::Retry;
use window_sidecar::proto::{self, subscribe_response::Kind};
use window_sidecar_tests::*;

/// The fields of every entry of a stream, in order.
async fn entries(client: &Client, key: &str) -> Vec<HashMap<String, String>> {
    let rows: Vec<(String, HashMap<String, String>)> =
        client.xrange(key, "-", "+", None).await.unwrap();
    rows.into_iter().map(|(_, fields)| fields).collect()
}

/// An entry ruststream-fred retried twice (`x-ruststream-retry-count` 2) is on its third
/// delivery; at `max_deliveries` 3 the sidecar's retry sends it to the dead letter, which says
/// 3 in both counts. A copy the sidecar retries carries ruststream-fred's count, raised.
#[tokio::test]
async fn retry_counts_hold_across_ruststream_fred_and_the_sidecar() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let theirs: String = inspect
        .xadd(
            "orders",
            false,
            None,
            "*",
            vec![("_payload", "a"), ("h:x-ruststream-retry-count", "2")],
        )
        .await
        .unwrap();
    let fresh: String = inspect
        .xadd("orders", false, None, "*", vec![("_payload", "b")])
        .await
        .unwrap();
    let open = proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..stream_open("orders", "g", "c", 2)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = sub.read().await;
    let counts: Vec<(String, u32)> = read
        .deliveries
        .iter()
        .map(|d| (d.entry_id.clone(), d.delivery_count))
        .collect();
    assert_eq!(counts, [(theirs, 3), (fresh, 1)]);
    let retries = read.deliveries.iter().map(|d| outcome(d.slot, Retry));
    sub.send(vec![], retries.collect()).await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.dead_lettered, 1);

    let dead = entries(&inspect, "orders:dead").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["_payload"], "a");
    assert_eq!(dead[0]["h:x-ruststream-retry-count"], "3");
    assert_eq!(dead[0]["h:x-window-deliveries"], "3");
    let stream = entries(&inspect, "orders").await;
    let copy = stream.last().unwrap();
    assert_eq!(copy["_payload"], "b");
    assert_eq!(copy["h:x-ruststream-retry-count"], "1");
    assert_eq!(copy["h:x-window-attempts"], "1");
    // The copy comes back as its second delivery.
    let again = loop {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => break read,
            Some(_) => {}
            None => panic!("the stream ended"),
        }
    };
    assert_eq!(again.deliveries[0].delivery_count, 2);
    sidecar.stop().await;
}
