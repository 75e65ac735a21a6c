"""The errors of window_client: one small hierarchy, each carrying the gRPC status underneath
(``status``, a ``grpc.StatusCode``, and ``details``) where there is one, so that catching them
needs no import of grpc.

    WindowError
    ├── ConnectionError          the sidecar cannot be reached (also a builtin ConnectionError)
    ├── RejectedError            the sidecar refused a command or an outcome of a delivery
    ├── SideEffectError          Redis answered a side effect of an acked delivery with an error
    ├── RequeueRefusedError      Redis refused to write a retry, retry_after or dead letter
    ├── SubscriptionEndedError   a subscription stopped for good
    └── AlreadySettledError      a command or an outcome for a delivery already settled
"""

from __future__ import annotations

import builtins
import re
from typing import TYPE_CHECKING, Any, Optional

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


class ConnectionError(WindowError, builtins.ConnectionError):
    """The sidecar could not be reached at ``address`` within the client's
    ``connect_timeout``: the message names the address and the cause, e.g. ``cannot reach
    the sidecar at 127.0.0.1:50079: connection refused``. Also a builtin ``ConnectionError``."""

    def __init__(
        self,
        address: str,
        cause: str,
        *,
        status: Optional[grpc.StatusCode] = grpc.StatusCode.UNAVAILABLE,
        details: str = "",
    ) -> None:
        super().__init__(f"cannot reach the sidecar at {address}: {cause}", status=status,
                         details=details)
        self.address = address
        self.cause = cause


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
    if code != grpc.StatusCode.UNAVAILABLE:
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
    if "timed out" in text or "timeout" in text:
        return f"connecting timed out ({cause})"
    return cause


def from_rpc(err: Any, address: str) -> WindowError:
    """The library's error for a failed unary call (``grpc.aio.AioRpcError``)."""
    cause = unreachable_cause(err)
    if cause is not None:
        return ConnectionError(address, cause, details=err.details() or "")
    code = err.code()
    details = err.details() or ""
    return WindowError(f"{code.name}: {details}" if details else code.name, status=code,
                       details=details)


__all__ = [
    "AlreadySettledError",
    "ConnectionError",
    "RejectedError",
    "RequeueRefusedError",
    "SettledError",
    "SideEffectError",
    "SubscriptionEndedError",
    "WindowError",
]
