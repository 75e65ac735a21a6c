"""window_client: a small asyncio helper over the generated window-sidecar gRPC stub.

``WindowClient(target).subscribe(stream, group, ...)`` is an async iterator of
:class:`Delivery`; ``delivery.queue("INCR", key)`` queues a side effect and ``ack()``,
``drop(reason)``, ``retry()``, ``retry_after(seconds)`` settle it; ``consume(stream, group,
handler)`` is the handler style. See README.md.
"""

from . import tracing
from ._proto import pb, pb_grpc
from .client import (
    DEFAULT_TARGET,
    RETRY_DELAY,
    RETRYABLE,
    TOKEN_ENV,
    Delivery,
    FlushEvent,
    Handler,
    SettledError,
    Stats,
    Subscription,
    WindowClient,
)

__all__ = [
    "DEFAULT_TARGET",
    "RETRY_DELAY",
    "RETRYABLE",
    "TOKEN_ENV",
    "Delivery",
    "FlushEvent",
    "Handler",
    "SettledError",
    "Stats",
    "Subscription",
    "WindowClient",
    "pb",
    "pb_grpc",
    "tracing",
]
