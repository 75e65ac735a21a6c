//! Everything that talks to Redis, by seam:
//!
//! - connections: the deployment and its pools (`connection`), a subscription's connection
//!   for its reads, on its slot's node on a cluster (`read_connection`), one command sent raw
//!   (`call`), what a failure is (`error`), replicas a read waits for (`replication`), what
//!   the server is and offers ([`server`]);
//! - reading and settling, per form: [`stream`], [`list`], [`pubsub`], side by side in
//!   [`form`]; entries parsed from replies ([`entry`]);
//! - flushing, one direction: plan → execute → redirections ([`flush`]);
//! - keys and admission: command key metadata, hash slots, the policy applied to queued
//!   commands ([`keys`]);
//! - the sidecar's own jobs, each with its script: the durable delay set ([`delay`]),
//!   consumer leases ([`lease`]), retention by acknowledgement ([`retention`]), the backlog and
//!   work gauges' sampling ([`sample`]), dead letters ([`dead_letters`]) and Publish
//!   ([`publish`]).
//!
//! It decides nothing: what to keep, hand out or settle is the core's (`window`, `engine`),
//! and the types it reads into and writes from are the core's `domain`.
//!
//! Two roles of connection: every subscription has its own client for blocking reads (a
//! blocking XREADGROUP holds up every command queued behind it on its connection), and one
//! shared pool carries flushes, Publish and the delay promoter.

mod call;
mod connection;
pub(crate) mod dead_letters;
pub mod delay;
pub(crate) mod entry;
mod error;
pub(crate) mod flush;
pub(crate) mod form;
pub mod keys;
pub(crate) mod lease;
pub(crate) mod list;
pub(crate) mod members;
pub(crate) mod publish;
pub(crate) mod pubsub;
mod read_connection;
mod replication;
pub(crate) mod retention;
pub(crate) mod sample;
pub(crate) mod server;
pub(crate) mod stream;

// Raw calls stay inside redis/: everything else asks Redis through a named function here.
use call::{arg, call, call_at, str_arg};
pub use connection::{ConnectOptions, Redis, TlsFiles, single_server};
pub use error::RedisError;
pub use flush::refusal_reason;
pub use keys::{companion_key, hash_tag};
pub use replication::{Replication, ReplicationWatch};
