"""window_client: a small asyncio helper over the generated window-sidecar gRPC stub.

``WindowClient(target).subscribe(stream, group, ...)`` is an async iterator of
:class:`Delivery`; ``delivery.queue("INCR", key)`` queues a side effect and ``ack()``,
``drop(reason)``, ``retry()``, ``retry_after(seconds)`` settle it; ``consume(stream, group,
handler)`` is the handler style; :mod:`window_client.sync` has the same API without asyncio.
See README.md.
"""

from . import sync, tracing
from ._proto import pb, pb_grpc
from .client import (
    ADDR_ENV,
    DEFAULT_TARGET,
    RETRY_DELAY,
    RETRYABLE,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    TOKEN_ENV,
    Delivery,
    FlushEvent,
    Handler,
    LifecycleEvent,
    SettledError,
    Stats,
    Subscription,
    TLSConfig,
    WindowClient,
)

__all__ = [
    "ADDR_ENV",
    "DEFAULT_TARGET",
    "RETRY_DELAY",
    "RETRYABLE",
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "TLS_SERVER_NAME_ENV",
    "TOKEN_ENV",
    "Delivery",
    "FlushEvent",
    "Handler",
    "LifecycleEvent",
    "SettledError",
    "Stats",
    "Subscription",
    "TLSConfig",
    "WindowClient",
    "pb",
    "pb_grpc",
    "sync",
    "tracing",
]
