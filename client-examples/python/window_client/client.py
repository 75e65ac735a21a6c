"""The asyncio (grpc.aio) client over the generated window-sidecar stub; its public names are
in :mod:`window_client.aio` (the synchronous client, :mod:`window_client`, runs this one on a
thread of its own).

    async with WindowClient("127.0.0.1:50051") as client:
        async with client.subscribe("orders", "order-service", consumer="worker-1", count=16) as sub:
            async for delivery in sub:
                delivery.queue("INCR", "orders:seen")
                delivery.ack()

See README.md for the full API and the guarantees.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import logging
import os
import random
import re
import warnings
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
    overload,
)

import grpc
from google.protobuf.duration_pb2 import Duration

from . import tracing
from ._proto import pb, pb_grpc
from .errors import (
    AlreadySettledError,
    ConnectionError,
    RejectedError,
    RequeueRefusedError,
    SettledError,
    SideEffectError,
    SubscriptionEndedError,
    WindowError,
    address_problem,
    explain,
    not_the_sidecar,
    probe,
    transport_failure,
    unreachable_cause,
)

if TYPE_CHECKING:
    from .commands import RedisCommands

log = logging.getLogger("window_client")

DEFAULT_TARGET = "127.0.0.1:50051"

#: Stream errors after which the subscription reconnects and resubscribes: the sidecar is down,
#: restarting or draining (UNAVAILABLE), or the previous stream of the same consumer name has
#: not been released yet (ALREADY_EXISTS).
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED}
)

#: The first delay of the client's own ``retry_after`` (a refused command or outcome settled
#: with ``retry_after``, a :meth:`Subscription.run` handler that raised): it doubles with each
#: delivery of the entry, up to :data:`MAX_RETRY_DELAY` (the options ``retry_delay`` and
#: ``max_retry_delay``). With ``max_deliveries`` and ``dead_letter`` a poison entry reaches the
#: dead letter at the cap.
RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 60.0

#: Consecutive failed opens after which a subscription ends with
#: :class:`~window_client.SubscriptionEndedError` (the option ``max_attempts``; 0: never).
MAX_ATTEMPTS = 10

#: How long a call waits for a connection to the sidecar that is neither made nor refused
#: (an address that drops packets) before it fails with
#: :class:`~window_client.ConnectionError` (``WindowClient(connect_timeout=...)``). A refused
#: connection fails the call at once.
CONNECT_TIMEOUT = 5.0

# The causes after which a call fails at once: nothing listens there.
_REFUSED = frozenset({"connection refused", "no such socket"})

#: What the client does with a delivery one of whose commands the sidecar refused
#: (``rejected_outcome``): ``"auto"`` settles it at once for a reason no retry fixes
#: (:data:`UNFIXABLE`), with ``dead_letter`` when the subscription has a dead-letter target and
#: ``drop`` when it has none, and with ``retry_after`` otherwise; ``"drop"`` always drops it;
#: ``"retry_after"`` always retries it after the growing delay (so that with
#: ``max_deliveries`` it reaches the dead letter at the cap).
REJECTED_OUTCOMES = ("auto", "drop", "retry_after")

#: The rejection reasons no retry can fix: the same command is refused again every time.
UNFIXABLE = frozenset({"INVALID_COMMAND", "FORBIDDEN_COMMAND", "PERMISSION_DENIED"})

# The sidecar's advice in an INCOMPLETE_SEGMENT message: the client has already settled the
# delivery, so it never passes the advice on.
_ADVICE = re.compile(r"[;,.]?\s*settle it with [^;]*$", re.IGNORECASE)


def _reason_name(reason: int) -> str:
    """A rejection reason's name without its prefix (``FORBIDDEN_COMMAND``)."""
    try:
        name = pb.RejectionReason.Name(reason)
    except ValueError:
        return str(reason)
    return name.removeprefix("REJECTION_REASON_")

#: The environment variable the bearer token is read from when ``WindowClient(token=...)`` is
#: not given (a sidecar started with ``--auth-token-file`` refuses calls without it).
TOKEN_ENV = "WINDOW_SIDECAR_TOKEN"

#: The environment variable the target is read from when ``WindowClient(target)`` is not given
#: (``HOST:PORT`` or ``unix:/path``; default :data:`DEFAULT_TARGET`).
ADDR_ENV = "WINDOW_SIDECAR_ADDR"

#: TLS from the environment (see :class:`TLSConfig`): the PEM CA file that turns TLS on and
#: verifies the sidecar, the PEM client certificate and key (mutual TLS), and the name to
#: verify instead of the target's host.
TLS_CA_ENV = "WINDOW_SIDECAR_TLS_CA"
TLS_CERT_ENV = "WINDOW_SIDECAR_TLS_CERT"
TLS_KEY_ENV = "WINDOW_SIDECAR_TLS_KEY"
TLS_SERVER_NAME_ENV = "WINDOW_SIDECAR_TLS_SERVER_NAME"

# Outcome rejections after which the slot is still open on the sidecar and must be settled again.
_RESETTLE = frozenset(
    {pb.REJECTION_REASON_INCOMPLETE_SEGMENT, pb.REJECTION_REASON_INVALID_OUTCOME}
)

Arg = Union[bytes, str, int, float]
FlushCallback = Callable[["FlushEvent"], Optional[Awaitable[None]]]
RejectionCallback = Callable[[pb.Rejection, Optional["Delivery"]], Optional[Awaitable[None]]]
LifecycleCallback = Callable[["LifecycleEvent"], Optional[Awaitable[None]]]
ErrorCallback = Callable[[WindowError], Optional[Awaitable[None]]]
Handler = Callable[["Delivery"], Optional[Awaitable[None]]]
Entry = Union[bytes, str, Dict[str, Any], pb.PublishEntry]

_FRAMING: Dict[Optional[str], "pb.Framing"] = {
    None: pb.FRAMING_UNSPECIFIED,
    "frames": pb.FRAMING_FRAMES,
    "raw": pb.FRAMING_RAW,
}


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d


def _arg(value: Arg) -> bytes:
    # Exact types first: this runs for every argument of every queued command. (Narrowed by
    # the type checks rather than cast(), a call at run time.)
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode()
    if type(value) is int:
        return str(value).encode()
    return _arg_other(value)


def _arg_other(value: Arg) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool):
        raise TypeError("a bool is not a Redis argument; pass 0/1 or a string")
    if isinstance(value, (str, int, float)):
        return str(value).encode()
    raise TypeError(f"unsupported Redis argument type {type(value).__name__}")


# RESP heads of packed commands (``*<n>\r\n$<len>\r\n<NAME>``, the CRLF after it added by
# the join) by name and argument count, made once each. Bounded: a program that makes up
# names as it goes packs them anew.
_RESP_HEADS: Dict[Tuple[str, int], bytes] = {}
_RESP_HEADS_MAX = 1024
# The length prefixes (``$<len>``) of bulk strings of the usual sizes, made once.
_RESP_LENGTHS = [b"$%d" % n for n in range(1024)]


def _pack(commands: List[Tuple[int, str, List[bytes]]]) -> Tuple[bytes, List[int]]:
    """Commands as ``Batch.packed_commands`` carries them: each a RESP array of bulk strings
    (the form Redis reads), and the slot of each. One bytes field costs a fraction of a
    ``QueuedCommand`` message per command, to build and to serialize."""
    parts: List[bytes] = []
    append = parts.append
    heads = _RESP_HEADS
    lengths = _RESP_LENGTHS
    for _, name, args in commands:
        head = heads.get((name, len(args)))
        if head is None:
            encoded = name.encode()
            head = b"*%d\r\n$%d\r\n%b" % (len(args) + 1, len(encoded), encoded)
            if len(heads) < _RESP_HEADS_MAX:
                heads[(name, len(args))] = head
        append(head)
        for a in args:
            n = len(a)
            append(lengths[n] if n < 1024 else b"$%d" % n)
            append(a)
    append(b"")
    # Every RESP token ends in CRLF: joined with it, no argument is first copied into a
    # formatted string of its own (a quarter less per command).
    return b"\r\n".join(parts), [command[0] for command in commands]


_REDIS_COMMANDS: Any = None


def _redis_commands() -> Any:
    """The RedisCommands class, imported on first use: redis-py costs the import of a client
    that never uses it."""
    global _REDIS_COMMANDS
    if _REDIS_COMMANDS is None:
        from .commands import RedisCommands

        _REDIS_COMMANDS = RedisCommands
    return _REDIS_COMMANDS


async def _load_redis_commands() -> None:
    """Imports the typed commands in a worker thread, once per process, before the first
    subscription opens. The import takes 60-100 ms (redis-py's client and command modules); on
    a delivery's first ``d.redis`` it held the event loop that long with every delivery behind
    it (p99 at 1,000/s 59-102 ms against 1.7 ms without ``d.redis``)."""
    if _REDIS_COMMANDS is not None:
        return
    try:
        await asyncio.get_running_loop().run_in_executor(None, _redis_commands)
    except ImportError as err:  # redis-py is a dependency: only a broken install gets here
        log.warning("the typed commands (Delivery.redis) cannot be imported: %s", err)


def _framing(framing: Optional[str]) -> "pb.Framing":
    try:
        return _FRAMING[framing]
    except KeyError:
        raise ValueError(f"framing is 'frames' or 'raw', not {framing!r}") from None


def _partitions(partitions: int) -> int:
    # Protobuf's own refusal of a negative uint32 would not name the option.
    if partitions < 0:
        raise ValueError(
            "partitions is how many partitions the stream has (0: the stream itself), "
            f"not {partitions}"
        )
    return partitions


def _partition_by(
    request: pb.PublishRequest,
    partitions: int,
    header: Optional[str],
    field: Optional[str],
) -> None:
    """Sets a stream Publish's ``partitions`` and ``partition_by``, refusing what the sidecar
    would refuse only after the call, named by this API's options."""
    if header and field:
        raise ValueError("partition_header and partition_field: one partition key, not both")
    if not _partitions(partitions):
        if header or field:
            given = "partition_header" if header else "partition_field"
            raise ValueError(
                f"{given} needs partitions: how many partitions the stream has "
                "(the number its subscriptions open it with)"
            )
        return
    if header:
        request.partition_by.header = header
    elif field:
        request.partition_by.field = field
    else:
        raise ValueError(
            "partitions needs partition_header or partition_field: where each entry's key "
            "is, which picks its partition"
        )
    request.partitions = partitions


# --------------------------------------------------------------------------------------------
# TLS


