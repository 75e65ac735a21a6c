//! The figures taken every `SAMPLE_EVERY` under load, the table they print as, and the sample
//! the end of the load is compared with.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar_harness::{SidecarProcess, metric_sum, ok_body};

use crate::observe::{admin_view_len, client_list, info_field};
use crate::plan::Target;

pub(crate) struct Sample {
    pub(crate) t: f64,
    pub(crate) rss_kib: u64,
    pub(crate) threads: u64,
    pub(crate) fds: usize,
    client_list: usize,
    pub(crate) sidecar_connections: usize,
    connected_clients: u64,
    admin_view: usize,
    open_gauge: f64,
    deliveries: f64,
    rate: f64,
    produced: u64,
}

pub(crate) async fn sample(
    started: Instant,
    previous: Option<&Sample>,
    sidecar: &SidecarProcess,
    inspect: &Client,
    metrics_addr: &str,
    targets: &[Arc<Target>],
) -> Sample {
    let t = started.elapsed().as_secs_f64();
    let metrics = ok_body(metrics_addr, "/metrics").await;
    let view = ok_body(metrics_addr, "/subscriptions").await;
    let (client_list, sidecar_connections) = client_list(inspect).await;
    let deliveries = metric_sum(&metrics, "window_sidecar_deliveries_total", "");
    let rate = match previous {
        Some(p) if t > p.t => (deliveries - p.deliveries) / (t - p.t),
        _ => 0.0,
    };
    Sample {
        t,
        rss_kib: sidecar.rss_kib(),
        threads: sidecar.thread_count(),
        fds: sidecar.open_fds(),
        client_list,
        sidecar_connections,
        connected_clients: info_field(inspect, fred::types::InfoKind::Clients, "connected_clients")
            .await,
        admin_view: admin_view_len(&view),
        open_gauge: metric_sum(&metrics, "window_sidecar_subscriptions_open", ""),
        deliveries,
        rate,
        produced: targets.iter().map(|t| t.tally.produced.load(Relaxed)).sum(),
    }
}

pub(crate) fn print_header() {
    println!(
        "{:>6} {:>9} {:>7} {:>5} {:>11} {:>12} {:>13} {:>10} {:>10} {:>9}",
        "t(s)",
        "rss(KiB)",
        "threads",
        "fds",
        "redis conns",
        "sidecar→redis",
        "subs view/gauge",
        "deliveries",
        "deliv/s",
        "produced"
    );
}

pub(crate) fn print_sample(s: &Sample) {
    println!(
        "{:>6.0} {:>9} {:>7} {:>5} {:>5}/{:<5} {:>12} {:>8}/{:<6} {:>10.0} {:>10.1} {:>9}",
        s.t,
        s.rss_kib,
        s.threads,
        s.fds,
        s.client_list,
        s.connected_clients,
        s.sidecar_connections,
        s.admin_view,
        s.open_gauge,
        s.deliveries,
        s.rate,
        s.produced
    );
}

/// The sample the end of the load is compared with: the end of the first minute (of the first
/// half, for a soak shorter than 2 minutes).
pub(crate) fn reference(samples: &[Sample], soak: Duration) -> &Sample {
    let reference_at = 60f64.min(soak.as_secs_f64() / 2.0);
    samples
        .iter()
        .find(|s| s.t + 0.5 >= reference_at)
        .expect("a sample after the first minute")
}
