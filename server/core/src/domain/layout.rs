//! The payload-and-headers layout every entry shares, whether it is a stream entry's fields, a
//! list value's frame or a dead letter: the payload in one field, each header in a field of
//! its own. Its own module so that entries and frames both build on it without depending on
//! each other.

/// The field that holds the payload in the payload-and-headers layout.
pub const PAYLOAD_FIELD: &[u8] = b"_payload";
/// The prefix of header fields in that layout.
pub const HEADER_PREFIX: &[u8] = b"h:";
