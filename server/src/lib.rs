//! window-sidecar: a gRPC sidecar that holds the window of a pipelined Redis subscription.
//!
//! Layers, from the bottom up (docs/layers.md; `.ci/layers.py` checks that nothing reaches up
//! or round in a circle): the core crate (`window-sidecar-core`, re-exported here as
//! [`window`], [`engine`], [`policy`], [`partition`] and [`domain`]) makes every decision and does no I/O;
//! [`config`] and [`telemetry`] are what every part reads its settings from and logs with;
//! [`redis`] knows the forms (how to read, how to settle) and executes flushes; `metrics` holds
//! every series the sidecar exports; [`session`] runs one subscription stream by executing its
//! engine's actions; [`scale`] runs the work sampler and the keeper beside the subscriptions;
//! [`grpc`] is the tonic service and the only place that converts between [`proto`] and domain
//! types; [`server`], `http` and [`dev`] wire the process together and make it observable;
//! [`cli`] is the operator's `dead-letters` command, a client of a running sidecar.
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

pub use window_sidecar_core::{domain, engine, partition, policy, window};
