//! What scaling needs beside the subscriptions: the keeper ([`keeper`], `--keep`: promote and
//! sample keys whether or not anything subscribes to them, so that the work-waiting gauge an
//! autoscaler scales on is there while every worker is scaled to zero). The sampling itself is
//! the session's (`crate::session::sampler`: one registry and one job for the backlog and work
//! gauges, which the keeper hands its keys). The series are registered with the others, in
//! `crate::metrics` (its `scale` part; the metric names, `window_sidecar_…` with the former
//! `window_…` kept for one release, in its `names`).

pub mod keeper;
