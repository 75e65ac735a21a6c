//! How the soak's tasks end: the stop flag they watch, and a subscription task's panic
//! surfaced as soon as it happens rather than when the soak ends.

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Resolves once the stop flag is set (the watch guard is not held across an await).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Surfaces a subscription task's panic now rather than when the soak ends.
pub(crate) async fn fail_fast(tasks: &mut [JoinHandle<()>]) {
    for task in tasks.iter_mut() {
        if task.is_finished() {
            // It only returns when told to stop: it panicked.
            task.await.expect("a subscription task");
            panic!("a subscription task ended before it was told to stop");
        }
    }
}
