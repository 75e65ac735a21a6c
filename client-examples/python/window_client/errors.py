"""The errors of window_client: one small hierarchy, each carrying the gRPC status underneath
(``status``, a ``grpc.StatusCode``, and ``details``) where there is one, so that catching them
needs no import of grpc.

    WindowError
    ├── ConnectionError          the sidecar cannot be reached (also a builtin ConnectionError):
    │                            nothing listens, the name does not resolve, TLS fails, or what
    │                            answers there is not the sidecar (Redis, an HTTP/1 server, a URL)
    ├── RedisUnavailableError    the sidecar answered, and said that Redis is unavailable
    ├── RefusedError             the sidecar refused the call (token, policy, request, limit)
    ├── CallTimeoutError         the sidecar was reached but did not answer within the call's
    │                            timeout (also a builtin TimeoutError)
    ├── RejectedError            the sidecar refused a command or an outcome of a delivery
    ├── SideEffectError          Redis answered a side effect of an acked delivery with an error
    ├── RequeueRefusedError      Redis refused to write a retry, retry_after or dead letter
    ├── SubscriptionEndedError   a subscription stopped for good
    └── AlreadySettledError      a command or an outcome for a delivery already settled
"""

from __future__ import annotations

import asyncio
import builtins
import re
from typing import TYPE_CHECKING, Any, Optional, Tuple

import grpc

if TYPE_CHECKING:
    from .client import Delivery


