//! The core of window-sidecar: every decision the sidecar makes, as pure state machines, and
//! the vocabulary they speak.
//!
//! [`window`] decides what is kept and what is settled; [`engine`] decides around it when to
//! read, what to hand out, leases, recovery, dead letters, draining; [`policy`] decides what an
//! operator lets clients do; [`partition`] decides which partition a key goes to and which
//! replica reads each; [`domain`] is the plain data they all share. Nothing here does
//! I/O, and the crate boundary makes that a compile error rather than a rule: its only
//! dependencies are `bytes`, `thiserror` and `wildmatch`, so no Redis client, gRPC stack or
//! runtime is in reach. The server crate executes what these decide.
#![forbid(unsafe_code)]

pub mod domain;
pub mod engine;
mod item;
pub mod partition;
pub mod policy;
pub mod window;
