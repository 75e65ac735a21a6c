"""Optional OpenTelemetry support.

When the ``opentelemetry-api`` package is importable, every delivery is handled in a span that
continues the producer's trace: its parent is the W3C trace context the sidecar hands over in
``Delivery.trace`` (extracted with ``TraceContextTextMapPropagator``). Without the package every
function here is a cheap no-op and the helper works unchanged. Spans are only recorded when an
SDK ``TracerProvider`` is configured (``opentelemetry-sdk``), as usual with OpenTelemetry.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

log = logging.getLogger("window_client")

try:  # pragma: no branch
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:  # opentelemetry is optional
    AVAILABLE = False
    _PROPAGATOR = None

_TRACER_NAME = "window_client"


def _tracer() -> Any:
    return otel_trace.get_tracer(_TRACER_NAME)


class DeliverySpan:
    """The span of one delivery: started when the delivery is handed out, made current while
    the consumer's loop body runs, ended when the delivery is settled (or its stream is lost)."""

    __slots__ = ("span", "context", "_token")

    def __init__(self, span: Any, context: Any) -> None:
        self.span = span
        self.context = context
        self._token: Any = None

    def attach(self) -> None:
        if self._token is None:
            self._token = otel_context.attach(self.context)

    def detach(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            try:
                otel_context.detach(token)
            except Exception:  # noqa: BLE001 - a token from another task's context
                log.debug("could not detach the delivery's trace context", exc_info=True)

    def end(self, outcome: str, error: Optional[str] = None) -> None:
        span = self.span
        if span is None:
            return
        self.span = None
        span.set_attribute("window.outcome", outcome)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()


def start_delivery_span(
    *,
    stream: str,
    group: str,
    consumer: str,
    entry_id: str,
    slot: int,
    delivery_count: int,
    traceparent: str,
    tracestate: str,
) -> Optional[DeliverySpan]:
    """Starts the span of a delivery as a child of its trace context, or returns None when
    OpenTelemetry is not installed."""
    if not AVAILABLE:
        return None
    carrier: Dict[str, str] = {}
    if traceparent:
        carrier["traceparent"] = traceparent
        if tracestate:
            carrier["tracestate"] = tracestate
    parent = _PROPAGATOR.extract(carrier) if carrier else None
    span = _tracer().start_span(
        f"process {stream}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "redis",
            "messaging.operation.type": "process",
            "messaging.destination.name": stream,
            "messaging.consumer.group.name": group,
            "messaging.message.id": entry_id,
            "window.consumer": consumer,
            "window.slot": slot,
            "window.delivery_count": delivery_count,
        },
    )
    return DeliverySpan(span, otel_trace.set_span_in_context(span, parent))


def outcome_trace(span: Any) -> Dict[str, str]:
    """The W3C trace context of a delivery's span while it records, for ``Outcome.trace`` (the
    sidecar's flush span links to it); empty without OpenTelemetry or a recording span."""
    if not AVAILABLE or span is None or not span.is_recording():
        return {}
    carrier: Dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=otel_trace.set_span_in_context(span))
    return carrier


def attach(context: Any) -> Any:
    """Makes ``context`` current in this thread; returns the token for :func:`detach` (None
    without OpenTelemetry)."""
    if not AVAILABLE or context is None:
        return None
    return otel_context.attach(context)


def detach(token: Any) -> None:
    """Undoes :func:`attach`."""
    if token is None:
        return
    try:
        otel_context.detach(token)
    except Exception:  # noqa: BLE001 - a token from another context
        log.debug("could not detach a delivery's trace context", exc_info=True)


def current_trace() -> Dict[str, str]:
    """The current W3C trace context as ``{"traceparent": ..., "tracestate": ...}`` (empty when
    OpenTelemetry is missing or no span is recording), for ``PublishEntry.trace``."""
    if not AVAILABLE:
        return {}
    carrier: Dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier
