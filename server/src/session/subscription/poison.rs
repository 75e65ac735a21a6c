//! Why entries failed, remembered for their dead letter: a subscription's state holds it, its
//! flushes write and read it. A part of its own, beneath both, so that the subscription's state
//! does not reach into its flushes for a type while they extend the subscription.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// The last side-effect error of entries an atomic-mode segment left pending, so that one that
/// keeps failing goes to the dead letter with Redis's error as its reason once past
/// `max_deliveries`. Bounded: past [`PoisonReasons::CAPACITY`] the oldest is forgotten (its
/// dead letter then gets the generic reason, as after a restart).
#[derive(Debug, Default)]
pub(super) struct PoisonReasons {
    reasons: HashMap<Bytes, String>,
    order: VecDeque<Bytes>,
}

impl PoisonReasons {
    const CAPACITY: usize = 1024;

    pub(super) fn remember(&mut self, key: Bytes, reason: String) {
        if self.reasons.insert(key.clone(), reason).is_none() {
            self.order.push_back(key);
            if self.order.len() > Self::CAPACITY
                && let Some(oldest) = self.order.pop_front()
            {
                self.reasons.remove(&oldest);
            }
        }
    }

    pub(super) fn take(&mut self, key: &Bytes) -> Option<String> {
        let reason = self.reasons.remove(key)?;
        self.order.retain(|k| k != key);
        Some(reason)
    }
}
