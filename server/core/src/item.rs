//! The domain's entry as the engine's [`Item`]: how a subscription's entry is known across
//! reads, counted, parked and redelivered. Apart from both so that the vocabulary does not
//! depend on a state machine built on it (the domain is the bottom layer), and the engine stays
//! generic over what it hands out.

use std::sync::Arc;

use bytes::Bytes;

use crate::domain::entry::{ATTEMPTS_HEADER, Parked};
use crate::domain::{Entry, Key};
use crate::engine::Item;

/// A stream id's two parts (`<ms>-<seq>`).
fn stream_id(id: &[u8]) -> Option<(u64, u64)> {
    let id = std::str::from_utf8(id).ok()?;
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// A stream entry is known by its id across reads; list values and messages have none (the
/// engine asks only of streams, and parks only stream entries).
impl Item for Arc<Entry> {
    type Id = Bytes;
    type Parked = Parked;
    fn park(&self) -> Parked {
        let (ms, seq) = stream_id(&self.id).unwrap_or_default();
        debug_assert!(stream_id(&self.id).is_some(), "parked a non-stream entry");
        Parked {
            ms,
            seq,
            delivery_count: self.delivery_count,
            earlier_attempts: self.earlier_attempts(),
        }
    }
    fn stub(parked: &Parked) -> Self {
        // Giving back takes a delivery off the count of its pending entry, the count less
        // the earlier copies' attempts: the stub carries those as the header they come from.
        let fields = (parked.earlier_attempts > 0)
            .then(|| {
                (
                    Bytes::from(format!("h:{ATTEMPTS_HEADER}")),
                    Bytes::from(parked.earlier_attempts.to_string()),
                )
            })
            .into_iter()
            .collect();
        Arc::new(Entry {
            id: parked.id(),
            fields,
            delivery_count: parked.delivery_count,
            ..Default::default()
        })
    }
    fn id(&self) -> Bytes {
        self.id.clone()
    }
    fn delivery_count(&self) -> u32 {
        self.delivery_count
    }
    fn ordering_key(&self) -> Option<&Key> {
        self.ordering_key.as_ref()
    }
    fn redelivered(&self) -> Self {
        let mut next = Entry::clone(self);
        next.delivery_count += 1;
        Arc::new(next)
    }
}
