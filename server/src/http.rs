//! The operator's HTTP endpoint: Prometheus metrics (`/metrics`), probes (`/livez`,
//! `/readyz`) and the admin view of open subscriptions (`/subscriptions`, JSON).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::session::Shared;

/// The content type of the Prometheus text format (OpenMetrics, as prometheus-client writes).
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/subscriptions", get(subscriptions))
        .with_state(shared);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        shared.metrics.encode(),
    )
        .into_response()
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    if shared.ready.load(Ordering::Relaxed) {
        return (StatusCode::OK, "ready\n").into_response();
    }
    let reason = shared
        .unready
        .lock()
        .expect("not poisoned")
        .clone()
        .unwrap_or_else(|| "Redis has not answered yet".to_owned());
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {reason}\n"),
    )
        .into_response()
}

async fn subscriptions(State(shared): State<Arc<Shared>>) -> Response {
    Json(serde_json::json!({ "subscriptions": shared.subscriptions() })).into_response()
}