class WindowError(Exception):
    """The base of every error of the client. ``status`` is the gRPC status code of the call
    that failed (None when no call failed), ``details`` its message."""

    def __init__(
        self,
        message: str,
        *,
        status: Optional[grpc.StatusCode] = None,
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.details = details


#: The address a message tells the user to point the client at.
_LISTEN_HINT = (
    "set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its "
    "--listen (127.0.0.1:50051 by default)"
)


def not_the_sidecar(err: BaseException) -> bool:
    """Whether ``err`` is a :class:`ConnectionError` whose probe found something else than the
    sidecar at the address (Redis, an HTTP/1 server, a TLS server reached in plaintext): no retry
    fixes it."""
    return isinstance(err, ConnectionError) and err.cause.startswith(
        ("a Redis server answers", "an HTTP/1 server answers", "a TLS server answers",
         "an HTTP server answers")
    )


def _next_step(cause: str) -> str:
    """What to do about an unreachable sidecar, by its cause."""
    text = cause.lower()
    if text.startswith(("a redis server", "an http/1 server", "a tls server", "an http server",
                        "the address is a url")):
        return ""  # the cause says it already
    if "connection refused" in text or "no such socket" in text:
        return f"nothing listens there: start the sidecar, or {_LISTEN_HINT}"
    if "does not resolve" in text:
        return "check the host name in the address"
    if "tls" in text or "ssl" in text or "certificate" in text or "handshake" in text:
        return ("check WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY) against the sidecar's "
                "--tls-cert, or unset them for a plaintext sidecar")
    if "no connection within" in text or "timed out" in text:
        return "check the address, and that no firewall drops the connection"
    return f"is the sidecar running there? {_LISTEN_HINT}"


class ConnectionError(WindowError, builtins.ConnectionError):
    """The sidecar could not be reached at ``address``: nothing listens there (at once), the
    host name does not resolve, TLS failed, no connection was made within the client's
    ``connect_timeout``, or what answers there is not the sidecar (a Redis server, an HTTP/1
    server such as the sidecar's metrics port, a URL given where ``host:port`` is expected).
    The message names the address, the cause and what to do, e.g. ``cannot reach the sidecar
    at 127.0.0.1:50079: connection refused; nothing listens there: …``. Also a builtin
    ``ConnectionError``."""

    def __init__(
        self,
        address: str,
        cause: str,
        *,
        status: Optional[grpc.StatusCode] = grpc.StatusCode.UNAVAILABLE,
        details: str = "",
    ) -> None:
        step = _next_step(cause)
        super().__init__(
            f"cannot reach the sidecar at {address}: {cause}" + (f"; {step}" if step else ""),
            status=status,
            details=details,
        )
        self.address = address
        self.cause = cause


class RedisUnavailableError(WindowError):
    """The sidecar at ``address`` answered the call, and its answer is that Redis is
    unavailable (``UNAVAILABLE`` from the sidecar: Redis is unreachable, did not answer
    within the sidecar's ``--redis-timeout``, or refused the sidecar's credentials).
    ``details`` is the sidecar's message. The sidecar itself is reachable: the fault is between
    it and Redis."""

    def __init__(self, address: str, details: str, *, call: str = "the call") -> None:
        super().__init__(
            f"the sidecar at {address} answered {call} that Redis is unavailable: {details}; "
            "check that Redis is up and that the sidecar's --redis-url reaches it (the "
            "sidecar's log says more)",
            status=grpc.StatusCode.UNAVAILABLE,
            details=details,
        )
        self.address = address
        self.call = call


#: The sidecar's own messages for an unavailable Redis (its ``UNAVAILABLE`` answers), as
#: opposed to an ``UNAVAILABLE`` that gRPC makes up on the client's side of a broken transport.
REDIS_UNAVAILABLE = (
    "Redis is unreachable",
    "Redis did not answer in time",
    "authentication to Redis failed",
)

#: What a refused call's ``reason`` (its status) asks the caller to do.
_REFUSAL_STEPS = {
    "UNAUTHENTICATED": "set WINDOW_SIDECAR_TOKEN to the token of the sidecar's "
    "--auth-token-file",
    "PERMISSION_DENIED": "the sidecar's policy or Redis's ACL does not allow it",
    "INVALID_ARGUMENT": "the request is not one the sidecar accepts; fix it, retrying will "
    "not help",
    "FAILED_PRECONDITION": "Redis holds something else at that key, or refuses the command; "
    "retrying will not help",
    "RESOURCE_EXHAUSTED": "a limit of the sidecar: send less, or raise the limit",
    "OUT_OF_RANGE": "a limit of the sidecar: send less, or raise the limit",
    "ALREADY_EXISTS": "the name is taken",
}


class RefusedError(WindowError):
    """The sidecar at ``address`` refused the call: ``reason`` is the status's name
    (``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``,
    ``RESOURCE_EXHAUSTED``, …) and ``details`` the sidecar's reason. Retrying the same call
    gets the same answer. (A command or an outcome of a delivery that the sidecar refuses is a
    :class:`RejectedError`.)"""

    def __init__(
        self,
        address: str,
        reason: grpc.StatusCode,
        details: str,
        *,
        call: str = "the call",
    ) -> None:
        step = _REFUSAL_STEPS.get(reason.name, "")
        super().__init__(
            f"the sidecar at {address} refused {call}: {reason.name}: {details}"
            + (f" ({step})" if step else ""),
            status=reason,
            details=details,
        )
        self.address = address
        self.reason = reason.name
        self.call = call


class CallTimeoutError(WindowError, builtins.TimeoutError):
    """The sidecar at ``address`` was reached, but no answer to the call came within its
    ``timeout`` (seconds). The sidecar answers within its ``--redis-timeout`` (5 s by default)
    even when Redis does not, and the clients' call timeouts are longer than that, so this
    means a sidecar too busy to answer or a timeout set shorter than its ``--redis-timeout``.
    A publish that timed out may have been written. Also a builtin ``TimeoutError``."""

    def __init__(self, address: str, timeout: Optional[float], *, call: str = "the call",
                 details: str = "") -> None:
        within = f" within {timeout:g} s" if timeout is not None else " in time"
        super().__init__(
            f"the sidecar at {address} did not answer {call}{within}; the sidecar itself "
            "waits up to its --redis-timeout (5 s by default) for Redis, so a longer silence "
            "means it is overloaded or stuck (see its log and metrics), or the call's timeout "
            "is shorter than its --redis-timeout; a publish may have been written",
            status=grpc.StatusCode.DEADLINE_EXCEEDED,
            details=details,
        )
        self.address = address
        self.timeout = timeout
        self.call = call


class RejectedError(WindowError):
    """The sidecar refused a command or an outcome of ``delivery`` (slot ``slot``):
    ``reason`` is the proto's ``RejectionReason`` name without its prefix (e.g.
    ``FORBIDDEN_COMMAND``), ``command`` the refused command's name (empty for an outcome),
    ``outcome`` what the client settled the delivery with because of it (``"dead_letter"``,
    ``"drop"``, ``"retry_after"``, or None when the application's own drop or retry stood)."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        slot: int,
        command: str = "",
        delivery: Optional["Delivery"] = None,
        outcome: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.slot = slot
        self.command = command
        self.delivery = delivery
        self.outcome = outcome


def _entry(entry_id: str, slot: int) -> str:
    """How a message names an entry: its stream id, else (a list value) its slot."""
    return f"entry {entry_id}" if entry_id else f"the entry of slot {slot}"


class SideEffectError(WindowError):
    """A side-effect command of an acked delivery that Redis answered with an error when it
    ran (``WRONGTYPE``, ``ERR value is not an integer or out of range``, …), from a flush
    report's ``side_effect_failures``. ``command`` is the command's name, ``error`` Redis's
    error as Redis worded it, ``entry_id`` the stream entry id (empty for a list value or a
    message), ``slot`` the delivery's slot and ``delivery`` the delivery when the client still
    has it.

    ``settled`` says what became of the entry: True in pipeline mode, where it was acked all
    the same (Redis has no rollback: the commands before and after the failed one ran); False
    in atomic mode, where its segment stopped at the failed command (the commands before it
    stay applied), the entry was not acked and is delivered again with its count raised, and
    at ``max_deliveries`` goes to the dead letter with Redis's error as its reason."""

    def __init__(
        self,
        *,
        slot: int,
        entry_id: str,
        command: str,
        error: str,
        settled: bool,
        delivery: Optional["Delivery"] = None,
    ) -> None:
        after = (
            "settled all the same: Redis has no rollback"
            if settled
            else "not settled: delivered again, and dead-lettered with this error at "
            "max_deliveries"
        )
        super().__init__(
            f"side effect {command} of {_entry(entry_id, slot)} failed: {error} ({after})"
        )
        self.slot = slot
        self.entry_id = entry_id
        self.command = command
        self.error = error
        self.settled = settled
        self.delivery = delivery


class RequeueRefusedError(WindowError):
    """Redis refused to write the ``retry``, ``retry_after`` or dead letter of an entry (out
    of memory, an ACL without the write, a key of the wrong type, a read-only replica), from a
    flush report's ``requeue_refused``. The entry was not settled: it stays pending and is
    delivered again. ``error`` is Redis's error as Redis worded it, ``entry_id`` the stream
    entry id (empty for a list value), ``slot`` the delivery's slot (0 for an entry moved to
    the dead letter past ``max_deliveries`` without being delivered), ``outcome`` the outcome
    whose write was refused (``"retry"``, ``"retry_after"``, ``"dead_letter"``; None when the
    client does not know it) and ``delivery`` the delivery when the client still has it."""

    def __init__(
        self,
        *,
        slot: int,
        entry_id: str,
        error: str,
        outcome: Optional[str] = None,
        delivery: Optional["Delivery"] = None,
    ) -> None:
        what = {
            "retry": "retry",
            "retry_after": "retry_after",
            "dead_letter": "dead letter",
        }.get(outcome or "", "dead letter" if slot == 0 else "requeue")
        super().__init__(
            f"{what} of {_entry(entry_id, slot)} not written: {error}; it stays pending and "
            "is delivered again"
        )
        self.slot = slot
        self.entry_id = entry_id
        self.error = error
        self.outcome = outcome
        self.delivery = delivery


class SubscriptionEndedError(WindowError):
    """A subscription stopped for good: ``attempts`` consecutive opens failed (the
    subscription's ``max_attempts``), or the sidecar answered with a status no retry fixes
    (``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``INVALID_ARGUMENT``, …). ``status`` and
    ``details`` are the last call's; ``cause`` the error it ended with."""

    def __init__(
        self,
        message: str,
        *,
        status: Optional[grpc.StatusCode] = None,
        details: str = "",
        attempts: int = 0,
        cause: Optional[BaseException] = None,
    ) -> None:
        super().__init__(message, status=status, details=details)
        self.attempts = attempts
        self.cause = cause


class AlreadySettledError(WindowError, RuntimeError):
    """A command was queued for, or an outcome given to, a delivery that is already
    settled."""

    def __init__(self, message: str, *, slot: int = 0, outcome: Optional[str] = None) -> None:
        super().__init__(message)
        self.slot = slot
        self.outcome = outcome


#: The name of :class:`AlreadySettledError` before it had its own hierarchy.
SettledError = AlreadySettledError


def unreachable_cause(err: Any) -> Optional[str]:
    """The cause, in a few words, when ``err`` (a ``grpc.aio.AioRpcError``) says the channel
    could not connect (the call never left the client); None otherwise."""
    try:
        code = err.code()
        details = err.details() or ""
    except Exception:  # noqa: BLE001 - not an RPC error
        return None
    if code != grpc.StatusCode.UNAVAILABLE or any(m in details for m in REDIS_UNAVAILABLE):
        # (The sidecar's answer about Redis may quote Redis's own "Connection refused".)
        return None
    text = details.lower()
    connecting = (
        "failed to connect" in text
        or "connect failed" in text
        or "connection refused" in text
        or "dns resolution failed" in text
        or "errors resolving" in text
        or "no such file or directory" in text
    )
    if not connecting:
        return None
    if "connection refused" in text:
        return "connection refused"
    if "no such file or directory" in text:
        return "no such socket"
    if "dns resolution failed" in text or "errors resolving" in text:
        return "the host name does not resolve"
    # "failed to connect to all addresses; last error: UNKNOWN: ipv4:1.2.3.4:5: <cause>"
    m = re.search(r"last error: [A-Z_]+: (?:(?:ipv4|ipv6|unix):\S+?: )?(.*)$", details)
    cause = m.group(1) if m else details
    if "ssl" in text or "handshake" in text or "certificate" in text:
        return f"the TLS handshake failed ({cause})"
    if "timed out" in text or "timeout" in text:
        return f"connecting timed out ({cause})"
    return cause


#: The causes that need no probe of the address: nothing listens there, or no such host.
PLAIN_CAUSES = frozenset({"connection refused", "no such socket", "the host name does not resolve"})

# What gRPC says when what answered does not speak the sidecar's HTTP/2 gRPC: a Redis server
# ("Failed parsing HTTP/2"), an HTTP server ("Received http2 header with status: 404"), a
# connection closed in the middle.
_TRANSPORT = re.compile(
    r"http2|http/2|http status code|settings frame|protocol error|socket closed|connection reset|stream removed|"
    r"goaway|bad http|unexpected eof|connection closed",
    re.IGNORECASE,
)


def transport_failure(err: Any) -> bool:
    """Whether ``err`` failed below the sidecar's answers: gRPC itself saw something other
    than the sidecar's HTTP/2 at the address, or the connection broke (as opposed to a status
    the sidecar sent)."""
    try:
        code = err.code()
        details = err.details() or ""
    except Exception:  # noqa: BLE001 - not an RPC error
        return False
    if unreachable_cause(err) is not None:
        return True
    if any(m in details for m in REDIS_UNAVAILABLE):
        return False  # the sidecar's own answer
    return code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    ) and bool(_TRANSPORT.search(details))