@dataclass(frozen=True)
class TLSConfig:
    """TLS to the sidecar: ``ca_file`` is the PEM CA bundle the sidecar's certificate is
    verified against (None: the system's roots), ``cert_file`` and ``key_file`` the PEM client
    certificate and its key for mutual TLS (both or neither), ``server_name`` the name to verify
    instead of the target's host (for example when the target is an IP or a Unix socket)."""

    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    server_name: Optional[str] = None

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional["TLSConfig"]:
        """The configuration ``WINDOW_SIDECAR_TLS_CA``, ``_CERT``, ``_KEY`` and
        ``_SERVER_NAME`` give, or None (no TLS) when ``WINDOW_SIDECAR_TLS_CA`` is unset or
        empty. A certificate, key or server name without the CA is an error rather than a
        silently plaintext channel."""
        env = os.environ if environ is None else environ
        ca = env.get(TLS_CA_ENV) or None
        cert = env.get(TLS_CERT_ENV) or None
        key = env.get(TLS_KEY_ENV) or None
        name = env.get(TLS_SERVER_NAME_ENV) or None
        if ca is None:
            given = [n for n, v in ((TLS_CERT_ENV, cert), (TLS_KEY_ENV, key),
                                    (TLS_SERVER_NAME_ENV, name)) if v]
            if given:
                raise ValueError(f"{' and '.join(given)} set without {TLS_CA_ENV}")
            return None
        return cls(ca_file=ca, cert_file=cert, key_file=key, server_name=name)

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials, the files read now."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a TLS client certificate needs its key, and a key its certificate")

        def read(path: Optional[str]) -> Optional[bytes]:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )

    def channel_options(self) -> List[Tuple[str, Any]]:
        """The channel options it needs (the name to verify, when it is not the target's)."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


# --------------------------------------------------------------------------------------------
# Deliveries


class Delivery:
    """One stream entry handed to the application.

    Queue side-effect commands with :attr:`redis` (redis-py's command methods, recorded) or
    :meth:`queue`, then settle it exactly once with
    :meth:`ack`, :meth:`drop`, :meth:`retry` or :meth:`retry_after`. Settling does not block: the
    helper sends a read's commands and outcomes together once every delivery of the read is
    settled (or after ``linger`` seconds)."""

    # What every delivery needs is stored when its read arrives (by _deliveries); the rest
    # is read from its message, or from its read, when asked for.
    __slots__ = (
        "slot",
        "payload",
        "outcome",
        "rejection",
        "_rd",
        "_msg",
        "_commands",
        "_span",
        "_handed",
        "_sent",
        "_reported",
        "_refused",
    )

    slot: int
    payload: bytes
    #: "ack", "drop", "retry", "retry_after" or "dead_letter" once settled; None while open
    #: or abandoned.
    outcome: Optional[str]
    #: The sidecar's Rejection when it refused this delivery's outcome.
    rejection: Optional[pb.Rejection]
    _rd: "_Read"
    _msg: pb.Delivery
    _commands: List[Tuple[int, str, List[bytes]]]
    _span: Optional[tracing.DeliverySpan]
    _handed: bool
    _sent: bool  # its outcome was written to its stream
    # Done for its read: a flush report of its read came after that, or the sidecar answered
    # the outcome ALREADY_SETTLED (its slot is no longer outstanding there: no report ever
    # names it).
    _reported: bool
    # The first refused command's rejection (the reason of the retry_after it causes) and the
    # error handed to on_error for it, once the client has settled.
    _refused: Optional[Tuple[pb.Rejection, RejectedError]]

    # -- reading --------------------------------------------------------------------------

    @property
    def entry_id(self) -> str:
        return self._msg.entry_id

    @property
    def read_id(self) -> int:
        return self._rd.read_id

    @property
    def partition(self) -> Optional[int]:
        """On a partitioned stream (``subscribe(..., partitions=n)``): the partition the entry
        was read from (its stream is ``<key>:{partition}``). Entry ids repeat across
        partitions, so ``(partition, entry_id)`` names an entry where ``entry_id`` alone does
        not. None on an unpartitioned stream, a list or pub/sub."""
        return self._rd.partition

    @property
    def headers(self) -> Dict[str, str]:
        return dict(self._msg.headers)

    @property
    def in_layout(self) -> bool:
        """True when the entry is in the payload layout (written by a window-sidecar client:
        a ``_payload`` field and ``h:<name>`` headers); False for an entry another producer
        wrote with plain fields (``XADD k * sku apple qty 2``), which has :attr:`fields` and
        no payload."""
        return not self._msg.fields

    @property
    def fields(self) -> Dict[str, bytes]:
        """An entry's fields, name to value (bytes), when it is not in the payload layout;
        empty otherwise (read :attr:`payload` and :attr:`headers`). A name that is not UTF-8
        keeps its bytes as surrogate escapes; a repeated name keeps its last value (all of
        them, in order, are in :attr:`raw_fields`)."""
        return {f.name.decode("utf-8", "surrogateescape"): f.value for f in self._msg.fields}

    @property
    def text_fields(self) -> Dict[str, str]:
        """:attr:`fields` with each value decoded as UTF-8 (an invalid byte becomes U+FFFD)."""
        return {
            f.name.decode("utf-8", "surrogateescape"): f.value.decode("utf-8", "replace")
            for f in self._msg.fields
        }

    @property
    def raw_fields(self) -> List[Tuple[bytes, bytes]]:
        """The entry's fields as they are, in order: (name, value) pairs of bytes."""
        return [(f.name, f.value) for f in self._msg.fields]

    @property
    def delivery_count(self) -> int:
        return self._msg.delivery_count

    @property
    def channel(self) -> str:
        """Pub/sub: the channel the message arrived on (empty otherwise)."""
        return self._msg.channel

    @property
    def subscription(self) -> "Subscription":
        """The subscription it came from (for example to :meth:`Subscription.stop` it)."""
        return self._rd.sub

    @property
    def trace(self) -> Optional[pb.TraceContext]:
        """The producer's W3C trace context (``.traceparent``, ``.tracestate``), or None."""
        return self._msg.trace if self._msg.HasField("trace") else None

    def _need_payload(self, what: str) -> None:
        if self._msg.fields:
            names = ", ".join(
                f.name.decode("utf-8", "replace") for f in list(self._msg.fields)[:8]
            )
            raise ValueError(
                f"{what}: entry {self.entry_id} has no payload: it is not in the payload "
                f"layout (a _payload field) but has the fields {names}; read them with "
                f"delivery.fields (bytes) or delivery.text_fields (text)"
            )

    def text(self) -> str:
        """The payload decoded as UTF-8. An entry with plain fields has no payload: then it
        raises ``ValueError`` naming them (read :attr:`fields` or :attr:`text_fields`)."""
        self._need_payload("text()")
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        """The payload parsed as JSON. An entry with plain fields has no payload: then it
        raises ``ValueError`` naming them (read :attr:`fields` or :attr:`text_fields`)."""
        self._need_payload("json()")
        return json.loads(self.payload)

    @property
    def redis(self) -> "RedisCommands":
        """redis-py's command methods, each queued as a side effect of this delivery instead
        of being sent: ``d.redis.hincrby("totals", sku, 2)``, ``d.redis.set(k, v, ex=60)``.
        A misspelled name fails here (``AttributeError``); see :mod:`window_client.commands`.
        Needs the ``redis`` package (a dependency of this one)."""
        # A new recorder per use, not kept on the delivery: kept, it would make a reference
        # cycle (delivery -> recorder -> bound queue -> delivery) for the cyclic GC per entry.
        commands: "RedisCommands" = _redis_commands()(self.queue)
        return commands

    @property
    def settled(self) -> bool:
        return self.outcome is not None

    @property
    def live(self) -> bool:
        """False once the stream it came on is gone: settling it then does nothing, the sidecar
        delivers the entry again on the next stream."""
        return self._rd.stream.alive

    @property
    def span(self) -> Any:
        """The OpenTelemetry span this delivery is handled in (None without OpenTelemetry)."""
        return self._span.span if self._span is not None else None

    @property
    def context(self) -> Any:
        """The OpenTelemetry context of that span (None without OpenTelemetry)."""
        return self._span.context if self._span is not None else None

    # -- side effects and outcomes --------------------------------------------------------

    def queue(self, name: str, *args: Arg) -> "Delivery":
        """Queues a Redis command as a side effect of this delivery. Its reply is never seen;
        it runs only if the delivery is acked, in the read's flush."""
        if self.outcome is not None:
            raise AlreadySettledError(
                f"delivery {self.entry_id} (slot {self.slot}) is already settled "
                f"({self.outcome})", slot=self.slot, outcome=self.outcome,
            )
        # The usual argument types inline (what _arg does first), without a call per argument.
        encoded: List[bytes] = []
        for a in args:
            if type(a) is str:
                encoded.append(a.encode())
            elif type(a) is bytes:
                encoded.append(a)
            else:
                encoded.append(_arg(a))
        # Kept as a tuple: the writer builds the batch's messages in place, once.
        self._commands.append((self.slot, name, encoded))
        return self

    def ack(self) -> None:
        """Keeps the queued commands and acknowledges the entry."""
        rd = self._rd
        st = rd.stream
        if (self.outcome is not None or self._span is not None or self.rejection is not None
                or rd.done or not st.alive or st.half_closed):
            self._settle("ack", (self.slot, _ACK, None))
            return
        # The usual ack (no span, no refused outcome, its read still open) does here what
        # _settle and Subscription._settled would, without their calls: this runs for every
        # delivery acked one by one.
        self.outcome = "ack"
        sub = rd.sub
        counts = sub.stats.outcomes
        counts["ack"] = counts.get("ack", 0) + 1
        if self._handed:
            st.handed_unsettled -= 1
            if st.handed_unsettled == 0 and st.drained is not None:
                st.wake_drained()
        st.unsettled -= 1
        if self._commands:
            rd.commands += self._commands
        rd.outcomes.append((self.slot, _ACK, None))
        rd.settled.append(self)
        rd.unsettled -= 1
        # As _read_settled, without the call.
        if rd.unsettled == 0 or st.draining or sub._ordered:
            sub._send(st, rd)
        elif rd.timer is None and sub._linger is not None:
            rd.timer = asyncio.get_running_loop().call_later(sub._linger, sub._send, st, rd)

    def drop(self, reason: str = "") -> None:
        """Discards the queued commands and acknowledges the entry: it is not delivered again."""
        self._settle("drop", (self.slot, pb.OUTCOME_KIND_DROP, {"reason": reason}))

    def retry(self, reason: str = "") -> None:
        """Discards the queued commands; the entry is delivered again as soon as possible."""
        self._settle("retry", (self.slot, pb.OUTCOME_KIND_RETRY, {"reason": reason}))

    def retry_after(self, seconds: float, reason: str = "") -> None:
        """Discards the queued commands; the entry is delivered again after ``seconds``
        (durably scheduled in Redis)."""
        if seconds < 0.001:
            raise ValueError("retry_after needs a delay of at least 1 ms")
        self._settle(
            "retry_after",
            (
                self.slot,
                pb.OUTCOME_KIND_RETRY_AFTER,
                {"delay": _duration(seconds), "reason": reason},
            ),
        )

    def dead_letter(self, reason: str = "") -> None:
        """Discards the queued commands and writes the entry to the subscription's dead-letter
        target at once, whatever its delivery count, with ``reason`` (the dead letter's
        ``x-window-reason``): for an entry no retry can fix. Raises ``ValueError`` on a
        subscription without a dead-letter target (``max_deliveries`` and ``dead_letter``), and
        on pub/sub, which has none."""
        if not self._rd.sub.has_dead_letter:
            raise ValueError(
                "dead_letter needs a dead-letter target: subscribe with max_deliveries and "
                "dead_letter, or settle it with drop"
            )
        self._settle("dead_letter", (self.slot, pb.OUTCOME_KIND_DEAD_LETTER, {"reason": reason}))

    def extend(self) -> None:
        """Tells the sidecar this delivery is still being worked on (``Batch.extend``): no
        outcome yet, but other consumers must not take it. A stream's
        entry is made idle again (another consumer's reclaim waits a whole ``min_idle`` from
        now), a reliable list's lease is renewed; simple lists and pub/sub accept it and
        nothing changes. Call it every so often from a handler that takes longer than
        ``min_idle`` or ``dead_after``; the sidecar passes one per slot every 200 ms on to
        Redis. It does not block, and does nothing once the delivery's stream is gone."""
        if self.outcome is not None:
            raise AlreadySettledError(
                f"delivery {self.entry_id} (slot {self.slot}) is already settled "
                f"({self.outcome})", slot=self.slot, outcome=self.outcome,
            )
        self._rd.sub._in_progress(self)

    def in_progress(self) -> None:
        """Deprecated: the name of :meth:`extend` before the clients shared one vocabulary."""
        warnings.warn("Delivery.in_progress() is deprecated: call extend()",
                      DeprecationWarning, stacklevel=2)
        self.extend()

    def _settle(self, kind: str, outcome: Any) -> None:
        if self.outcome is not None:
            raise AlreadySettledError(
                f"delivery {self.entry_id} (slot {self.slot}) is already settled "
                f"({self.outcome})", slot=self.slot, outcome=self.outcome,
            )
        if self._span is not None:
            # The handling span's context goes back with the outcome: the sidecar's flush span
            # links to it. (An ack that carries one is sent as an outcome, never packed.)
            trace = tracing.outcome_trace(self._span.span)
            if trace:
                slot, outcome_kind, extra = outcome
                outcome = (slot, outcome_kind, {**(extra or {}), "trace": pb.TraceContext(**trace)})
        self.outcome = kind
        self._rd.sub._settled(self, kind, outcome)

    def __repr__(self) -> str:
        return (
            f"Delivery(slot={self.slot}, entry_id={self.entry_id!r}, "
            f"delivery_count={self.delivery_count}, outcome={self.outcome!r})"
        )


def _deliveries(rd: "_Read", msgs: Iterable[pb.Delivery]) -> List[Delivery]:
    """A read's deliveries, made without calling the class: a call through ``type`` to a
    Python ``__init__`` per delivery costs more than all of its stores."""
    new = Delivery.__new__
    deliveries: List[Delivery] = []
    append = deliveries.append
    for msg in msgs:
        d = new(Delivery)
        d.slot = msg.slot
        d.payload = msg.payload
        d.outcome = None
        d.rejection = None
        d._rd = rd
        d._msg = msg
        d._commands = []
        d._span = None
        d._handed = False
        d._sent = False
        d._reported = False
        d._refused = None
        append(d)
    return deliveries


class _Settles(Protocol):
    @property
    def outcome(self) -> Optional[str]: ...


_D = TypeVar("_D", bound=_Settles)


class _Deliveries(Sequence[_D]):
    """A read's deliveries in stream order, as a sequence: what both clients' ``Batch`` are."""

    __slots__ = ()
    _deliveries: List[_D]

    @overload
    def __getitem__(self, index: int) -> _D: ...

    @overload
    def __getitem__(self, index: slice) -> List[_D]: ...

    def __getitem__(self, index: Any) -> Any:
        return self._deliveries[index]

    def __len__(self) -> int:
        return len(self._deliveries)

    def __iter__(self) -> Iterator[_D]:
        return iter(self._deliveries)

    @property
    def unsettled(self) -> List[_D]:
        """The deliveries not settled yet."""
        return [d for d in self._deliveries if d.outcome is None]


class Batch(_Deliveries[Delivery]):
    """The deliveries of one read, handed out together by :meth:`Subscription.batches`: a
    sequence of :class:`Delivery` in stream order, each settled on its own as usual, or all
    that are still open at once with :meth:`ack` (or :meth:`drop`, :meth:`retry`).

    A read handled as one call costs the helper less per delivery than handing its deliveries
    out one by one: what a handler needs per entry is its side effects and its outcome."""

    __slots__ = ("read_id", "partition", "_deliveries", "_sub", "_stream")

    def __init__(self, sub: "Subscription", stream: "_Stream", read_id: int,
                 deliveries: List[Delivery], partition: Optional[int] = None) -> None:
        self.read_id = read_id
        #: On a partitioned stream: the partition the read came from, that of each of its
        #: deliveries (:attr:`Delivery.partition`); None on an unpartitioned one.
        self.partition: Optional[int] = partition
        self._deliveries = deliveries
        self._sub = sub
        self._stream = stream

    def ack(self) -> None:
        """Acks every delivery of the batch that is not settled yet, keeping its queued
        commands: the same as :meth:`Delivery.ack` on each, in one step."""
        self._sub._settle_all(self, "ack")

    def drop(self, reason: str = "") -> None:
        """Drops every delivery of the batch that is not settled yet."""
        self._sub._settle_all(self, "drop", reason)

    def retry(self, reason: str = "") -> None:
        """Retries every delivery of the batch that is not settled yet."""
        self._sub._settle_all(self, "retry", reason)

    def __repr__(self) -> str:
        return f"Batch(read_id={self.read_id}, deliveries={len(self._deliveries)})"


@dataclass
class FlushEvent:
    """A flush report of the sidecar, with the deliveries of the read it belongs to that it
    covers (an ordered subscription's read may be flushed in parts, one event per part).

    ``settled`` are the deliveries whose outcome reached the sidecar before the flush (their
    outcome is in ``Delivery.outcome``; with ``ok`` their acks' side effects ran and the entries
    are acknowledged); ``abandoned`` are the others, which stay pending and come back."""

    report: pb.FlushReport
    deliveries: List[Delivery]
    # How many of ``deliveries``, from the first, are the settled ones, when the helper made
    # the event (it lists them first): a slice rather than a pass per access.
    _n_settled: Optional[int] = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.report.ok

    @property
    def settled(self) -> List[Delivery]:
        if self._n_settled is not None:
            return self.deliveries[:self._n_settled]
        return [d for d in self.deliveries if d._sent]

    @property
    def abandoned(self) -> List[Delivery]:
        if self._n_settled is not None:
            return self.deliveries[self._n_settled:]
        return [d for d in self.deliveries if not d._sent]

    @property
    def read_id(self) -> int:
        return self.report.read_id


@dataclass
class Stats:
    opens: int = 0
    reconnects: int = 0
    reads: int = 0
    deliveries: int = 0
    batches: int = 0
    flushes: int = 0
    #: Flush reports that came in the read that rode on their flush (one message for both).
    reports_in_reads: int = 0
    failed_flushes: int = 0
    rejections: int = 0
    outcomes: Dict[str, int] = field(default_factory=dict)


@dataclass
class LifecycleEvent:
    """What happened to a subscription's stream, for ``on_lifecycle``.

    ``kind`` is one of:

    - ``"opened"``: the first stream is open (``opened`` is the sidecar's ``Opened``);
    - ``"resubscribed"``: a later stream is open, after a reconnect (``opened`` as above);
    - ``"draining"``: the sidecar began its graceful shutdown (``draining`` is its
      ``Draining``: the grace and how many deliveries were outstanding). No new deliveries of
      that stream are handed out; those started (handed out by the iteration, or to ``run``'s
      handler) can still be settled within the grace, and once they are the client
      half-closes the stream, so the sidecar ends it at once: the deliveries it read ahead and
      never handed out stay pending and are delivered again, to the next subscription;
    - ``"disconnected"``: the stream ended, or an attempt to open one failed, and the client
      tries again after its backoff (``error`` is the ``grpc.aio.AioRpcError`` it ended with,
      None when the sidecar ended it without one)."""

    kind: str
    opened: Optional[pb.Opened] = None
    draining: Optional[pb.Draining] = None
    error: Optional[BaseException] = None


# --------------------------------------------------------------------------------------------
# One gRPC stream of a subscription


class _Read:
    """One read of a stream: what its deliveries share, and what they wait for."""

    __slots__ = ("sub", "stream", "read_id", "partition", "deliveries", "unsettled", "commands",
                 "outcomes", "settled", "timer", "reported", "done")

    def __init__(self, sub: "Subscription", stream: "_Stream", read_id: int,
                 partition: Optional[int], msgs: Sequence[pb.Delivery]) -> None:
        self.sub = sub
        self.stream = stream
        self.read_id = read_id
        self.partition = partition
        self.reported = False  # a flush report of it came (an ordered read may have several)
        self.done = False  # taken off its stream's reads: its slots are no longer outstanding
        self.deliveries = _deliveries(self, msgs)
        self.unsettled = len(msgs)
        self.commands: List[Any] = []
        self.outcomes: List[Any] = []
        self.settled: List[Delivery] = []  # the deliveries of those outcomes
        self.timer: Optional[asyncio.TimerHandle] = None


_ACK = pb.OUTCOME_KIND_ACK
# The end of a stream's reads (missing from grpc-stubs).
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]
_HALF_CLOSE = object()
_END = object()


