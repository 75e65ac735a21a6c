"""Deprecated: the synchronous client is :mod:`window_client` itself now (``from
window_client import WindowClient``); this module keeps the old import path working for one
release."""

import warnings

from . import _sync
from ._sync import Delivery, Subscription, SyncHandler

warnings.warn(
    "window_client.sync is deprecated: the synchronous client is window_client itself "
    "(from window_client import WindowClient); the asyncio one is window_client.aio",
    DeprecationWarning,
    stacklevel=2,
)



class WindowClient(_sync.WindowClient):
    """The synchronous client (:class:`window_client.WindowClient`), by its old path."""

    _old_async_default = False


__all__ = ["Delivery", "Subscription", "SyncHandler", "WindowClient"]
