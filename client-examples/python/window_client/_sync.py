"""The synchronous client, :mod:`window_client`'s default (the asyncio one is
:mod:`window_client.aio`):

    from window_client import WindowClient

    with WindowClient() as client:                     # target, token, TLS from the environment
        client.publish("orders", [b'{"id": 1}'])
        with client.subscribe("orders", "order-service", consumer="worker-1") as sub:
            signal.signal(signal.SIGTERM, lambda *_: sub.stop())
            for delivery in sub:                        # blocks until a delivery comes
                delivery.redis.incr("orders:seen")
                delivery.ack()

It is a thin layer: the asyncio client (:mod:`window_client.aio`) runs on an event loop of
its own in a background thread, and every call here hands its work to that loop and waits for
the answer. Behaviour, options and defaults are the asyncio client's, word for word:
batching, the rule for a refused command and a failed handler, reconnecting, draining, the
lifecycle events, the errors. Callbacks (``on_flush``, ``on_rejection``, ``on_lifecycle``,
``on_error``) run on the
client's thread, not the caller's: keep them short and thread-safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import warnings
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Coroutine,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    cast,
)

from . import client as aio
from . import tracing
from ._proto import pb

if TYPE_CHECKING:
    from .commands import RedisCommands

T = TypeVar("T")

SyncHandler = Callable[["Delivery"], None]


class _Loop:
    """An event loop running in a daemon thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="window-client", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
        """Runs ``coro`` on the loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Calls ``fn`` on the loop's thread and waits for its result (or its exception)."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                done.set_exception(err)

        self.loop.call_soon_threadsafe(call)
        return done.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Delivery:
    """A :class:`window_client.Delivery` for the caller's thread: the same fields, and its
    ``redis``, ``queue``, ``extend``, ``ack``, ``drop``, ``retry`` and ``retry_after`` run on
    the client's loop."""

    __slots__ = ("_d", "_loop", "_sub")

    def __init__(self, d: aio.Delivery, loop: _Loop, sub: "Subscription") -> None:
        self._d = d
        self._loop = loop
        self._sub = sub

    @property
    def slot(self) -> int:
        return self._d.slot

    @property
    def entry_id(self) -> str:
        return self._d.entry_id

    @property
    def payload(self) -> bytes:
        return self._d.payload

    @property
    def read_id(self) -> int:
        return self._d.read_id

    @property
    def partition(self) -> Optional[int]:
        """On a partitioned stream: the partition the entry was read from (entry ids repeat
        across partitions); None otherwise (see the asyncio ``Delivery.partition``)."""
        return self._d.partition

    @property
    def headers(self) -> Dict[str, str]:
        return self._d.headers

    @property
    def in_layout(self) -> bool:
        return self._d.in_layout

    @property
    def fields(self) -> Dict[str, bytes]:
        return self._d.fields

    @property
    def text_fields(self) -> Dict[str, str]:
        return self._d.text_fields

    @property
    def raw_fields(self) -> List[Tuple[bytes, bytes]]:
        return self._d.raw_fields

    @property
    def delivery_count(self) -> int:
        return self._d.delivery_count

    @property
    def channel(self) -> str:
        return self._d.channel

    @property
    def trace(self) -> Optional[pb.TraceContext]:
        return self._d.trace

    @property
    def outcome(self) -> Optional[str]:
        return self._d.outcome

    @property
    def settled(self) -> bool:
        return self._d.settled

    @property
    def live(self) -> bool:
        return self._d.live

    @property
    def span(self) -> Any:
        return self._d.span

    @property
    def context(self) -> Any:
        return self._d.context

    @property
    def subscription(self) -> "Subscription":
        return self._sub

    @property
    def delivery(self) -> aio.Delivery:
        """The asyncio client's delivery (use it only on the client's loop)."""
        return self._d

    def json(self) -> Any:
        return self._d.json()

    def text(self) -> str:
        return self._d.text()

    @property
    def redis(self) -> "RedisCommands":
        """redis-py's command methods, queued on this delivery (see the asyncio
        :attr:`window_client.aio.Delivery.redis`)."""
        from .commands import RedisCommands

        return RedisCommands(self.queue)

    def queue(self, name: str, *args: aio.Arg) -> "Delivery":
        self._loop.call(self._d.queue, name, *args)
        return self

    def extend(self) -> None:
        self._loop.call(self._d.extend)

    def in_progress(self) -> None:
        """Deprecated: the name of :meth:`extend` before the clients shared one vocabulary."""
        warnings.warn("Delivery.in_progress() is deprecated: call extend()",
                      DeprecationWarning, stacklevel=2)
        self.extend()

    def ack(self) -> None:
        self._loop.call(self._d.ack)

    def drop(self, reason: str = "") -> None:
        self._loop.call(self._d.drop, reason)

    def retry(self, reason: str = "") -> None:
        self._loop.call(self._d.retry, reason)

    def retry_after(self, seconds: float, reason: str = "") -> None:
        self._loop.call(self._d.retry_after, seconds, reason)

    def dead_letter(self, reason: str = "") -> None:
        self._loop.call(self._d.dead_letter, reason)

    def __repr__(self) -> str:
        return repr(self._d)


