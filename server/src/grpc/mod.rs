//! The tonic services: Subscribe spawns a session per stream, Publish writes entries, the
//! dead-letter service ([`DeadLetters`]) inspects, redrives and purges. Errors become gRPC
//! statuses here and nowhere else.

mod connections;
pub mod convert;
mod dead_letters;
pub mod deadline;
mod unix;

pub use connections::{ConnectionId, Connections, Numbered};
pub use dead_letters::DeadLetters;
pub use unix::connect_unix;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;

use futures::{Stream, StreamExt};
use opentelemetry::global;
use opentelemetry::trace::{Span, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::domain::Target;
use crate::partition;
use crate::policy::PolicyError;
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
    connections: Connections,
    /// Where unkeyed entries published to a partitioned stream begin their turn.
    publish_turn: Arc<AtomicU32>,
}

impl Service {
    pub fn new(shared: Arc<Shared>, limits: OpenLimits, sessions: TaskTracker) -> Self {
        Self {
            shared,
            limits,
            sessions,
            connections: Connections::default(),
            publish_turn: Arc::new(AtomicU32::new(0)),
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
        let policy = &self.shared.settings.policy;
        let held = match ConnectionId::of(&request) {
            Some(id) => Some(
                self.connections
                    .open(id, policy.limits.max_subscriptions_per_connection)
                    .map_err(|e| policy_status(&e, e.to_string()))?,
            ),
            None => None,
        };
        let max_message_size = policy.limits.max_message_size;
        let inbound = request.into_inner().map(move |message| match message {
            Ok(message) => convert::client_message(message, limits),
            Err(status) if is_too_large(&status) => Err(InboundError::TooLarge(format!(
                "a message is larger than this sidecar's --max-message-size of {max_message_size} bytes ({}); send fewer commands per batch or ask the operator to raise the limit",
                status.message()
            ))),
            Err(status) => Err(InboundError::Transport(status.message().to_owned())),
        });
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let shared = self.shared.clone();
        self.sessions.spawn(async move {
            session::run(shared, inbound, tx).await;
            drop(held);
        });
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
        let (target, framing) = convert::publish_target(&request)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let partitioned = convert::publish_partitions(&request)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let policy = &self.shared.settings.policy;
        let checked = match (&target, &partitioned) {
            (Target::Stream { key, .. }, Some((partitions, _))) => {
                let key = String::from_utf8_lossy(key);
                (0..*partitions)
                    .try_for_each(|p| policy.check_key(partition::stream_key(&key, p).as_bytes()))
            }
            (Target::Stream { key, .. } | Target::List(key), None) => policy.check_key(key),
            (Target::Channel(name) | Target::ShardedChannel(name), _) => policy.check_channel(name),
            (Target::List(_), Some(_)) => unreachable!("partitions are refused off a stream"),
        };
        if let Err(err) = checked {
            return Err(policy_status(&err, err.to_string()));
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
                    KeyValue::new("window.subscription", target.describe()),
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
        let entries = request
            .entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                convert::publish_fields(entry, &target, framing, trace.as_deref())
                    .map_err(|e| Status::invalid_argument(format!("entries[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let published = entries.len() as u64;
        let pool = self.shared.redis.pool();
        let result = match (&partitioned, &target) {
            (Some((partitions, by)), Target::Stream { key, max_len }) => {
                let key = String::from_utf8_lossy(key);
                let streams: Vec<_> = (0..*partitions)
                    .map(|p| (Bytes::from(partition::stream_key(&key, p)), *max_len))
                    .collect();
                let turn = self.publish_turn.fetch_add(1, Ordering::Relaxed);
                let keys = entries.iter().map(|f| by.in_fields(f).map(|k| &k[..]));
                let routes = partition::route(keys, *partitions, turn);
                redis::publish::publish_partitioned(pool, &streams, &routes, entries).await
            }
            _ => redis::publish::publish(pool, &target, entries, framing).await,
        };
        if let Some(mut span) = span {
            if let Err(err) = &result {
                span.set_status(opentelemetry::trace::Status::error(err.to_string()));
            }
            span.end();
        }
        let result = result.map_err(|e| redis_status(&self.shared.redis.explain(e)))?;
        self.shared.metrics.published.inc_by(published);
        Ok(Response::new(proto::PublishResponse {
            ids: result
                .ids
                .into_iter()
                .map(|id| String::from_utf8_lossy(&id).into_owned())
                .collect(),
            receivers: result.receivers,
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
        SessionError::Layout(_) => Status::invalid_argument(message),
        SessionError::GroupDeleted { .. } | SessionError::WrongType { .. } => {
            Status::failed_precondition(message)
        }
        SessionError::LeaseLost { .. } => Status::aborted(message),
        SessionError::ShuttingDown => Status::unavailable(message),
        SessionError::Denied(err) => policy_status(err, message),
        SessionError::TooLarge(_) => Status::resource_exhausted(message),
        SessionError::Redis(redis) => {
            let mut status = redis_status(redis);
            status = Status::new(status.code(), message);
            status
        }
    }
}

/// tonic's own refusal of a message over the decoding limit (it says OUT_OF_RANGE).
fn is_too_large(status: &Status) -> bool {
    status.code() == tonic::Code::OutOfRange && status.message().contains("too large")
}

/// gRPC clients expect RESOURCE_EXHAUSTED for a request over the size limit, as other servers
/// send; tonic answers a unary call with OUT_OF_RANGE before the handler runs. This rewrites
/// that answer (Subscribe streams get theirs from the session).
pub fn too_large_is_resource_exhausted<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    use tonic::codegen::http::HeaderValue;
    let headers = response.headers_mut();
    let decoding_limit = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| {
                m.contains("decoded%20message%20length%20too%20large")
                    || m.contains("decoded message length too large")
            });
    if decoding_limit {
        headers.insert("grpc-status", HeaderValue::from_static("8"));
        let message = headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .map(|m| format!("the request is larger than this sidecar's --max-message-size: {m}"));
        if let Some(value) =
            message.and_then(|m| HeaderValue::from_str(&m.replace(' ', "%20")).ok())
        {
            headers.insert("grpc-message", value);
        }
    }
    response
}

/// The status of a policy refusal: a limit is RESOURCE_EXHAUSTED, anything else a permission.
pub fn policy_status(err: &PolicyError, message: String) -> Status {
    if err.is_limit() {
        Status::resource_exhausted(message)
    } else {
        Status::permission_denied(message)
    }
}

/// The status of a Redis failure.
pub fn redis_status(err: &RedisError) -> Status {
    let message = err.to_string();
    match err {
        RedisError::Unavailable(_) | RedisError::Timeout(_) => Status::unavailable(message),
        // Not FAILED_PRECONDITION: nothing in the request is wrong and the client cannot fix
        // it. The sidecar is unusable until the operator fixes its credentials or the ACL, and
        // then serves again without a restart (its connections retry): a client that backs off
        // and retries, as on any UNAVAILABLE, resumes by itself.
        RedisError::Auth { .. } => Status::unavailable(message),
        // WRONGTYPE (the key is not a stream), NOPERM (ACL) and the like: the deployment must
        // change, retrying will not help.
        RedisError::Refused { .. } | RedisError::DelaySetWrongType { .. } => {
            Status::failed_precondition(message)
        }
        RedisError::Url { .. } | RedisError::Tls { .. } | RedisError::Protocol { .. } => {
            Status::internal(message)
        }
    }
}
