//! The tonic service: Subscribe spawns a session per stream, Publish appends entries. Errors
//! become gRPC statuses here and nowhere else.

pub mod convert;

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use opentelemetry::global;
use opentelemetry::trace::{Span, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::proto;
use crate::proto::window_service_server::WindowService;
use crate::redis::{self, RedisError};
use crate::session::{self, InboundError, SessionError, Shared};
use crate::telemetry::{TRACER, format_traceparent, parse_traceparent};
use convert::OpenLimits;

/// Events buffered towards one client. Small: each read is one message, and the in-flight
/// limit already bounds how many reads can be waiting.
const OUTBOUND_CAPACITY: usize = 16;

/// The most entries one Publish call may carry.
pub const MAX_PUBLISH_ENTRIES: usize = 10_000;

/// The WindowService implementation.
#[derive(Debug, Clone)]
pub struct Service {
    shared: Arc<Shared>,
    limits: OpenLimits,
    /// Sessions still running, so shutdown can wait for their final flushes.
    sessions: TaskTracker,
}

impl Service {
    pub fn new(shared: Arc<Shared>, limits: OpenLimits, sessions: TaskTracker) -> Self {
        Self {
            shared,
            limits,
            sessions,
        }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<proto::SubscribeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl WindowService for Service {
    type SubscribeStream = ResponseStream;

    async fn subscribe(
        &self,
        request: Request<Streaming<proto::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let limits = self.limits;
        let inbound = request.into_inner().map(move |message| match message {
            Ok(message) => convert::client_message(message, limits),
            Err(status) => Err(InboundError::Transport(status.message().to_owned())),
        });
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        self.sessions
            .spawn(session::run(self.shared.clone(), inbound, tx));
        let outbound = ReceiverStream::new(rx)
            .map(|item| item.map(convert::event).map_err(|e| session_status(&e)));
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn publish(
        &self,
        request: Request<proto::PublishRequest>,
    ) -> Result<Response<proto::PublishResponse>, Status> {
        let caller = request
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(|tp| parse_traceparent(tp, None));
        let request = request.into_inner();
        let span = self.shared.settings.tracing.then(|| {
            let tracer = global::tracer(TRACER);
            let parent = caller
                .clone()
                .map(|c| Context::new().with_remote_span_context(c))
                .unwrap_or_default();
            tracer
                .span_builder("window.publish")
                .with_kind(SpanKind::Producer)
                .with_attributes([
                    KeyValue::new("window.subscription", request.stream.clone()),
                    KeyValue::new("window.entries", request.entries.len() as i64),
                ])
                .start_with_context(&tracer, &parent)
        });
        // Entries carry the publish span's context, or the caller's when spans are off.
        let trace = span
            .as_ref()
            .map(|s| s.span_context().clone())
            .or(caller)
            .and_then(|c| format_traceparent(&c));
        if request.stream.is_empty() {
            return Err(Status::invalid_argument("stream is required"));
        }
        if request.entries.is_empty() {
            return Err(Status::invalid_argument("entries must not be empty"));
        }
        if request.entries.len() > MAX_PUBLISH_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_PUBLISH_ENTRIES} entries per Publish call, got {}",
                request.entries.len()
            )));
        }
        let entries = request
            .entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                convert::publish_fields(entry, trace.as_deref())
                    .map_err(|e| Status::invalid_argument(format!("entries[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let max_len = (request.max_len > 0).then_some(request.max_len);
        let published = entries.len() as u64;
        let pool = self.shared.redis.pool();
        let result = redis::stream::publish(pool, &request.stream, entries, max_len).await;
        if let Some(mut span) = span {
            if let Err(err) = &result {
                span.set_status(opentelemetry::trace::Status::error(err.to_string()));
            }
            span.end();
        }
        let ids = result.map_err(|e| redis_status(&e))?;
        self.shared.metrics.published.inc_by(published);
        Ok(Response::new(proto::PublishResponse {
            ids: ids
                .into_iter()
                .map(|id| String::from_utf8_lossy(&id).into_owned())
                .collect(),
        }))
    }
}

/// The status a session ends its stream with.
pub fn session_status(err: &SessionError) -> Status {
    let message = err.to_string();
    match err {
        SessionError::InvalidRequest(_) | SessionError::NotOpened | SessionError::SecondOpen => {
            Status::invalid_argument(message)
        }
        SessionError::ConsumerBusy { .. } => Status::already_exists(message),
        SessionError::ShuttingDown => Status::unavailable(message),
        SessionError::Redis(redis) => {
            let mut status = redis_status(redis);
            status = Status::new(status.code(), message);
            status
        }
    }
}

/// The status of a Redis failure.
pub fn redis_status(err: &RedisError) -> Status {
    let message = err.to_string();
    match err {
        RedisError::Unavailable(_) | RedisError::Timeout(_) => Status::unavailable(message),
        // WRONGTYPE (the key is not a stream), NOPERM (ACL) and the like: the deployment must
        // change, retrying will not help.
        RedisError::Refused { .. } => Status::failed_precondition(message),
        RedisError::Url { .. } | RedisError::Tls { .. } | RedisError::Protocol { .. } => {
            Status::internal(message)
        }
    }
}