class _Extend:
    """An outbox item: slots to extend (``Batch.extend``)."""

    __slots__ = ("slots",)

    def __init__(self, slots: List[int]) -> None:
        self.slots = slots


# How long a new stream waits for the server's headers before it sends its open anyway.
_HEADERS_WAIT = 0.5


class _Stream:
    """One Subscribe call. Slots and read ids are only meaningful on their own stream."""

    def __init__(self, gen: int, call: Any) -> None:
        self.gen = gen
        self.call = call
        self.alive = True
        self.half_closed = False
        self.draining = False  # the sidecar sent Draining: hand nothing more out
        self.opened: Optional[pb.Opened] = None
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.reads: Dict[int, _Read] = {}
        self.unsettled = 0  # delivered on this stream and not settled by the application
        self.handed_unsettled = 0  # of those, handed out by the iterator
        # Made only while a close waits for handed_unsettled to drop to 0: an Event set and
        # cleared around every delivery cost more than the rest of handing it out.
        self.drained: Optional[asyncio.Future[None]] = None

    @property
    def slots(self) -> Dict[int, Delivery]:
        """The deliveries whose read still waits for them, by slot (a slot is never reused
        on a stream). Made when asked for, for the rare lookup by slot (a rejection): kept up
        to date, a map cost an insert and a removal per delivery."""
        return {d.slot: d for rd in self.reads.values() for d in rd.deliveries
                if not d._reported}

    def wake_drained(self) -> None:
        waiter = self.drained
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Batches:
    """What :meth:`Subscription.batches` returns: the subscription's own iteration, which
    hands out a Batch per read once the subscription is batched."""

    __slots__ = ("_sub",)

    def __init__(self, sub: "Subscription") -> None:
        self._sub = sub

    def __aiter__(self) -> "_Batches":
        return self

    def __anext__(self) -> Awaitable[Batch]:
        # The subscription hands out a Batch once it is batched. Not cast(Awaitable[Batch], …):
        # that subscripts a generic and calls cast() at run time, once per read.
        return self._sub.__anext__()  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Subscription


