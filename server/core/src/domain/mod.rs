//! The product's vocabulary, as plain data: what a subscription reads ([`Source`] and its
//! forms, [`Mode`], the block limits), what it holds ([`Entry`], its payload-and-headers layout,
//! [`ReadBatch`], an ordering key's value [`Key`]), how list values and messages carry headers
//! ([`frame`]), where a Publish writes ([`Target`]), a dead letter as an operator reads it
//! ([`letter`]), and the name patterns that choose keys, channels and dead letters
//! ([`Patterns`]). Every layer speaks these types; how they are read from and written to
//! Redis is the Redis adapter's business, how they travel on the wire the gRPC layer's.

pub mod entry;
pub mod frame;
pub mod key;
pub mod layout;
pub mod letter;
pub mod pattern;
pub mod source;
pub mod target;

pub use entry::{Body, Entry, ReadBatch};
pub use frame::Framing;
pub use key::Key;
pub use pattern::Patterns;
pub use source::{
    DEFAULT_DEAD_AFTER, ListSource, MAX_BLOCK, Mode, OrderingKey, PubSubSource, Source,
    StreamSource,
};
pub use target::Target;
