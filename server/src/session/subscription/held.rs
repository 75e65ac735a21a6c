//! A simple list's entries that only this sidecar still has. A simple list's entries leave
//! Redis when they are popped, so when Redis refuses to write one's retry, delay or dead letter
//! (or its give-back when its client left), nothing in Redis keeps it. The subscription holds
//! it here and pushes it back where it was read as soon as Redis takes that write, trying again
//! with a backoff; once back, it is read and delivered again like any given-back entry.

use std::time::{Duration, Instant};

/// Entries waiting to be given back, each with whether its client had it (`seen`: its give-back
/// counts the delivery), and when to try next.
#[derive(Debug)]
pub(super) struct Held<E> {
    entries: Vec<(E, bool)>,
    next: Option<Instant>,
    backoff: Duration,
}

impl<E> Default for Held<E> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            next: None,
            backoff: Self::FIRST,
        }
    }
}

impl<E> Held<E> {
    /// The wait after a first refusal; it doubles with each refusal in a row up to
    /// [`Held::LONGEST`], which bounds how long entries wait once Redis takes writes again.
    const FIRST: Duration = Duration::from_millis(100);
    const LONGEST: Duration = Duration::from_secs(2);

    /// Holds `entries`, to be given back at once unless a try is already waiting out a refusal.
    pub(super) fn hold(&mut self, entries: impl IntoIterator<Item = E>, seen: bool, now: Instant) {
        let before = self.entries.len();
        self.entries.extend(entries.into_iter().map(|e| (e, seen)));
        if self.entries.len() > before && self.next.is_none() {
            self.next = Some(now);
        }
    }

    /// When the next give-back is due; `None` while nothing is held.
    pub(super) fn due(&self) -> Option<Instant> {
        self.next
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Everything held, for a give-back: the seen ones, then the others.
    pub(super) fn take(&mut self) -> (Vec<E>, Vec<E>) {
        self.next = None;
        let (seen, unseen): (Vec<_>, Vec<_>) = self.entries.drain(..).partition(|(_, s)| *s);
        (
            seen.into_iter().map(|(e, _)| e).collect(),
            unseen.into_iter().map(|(e, _)| e).collect(),
        )
    }

    /// Redis took the give-back: the next refusal starts the backoff again.
    pub(super) fn given_back(&mut self) {
        self.backoff = Self::FIRST;
    }

    /// Redis refused the give-back of `entries`: held again, tried after the backoff.
    pub(super) fn refused(&mut self, entries: Vec<E>, seen: bool, now: Instant) {
        if entries.is_empty() {
            return;
        }
        self.entries.extend(entries.into_iter().map(|e| (e, seen)));
        self.next = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(Self::LONGEST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn held_entries_are_given_back_at_once_then_after_a_growing_wait() {
        let now = Instant::now();
        let mut held = Held::default();
        assert_eq!(held.due(), None);
        held.hold([1, 2], true, now);
        assert_eq!(held.due(), Some(now));
        let (seen, unseen) = held.take();
        assert_eq!((seen, unseen), (vec![1, 2], vec![]));
        assert_eq!(held.due(), None);
        held.refused(vec![1, 2], true, now);
        assert_eq!(held.due(), Some(now + Duration::from_millis(100)));
        held.take();
        held.refused(vec![1, 2], true, now);
        assert_eq!(held.due(), Some(now + Duration::from_millis(200)));
        // More entries refused meanwhile wait for the try already due.
        held.hold([3], false, now);
        assert_eq!(held.due(), Some(now + Duration::from_millis(200)));
        assert_eq!(held.take(), (vec![1, 2], vec![3]));
        held.given_back();
        held.refused(vec![3], false, now);
        assert_eq!(held.due(), Some(now + Duration::from_millis(100)));
    }

    proptest! {
        /// Whatever Redis answers, no held entry is lost or doubled, a try is due whenever
        /// something is held, and no wait exceeds the longest.
        #[test]
        fn nothing_held_is_lost_or_doubled(
            steps in proptest::collection::vec((0u8..3, 0usize..4, any::<bool>()), 0..64),
        ) {
            let now = Instant::now();
            let mut held = Held::default();
            let mut next_id = 0u32;
            let mut back = Vec::new();
            for (step, n, seen) in steps {
                match step {
                    0 => {
                        let entries: Vec<u32> = (next_id..next_id + n as u32).collect();
                        next_id += n as u32;
                        held.hold(entries, seen, now);
                    }
                    1 => {
                        let (seen, unseen) = held.take();
                        held.refused(seen, true, now);
                        held.refused(unseen, false, now);
                    }
                    _ => {
                        let (seen, unseen) = held.take();
                        back.extend(seen);
                        back.extend(unseen);
                        held.given_back();
                    }
                }
                prop_assert_eq!(held.due().is_some(), held.len() > 0);
                if let Some(due) = held.due() {
                    prop_assert!(due <= now + Held::<u32>::LONGEST);
                }
            }
            let (seen, unseen) = held.take();
            back.extend(seen);
            back.extend(unseen);
            back.sort_unstable();
            prop_assert_eq!(back, (0..next_id).collect::<Vec<_>>());
        }
    }
}
