//! The reader: a subscription's blocking reads, in order, on its own connection.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::domain::ReadBatch;
use crate::redis::RedisError;
use crate::redis::form::Reader;

/// A read the engine asked for.
pub(in crate::session) struct ReadRequest {
    pub count: u32,
    pub block: Duration,
    pub reread: bool,
    pub recover: bool,
}

/// Serves read requests on the subscription's dedicated connection, in order, until the
/// subscription drops its sender; then closes the connection.
pub(in crate::session) async fn read_loop(
    mut reader: Reader,
    mut requests: mpsc::Receiver<ReadRequest>,
    results: mpsc::Sender<Result<ReadBatch, RedisError>>,
) {
    while let Some(r) = requests.recv().await {
        let batch = reader.read(r.count, r.block, r.reread, r.recover).await;
        if results.send(batch).await.is_err() {
            break;
        }
    }
    reader.close().await;
}