#: The probe's line: Redis reads an inline PING (with arguments it refuses: ``-ERR``), an
#: HTTP/1 server a request line (``HTTP/1.x 4xx``).
PROBE = b"PING / HTTP/1.0\r\n\r\n"


def what_answers(reply: bytes, *, tls: bool = False) -> Optional[str]:
    """What kind of server sent ``reply`` to the probe's line, as the cause of a
    :class:`ConnectionError`; None when it is none the client knows (the sidecar itself, or
    silence)."""
    if reply.startswith((b"+PONG", b"-ERR", b"-NOAUTH", b"-WRONGPASS", b"-NOPERM", b"-DENIED",
                         b"-LOADING", b"-MISCONF", b"-READONLY", b"-MASTERDOWN")):
        return (f"a Redis server answers there, not the sidecar; {_LISTEN_HINT} (the sidecar "
                "reaches Redis through its own --redis-url)")
    if reply.startswith(b"HTTP/1."):
        return (f"an HTTP/1 server answers there (the sidecar's metrics and probes port, "
                f"--metrics-listen?), not the sidecar's gRPC port; {_LISTEN_HINT}")
    if not tls and reply[:1] == b"\x15" and reply[1:2] == b"\x03":
        return ("a TLS server answers there and the client speaks plaintext; set "
                "WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY for mutual TLS) to connect with TLS")
    return None


