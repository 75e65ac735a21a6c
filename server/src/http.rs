//! The operator's HTTP endpoint: Prometheus metrics (`/metrics`), probes (`/livez`,
//! `/readyz`) and the admin view of open subscriptions (`/subscriptions`, JSON), with who may
//! read that view (`--admin-view`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::AdminView;
use crate::session::Shared;

/// The content type of the Prometheus text format (OpenMetrics, as prometheus-client writes).
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the handlers share.
#[derive(Clone)]
struct Endpoint {
    shared: Arc<Shared>,
    admin_view: AdminView,
}

/// Serves until `shutdown` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    admin_view: AdminView,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/subscriptions", get(subscriptions))
        .with_state(Endpoint { shared, admin_view });
    // The peer's address decides who may read the admin view.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}

/// With exemplars (trace ids on the duration histograms) when the scraper asks for OpenMetrics.
async fn metrics(State(endpoint): State<Endpoint>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok());
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        endpoint.shared.metrics.encode_for(accept),
    )
        .into_response()
}

async fn ready(State(endpoint): State<Endpoint>) -> Response {
    let shared = &endpoint.shared;
    if shared.ready.load(Ordering::Relaxed) {
        return (StatusCode::OK, "ready\n").into_response();
    }
    let reason = shared
        .unready
        .lock()
        .clone()
        .unwrap_or_else(|| "Redis has not answered yet".to_owned());
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {reason}\n"),
    )
        .into_response()
}

async fn subscriptions(
    State(endpoint): State<Endpoint>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> Response {
    // `to_canonical`: a listener on `[::]` sees IPv4 peers as `::ffff:a.b.c.d`.
    let loopback = peer.ip().to_canonical().is_loopback();
    match endpoint.admin_view {
        AdminView::Open => {}
        AdminView::Loopback if loopback => {}
        AdminView::Loopback => {
            return (
                StatusCode::FORBIDDEN,
                format!(
                    "the admin view answers only loopback peers, not {}: read it from the pod (kubectl port-forward), or start the sidecar with --admin-view open (WINDOW_ADMIN_VIEW=open) to serve it to everyone who reaches this port\n",
                    peer.ip().to_canonical()
                ),
            )
                .into_response();
        }
        AdminView::Off => {
            return (
                StatusCode::NOT_FOUND,
                "the admin view is off (--admin-view off, WINDOW_ADMIN_VIEW=off)\n",
            )
                .into_response();
        }
    }
    Json(serde_json::json!({
        "subscriptions": endpoint.shared.subscriptions(),
        "partitioned": endpoint.shared.partitioned(),
    }))
    .into_response()
}