class Batch(aio._Deliveries[Delivery]):
    """The deliveries of one read, handed out together by :meth:`Subscription.batches` (see
    the asyncio :class:`~window_client.aio.Batch`)."""

    def __init__(self, batch: aio.Batch, loop: _Loop, sub: "Subscription") -> None:
        self._batch = batch
        self._loop = loop
        self._deliveries = [Delivery(d, loop, sub) for d in batch]

    @property
    def read_id(self) -> int:
        return self._batch.read_id

    @property
    def partition(self) -> Optional[int]:
        """On a partitioned stream: the partition the read came from; None otherwise."""
        return self._batch.partition

    def ack(self) -> None:
        self._loop.call(self._batch.ack)

    def drop(self, reason: str = "") -> None:
        self._loop.call(self._batch.drop, reason)

    def retry(self, reason: str = "") -> None:
        self._loop.call(self._batch.retry, reason)

    def __repr__(self) -> str:
        return repr(self._batch)


class Subscription:
    """A blocking iterator of :class:`Delivery` over one subscription and a context manager
    (leaving it closes the subscription: what is settled is flushed and reported)."""

    def __init__(self, sub: aio.Subscription, loop: _Loop) -> None:
        self._sub = sub
        sub._attach_spans = False  # made current in the caller's thread, by __next__
        self._loop = loop
        self._token: Any = None

    @property
    def subscription(self) -> aio.Subscription:
        """The asyncio subscription underneath (use it only on the client's loop)."""
        return self._sub

    @property
    def opened(self) -> Optional[pb.Opened]:
        return self._sub.opened

    @property
    def partitions(self) -> int:
        """How many partitions of the partitioned stream the sidecar shares out for this
        subscription (``Opened.partitions``), once it is open: 0 before that, on an
        unpartitioned stream and from an older sidecar (see the asyncio property)."""
        return self._sub.partitions

    @property
    def stats(self) -> aio.Stats:
        return self._sub.stats

    def start(self) -> "Subscription":
        self._loop.call(self._sub.start)
        return self

    def wait_opened(self, timeout: Optional[float] = None) -> pb.Opened:
        """Starts it and waits until its stream is open (see the asyncio method)."""
        return self._loop.run(self._sub.wait_opened(timeout))

    def __iter__(self) -> "Subscription":
        self._loop.call(self._sub.__aiter__)  # refuses a subscription iterated by batches
        return self

    def __next__(self) -> Delivery:
        self._leave()
        try:
            d = self._loop.run(self._sub.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None
        if d.context is not None:
            # Current in the caller's thread while it handles the delivery.
            self._token = tracing.attach(d.context)
        return Delivery(d, self._loop, self)

    def batches(self) -> Iterator[Batch]:
        """A blocking iterator of :class:`Batch`: each read's deliveries handed out together
        (``for batch in sub.batches(): for d in batch: ...; batch.ack()``). No delivery span is
        made current in the caller's thread (a batch is no one delivery)."""
        # At the call, as the asyncio method: from now on the iteration hands out batches (or
        # TypeError when it is already iterated delivery by delivery).
        self._loop.call(self._sub.batches)
        return self._batches()

    def _batches(self) -> Iterator[Batch]:
        while True:
            self._leave()
            try:
                batch = cast(aio.Batch, self._loop.run(self._sub.__anext__()))
            except StopAsyncIteration:
                return
            yield Batch(batch, self._loop, self)

    def _leave(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            tracing.detach(token)

    def stop(self, *, drain: bool = True) -> None:
        """Hands out nothing more (the iteration ends). Safe from any thread and from a signal
        handler: it only schedules the stop on the client's loop."""
        self._loop.loop.call_soon_threadsafe(lambda: self._sub.stop(drain=drain))

    def close(self, *, drain: bool = True) -> None:
        """:meth:`stop`, then waits until the stream has ended (see the asyncio method)."""
        self._leave()
        self._loop.run(self._sub.close(drain=drain))

    def run(self, handler: SyncHandler) -> None:
        """The handler style, with the asyncio client's rules: a delivery the handler returns
        without settling is acked; one whose handler raised is settled with ``retry_after``
        (the growing delay) and the reason ``handler failed: <error>``."""
        for d in self:
            try:
                handler(d)
            except Exception as err:  # noqa: BLE001 - the entry comes back; the loop goes on
                self._loop.call(self._sub._handler_failed, d._d, err)
                continue
            self._loop.call(self._sub._handler_returned, d._d)

    def __enter__(self) -> "Subscription":
        return self.start()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(drain=exc_type is None)


class WindowClient:
    """The synchronous client: the arguments of :class:`window_client.aio.WindowClient`
    (``target``, ``token``, ``tls``, ``options``, ``connect_timeout``; the first three from
    the environment by default), its methods without ``await``. Close it (or use ``with``) to
    stop its thread.

    Made inside a running event loop (code written for the asyncio client when it was this
    package's default), ``window_client.WindowClient(...)`` returns the asyncio client with a
    ``DeprecationWarning``, for one release: import it from :mod:`window_client.aio`."""

    # Whether construction inside a running event loop gives the asyncio client (the
    # top-level name only; window_client.sync keeps the synchronous one).
    _old_async_default = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._old_async_default:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                warnings.warn(
                    "window_client.WindowClient is the synchronous client now; made in a "
                    "running event loop it gives the asyncio client for one more release: "
                    "import it from window_client.aio",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return aio.WindowClient(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, target: Optional[str] = None, **kwargs: Any) -> None:
        self._loop = _Loop()

        async def make() -> aio.WindowClient:
            return aio.WindowClient(target, **kwargs)

        try:
            self._client = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise
        self.target = self._client.target
        self.tls = self._client.tls
        self.metadata = self._client.metadata

    @property
    def client(self) -> aio.WindowClient:
        """The asyncio client underneath (use it only on the client's loop)."""
        return self._client

    def __enter__(self) -> "WindowClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def publish(self, stream: str, entries: Iterable[aio.Entry], **kwargs: Any) -> List[str]:
        """See :meth:`window_client.WindowClient.publish`."""
        return self._loop.run(self._client.publish(stream, list(entries), **kwargs))

    def publish_list(self, key: str, entries: Iterable[aio.Entry], **kwargs: Any) -> None:
        """See :meth:`window_client.WindowClient.publish_list`."""
        self._loop.run(self._client.publish_list(key, list(entries), **kwargs))

    def publish_channel(
        self, channel: str, entries: Iterable[aio.Entry], **kwargs: Any
    ) -> List[int]:
        """See :meth:`window_client.WindowClient.publish_channel`."""
        return self._loop.run(self._client.publish_channel(channel, list(entries), **kwargs))

    def _wrap(self, make: Callable[[], aio.Subscription]) -> Subscription:
        return Subscription(self._loop.call(make), self._loop)

    def subscribe(self, stream: str, group: str, **kwargs: Any) -> Subscription:
        """See :meth:`window_client.WindowClient.subscribe`."""
        return self._wrap(lambda: self._client.subscribe(stream, group, **kwargs))

    def subscribe_reliable_list(self, key: str, **kwargs: Any) -> Subscription:
        """See :meth:`window_client.WindowClient.subscribe_reliable_list`."""
        return self._wrap(lambda: self._client.subscribe_reliable_list(key, **kwargs))

    def subscribe_list(self, key: str, **kwargs: Any) -> Subscription:
        """See :meth:`window_client.WindowClient.subscribe_list`."""
        return self._wrap(lambda: self._client.subscribe_list(key, **kwargs))

    def subscribe_pubsub(self, channels: Sequence[str] = (), **kwargs: Any) -> Subscription:
        """See :meth:`window_client.WindowClient.subscribe_pubsub`."""
        return self._wrap(lambda: self._client.subscribe_pubsub(channels, **kwargs))

    def consume(self, stream: str, group: str, handler: SyncHandler, **kwargs: Any) -> aio.Stats:
        """``subscribe(stream, group, **kwargs)`` and :meth:`Subscription.run` ``(handler)``
        until ``delivery.subscription.stop()``; returns the subscription's stats."""
        with self.subscribe(stream, group, **kwargs) as sub:
            sub.run(handler)
        return sub.stats


__all__ = ["Delivery", "Subscription", "SyncHandler", "WindowClient"]
