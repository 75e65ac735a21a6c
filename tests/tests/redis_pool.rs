//! The sidecar's Redis connections as a library user sees them: a pool client that stops, for
//! whatever reason, is started again, and one stopped on purpose stays stopped.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::redis::{ConnectOptions, Redis};
use window_sidecar_harness::*;

#[tokio::test]
async fn a_pool_client_that_stops_is_started_again() {
    let server = RedisServer::start();
    let redis = Redis::connect(&ConnectOptions {
        url: server.url(),
        pool_size: 2,
        timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .unwrap();
    assert!(eventually(STEP, || async { redis.ping().await }).await);

    // Its routing task ends, as fred's does on an error it does not recover from (a failed
    // ASKING did that): before, every command sent to it waited out its timeout from then on.
    let stopped = redis.pool_clients().next().unwrap();
    let _ = stopped.quit().await;
    let back = eventually(STEP, || async {
        stopped.is_connected() && stopped.ping::<String>(None).await.is_ok()
    })
    .await;
    assert!(back, "the stopped pool client was not started again");
    for _ in 0..10 {
        assert!(redis.ping().await, "every pool client answers");
    }

    redis.quit().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        redis.pool_clients().all(|c| !c.is_connected()),
        "a pool closed on purpose stays closed"
    );
}