def _host_port(address: str) -> Optional[Tuple[str, Optional[int]]]:
    """The host and port of a target to probe, or (path, None) for a Unix socket; None for a
    target the probe does not understand."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        return (("/" + path.lstrip("/")) if path.startswith("//") else path), None
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if address.startswith(scheme):
            address = address[len(scheme):]
            break
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


async def probe(address: str, *, tls: bool = False, timeout: float = 1.0) -> Optional[str]:
    """Connects to ``address`` once with a raw socket, sends ``PING / HTTP/1.0`` (a command
    to Redis, a request line to an HTTP/1 server) and reads the reply: the
    cause to report when a Redis server (``+PONG``, ``-NOAUTH``, ``-ERR``), an HTTP/1 server
    (``HTTP/1.1 400``: the sidecar's metrics port) or a TLS server answers there; None when it
    cannot tell (then the gRPC error stands)."""
    where = _host_port(address)
    if where is None:
        return None
    host, port = where
    writer = None
    try:
        if port is None:
            opening = asyncio.open_unix_connection(host)
        else:
            opening = asyncio.open_connection(host, port)
        reader, writer = await asyncio.wait_for(opening, timeout)
        writer.write(PROBE)
        await asyncio.wait_for(writer.drain(), timeout)
        reply = await asyncio.wait_for(reader.read(64), timeout)
    except (OSError, asyncio.TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
    return what_answers(reply, tls=tls)


def address_problem(target: str) -> Optional[str]:
    """Why ``target`` is not an address a client can use, when it is a URL where ``host:port``
    (or ``unix:/path``) is expected; None otherwise."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", target)
    if m is None or m.group(1).lower() in ("dns", "unix", "unix-abstract", "ipv4", "ipv6"):
        return None
    scheme = m.group(1).lower()
    rest = m.group(2).split("/", 1)[0].rpartition("@")[2]
    if scheme in ("redis", "rediss"):
        return (f"the address is a Redis URL; {_LISTEN_HINT}, not Redis's (that one goes to "
                "the sidecar's --redis-url)")
    hint = f"give {rest}" if rest else "give host:port"
    if scheme == "https":
        hint += " and WINDOW_SIDECAR_TLS_CA for TLS"
    return (f"the address is a URL, and the sidecar takes host:port or unix:/path: {hint} "
            "(WINDOW_SIDECAR_ADDR or the client's address)")


