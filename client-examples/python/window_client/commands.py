"""Typed side effects: redis-py's own command methods, recorded instead of sent.

``delivery.redis`` is a :class:`RedisCommands`: every data command of redis-py
(``hincrby``, ``set``, ``xadd``, ``zadd``, ``lpush``, ``expire``, ``publish``, ``eval``,
``fcall``, …) with its own signature and defaults. redis-py's command mixins build each
command's arguments and hand them to ``execute_command``; here ``execute_command`` queues them
on the delivery instead of sending them, so the command runs only with the delivery's ack.

A misspelled name fails where it is called (``AttributeError``), an argument Redis cannot take
(``None``, a dict, a bool) fails there too (``TypeError``), and the administrative commands
(``flushall``, ``config_set``, ``acl_*``, ``cluster_*``, …) are not offered: the sidecar would
refuse them. A call returns None (the reply is never seen). For a command redis-py lacks,
``delivery.queue(name, *args)`` stays.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from redis.commands.core import (
    DataAccessCommands,
    FunctionCommands,
    PubSubCommands,
    ScriptCommands,
)


class RedisCommands(DataAccessCommands, PubSubCommands, ScriptCommands, FunctionCommands):
    """redis-py's data commands, each queued on one delivery rather than sent."""

    # redis-py's typing picks a method's synchronous overload by this marker.
    _is_async_client: Literal[False] = False
    # Part of redis-py's client protocol; no command method queued here uses it.
    _event_dispatcher: Any = None

    def __init__(self, queue: Callable[..., Any]) -> None:
        self._queue = queue

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Queues the command redis-py built (its options, e.g. the keys a cluster client
        routes by, are not needed here). redis-py names some commands as two words in one
        string (``"XINFO STREAM"``): they are split as it splits them on the wire."""
        name = args[0]
        if type(name) is str and " " not in name:  # the usual case, first
            self._queue(*args)
            return None
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).decode()
        words = str(name).split()
        self._queue(words[0], *words[1:], *args[1:])
        return None


__all__ = ["RedisCommands"]
