"""The asyncio client, for code that runs on an event loop (as ``redis.asyncio`` is to
``redis`` and ``grpc.aio`` to ``grpc``):

    from window_client.aio import WindowClient

    async with WindowClient() as client:               # target, token, TLS from the environment
        await client.publish("orders", [b'{"id": 1}'])
        async with client.subscribe("orders", "order-service", consumer="worker-1") as sub:
            async for d in sub:
                d.redis.hincrby("orders:seen", "total", 1)
                d.ack()

The errors, the options and the behaviour are those of :mod:`window_client`, the synchronous
client, which runs this one on a thread of its own.
"""

from .client import (
    CONNECT_TIMEOUT,
    MAX_ATTEMPTS,
    MAX_RETRY_DELAY,
    REJECTED_OUTCOMES,
    RETRY_DELAY,
    RETRYABLE,
    UNFIXABLE,
    Batch,
    Delivery,
    ErrorCallback,
    FlushCallback,
    FlushEvent,
    Handler,
    LifecycleCallback,
    LifecycleEvent,
    RejectionCallback,
    Stats,
    Subscription,
    TLSConfig,
    WindowClient,
)
from .errors import (
    AlreadySettledError,
    ConnectionError,
    RejectedError,
    RequeueRefusedError,
    SideEffectError,
    SubscriptionEndedError,
    WindowError,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "MAX_ATTEMPTS",
    "MAX_RETRY_DELAY",
    "REJECTED_OUTCOMES",
    "RETRYABLE",
    "RETRY_DELAY",
    "UNFIXABLE",
    "AlreadySettledError",
    "Batch",
    "ConnectionError",
    "Delivery",
    "ErrorCallback",
    "FlushCallback",
    "FlushEvent",
    "Handler",
    "LifecycleCallback",
    "LifecycleEvent",
    "RejectedError",
    "RequeueRefusedError",
    "RejectionCallback",
    "Stats",
    "SideEffectError",
    "Subscription",
    "SubscriptionEndedError",
    "TLSConfig",
    "WindowClient",
    "WindowError",
]