async def explain(
    err: Any, address: str, *, call: str = "the call", timeout: Optional[float] = None,
    tls: bool = False,
) -> WindowError:
    """The library's error for a failed call (``grpc.aio.AioRpcError``), by its cause; a
    failure below the sidecar's answers probes the address once to say what answers there
    instead (Redis, an HTTP/1 server, TLS)."""
    cause = unreachable_cause(err)
    tls_failed = cause is not None and cause.startswith("the TLS handshake failed")
    if cause not in PLAIN_CAUSES and not tls_failed and transport_failure(err):
        seen = await probe(address, tls=tls)
        details = err.details() or ""
        if seen is not None:
            return ConnectionError(address, seen, status=err.code(), details=details)
        if cause is None:
            m = re.search(r"(?:http2 header with status:|http status code) (\d+)", details,
                          re.IGNORECASE)
            cause = (
                f"an HTTP server answers there with {m.group(1)}, not the sidecar's gRPC "
                "service" if m else f"the connection failed ({details})"
            )
        return ConnectionError(address, cause, status=err.code(), details=details)
    return from_rpc(err, address, call=call, timeout=timeout)


def from_rpc(
    err: Any, address: str, *, call: str = "the call", timeout: Optional[float] = None
) -> WindowError:
    """The library's error for a failed call (``grpc.aio.AioRpcError``), without a probe."""
    cause = unreachable_cause(err)
    if cause is not None:
        return ConnectionError(address, cause, details=err.details() or "")
    code = err.code()
    details = err.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and any(m in details for m in REDIS_UNAVAILABLE):
        return RedisUnavailableError(address, details, call=call)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CallTimeoutError(address, timeout, call=call, details=details)
    if code.name in _REFUSAL_STEPS:
        return RefusedError(address, code, details, call=call)
    return WindowError(f"{code.name}: {details}" if details else code.name, status=code,
                       details=details)


__all__ = [
    "AlreadySettledError",
    "CallTimeoutError",
    "ConnectionError",
    "RedisUnavailableError",
    "RefusedError",
    "RejectedError",
    "RequeueRefusedError",
    "SettledError",
    "SideEffectError",
    "SubscriptionEndedError",
    "WindowError",
]
