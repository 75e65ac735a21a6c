//! An entry's ordering key as the engine's lanes hold it. Every delivery of an ordered
//! subscription looks its key up, clones it into the books of its flush and drops it again
//! several times; a key cut from the read's buffer would touch that buffer's shared reference
//! count each time. A key as long as a UUID or shorter is copied out instead (one copy, when
//! the entry is read); a longer one goes on sharing the buffer.

use std::fmt;
use std::hash::{Hash, Hasher};

use bytes::Bytes;

/// The longest key kept inline: a UUID in text (36 bytes) fits.
const INLINE: usize = 38;

/// An ordering key's value: compared and hashed as its bytes, however it is held.
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Bytes),
}

impl Key {
    /// The key `value`, copied when short.
    pub fn new(value: &Bytes) -> Key {
        Key::inline(value).unwrap_or_else(|| Key(Repr::Shared(value.clone())))
    }

    fn inline(value: &[u8]) -> Option<Key> {
        let mut bytes = [0; INLINE];
        bytes.get_mut(..value.len())?.copy_from_slice(value);
        Some(Key(Repr::Inline {
            len: value.len() as u8,
            bytes,
        }))
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(bytes) => bytes,
        }
    }
}

impl From<&[u8]> for Key {
    fn from(value: &[u8]) -> Key {
        Key::inline(value).unwrap_or_else(|| Key(Repr::Shared(Bytes::copy_from_slice(value))))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(b\"{}\")", self.as_bytes().escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn short_and_long_keys_compare_and_hash_by_their_bytes() {
        let short = Bytes::from_static(b"customer-42");
        let long = Bytes::from(vec![b'k'; INLINE + 1]);
        let edge = Bytes::from(vec![b'e'; INLINE]);
        for value in [&short, &long, &edge, &Bytes::new()] {
            let key = Key::new(value);
            assert_eq!(key.as_bytes(), value.as_ref());
            assert_eq!(key, Key::from(value.as_ref()));
        }
        assert!(matches!(Key::new(&edge).0, Repr::Inline { .. }));
        assert!(matches!(Key::new(&long).0, Repr::Shared(_)));
        assert_ne!(Key::new(&short), Key::new(&edge));
        let mut lanes = HashMap::new();
        lanes.insert(Key::new(&long), 1);
        lanes.insert(Key::new(&short), 2);
        assert_eq!(lanes.get(&Key::from(long.as_ref())), Some(&1));
        assert_eq!(lanes.get(&Key::from(&b"customer-42"[..])), Some(&2));
    }
}