class Subscription:
    """An async iterator of :class:`Delivery` over one subscription, reconnecting as needed.

    Use ``async with client.subscribe(...) as sub: async for d in sub: ...``. Call
    :meth:`stop` (from anywhere, also from a callback) to end the iteration, and
    ``await close()`` to wait until what was settled has been flushed and reported."""

    def __init__(
        self,
        client: "WindowClient",
        open_msg: Any,
        *,
        on_flush: Optional[FlushCallback],
        on_rejection: Optional[RejectionCallback],
        on_lifecycle: Optional[LifecycleCallback] = None,
        linger: Optional[float],
        backoff: Tuple[float, float],
        retry_delay: float = RETRY_DELAY,
        max_retry_delay: float = MAX_RETRY_DELAY,
        rejected_outcome: str = "auto",
        max_attempts: int = MAX_ATTEMPTS,
        on_error: Optional[ErrorCallback] = None,
        close_timeout: float,
        packed_acks: bool = False,
    ) -> None:
        if rejected_outcome not in REJECTED_OUTCOMES:
            raise ValueError(
                f"rejected_outcome is one of {', '.join(REJECTED_OUTCOMES)}, "
                f"not {rejected_outcome!r}"
            )
        self._client = client
        self._open = open_msg
        self._ordered = open_msg.HasField("ordering_key")
        self._is_stream = open_msg.WhichOneof("source") == "stream"
        # A partitioned stream's replica reads each partition it holds within a window of that
        # partition's own: up to max_in_flight each, all on this one stream. What the sidecar
        # says it shares out (Opened.partitions) sets it, not what was asked: a sidecar older
        # than partitions reads the stream itself.
        self._windows = 1
        #: The stream or list key (pub/sub: the channels and patterns), and the group (streams).
        self.stream_key, self.group, self._consumer = _source_names(open_msg)
        self._on_flush = on_flush
        self._on_rejection = on_rejection
        self._on_lifecycle = on_lifecycle
        self._packed_acks = packed_acks
        self._linger = linger
        self._backoff = backoff
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._rejected_outcome = rejected_outcome
        self._max_attempts = max_attempts
        self._on_error = on_error
        self._close_timeout = close_timeout
        # Deliveries to hand out, and the iterator's waiter when there are none. A deque and a
        # future rather than an asyncio.Queue: this is paid per delivery.
        self._ready: collections.deque[Any] = collections.deque()
        # Hands out a Batch per read (batches()) instead of one Delivery at a time.
        self._batched = False
        self._iterated = False  # iterated delivery by delivery
        self._waiter: Optional[asyncio.Future[None]] = None
        # A read's batch was queued for the writer: let it run before the next delivery.
        self._yield_to_writer = False
        self._task: Optional[asyncio.Task[None]] = None
        self._stream: Optional[_Stream] = None
        self._gen = 0
        self._closing = False
        self._stop_event = asyncio.Event()
        self._error: Optional[BaseException] = None
        self._current: Optional[Delivery] = None
        self._drain = True
        self._background: set[asyncio.Task[None]] = set()
        #: The last ``Opened`` message (consumer name and effective settings), or None.
        self.opened: Optional[pb.Opened] = None
        self._opened_event = asyncio.Event()
        # Whether a delivery's span is made current in the iterating task (window_client.sync
        # makes it current in its caller's thread instead).
        self._attach_spans = True
        self.stats = Stats()

    # -- iteration ------------------------------------------------------------------------

    def start(self) -> "Subscription":
        """Starts the subscription (iterating or ``async with`` does it too)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="window-subscription")
        return self

    def __aiter__(self) -> "Subscription":
        if self._batched:
            raise TypeError("this subscription hands out batches: iterate sub.batches()")
        self._iterated = True
        return self.start()

    def batches(self) -> AsyncIterator[Batch]:
        """An async iterator of :class:`Batch`: each read's deliveries handed out together
        (``async for batch in sub.batches(): for d in batch: ...; batch.ack()``) instead of one
        at a time. The same subscription cannot be iterated both ways."""
        if self._iterated:
            raise TypeError("this subscription is already iterated delivery by delivery")
        if not self._batched:
            self._batched = True
            # Reads that came before (``async with`` starts the subscription) are regrouped.
            waiting = list(self._ready)
            self._ready.clear()
            for item in waiting:
                last = self._ready[-1] if self._ready else None
                if item is _END:
                    self._ready.append(item)
                elif isinstance(last, Batch) and last._deliveries[0]._rd is item._rd:
                    last._deliveries.append(item)
                else:
                    rd = item._rd
                    self._ready.append(Batch(self, rd.stream, rd.read_id, [item], rd.partition))
        self.start()
        return _Batches(self)

    async def __anext__(self) -> Delivery:
        if self._current is not None:
            self._leave_current()
        if self._yield_to_writer:
            # Without this the next read, already here, would be handled before the writer
            # task sends this one's batch, and the sidecar's flush would wait for both.
            self._yield_to_writer = False
            await asyncio.sleep(0)
        while True:
            while not self._ready:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            item = self._ready.popleft()
            if item is _END:
                self._ready.appendleft(_END)
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            if self._batched:
                st = item._stream
                if self._closing or not st.alive or st.draining:
                    continue  # as below
                return cast(Delivery, self._hand_out_batch(item))
            st = item._rd.stream
            if self._closing or not st.alive or st.draining:
                # Not handed out: stays outstanding on the sidecar, then pending in Redis, and
                # comes back on the next stream of this consumer name.
                continue
            if tracing.AVAILABLE:
                return self._hand_out(item)
            # What _hand_out does without tracing, inline: this runs for every delivery. (Typed
            # by the assignment rather than cast(), a call at run time.)
            d: Delivery = item
            d._handed = True
            st.handed_unsettled += 1
            return d

    @property
    def partitions(self) -> int:
        """How many partitions of the partitioned stream the sidecar shares out among the
        group's replicas for this subscription (``Opened.partitions``), once it is open
        (:meth:`wait_opened`): 0 before that, on an unpartitioned stream, a list or pub/sub,
        and from a sidecar older than the field, which then reads the stream itself whatever
        ``partitions`` asked for. Its deliveries name their partition
        (:attr:`Delivery.partition`)."""
        opened = self.opened
        return opened.partitions if opened is not None else 0

    async def wait_opened(self, timeout: Optional[float] = None) -> pb.Opened:
        """Starts the subscription and waits until its stream is open (the sidecar's
        ``Opened`` has arrived, so a pub/sub message published from now on reaches it);
        returns that ``Opened``. Raises the subscription's error when it ended before (for
        example ``UNAUTHENTICATED``), ``asyncio.TimeoutError`` after ``timeout`` seconds."""
        task = self.start()._task
        assert task is not None
        if self.opened is None:
            waiter = asyncio.ensure_future(self._opened_event.wait())
            try:
                await asyncio.wait({waiter, task}, timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if self.opened is not None:
            return self.opened
        if self._error is not None:
            raise self._error
        if task.done():
            raise SubscriptionEndedError("the subscription ended before its stream opened")
        raise asyncio.TimeoutError("the subscription's stream did not open in time")

    def _hand_out_all(self, items: Iterable[Any]) -> None:
        self._ready.extend(items)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def __aenter__(self) -> "Subscription":
        return self.start()

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        # Leaving on an exception: don't wait for the delivery that was being handled.
        await self.close(drain=exc_type is None)

    def _hand_out(self, d: Delivery) -> Delivery:
        d._handed = True
        d._rd.stream.handed_unsettled += 1
        if tracing.AVAILABLE:
            self._start_span(d)
            if d._span is not None and self._attach_spans:
                # Current while the loop body handles it: spans the application starts are
                # children. (_current is only the delivery whose span is to be detached.)
                d._span.attach()
                self._current = d
        return d

    def _hand_out_batch(self, batch: Batch) -> Batch:
        deliveries = batch._deliveries
        for d in deliveries:
            d._handed = True
        batch._stream.handed_unsettled += len(deliveries)
        if tracing.AVAILABLE:
            # Each delivery's span is started, none made current: a batch's loop body runs in
            # no one delivery's span (use Delivery.context to make one current).
            for d in deliveries:
                self._start_span(d)
        return batch

    def _start_span(self, d: Delivery) -> None:
        trace = d.trace
        d._span = tracing.start_delivery_span(
            stream=self.stream_key,
            group=self.group,
            consumer=self.opened.consumer if self.opened is not None else self._consumer,
            entry_id=d.entry_id,
            slot=d.slot,
            delivery_count=d.delivery_count,
            traceparent=trace.traceparent if trace is not None else "",
            tracestate=trace.tracestate if trace is not None else "",
        )

    def _leave_current(self) -> None:
        d, self._current = self._current, None
        if d is not None and d._span is not None:
            d._span.detach()

    # -- stopping -------------------------------------------------------------------------

    def stop(self, *, drain: bool = True) -> None:
        """Ends the iteration: no further deliveries are handed out. Deliveries already handed
        out can still be settled (for up to ``close_timeout``; not at all with ``drain=False``);
        then the stream is half-closed, the sidecar flushes what was settled and reports it, and
        the stream ends. Entries read but never handed out stay pending and come back. Safe to
        call from callbacks."""
        if not drain:
            self._drain = False
        if self._closing:
            if not drain and self._stream is not None:
                self._stream.wake_drained()
            return
        self._closing = True
        self._stop_event.set()
        self._hand_out_all((_END,))
        st = self._stream
        if st is not None and st.alive:
            self._spawn(self._half_close(st, self._close_timeout))

    async def close(self, *, drain: bool = True) -> None:
        """:meth:`stop`, then waits until the stream has ended (its flush reports delivered)."""
        self.stop(drain=drain)
        self._leave_current()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self._close_timeout + 5)
        except asyncio.TimeoutError:
            log.warning("subscription did not end in time; cancelling its stream")
            st = self._stream
            if st is not None:
                st.call.cancel()
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass

    async def run(self, handler: Handler) -> None:
        """The handler style of ``async for delivery in sub``: calls ``handler(delivery)``
        (plain or async) for each delivery until :meth:`stop`.

        A delivery the handler returns without settling is acked, so a handler only queues
        commands; one whose handler raised is settled with ``retry_after`` (``retry_delay``,
        doubled per delivery up to ``max_retry_delay``) and the reason ``handler failed:
        <error>``: never lost, and with ``max_deliveries`` and ``dead_letter`` a poison entry
        ends in the dead letter. Raises :class:`SubscriptionEndedError` when the subscription
        ends for good."""
        async for d in self:
            try:
                result = handler(d)
                # None (a plain handler) first: isawaitable() is an ABC check per delivery.
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception as err:  # noqa: BLE001 - the entry comes back; the loop goes on
                self._handler_failed(d, err)
                continue
            self._handler_returned(d)

    @property
    def has_dead_letter(self) -> bool:
        """True when the subscription has a dead-letter target (``max_deliveries`` with
        ``dead_letter``): :meth:`Delivery.dead_letter` needs one."""
        return self._open.dead_letter.WhichOneof("target") is not None

    def retry_delay(self, delivery_count: int) -> float:
        """The delay of the client's own ``retry_after`` for a delivery with this count:
        ``retry_delay`` doubled per earlier delivery, at most ``max_retry_delay``."""
        n = max(delivery_count, 1) - 1
        return min(self._max_retry_delay, self._retry_delay * (2.0 ** min(n, 62)))

    def _handler_failed(self, d: Delivery, err: BaseException) -> None:
        """The rule for a failed handler: retry_after (the growing delay), "handler failed: …"."""
        log.warning("handler failed on %s", d.entry_id, exc_info=err)
        if not d.settled:
            d.retry_after(self.retry_delay(d.delivery_count), f"handler failed: {err!r}")

    def _handler_returned(self, d: Delivery) -> None:
        """What a handler leaves unsettled is acked."""
        if not d.settled:
            d.ack()

    async def _half_close(self, st: _Stream, timeout: float) -> None:
        """Waits (up to ``timeout``) until the deliveries handed out on ``st`` are settled,
        sends what is settled and half-closes the stream: the sidecar flushes it, reports and
        ends the stream; what has no outcome stays pending and comes back. Used by :meth:`stop`
        and when the sidecar drains (``timeout`` its grace)."""
        if st.handed_unsettled and self._drain and st.drained is None:
            st.drained = asyncio.get_running_loop().create_future()
        if st.drained is not None:
            try:
                await asyncio.wait_for(asyncio.shield(st.drained), timeout)
            except asyncio.TimeoutError:
                log.warning(
                    "closing with %d unsettled deliveries: they stay pending and come back",
                    st.handed_unsettled,
                )
        if not st.alive or st.half_closed:
            return
        for rd in list(st.reads.values()):
            self._send(st, rd)
        st.half_closed = True
        st.outbox.put_nowait(_HALF_CLOSE)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- settling and batching ------------------------------------------------------------

    def _settled(self, d: Delivery, kind: str, outcome: Any) -> None:
        rd = d._rd
        st = rd.stream
        counts = self.stats.outcomes
        counts[kind] = counts.get(kind, 0) + 1
        if d._span is not None:
            d._span.end(kind)
        if d.rejection is not None:
            # A second outcome after the sidecar refused the first: the slot is still open.
            d.rejection = None
            if st.alive and not st.half_closed:
                st.outbox.put_nowait((list(d._commands), [outcome], [d]))
            return
        # What _settle_all does for a batch of plain acks: this runs for every delivery settled.
        if d._handed:
            st.handed_unsettled -= 1
            if st.handed_unsettled == 0 and st.drained is not None:
                st.wake_drained()
        if not st.alive or st.half_closed:
            log.debug(
                "delivery %s settled after its stream ended: the entry will be delivered again",
                d.entry_id,
            )
            return
        if rd.done:
            log.debug(
                "delivery %s settled after the sidecar abandoned it: it will be delivered again",
                d.entry_id,
            )
            return
        st.unsettled -= 1
        if d._commands:
            rd.commands += d._commands
        rd.outcomes.append(outcome)
        rd.settled.append(d)
        rd.unsettled -= 1
        self._read_settled(st, rd)

    def _read_settled(self, st: _Stream, rd: _Read) -> None:
        """Deliveries of ``rd`` were settled: send them now, or when the rest is."""
        if rd.unsettled == 0 or st.draining or self._ordered:
            # Draining: the grace is running, nothing waits for the rest of the read. Ordered:
            # a key's next entry waits in the sidecar for this one's flush.
            self._send(st, rd)
        elif rd.timer is None and self._linger is not None:
            rd.timer = asyncio.get_running_loop().call_later(self._linger, self._send, st, rd)

    def _settle_all(self, batch: Batch, kind: str, reason: str = "") -> None:
        """Settles every open delivery of ``batch`` with ``kind``: what :meth:`_settled` does
        per delivery, once per batch for plain acks (the usual end of a batch)."""
        pending = [d for d in batch._deliveries if d.outcome is None]
        if not pending:
            return
        if kind != "ack" or [d for d in pending if d._span is not None or d.rejection is not None]:
            for d in pending:
                if kind == "ack":
                    d.ack()
                else:
                    getattr(d, kind)(reason)
            return
        # Plain acks: what _settled does per delivery, for all of them at once.
        n = len(pending)
        stats = self.stats.outcomes
        stats["ack"] = stats.get("ack", 0) + n
        handed = 0
        commands: List[Any] = []
        for d in pending:
            d.outcome = "ack"
            handed += d._handed
            if d._commands:
                commands += d._commands
        st = batch._stream
        if handed:
            st.handed_unsettled -= handed
            if st.handed_unsettled == 0 and st.drained is not None:
                st.wake_drained()
        if not st.alive or st.half_closed:
            log.debug("%d deliveries of read %d settled after their stream ended: they will be "
                      "delivered again", n, batch.read_id)
            return
        rd = pending[0]._rd
        if rd.done:
            log.debug("%d deliveries of read %d settled after the sidecar abandoned them: they "
                      "will be delivered again", n, batch.read_id)
            return
        st.unsettled -= n
        rd.commands += commands
        rd.outcomes += [(d.slot, _ACK, None) for d in pending]
        rd.settled += pending
        rd.unsettled -= n
        self._read_settled(st, rd)

    def _in_progress(self, d: Delivery) -> None:
        st = d._rd.stream
        if st.alive and not st.half_closed and not d._rd.done:
            st.outbox.put_nowait(_Extend([d.slot]))

    def _send(self, st: _Stream, rd: _Read) -> None:
        if rd.timer is not None:
            rd.timer.cancel()
            rd.timer = None
        if not (rd.commands or rd.outcomes) or not st.alive or st.half_closed:
            return
        # Commands, outcomes and the deliveries the outcomes settle (marked sent by the writer).
        st.outbox.put_nowait((rd.commands, rd.outcomes, rd.settled))
        rd.commands, rd.outcomes, rd.settled = [], [], []
        self._yield_to_writer = True

    async def _writer(self, st: _Stream) -> None:
        try:
            while True:
                item = await st.outbox.get()
                if item is _HALF_CLOSE:
                    await st.call.done_writing()
                    return
                if isinstance(item, pb.SubscribeRequest):
                    await st.call.write(item)
                    continue
                commands: List[Any]
                outcomes: List[Any]
                settled: List[Delivery]
                extend: List[int] = []
                if isinstance(item, _Extend):
                    commands, outcomes, settled = [], [], []
                    extend += item.slots
                else:
                    # The lists are the writer's (_send made its read new ones): extended in
                    # place.
                    commands, outcomes, settled = item
                half = False
                # Whatever else is waiting goes in the same message: commands first, then
                # outcomes, as the sidecar applies them.
                while not st.outbox.empty():
                    item = st.outbox.get_nowait()
                    if item is _HALF_CLOSE:
                        half = True
                        break
                    if isinstance(item, pb.SubscribeRequest):  # never after the open
                        raise RuntimeError("an unexpected request in a stream's outbox")
                    if isinstance(item, _Extend):
                        extend += item.slots
                    else:
                        commands += item[0]
                        outcomes += item[1]
                        settled += item[2]
                # Built in place: constructing each message first and then the batch from them
                # would copy every one (upb), nearly twice the cost per delivery. Fields set one
                # by one rather than as keywords, and a single argument appended rather than a
                # list extended: a fifth less per command (upb).
                request = pb.SubscribeRequest()
                batch = request.batch
                batch.SetInParent()
                if commands and st.opened is not None and st.opened.packed_commands:
                    # A sidecar that reads them: one bytes field for all of them.
                    batch.packed_commands, packed_slots = _pack(commands)
                    batch.packed_command_slots.extend(packed_slots)
                else:
                    add_command = batch.commands.add
                    for slot, name, args in commands:
                        command = add_command()
                        command.slot = slot
                        command.name = name
                        if len(args) == 1:
                            command.args.append(args[0])
                        elif args:
                            command.args.extend(args)
                if extend:
                    batch.extend.extend(extend)
                acks = (
                    [slot for slot, kind, extra in outcomes if kind == _ACK and not extra]
                    if self._packed_acks
                    else []
                )
                if outcomes and len(acks) == len(outcomes):
                    # All plain acks (the usual batch): one packed field, filled in one call.
                    batch.acks.extend(acks)
                else:
                    add_outcome = batch.outcomes.add
                    for slot, kind, extra in outcomes:
                        if extra:
                            add_outcome(slot=slot, kind=kind, **extra)
                        else:
                            add_outcome(slot=slot, kind=kind)
                for d in settled:
                    d._sent = True
                await st.call.write(request)
                self.stats.batches += 1
                if half:
                    await st.call.done_writing()
                    return
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the reader sees the stream's status
            log.debug("writer of stream %d stopped: %r", st.gen, err)

    # -- the stream loop ------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        try:
            await _load_redis_commands()
            while not self._closing:
                opened_before = self.stats.opens
                error: Optional[grpc.aio.AioRpcError] = None
                try:
                    await self._session()
                    if self._closing:
                        break
                    log.warning("the sidecar ended the subscription stream; resubscribing")
                except grpc.aio.AioRpcError as err:
                    if self._closing and err.code() in (
                        grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.UNAVAILABLE,
                    ):
                        break
                    if err.code() not in RETRYABLE:
                        log.error("subscription failed: %s: %s", err.code().name, err.details())
                        await self._end(err, attempt + 1)
                        break
                    if transport_failure(err):
                        # Redis or an HTTP server at the address: no retry fixes that.
                        explained = await explain(err, self._client.target,
                                                  call="the subscription",
                                                  tls=self._client.tls is not None)
                        if not_the_sidecar(explained):
                            await self._end(err, attempt + 1, explained)
                            break
                    error = err
                    st = self._stream
                    reads = st.reads.values() if st is not None else ()
                    lost = [d for rd in reads for d in rd.deliveries if not d._sent]
                    held = sum(1 for d in lost if d.outcome is not None)
                    log.warning(
                        "subscription stream ended with %s (%s); %d deliveries without an "
                        "outcome on the sidecar (%d settled here but not sent yet) stay pending "
                        "and come back; resubscribing",
                        err.code().name,
                        err.details(),
                        len(lost),
                        held,
                    )
                except Exception as err:  # noqa: BLE001 - a bug: end the iteration with it
                    log.exception("subscription failed")
                    self._error = err
                    break
                finally:
                    self._lose_stream()
                if self._closing:
                    break
                if self.stats.opens > opened_before:
                    attempt = 0  # that stream opened: the backoff starts over
                await self._lifecycle(LifecycleEvent("disconnected", error=error))
                attempt += 1
                if self._max_attempts and attempt >= self._max_attempts and error is not None:
                    await self._end(error, attempt)
                    break
                base, cap = self._backoff
                delay = min(cap, base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                try:
                    await asyncio.wait_for(self._stop_event.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                self.stats.reconnects += 1
        except asyncio.CancelledError:
            self._lose_stream()
            raise
        finally:
            self._hand_out_all((_END,))

    async def _end(
        self, err: grpc.aio.AioRpcError, attempts: int, known: Optional[WindowError] = None
    ) -> None:
        """Ends the subscription for good with a SubscriptionEndedError made of ``err``, the
        last attempt's, and hands it to ``on_error``."""
        explained = known or await explain(err, self._client.target, call="the subscription",
                                           tls=self._client.tls is not None)
        what = f"the subscription to {self.stream_key or 'its source'}"
        why = str(explained)
        if err.code() in RETRYABLE and attempts > 1:
            message = f"{what} ended after {attempts} failed attempts: {why}"
        else:
            message = f"{what} ended: {why}"
        ended = SubscriptionEndedError(
            message, status=err.code(), details=err.details() or "", attempts=attempts,
            cause=explained,
        )
        log.error("%s", message)
        self._error = ended
        await self._report(ended)

    async def _report(self, err: WindowError) -> None:
        if self._on_error is not None:
            await _call(self._on_error, err)

    async def _lifecycle(self, event: LifecycleEvent) -> None:
        if self._on_lifecycle is not None:
            await _call(self._on_lifecycle, event)

    async def _session(self) -> None:
        self._gen += 1
        call = self._client.stub.Subscribe(metadata=self._client.metadata)
        st = _Stream(self._gen, call)
        self._stream = st
        st.outbox.put_nowait(pb.SubscribeRequest(open=self._open))
        # The open goes out once the sidecar has answered with the call's headers. A sidecar
        # that refuses the call (no token, too many subscriptions) answers with its status at
        # once and resets the stream; a request written into that reset makes grpcio report
        # INTERNAL "Internal error from Core" instead of the status (about one refusal in six
        # here). The sidecar sends its headers at once; a server or proxy that holds them
        # until its first message gets the open after a short wait instead of never.
        try:
            await asyncio.wait_for(asyncio.shield(call.initial_metadata()), _HEADERS_WAIT)
        except asyncio.TimeoutError:
            pass
        writer = asyncio.get_running_loop().create_task(self._writer(st))
        if self._closing:
            self._spawn(self._half_close(st, self._close_timeout))
        try:
            while True:
                msg = await call.read()
                if msg is _EOF:
                    return
                kind = msg.WhichOneof("kind")
                if kind == "opened":
                    self._opened(st, msg.opened)
                    await self._lifecycle(LifecycleEvent(
                        "opened" if self.stats.opens == 1 else "resubscribed", opened=msg.opened
                    ))
                elif kind == "read":
                    read = msg.read
                    if read.HasField("flushed"):
                        # The flush this read rode on (Open.reports_in_reads): an earlier read's.
                        self.stats.reports_in_reads += 1
                        await self._flushed(st, read.flushed)
                    self._read(st, read)
                elif kind == "flush":
                    await self._flushed(st, msg.flush)
                elif kind == "rejections":
                    await self._rejected(st, msg.rejections)
                elif kind == "draining":
                    await self._draining(st, msg.draining)
        finally:
            writer.cancel()

    async def _draining(self, st: _Stream, draining: pb.Draining) -> None:
        """The sidecar is shutting down: no more reads come on this stream, and what is settled
        within the grace is still flushed. Nothing more of this stream is handed out; what is
        settled goes out now, and what the application settles later as soon as it is settled,
        rather than at the end of its read. Once every delivery the application started (was
        handed) is settled, or the grace is over, the stream is half-closed: the sidecar then
        ends the subscription at once instead of waiting out its grace for the deliveries the
        client holds and will never hand out (they stay pending and are delivered again, to the
        next subscription), and the subscription resubscribes, to the next sidecar."""
        grace = draining.grace.ToNanoseconds() / 1e9 if draining.HasField("grace") else 0.0
        log.info(
            "the sidecar is draining (%d outstanding, grace %.1f s, %d started here): sending "
            "settled outcomes now, handing out nothing more, half-closing once the started "
            "ones are settled",
            draining.outstanding, grace, st.handed_unsettled,
        )
        st.draining = True
        for rd in list(st.reads.values()):
            self._send(st, rd)
        if st.alive and not st.half_closed:
            # A drain without a grace (none given) is bounded by close_timeout instead.
            self._spawn(self._half_close(st, grace if grace > 0 else self._close_timeout))
        await self._lifecycle(LifecycleEvent("draining", draining=draining))

    def _opened(self, st: _Stream, opened: pb.Opened) -> None:
        st.opened = opened
        self.opened = opened
        self._windows = max(1, opened.partitions)
        self._opened_event.set()
        self.stats.opens += 1
        log.info(
            "%s as consumer %r on %s/%s (count %d, max in flight %d, mode %s, %s)",
            "subscribed" if self.stats.opens == 1 else "resubscribed",
            opened.consumer,
            self.stream_key,
            self.group,
            opened.count,
            opened.max_in_flight,
            pb.Mode.Name(opened.mode),
            opened.subscription_id,
        )

    def _read(self, st: _Stream, read: pb.Read) -> None:
        msgs = read.deliveries
        if not msgs:
            return
        read_id = read.read_id  # a message field: read once, not once per delivery
        partition = read.partition if read.HasField("partition") else None
        rd = _Read(self, st, read_id, partition, msgs)
        deliveries = rd.deliveries
        limit = st.opened.max_in_flight * self._windows if st.opened is not None else 0
        if limit and st.unsettled + len(deliveries) > limit:
            # The sidecar only reads while fewer than max_in_flight (per partition) are out.
            log.warning(
                "read %d has %d deliveries with %d unsettled: more than max_in_flight %d",
                read.read_id, len(deliveries), st.unsettled, limit,
            )
        st.unsettled += len(deliveries)
        st.reads[read_id] = rd
        self.stats.reads += 1
        self.stats.deliveries += len(deliveries)
        if self._closing:
            return  # not handed out: abandoned on close, delivered again later
        if self._batched:
            self._hand_out_all((Batch(self, st, read_id, deliveries, partition),))
        else:
            self._hand_out_all(deliveries)

    async def _flushed(self, st: _Stream, report: Any) -> None:
        """A flush report. An ordered subscription's read may be flushed in parts (a settled
        delivery whose key has a later entry waiting goes ahead of the rest of its read), so a
        read can have several reports: each covers the read's deliveries sent since the last
        one, and the read is done once all of them were sent (or, the stream closing, the
        sidecar abandoned the rest)."""
        rd = st.reads.get(report.read_id)
        deliveries: List[Delivery] = []
        sent = retried = 0
        whole = False
        if rd is not None:
            first = not rd.reported
            rd.reported = True
            # One pass: the sent deliveries not reported before are reported now; the rest
            # (neither sent nor reported) is what the read still waits for.
            rest: List[Delivery] = []
            for d in rd.deliveries:
                if d._reported:
                    continue
                if d._sent:
                    d._reported = True
                    deliveries.append(d)
                else:
                    rest.append(d)
            sent = len(deliveries)
            part = self._ordered and st.alive and not st.half_closed and bool(rest)
            if not part:
                # Done: every delivery was sent, or the rest is abandoned (close, drain).
                del st.reads[report.read_id]
                rd.done = True
                # Each delivery names its read and the read its deliveries: with that cycle
                # broken they are freed with their last reference, not by a run of the cyclic
                # GC (left to it, these deliveries cost more than eager ones did).
                rd.deliveries = []
                whole = first
                if rd.timer is not None:
                    rd.timer.cancel()
                    rd.timer = None
                for d in rest:
                    if d.outcome is None:
                        st.unsettled -= 1  # abandoned by the sidecar (drain or close)
                deliveries.extend(rest)
        self.stats.flushes += 1
        if whole and not self._ordered and report.settles != sent:
            # A retry kept in place settles nothing: every retry of a stream (unless it went
            # to the dead letter at max_deliveries), and on an ordered subscription a keyed
            # entry's. (Counted only here: as many settles as outcomes is the usual report.)
            if self._is_stream:
                retried = sum(1 for d in deliveries[:sent]
                              if d.outcome in ("retry", "retry_after"))
            if not sent - retried <= report.settles <= sent:
                log.warning(
                    "flush of read %d settled %d entries, but %d outcomes were sent for it",
                    report.read_id, report.settles, sent,
                )
        if not report.ok:
            self.stats.failed_flushes += 1
            log.warning(
                "flush of read %d failed: %s (%d failed, settle failed: %s)",
                report.read_id, report.error, report.failed, report.settle_failed,
            )
        else:
            log.debug(
                "flushed read %d: kept %d dropped %d commands %d settles %d",
                report.read_id, report.segments_kept, report.segments_dropped,
                report.commands, report.settles,
            )
        if self._on_flush is not None:
            await _call(self._on_flush, FlushEvent(report, deliveries, sent))
        if report.side_effect_failures or report.requeue_refused:
            await self._flush_errors(report, deliveries)

    async def _flush_errors(self, report: Any, deliveries: List[Delivery]) -> None:
        """What a flush report says Redis refused, each as an error for ``on_error``: a side
        effect that failed when it ran (:class:`SideEffectError`) and a retry, retry_after or
        dead letter Redis did not write (:class:`RequeueRefusedError`)."""
        by_slot = {d.slot: d for d in deliveries}
        errors: List[WindowError] = []
        for f in report.side_effect_failures:
            errors.append(SideEffectError(
                slot=f.slot, entry_id=f.entry_id, command=f.command, error=f.error,
                settled=f.settled, delivery=by_slot.get(f.slot),
            ))
        for r in report.requeue_refused:
            d = by_slot.get(r.slot) if r.slot else None
            errors.append(RequeueRefusedError(
                slot=r.slot, entry_id=r.entry_id, error=r.error,
                outcome=d.outcome if d is not None else None, delivery=d,
            ))
        for error in errors:
            log.warning("%s", error.message)
            await self._report(error)

    async def _rejected(self, st: _Stream, rejections: pb.Rejections) -> None:
        """The rule for a refused command or outcome: the delivery is never acked without its
        command; the client settles it as ``rejected_outcome`` says and hands ``on_error`` a
        :class:`RejectedError`.

        A batch carries a delivery's commands and its outcome together, so a refused command
        comes back with its ack refused as ``INCOMPLETE_SEGMENT`` (the slot stays open): the
        client then settles it again, by the command's rejection: with ``"auto"`` dead-lettered
        (or, without a dead-letter target, dropped) for a reason no retry fixes
        (:data:`UNFIXABLE`), else ``retry_after`` with the growing delay. A drop or retry the
        application gave with a refused command stands.

        An outcome refused ``ALREADY_SETTLED`` (on a partitioned stream: its partition was
        handed over, or fenced, before the outcome came) is not settled again: the entry is the
        partition's new reader's, and no flush report will name the slot, so the delivery is
        done for its read here (:meth:`_unreported`)."""
        reported: List[RejectedError] = []
        slots = st.slots  # made once for all of them: a partition handed over refuses a window
        for rej in rejections.rejections:
            self.stats.rejections += 1
            d = slots.get(rej.slot)
            reason = _reason_name(rej.reason)
            message = _ADVICE.sub("", rej.message).strip()
            if d is not None and rej.command:
                if d._refused is None:
                    refused = RejectedError(
                        f"the sidecar refused {rej.command} of entry {d.entry_id} "
                        f"(slot {rej.slot}): {reason}: {message}",
                        reason=reason, slot=rej.slot, command=rej.command, delivery=d,
                    )
                    d._refused = (rej, refused)
                    reported.append(refused)
                else:
                    log.debug("sidecar also refused %s of slot %d (%s): %s",
                              rej.command, rej.slot, reason, message)
            elif d is not None and rej.reason in _RESETTLE and st.alive and not st.half_closed:
                # The slot is still open on the sidecar: it needs another outcome.
                cause = d._refused[0] if d._refused is not None else rej
                cause_reason = _reason_name(cause.reason)
                cause_message = _ADVICE.sub("", cause.message).strip()
                d.rejection = rej
                d.outcome = None
                d._sent = False
                d._commands = []
                policy = self._rejected_outcome
                unfixable = policy == "auto" and cause_reason in UNFIXABLE
                why = f"rejected: {cause_reason}: {cause_message}"
                if unfixable and self.has_dead_letter:
                    d.dead_letter(why)
                elif policy == "drop" or unfixable:
                    d.drop(why)
                else:
                    d.retry_after(self.retry_delay(d.delivery_count), why)
                error = d._refused[1] if d._refused is not None else None
                if error is None:
                    error = RejectedError(
                        f"the sidecar refused the outcome of entry {d.entry_id} "
                        f"(slot {rej.slot}): {reason}: {message}",
                        reason=reason, slot=rej.slot, delivery=d,
                    )
                    reported.append(error)
                error.outcome = d.outcome
                error.message = f"{error.message}; the client settled it with {d.outcome}"
                error.args = (error.message,)
            elif d is None or not rej.command:
                if (d is not None and rej.reason == pb.REJECTION_REASON_ALREADY_SETTLED
                        and d._sent and not d._reported):
                    self._unreported(st, d)
                    del slots[d.slot]
                log.warning("sidecar refused an outcome for slot %d (%s): %s",
                            rej.slot, reason, message)
            if self._on_rejection is not None:
                await _call(self._on_rejection, rej, d)
        for error in reported:
            log.warning("%s", error.message)
            await self._report(error)

    def _unreported(self, st: _Stream, d: Delivery) -> None:
        """The sidecar answered ``d``'s outcome ALREADY_SETTLED: the slot is no longer outstanding
        there (its partition was handed over to another replica, or fenced itself), so no flush
        report will ever name it, and its entry is delivered again by the partition's new
        reader. It is done for its read as a reported delivery is; once every delivery of the
        read is, the read is dropped as its last report would have dropped it. Nothing else
        waits for it: its outcome already took it off the unsettled counts."""
        d._reported = True
        rd = d._rd
        if rd.done or not all(x._reported for x in rd.deliveries):
            return
        del st.reads[rd.read_id]
        rd.done = True
        rd.deliveries = []  # breaks the cycle through its deliveries, as in _flushed
        if rd.timer is not None:
            rd.timer.cancel()
            rd.timer = None

    def _lose_stream(self) -> None:
        st = self._stream
        if st is None or not st.alive:
            return
        st.alive = False
        st.wake_drained()
        for rd in st.reads.values():
            if rd.timer is not None:
                rd.timer.cancel()
            for d in rd.deliveries:
                if d.outcome is None and d._span is not None:
                    d._span.end("abandoned", "the subscription stream ended before an outcome")


