//! A call's deadline answered as `DEADLINE_EXCEEDED`. tonic ends a call whose `grpc-timeout`
//! passes with `CANCELLED` ("Timeout expired"), which gRPC keeps for a call its client
//! cancelled: a client whose own deadline passes at the same moment then reports either, by
//! which answer came first. This layer answers first, a little before tonic would, with the
//! status every gRPC library maps to its timeout error. Like tonic's, it times the answer's
//! start: a stream's messages run past it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;
use tonic::codegen::http::{HeaderMap, Request, Response};

/// How much sooner than the deadline the sidecar answers: enough for its timer to fire before
/// tonic's, which started a moment earlier.
fn early(timeout: Duration) -> Duration {
    let margin = (timeout / 50).clamp(Duration::from_millis(1), Duration::from_millis(20));
    timeout.saturating_sub(margin)
}

/// The `grpc-timeout` of a call: up to eight digits and a unit (`H`, `M`, `S`, `m`, `u`,
/// `n`), as the gRPC HTTP/2 protocol writes it; `None` when absent or malformed (tonic then
/// sets no deadline either).
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The service wrapped by [`Deadlines::layer`].
#[derive(Clone, Debug)]
pub struct Deadlines<S>(S);

impl<S> Deadlines<S> {
    pub fn layer() -> impl tower::Layer<S, Service = Self> + Clone {
        tower::layer::layer_fn(Self)
    }
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for Deadlines<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Answer<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let timeout = grpc_timeout(request.headers());
        let answer = self.0.call(request);
        let Some(timeout) = timeout else {
            return Box::pin(answer);
        };
        Box::pin(async move {
            match tokio::time::timeout(early(timeout), answer).await {
                Ok(answer) => answer,
                Err(_) => Ok(Status::deadline_exceeded(format!(
                    "the call's deadline ({timeout:?}, its grpc-timeout) passed before the \
                     sidecar could answer; the sidecar waits up to its --redis-timeout for \
                     Redis, so a deadline shorter than that can pass first"
                ))
                .into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::http::HeaderValue;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_str(value).unwrap());
        grpc_timeout(&headers)
    }

    #[test]
    fn a_grpc_timeout_is_read_in_each_unit_and_nothing_else() {
        assert_eq!(timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout("999m"), Some(Duration::from_millis(999)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout("1500u"), Some(Duration::from_micros(1500)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for malformed in ["", "S", "123456789S", "1s", "-1S", "1.5S", "10"] {
            assert_eq!(timeout(malformed), None, "{malformed:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    #[test]
    fn the_sidecar_answers_a_little_before_the_deadline() {
        assert_eq!(
            early(Duration::from_secs(1)),
            Duration::from_millis(980),
            "20 ms sooner at most"
        );
        assert_eq!(early(Duration::from_millis(100)), Duration::from_millis(98));
        assert_eq!(early(Duration::from_millis(10)), Duration::from_millis(9));
        assert_eq!(early(Duration::from_micros(500)), Duration::ZERO);
    }
}
