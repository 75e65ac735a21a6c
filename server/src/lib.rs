//! window-sidecar: a gRPC sidecar that holds the window of a pipelined Redis subscription.
//!
//! Layers, from the inside out: the core crate (`window-sidecar-core`, re-exported here as
//! [`window`], [`engine`], [`policy`] and [`domain`]) makes every decision and does no I/O;
//! [`redis`] knows the forms (how to read, how to settle) and executes flushes; [`session`]
//! runs one subscription stream by executing its engine's actions; [`grpc`] is the tonic
//! service and the only place that converts between proto and domain types; [`config`],
//! [`telemetry`], `metrics`, `http`, [`scale`] and [`server`] wire the process together and
//! make it observable; [`cli`] is the operator's `dead-letters` command, a client of a running
//! sidecar.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod dev;
pub mod grpc;
pub(crate) mod http;
pub(crate) mod metrics;
pub mod proto;
pub mod redis;
pub mod scale;
pub mod server;
pub mod session;
pub mod telemetry;

pub use window_sidecar_core::{domain, engine, policy, window};