async def _awaited(rpc: Any) -> Any:
    """A gRPC call as a coroutine, for asyncio.wait."""
    return await rpc


async def _call(fn: Callable[..., Any], *args: Any) -> None:
    try:
        result = fn(*args)
        if result is not None and inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001 - a callback must not end the subscription
        log.exception("callback %r failed", fn)


# --------------------------------------------------------------------------------------------
# Client


class WindowClient:
    """A channel to the sidecar: :meth:`publish` (and :meth:`publish_list`,
    :meth:`publish_channel`), the ``subscribe*`` methods and :meth:`consume`.

    ``target`` is any grpcio target (``HOST:PORT``, ``unix:/path/to.sock``); default: env
    ``WINDOW_SIDECAR_ADDR``, else ``127.0.0.1:50051``. ``token`` is the bearer token every call
    carries as ``authorization: Bearer <token>`` (default: env ``WINDOW_SIDECAR_TOKEN``; none
    when empty), for a sidecar started with ``--auth-token-file``. ``tls`` is a
    :class:`TLSConfig`, ``True`` (TLS with the system's roots) or ``False`` (plaintext); by
    default it comes from the environment (:meth:`TLSConfig.from_env`: TLS when
    ``WINDOW_SIDECAR_TLS_CA`` is set). ``channel`` replaces all of that with a channel of the
    caller's own. ``connect_timeout`` (seconds) bounds how long a call waits to reach the
    sidecar before it fails with :class:`~window_client.ConnectionError`, which names the
    address and the cause."""

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        channel: Optional[grpc.aio.Channel] = None,
        options: Sequence[Tuple[str, Any]] = (),
        token: Optional[str] = None,
        tls: Union[TLSConfig, bool, None] = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.target = target or os.environ.get(ADDR_ENV) or DEFAULT_TARGET
        self.connect_timeout = connect_timeout
        problem = address_problem(self.target) if channel is None else None
        if problem is not None:
            raise ConnectionError(self.target, problem, status=None)
        if tls is None:
            tls = TLSConfig.from_env()
        elif tls is True:
            tls = TLSConfig()
        #: The TLS configuration of the channel (None: plaintext).
        self.tls: Optional[TLSConfig] = tls or None
        if channel is None:
            channel_options = [
                # Reconnect quickly after a sidecar restart.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2000),
                *(self.tls.channel_options() if self.tls is not None else ()),
                *options,
            ]
            if self.tls is not None:
                channel = grpc.aio.secure_channel(
                    self.target, self.tls.credentials(), options=channel_options
                )
            else:
                channel = grpc.aio.insecure_channel(self.target, options=channel_options)
        self._channel = channel
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        #: The metadata sent with every call (the bearer token, when there is one).
        self.metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self.stub: Any = pb_grpc.WindowServiceStub(self._channel)

    async def __aenter__(self) -> "WindowClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def publish(
        self,
        stream: str,
        entries: Iterable[Entry],
        *,
        max_len: int = 0,
        partitions: int = 0,
        partition_header: Optional[str] = None,
        partition_field: Optional[str] = None,
        timeout: float = 30.0,
        inject_trace: bool = True,
    ) -> List[str]:
        """Appends entries to a stream in one call and returns their ids. An entry is a payload
        (bytes or str, JSON-encoded if it is a dict without a ``payload`` key), a dict with
        ``payload``, ``headers`` and ``trace`` (``{"traceparent": ..., "tracestate": ...}``),
        or a ``PublishEntry``. With ``inject_trace`` the current OpenTelemetry context is
        attached to entries that carry none. Waits up to ``connect_timeout`` for the sidecar
        to be reachable, then raises :class:`~window_client.ConnectionError`; it is never
        retried after it was sent, since XADD is not idempotent (any other failure raises
        :class:`~window_client.WindowError` with the call's status). ``timeout`` bounds the
        whole call. ``max_len`` trims the stream to about that many entries.

        ``partitions`` (0: the stream itself) publishes to the partitioned stream ``stream``
        (see :meth:`subscribe`), with ``partition_header`` (a header of the entries) or
        ``partition_field`` (a field as stored): exactly one of the two, naming where each
        entry's key is, the same key the subscriptions order by. Each entry goes to its key's
        partition, ``stream:{n}`` (n: the 32-bit FNV-1a hash of the key's bytes modulo
        ``partitions``), so a key's entries stay in one partition in the order published;
        entries without the key take turns. ``max_len`` then trims each partition."""
        request = pb.PublishRequest(stream=stream, max_len=max_len)
        _partition_by(request, partitions, partition_header, partition_field)
        response = await self._publish(request, entries, timeout, inject_trace)
        return list(response.ids)

    async def publish_list(
        self,
        key: str,
        entries: Iterable[Entry],
        *,
        framing: Optional[str] = None,
        timeout: float = 30.0,
        inject_trace: bool = True,
    ) -> None:
        """Pushes entries onto a list (LPUSH, where list subscriptions read them in order), the
        entries as for :meth:`publish`. ``framing``: ``"frames"`` (the default: an entry with
        headers or a trace context is written as a frame that carries them) or ``"raw"`` (the
        payload alone; headers are refused)."""
        await self._publish(
            pb.PublishRequest(list=key, framing=_framing(framing)),
            entries,
            timeout,
            inject_trace and framing != "raw",
        )

    async def publish_channel(
        self,
        channel: str,
        entries: Iterable[Entry],
        *,
        sharded: bool = False,
        framing: Optional[str] = None,
        timeout: float = 30.0,
        inject_trace: bool = True,
    ) -> List[int]:
        """Publishes entries on a pub/sub channel (PUBLISH; ``sharded``: SPUBLISH on a sharded
        channel), the entries and ``framing`` as for :meth:`publish_list`; returns how many
        subscribers received each entry."""
        request = (
            pb.PublishRequest(sharded_channel=channel, framing=_framing(framing))
            if sharded
            else pb.PublishRequest(channel=channel, framing=_framing(framing))
        )
        response = await self._publish(
            request, entries, timeout, inject_trace and framing != "raw"
        )
        return list(response.receivers)

    async def _publish(
        self,
        request: pb.PublishRequest,
        entries: Iterable[Entry],
        timeout: float,
        inject_trace: bool,
    ) -> pb.PublishResponse:
        current = tracing.current_trace() if inject_trace else {}
        msgs = []
        for entry in entries:
            if isinstance(entry, pb.PublishEntry):
                msg = entry
            elif isinstance(entry, (bytes, str)):
                msg = pb.PublishEntry(payload=_arg(entry))
            elif isinstance(entry, dict) and "payload" in entry:
                msg = pb.PublishEntry(
                    payload=_arg(entry["payload"]),
                    headers=dict(entry.get("headers") or {}),
                )
                if entry.get("trace"):
                    msg.trace.CopyFrom(pb.TraceContext(**entry["trace"]))
            elif isinstance(entry, dict):
                msg = pb.PublishEntry(payload=json.dumps(entry).encode())
            else:
                raise TypeError(f"unsupported entry type {type(entry).__name__}")
            if current and not msg.HasField("trace"):
                msg.trace.CopyFrom(pb.TraceContext(**current))
            msgs.append(msg)
        request.entries.extend(msgs)
        response: pb.PublishResponse = await self._unary(self.stub.Publish, request, timeout)
        return response

    async def _unary(self, method: Any, request: Any, timeout: float, call: str = "publish") -> Any:
        """One unary call, failing fast: a refused connection (nothing listens at the target)
        fails it at once; a connection that is neither made nor refused is waited for
        ``connect_timeout``; any other failure of a call that could not connect (it never
        left the client) is tried again until then. Reaching the sidecar is bounded by
        ``connect_timeout``, its answer by ``timeout`` alone (longer than the sidecar's
        ``--redis-timeout``, so that the sidecar's own answer about Redis arrives). Then, or on
        any other failure, the library's error (never retried once sent)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        connect_by = loop.time() + min(self.connect_timeout, timeout)
        pause = 0.05
        while True:
            ready = self._channel.get_state(True) == grpc.ChannelConnectivity.READY
            rpc = method(
                request,
                timeout=max(0.001, end - loop.time()),
                wait_for_ready=False,
                metadata=self.metadata,
            )
            try:
                if ready:
                    return await rpc
                answer = asyncio.ensure_future(_awaited(rpc))
                done, _ = await asyncio.wait({answer}, timeout=max(0.0, connect_by - loop.time()))
                if not done and self._channel.get_state() != grpc.ChannelConnectivity.READY:
                    # Neither made nor refused within connect_timeout.
                    rpc.cancel()
                    answer.cancel()
                    seen = await probe(self.target, tls=self.tls is not None)
                    raise ConnectionError(
                        self.target,
                        seen or f"no connection within {self.connect_timeout:g} s",
                        status=grpc.StatusCode.DEADLINE_EXCEEDED,
                    ) from None
                return await answer
            except grpc.aio.AioRpcError as err:
                cause = unreachable_cause(err)
                if cause is not None and cause not in _REFUSED and "TLS" not in cause:
                    # Something answers there that is not the sidecar: say what, at once.
                    seen = await probe(self.target, tls=self.tls is not None)
                    if seen is not None:
                        raise ConnectionError(self.target, seen,
                                              details=err.details() or "") from None
                    if loop.time() + pause < connect_by:
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 0.5)
                        continue
                raise await explain(err, self.target, call=call, timeout=timeout,
                                    tls=self.tls is not None) from None

    def subscribe(
        self,
        stream: str,
        group: str,
        *,
        consumer: str = "",
        start_id: str = "",
        min_idle: Optional[float] = None,
        partitions: int = 0,
        **options: Any,
    ) -> Subscription:
        """A subscription to ``stream`` in consumer group ``group`` (at least once).

        ``consumer`` should be stable per replica (a restarted worker gets its own pending
        entries back first); empty means the sidecar's ``--consumer-name``. ``start_id`` is
        where a new group starts ("0", the default, or "$"); entries pending longer than
        ``min_idle`` seconds on another consumer are claimed. ``options`` are those of every
        source, see :meth:`_subscription`; ``dead_letter`` names a stream here.

        ``partitions`` (0: the stream itself) reads the partitioned stream ``stream``: its
        partitions are the streams ``stream:{0}`` … ``stream:{partitions-1}``, which the
        group's subscriptions that open it with the same number share out among themselves,
        each partition read by one of them at a time and handed over as replicas come and go
        (``consumer`` names this replica among them, so give each its own). With
        ``ordering_header`` or ``ordering_field`` a key's entries are then delivered one at a
        time across the whole group, not only within this subscription, provided the producer
        put them in one partition by that key (:meth:`publish` with ``partitions``). The
        deliveries of every partition this replica reads come through this one
        subscription."""
        src = pb.StreamSource(
            key=stream, group=group, consumer=consumer, start_id=start_id,
            partitions=_partitions(partitions),
        )
        if min_idle is not None:
            src.min_idle.CopyFrom(_duration(min_idle))
        return self._subscription(pb.Open(stream=src), **options)

    def subscribe_reliable_list(
        self,
        key: str,
        *,
        consumer: str = "",
        dead_after: Optional[float] = None,
        framing: Optional[str] = None,
        **options: Any,
    ) -> Subscription:
        """A list read reliably (at least once): a read moves entries to the consumer's
        processing list, which a restarted ``consumer`` gets back first; a consumer silent for
        ``dead_after`` seconds (default 30) is dead and its entries go back to ``key``.
        ``dead_letter`` names a list here. ``framing``: ``"frames"`` (the default: a value
        that is a frame is delivered as its payload and headers) or ``"raw"`` (values as they
        are)."""
        src = pb.ReliableListSource(key=key, consumer=consumer)
        if dead_after is not None:
            src.dead_after.CopyFrom(_duration(dead_after))
        return self._subscription(
            pb.Open(reliable_list=src, framing=_framing(framing)), **options
        )

    def subscribe_list(
        self, key: str, *, framing: Optional[str] = None, **options: Any
    ) -> Subscription:
        """A list read by popping: at most once (a crash loses what was in flight).
        ``framing`` as for :meth:`subscribe_reliable_list`."""
        return self._subscription(
            pb.Open(simple_list=pb.SimpleListSource(key=key), framing=_framing(framing)),
            **options,
        )

    def subscribe_pubsub(
        self,
        channels: Sequence[str] = (),
        *,
        patterns: Sequence[str] = (),
        sharded_channels: Sequence[str] = (),
        buffer: int = 0,
        framing: Optional[str] = None,
        **options: Any,
    ) -> Subscription:
        """Pub/sub messages that arrive while subscribed (at most once); ``delivery.channel``
        names the channel. ``buffer`` (default 10000) bounds what a slow consumer may lag.
        ``framing`` as for :meth:`subscribe_reliable_list`."""
        src = pb.PubSubSource(
            channels=channels, patterns=patterns, sharded_channels=sharded_channels, buffer=buffer
        )
        return self._subscription(pb.Open(pubsub=src, framing=_framing(framing)), **options)

    async def consume(
        self, stream: str, group: str, handler: Handler, **options: Any
    ) -> Stats:
        """The handler style: ``subscribe(stream, group, **options)`` and
        :meth:`Subscription.run` ``(handler)`` until ``delivery.subscription.stop()``; returns
        the subscription's stats."""
        async with self.subscribe(stream, group, **options) as sub:
            await sub.run(handler)
        return sub.stats

    def _subscription(
        self,
        open_msg: pb.Open,
        *,
        count: int = 16,
        max_in_flight: int = 0,
        block: Optional[float] = None,
        atomic: bool = False,
        max_deliveries: int = 0,
        dead_letter: str = "",
        reports_in_reads: bool = False,
        packed_acks: bool = False,
        ordering_header: str = "",
        ordering_field: str = "",
        on_flush: Optional[FlushCallback] = None,
        on_rejection: Optional[RejectionCallback] = None,
        on_lifecycle: Optional[LifecycleCallback] = None,
        on_error: Optional[ErrorCallback] = None,
        linger: Optional[float] = 0.25,
        backoff: Tuple[float, float] = (0.1, 5.0),
        rejected_outcome: str = "auto",
        retry_delay: float = RETRY_DELAY,
        max_retry_delay: float = MAX_RETRY_DELAY,
        max_attempts: int = MAX_ATTEMPTS,
        rejected_retry_delay: Optional[float] = None,
        close_timeout: float = 10.0,
    ) -> Subscription:
        """The options of every source. ``count`` entries per read; ``max_in_flight`` (0:
        twice count) caps unsettled deliveries; ``block`` in seconds. ``atomic``: each acked
        delivery's commands and its settle run as one script. ``max_deliveries`` (0: no
        cap) with ``dead_letter`` (a stream for streams, a list for lists): an entry retried at
        the cap goes there instead. ``reports_in_reads``: the sidecar sends the report of the
        flush a read rode on inside that read (one message per read each way under a
        backlog); ``packed_acks``: a batch of plain acks is sent as the packed ``Batch.acks``
        (both off by default, as in every client of this project; on under load).
        ``ordering_header`` (streams and reliable lists) or ``ordering_field`` (streams: a
        field as stored, for entries another producer wrote): the entry's ordering key. Entries
        that share a key are delivered one at a time, in the order read: the next waits in the
        sidecar until the one before is settled and flushed; other keys flow meanwhile; a
        ``retry`` or ``retry_after`` keeps the entry in its place. At most one of the two.
        The order holds within this subscription, or across the group's replicas on a stream
        read with ``partitions`` (see :meth:`subscribe`).
        ``on_flush(FlushEvent)``, ``on_rejection(rejection, delivery)`` and
        ``on_lifecycle(LifecycleEvent)`` (opened, resubscribed, draining, disconnected) may be
        plain or async functions. A read's commands and outcomes are sent in
        one message once every delivery of the read is settled, or ``linger`` seconds after the
        first of them was settled (None: only when all are); an ordered subscription sends each
        outcome at once. Its read may be flushed in parts, so one read can have several
        ``on_flush`` events.

        ``rejected_outcome`` says what the client does with a delivery whose command the
        sidecar refused: ``"auto"`` (for a reason no retry fixes, dead-letter at once with a
        ``dead_letter`` target, else drop at once; ``retry_after`` for any other reason),
        ``"drop"`` or ``"retry_after"``; its own ``retry_after`` (also after
        a failed handler) waits ``retry_delay`` seconds doubled per delivery, at most
        ``max_retry_delay``. ``on_error(WindowError)`` (plain or async) gets every
        :class:`RejectedError`, a :class:`SideEffectError` per side effect Redis answered with
        an error, a :class:`RequeueRefusedError` per retry, retry_after or dead letter Redis
        did not write (both from the flush reports, which ``on_flush`` still gets), and the
        :class:`SubscriptionEndedError` the subscription ends with: after ``max_attempts``
        consecutive failed opens (0: never give up), or at once for a status no retry fixes.
        ``rejected_retry_delay`` is the deprecated name of ``retry_delay``."""
        if rejected_retry_delay is not None:
            warnings.warn("rejected_retry_delay is deprecated: use retry_delay",
                          DeprecationWarning, stacklevel=3)
            retry_delay = rejected_retry_delay
        if max_deliveries and not dead_letter:
            raise ValueError("max_deliveries needs a dead_letter target")
        if ordering_header and ordering_field:
            raise ValueError("ordering_header and ordering_field: one ordering key, not both")
        if ordering_header:
            open_msg.ordering_key.header = ordering_header
        elif ordering_field:
            open_msg.ordering_key.field = ordering_field
        open_msg.count = count
        open_msg.max_in_flight = max_in_flight
        open_msg.reports_in_reads = reports_in_reads
        if block is not None:
            open_msg.block.CopyFrom(_duration(block))
        if atomic:
            open_msg.mode = pb.MODE_ATOMIC
        if max_deliveries:
            open_msg.max_deliveries = max_deliveries
            if open_msg.WhichOneof("source") == "stream":
                open_msg.dead_letter.stream = dead_letter
            else:
                open_msg.dead_letter.list = dead_letter
        return Subscription(
            self,
            open_msg,
            on_flush=on_flush,
            on_rejection=on_rejection,
            on_lifecycle=on_lifecycle,
            on_error=on_error,
            linger=linger,
            backoff=backoff,
            rejected_outcome=rejected_outcome,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            max_attempts=max_attempts,
            close_timeout=close_timeout,
            packed_acks=packed_acks,
        )


def _source_names(open_msg: pb.Open) -> Tuple[str, str, str]:
    """The key, group and consumer of a subscription's source, for logs and spans."""
    source = open_msg.WhichOneof("source")
    if source == "stream":
        return open_msg.stream.key, open_msg.stream.group, open_msg.stream.consumer
    if source == "reliable_list":
        return open_msg.reliable_list.key, "", open_msg.reliable_list.consumer
    if source == "simple_list":
        return open_msg.simple_list.key, "", ""
    ps = open_msg.pubsub
    return ",".join([*ps.channels, *ps.patterns, *ps.sharded_channels]), "", ""
