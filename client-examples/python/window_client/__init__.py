"""window_client: the Python client of window-sidecar.

``WindowClient(target).subscribe(stream, group, ...)`` is an iterator of :class:`Delivery`;
``delivery.redis.hincrby(key, field, 1)`` queues a side effect with redis-py's own command
methods (``delivery.queue(name, *args)`` for what redis-py lacks) and ``ack()``,
``drop(reason)``, ``retry()``, ``retry_after(seconds)`` settle it. This module is the
synchronous client; :mod:`window_client.aio` is the same for asyncio (as ``redis`` and
``redis.asyncio``, ``grpc`` and ``grpc.aio``). Errors are :class:`WindowError` and its
subclasses. See README.md.
"""

import warnings
from typing import TYPE_CHECKING, Any

from . import aio, tracing
from ._proto import pb, pb_grpc
from ._sync import Batch, Delivery, Subscription, SyncHandler, WindowClient
from .client import (
    ADDR_ENV,
    CONNECT_TIMEOUT,
    DEFAULT_TARGET,
    MAX_ATTEMPTS,
    MAX_RETRY_DELAY,
    REJECTED_OUTCOMES,
    RETRY_DELAY,
    RETRYABLE,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    TOKEN_ENV,
    UNFIXABLE,
    FlushEvent,
    LifecycleEvent,
    Stats,
    TLSConfig,
)
from .errors import (
    AlreadySettledError,
    CallTimeoutError,
    ConnectionError,
    RedisUnavailableError,
    RefusedError,
    RejectedError,
    RequeueRefusedError,
    SettledError,
    SideEffectError,
    SubscriptionEndedError,
    WindowError,
)

if TYPE_CHECKING:
    from .commands import RedisCommands

# The asyncio names this module had when the asyncio client was its default, kept for one
# release (the ones whose name now means the synchronous class are not: WindowClient, made in
# a running event loop, still gives the asyncio client, with a warning).
_MOVED = {"Handler": "Handler"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"window_client.{name} is deprecated: use window_client.aio.{_MOVED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(aio, _MOVED[name])
    if name == "RedisCommands":
        # Imported on first use: redis-py costs the import of a client that never uses it.
        from .commands import RedisCommands

        return RedisCommands
    if name == "sync":
        from . import sync

        return sync
    raise AttributeError(f"module 'window_client' has no attribute {name!r}")


__all__ = [
    "ADDR_ENV",
    "CONNECT_TIMEOUT",
    "DEFAULT_TARGET",
    "MAX_ATTEMPTS",
    "MAX_RETRY_DELAY",
    "REJECTED_OUTCOMES",
    "RETRYABLE",
    "RETRY_DELAY",
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "TLS_SERVER_NAME_ENV",
    "TOKEN_ENV",
    "UNFIXABLE",
    "AlreadySettledError",
    "CallTimeoutError",
    "ConnectionError",
    "Batch",
    "Delivery",
    "FlushEvent",
    "LifecycleEvent",
    "RedisCommands",
    "RedisUnavailableError",
    "RefusedError",
    "RejectedError",
    "RequeueRefusedError",
    "SettledError",
    "Stats",
    "SideEffectError",
    "Subscription",
    "SubscriptionEndedError",
    "SyncHandler",
    "TLSConfig",
    "WindowClient",
    "WindowError",
    "aio",
    "pb",
    "pb_grpc",
    "tracing",
]
