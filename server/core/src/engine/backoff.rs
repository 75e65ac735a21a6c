//! How long to wait after failures in a row: before the next read, the next fetch of parked
//! entries, the next count of due retries. In a file of its own beneath both its users, the
//! handlers that retry reads and the lanes that retry fetches and counts.

use std::time::Duration;

/// The wait before the next read after `failures` failed ones in a row.
pub(super) fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100 << failures.min(5))
}
