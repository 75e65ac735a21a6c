//! The subscription engine, as a pure state machine beside the window.
//!
//! It owns everything a subscription decides around its [`Window`](crate::window::Window): when to
//! read and how many (room, read-ahead, backoff after failures, re-reads after failed or unknown
//! flushes), which entries of a read may be handed out (never one outstanding or being flushed),
//! delivery caps and dead letters, consumer leases and recovery timing, draining and closing.
//! Events go in — a read came back, a client batch, a flush result, a lease renewal, a timer, the
//! client left, shutdown — and [`Action`]s come out for the I/O task to execute in order. It never
//! talks to Redis, the network or a clock (every handler takes `now`), so every rule is tested here
//! without I/O. Like the window it is generic over the entry: see [`Item`].
//!
//! Its files, bottom to top, each importing only files beneath it: [`types`], the vocabulary
//! (what it needs of an entry, its settings, its ids, what its handlers take and return),
//! [`report`], a flush's report as the client reads it (which the engine makes when it hands a
//! flush out, fills when the flush is reported and hands to the client), and [`action`], what
//! it asks of the I/O task; the parts, each a rule or a state of its own:
//! [`backoff`] (the wait after failures), [`counts`] (delivery caps, dead letters, which
//! redelivered entries are already held), [`liveness`] (the consumer lease, recovery timing),
//! [`ordering`] (one delivery per ordering key at a time, retries kept in place); [`state`],
//! the [`Engine`] holding them; and the handlers, each an `impl` block on it: [`events`] (what
//! the I/O task reports, and what follows after each event), [`flow`] (room, reads,
//! read-ahead, re-reads, flushes), [`deliver`] (what a read hands out), [`extend`] (deliveries
//! the client still works on), [`closing`] (draining and closing). This file only declares
//! them and names what the engine exports: no file of the engine imports it, so no part
//! reaches another through the engine's root.

mod action;
mod backoff;
mod closing;
mod counts;
mod deliver;
mod events;
mod extend;
mod flow;
mod liveness;
mod ordering;
mod report;
mod state;
mod types;

pub use action::Action;
pub use counts::exhausted;
pub use report::{FlushReport, FlushResult, PlanCounts, RequeueRefused, SideEffectFailure};
pub use state::Engine;
pub use types::{
    Applied, ClosedCounts, Config, FetchId, FlushId, FlushStatus, Item, Kind, Lane, LaneReadId,
    LeaseRenewal, Read, ReadError, ReadFrom, SettleRequest, Stop, View,
};

#[cfg(test)]
mod tests;
