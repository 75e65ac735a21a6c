"""Unit tests of the client that need no sidecar: the rule for a refused command, the options
of the Open message, the bearer token, typed side effects, entries without the payload layout,
the errors and the import paths. Run against the installed package:

    python -m unittest discover -s tests        (from outside client-examples/python)
"""

import asyncio
import importlib
import os
import socket
import sys
import time
import unittest
import warnings
from typing import Any, List, Tuple
from unittest import mock

from google.protobuf.duration_pb2 import Duration

import window_client
from window_client import (
    RETRY_DELAY,
    TOKEN_ENV,
    ConnectionError,
    RejectedError,
    RequeueRefusedError,
    SideEffectError,
    WindowError,
    pb,
)
from window_client.aio import Delivery, WindowClient
from window_client.client import Subscription, _Stream


def _one_delivery(
    sub: Subscription, count: int = 1, **fields: str
) -> Tuple[_Stream, Delivery]:
    """A stream with one read of one delivery (slot 7), handed out as the iterator would."""
    st = _Stream(1, call=None)
    sub._stream = st
    if fields:
        msg = pb.Delivery(slot=7, entry_id="1-0", delivery_count=count, fields=[
            pb.Field(name=k.encode(), value=v.encode()) for k, v in fields.items()])
    else:
        msg = pb.Delivery(slot=7, entry_id="1-0", payload=b"{}", delivery_count=count)
    sub._read(st, pb.Read(read_id=1, deliveries=[msg]))
    item = sub._ready.popleft()
    assert isinstance(item, Delivery)
    return st, sub._hand_out(item)


def _sent(st: _Stream) -> List[Any]:
    """The (commands, outcomes) of each batch queued for the stream's writer."""
    items = []
    while not st.outbox.empty():
        commands, outcomes, _ = st.outbox.get_nowait()
        items.append((commands, outcomes))
    return items


def _forbidden(st: _Stream) -> pb.Rejections:
    """What the sidecar answers for a batch of slot 7 with FLUSHALL and an ack: the command,
    then the ack it made incomplete (with the sidecar's advice, never passed on)."""
    return pb.Rejections(rejections=[
        pb.Rejection(slot=7, reason=pb.REJECTION_REASON_FORBIDDEN_COMMAND,
                     message="FLUSHALL is forbidden in a window", command="FLUSHALL"),
        pb.Rejection(slot=7, reason=pb.REJECTION_REASON_INCOMPLETE_SEGMENT,
                     message="slot 7 cannot be acked: one of its commands was refused, so its "
                             "segment is incomplete; settle it with drop, retry or retry_after"),
    ])


class RejectedCommand(unittest.IsolatedAsyncioTestCase):
    """With rejected_outcome="retry_after": the entry comes back, towards the dead letter."""

    async def asyncSetUp(self) -> None:
        self.client = WindowClient("127.0.0.1:1", token="")
        self.seen: List[Any] = []
        self.errors: List[WindowError] = []
        self.sub = self.client.subscribe(
            "orders", "g", max_deliveries=2, dead_letter="orders:dead",
            rejected_outcome="retry_after", on_error=self.errors.append,
            on_rejection=lambda rej, d: self.seen.append((rej.reason, d.outcome if d else None)),
        )

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def test_the_delay_grows_per_delivery_up_to_the_cap(self) -> None:
        self.assertEqual([self.sub.retry_delay(n) for n in (1, 2, 3, 4, 7, 8, 100)],
                         [1.0, 2.0, 4.0, 8.0, 60.0, 60.0, 60.0])
        st, d = _one_delivery(self.sub, count=3)
        d.queue("FLUSHALL").ack()
        _sent(st)
        await self.sub._rejected(st, _forbidden(st))
        [(_, [(_, kind, extra)])] = _sent(st)
        self.assertEqual((kind, extra["delay"].seconds), (pb.OUTCOME_KIND_RETRY_AFTER, 4))

    async def test_a_refused_command_turns_the_ack_into_retry_after(self) -> None:
        st, d = _one_delivery(self.sub)
        d.queue("FLUSHALL").ack()
        [(commands, outcomes)] = _sent(st)
        self.assertEqual(commands, [(7, "FLUSHALL", [])])
        self.assertEqual(outcomes, [(7, pb.OUTCOME_KIND_ACK, None)])
        await self.sub._rejected(st, _forbidden(st))
        delay = Duration()
        delay.FromNanoseconds(int(RETRY_DELAY * 1e9))
        self.assertEqual(_sent(st), [([], [(7, pb.OUTCOME_KIND_RETRY_AFTER, {
            "delay": delay,
            "reason": "rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden in a window"})])])
        self.assertEqual(RETRY_DELAY, 1.0)
        self.assertEqual(d.outcome, "retry_after")
        self.assertIsNone(d.rejection)
        # The callback sees the delivery already settled by the helper, never dropped.
        self.assertEqual(self.seen, [
            (pb.REJECTION_REASON_FORBIDDEN_COMMAND, "ack"),
            (pb.REJECTION_REASON_INCOMPLETE_SEGMENT, "retry_after"),
        ])
        # One error for the delivery, after the client settled it; no advice passed on.
        [err] = self.errors
        assert isinstance(err, RejectedError)
        self.assertEqual((err.reason, err.slot, err.command, err.outcome, err.delivery),
                         ("FORBIDDEN_COMMAND", 7, "FLUSHALL", "retry_after", d))
        self.assertNotIn("settle it with", str(err))

    async def test_a_drop_with_a_refused_command_stands(self) -> None:
        st, d = _one_delivery(self.sub)
        d.queue("FLUSHALL").drop("invalid")
        _sent(st)
        await self.sub._rejected(st, pb.Rejections(rejections=[
            pb.Rejection(slot=7, reason=pb.REJECTION_REASON_FORBIDDEN_COMMAND,
                         message="forbidden", command="FLUSHALL"),
        ]))
        self.assertEqual(_sent(st), [])
        self.assertEqual(d.outcome, "drop")

    async def test_a_refused_outcome_is_settled_again(self) -> None:
        st, d = _one_delivery(self.sub)
        d.ack()
        _sent(st)
        await self.sub._rejected(st, pb.Rejections(rejections=[
            pb.Rejection(slot=7, reason=pb.REJECTION_REASON_INVALID_OUTCOME, message="bad"),
        ]))
        [(_, [(slot, kind, extra)])] = _sent(st)
        self.assertEqual((slot, kind, extra["reason"]),
                         (7, pb.OUTCOME_KIND_RETRY_AFTER, "rejected: INVALID_OUTCOME: bad"))
        [err] = self.errors
        assert isinstance(err, RejectedError)
        self.assertEqual((err.reason, err.command, err.outcome), ("INVALID_OUTCOME", "", "retry_after"))


class RejectedCommandByDefault(unittest.IsolatedAsyncioTestCase):
    """The default, rejected_outcome="auto": a reason no retry fixes dead-letters the entry at
    once (drops it on a subscription without a dead-letter target)."""

    async def asyncSetUp(self) -> None:
        self.client = WindowClient("127.0.0.1:1", token="")
        self.errors: List[WindowError] = []
        self.sub = self.client.subscribe("orders", "g", max_deliveries=3, dead_letter="dead",
                                         on_error=self.errors.append)

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def test_a_forbidden_command_dead_letters_the_delivery_at_once(self) -> None:
        st, d = _one_delivery(self.sub)
        d.queue("FLUSHALL").ack()
        _sent(st)
        with self.assertLogs("window_client", "WARNING") as logs:
            await self.sub._rejected(st, _forbidden(st))
        self.assertEqual(_sent(st), [([], [(7, pb.OUTCOME_KIND_DEAD_LETTER, {
            "reason": "rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden in a window"})])])
        [err] = self.errors
        assert isinstance(err, RejectedError)
        self.assertEqual((err.reason, err.outcome), ("FORBIDDEN_COMMAND", "dead_letter"))
        self.assertIn("the client settled it with dead_letter", str(err))
        self.assertFalse(any("settle it with" in line for line in logs.output), logs.output)

    async def test_without_a_dead_letter_target_it_is_dropped_at_once(self) -> None:
        sub = self.client.subscribe("orders", "g2", on_error=self.errors.append)
        self.assertFalse(sub.has_dead_letter)
        st, d = _one_delivery(sub)
        d.queue("FLUSHALL").ack()
        _sent(st)
        await sub._rejected(st, _forbidden(st))
        self.assertEqual(_sent(st), [([], [(7, pb.OUTCOME_KIND_DROP, {
            "reason": "rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden in a window"})])])
        [err] = self.errors
        assert isinstance(err, RejectedError)
        self.assertEqual((err.reason, err.outcome), ("FORBIDDEN_COMMAND", "drop"))

    async def test_dead_letter_needs_a_target(self) -> None:
        st, d = _one_delivery(self.sub)
        d.queue("SET", "a", "b").dead_letter("bad sku")
        self.assertEqual(_sent(st), [([(7, "SET", [b"a", b"b"])], [(7, pb.OUTCOME_KIND_DEAD_LETTER, {
            "reason": "bad sku"})])])
        self.assertEqual(d.outcome, "dead_letter")
        bare = self.client.subscribe("orders", "g2")
        _, d = _one_delivery(bare)
        with self.assertRaisesRegex(ValueError, "dead-letter target"):
            d.dead_letter("bad sku")
        self.assertIsNone(d.outcome)

    async def test_another_reason_is_retried_with_the_growing_delay(self) -> None:
        st, d = _one_delivery(self.sub, count=2)
        d.queue("SET", "a", "b").ack()
        _sent(st)
        await self.sub._rejected(st, pb.Rejections(rejections=[
            pb.Rejection(slot=7, reason=pb.REJECTION_REASON_CROSS_SLOT, message="x",
                         command="SET"),
            pb.Rejection(slot=7, reason=pb.REJECTION_REASON_INCOMPLETE_SEGMENT, message="y"),
        ]))
        [(_, [(_, kind, extra)])] = _sent(st)
        self.assertEqual((kind, extra["delay"].seconds), (pb.OUTCOME_KIND_RETRY_AFTER, 2))

    async def test_rejected_outcome_is_checked(self) -> None:
        with self.assertRaises(ValueError):
            self.client.subscribe("orders", "g", rejected_outcome="dead_letter")


class FlushReportErrors(unittest.IsolatedAsyncioTestCase):
    """What a flush report says Redis refused reaches on_error, after on_flush got it."""

    async def asyncSetUp(self) -> None:
        self.client = WindowClient("127.0.0.1:1", token="")
        self.calls: List[Any] = []
        self.sub = self.client.subscribe(
            "orders", "g", max_deliveries=2, dead_letter="orders:dead",
            on_error=lambda err: self.calls.append(err),
            on_flush=lambda ev: self.calls.append("flush"),
        )

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def test_a_failed_side_effect_of_an_ack(self) -> None:
        st, d = _one_delivery(self.sub)
        d.queue("HINCRBY", "h", "f", 1).ack()
        _sent(st)
        await self.sub._flushed(st, pb.FlushReport(
            read_id=1, ok=False, settles=1, side_effect_failures=[pb.SideEffectFailure(
                slot=7, entry_id="1-0", command="HINCRBY",
                error="ERR hash value is not an integer", settled=True)]))
        self.assertEqual(self.calls[0], "flush")
        [err] = self.calls[1:]
        assert isinstance(err, SideEffectError)
        self.assertIsInstance(err, WindowError)
        self.assertEqual((err.slot, err.entry_id, err.command, err.settled, err.delivery),
                         (7, "1-0", "HINCRBY", True, d))
        self.assertEqual(str(err), "side effect HINCRBY of entry 1-0 failed: ERR hash value is "
                         "not an integer (settled all the same: Redis has no rollback)")
        atomic = SideEffectError(slot=7, entry_id="", command="INCR", error="ERR x",
                                 settled=False)
        self.assertIn("of the entry of slot 7 failed: ERR x (not settled: delivered again",
                      str(atomic))

    async def test_a_refused_dead_letter(self) -> None:
        st, d = _one_delivery(self.sub)
        d.dead_letter("poison")
        _sent(st)
        await self.sub._flushed(st, pb.FlushReport(
            read_id=1, ok=False, settle_failed=True, requeue_refused=[pb.RequeueRefusal(
                slot=7, entry_id="1-0", error="WRONGTYPE Operation against a key")]))
        [_, err] = self.calls
        assert isinstance(err, RequeueRefusedError)
        self.assertEqual((err.slot, err.entry_id, err.outcome, err.delivery),
                         (7, "1-0", "dead_letter", d))
        self.assertEqual(str(err), "dead letter of entry 1-0 not written: WRONGTYPE Operation "
                         "against a key; it stays pending and is delivered again")


class TypedSideEffects(unittest.IsolatedAsyncioTestCase):
    async def test_redis_py_methods_are_queued(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            st, d = _one_delivery(client.subscribe("orders", "g"))
            d.redis.hincrby("totals", "apple", 2)
            d.redis.set("last", "apple", ex=60)
            d.redis.xadd("audit", {"sku": "apple"})
            d.redis.zadd("scores", {"apple": 1.5})
            d.queue("HINCRBY", "totals", "pear", 1)  # by name, for what redis-py lacks
            d.ack()
            [(commands, _)] = _sent(st)
            self.assertEqual(commands, [
                (7, "HINCRBY", [b"totals", b"apple", b"2"]),
                (7, "SET", [b"last", b"apple", b"EX", b"60"]),
                (7, "XADD", [b"audit", b"*", b"sku", b"apple"]),
                (7, "ZADD", [b"scores", b"1.5", b"apple"]),
                (7, "HINCRBY", [b"totals", b"pear", b"1"]),
            ])

    async def test_wrong_names_and_types_fail_at_the_call(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            st, d = _one_delivery(client.subscribe("orders", "g"))
            with self.assertRaises(AttributeError):
                d.redis.hincrbyy("totals", "apple", 1)  # type: ignore[attr-defined]
            with self.assertRaises(AttributeError):
                d.redis.flushall()  # type: ignore[attr-defined]  # refused anyway: not offered
            with self.assertRaises(TypeError):
                d.redis.hset("h", "f", None)  # type: ignore[arg-type]
            with self.assertRaises(TypeError):
                d.redis.set("k", {"not": "a value"})  # type: ignore[arg-type]
            d.ack()
            [(commands, _)] = _sent(st)
            self.assertEqual(commands, [])


class EntriesFromAnyProducer(unittest.IsolatedAsyncioTestCase):
    async def test_fields_as_bytes_and_text(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            _, d = _one_delivery(client.subscribe("orders", "g"), sku="apple", qty="2")
            self.assertFalse(d.in_layout)
            self.assertEqual(d.fields, {"sku": b"apple", "qty": b"2"})
            self.assertEqual(d.text_fields, {"sku": "apple", "qty": "2"})
            self.assertEqual(d.raw_fields, [(b"sku", b"apple"), (b"qty", b"2")])
            for call in (d.json, d.text):
                with self.assertRaises(ValueError) as err:
                    call()
                self.assertIn("the fields sku, qty", str(err.exception))
                self.assertIn("delivery.fields", str(err.exception))

    async def test_the_payload_layout(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            _, d = _one_delivery(client.subscribe("orders", "g"))
            self.assertTrue(d.in_layout)
            self.assertEqual((d.json(), d.text(), d.fields), ({}, "{}", {}))


class _Call:
    """A Subscribe call that keeps what the writer writes."""

    def __init__(self) -> None:
        self.written: List[pb.SubscribeRequest] = []

    async def write(self, request: pb.SubscribeRequest) -> None:
        self.written.append(request)

    async def done_writing(self) -> None:
        pass


class DeliveryViews(unittest.IsolatedAsyncioTestCase):
    """A delivery reads what it was not given at once from its message and its read: the
    values and types are the message's, before and after it is settled."""

    async def test_what_a_delivery_reads_is_its_message(self) -> None:
        trace = pb.TraceContext(traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
                                tracestate="k=v")
        msgs = [
            pb.Delivery(slot=11, entry_id="1700000000000-5", payload=b'{"id": 5}',
                        delivery_count=3, headers={"h": "v"}, trace=trace),
            pb.Delivery(slot=12, entry_id="1700000000000-6", delivery_count=1,
                        fields=[pb.Field(name=b"sku", value=b"apple")]),
            pb.Delivery(slot=13, entry_id="", payload=b"news", delivery_count=1,
                        channel="alerts"),
        ]
        async with WindowClient("127.0.0.1:1", token="") as client:
            sub = client.subscribe("orders", "g", partitions=4)
            st = _Stream(1, call=None)
            sub._stream = st
            sub._read(st, pb.Read(read_id=9, partition=2, deliveries=msgs))
            sub._read(st, pb.Read(read_id=10, deliveries=[
                pb.Delivery(slot=14, entry_id="1-0", payload=b"x", delivery_count=1)]))
            ds = [sub._hand_out(sub._ready.popleft()) for _ in range(4)]
            for d, m in zip(ds, msgs):
                with self.subTest(slot=m.slot):
                    self.assertEqual((d.slot, d.entry_id, d.payload, d.delivery_count),
                                     (m.slot, m.entry_id, m.payload, m.delivery_count))
                    self.assertEqual((type(d.slot), type(d.entry_id), type(d.payload)),
                                     (int, str, bytes))
                    self.assertEqual((d.read_id, d.partition), (9, 2))
                    self.assertEqual((d.headers, d.channel), (dict(m.headers), m.channel))
                    self.assertIs(d.subscription, sub)
                    self.assertTrue(d.live)
                    self.assertEqual((d.outcome, d.settled, d.rejection), (None, False, None))
            self.assertEqual(ds[0].trace, trace)
            self.assertIsNone(ds[1].trace)
            self.assertEqual((ds[1].fields, ds[1].payload, ds[1].in_layout),
                             ({"sku": b"apple"}, b"", False))
            self.assertEqual((ds[3].read_id, ds[3].partition), (10, None))
            self.assertEqual(repr(ds[0]), "Delivery(slot=11, entry_id='1700000000000-5', "
                                          "delivery_count=3, outcome=None)")
            ds[0].queue("INCR", "n").ack()
            ds[1].drop("bad")
            # Settled, it reads the same; its outcome is set.
            self.assertEqual((ds[0].entry_id, ds[0].read_id, ds[0].partition, ds[0].outcome),
                             ("1700000000000-5", 9, 2, "ack"))
            self.assertEqual((ds[1].outcome, ds[1].settled), ("drop", True))
            self.assertEqual(sub.stats.outcomes, {"ack": 1, "drop": 1})
            with self.assertRaises(window_client.AlreadySettledError):
                ds[0].ack()
            with self.assertRaises(window_client.AlreadySettledError):
                ds[1].queue("INCR", "n")
            st.alive = False
            self.assertFalse(ds[2].live)

    async def test_a_read_reported_with_a_delivery_abandoned(self) -> None:
        """Two deliveries settled and sent, the third open when the report comes: the event
        lists the two as settled and the third as abandoned; the read and its slots are gone,
        and the abandoned delivery settled later is sent nowhere."""
        events: List[window_client.FlushEvent] = []
        async with WindowClient("127.0.0.1:1", token="") as client:
            sub = client.subscribe("orders", "g", linger=None, packed_acks=True,
                                   on_flush=events.append)
            call = _Call()
            st = _Stream(1, call=call)
            st.opened = pb.Opened(packed_commands=True)
            sub._stream = st
            writer = asyncio.get_running_loop().create_task(sub._writer(st))
            try:
                sub._read(st, pb.Read(read_id=1, deliveries=[
                    pb.Delivery(slot=n, entry_id=f"{n}-0", payload=b"{}", delivery_count=1)
                    for n in (1, 2, 3)]))
                d1, d2, d3 = (sub._hand_out(sub._ready.popleft()) for _ in range(3))
                self.assertEqual(set(st.slots), {1, 2, 3})
                d1.queue("INCR", "n").ack()
                d2.ack()
                sub._send(st, st.reads[1])  # what a drain does with a read not all settled
                await asyncio.sleep(0)
                [request] = call.written
                self.assertEqual((request.batch.packed_commands, list(request.batch.acks)),
                                 (b"*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n", [1, 2]))
                self.assertEqual((d1._sent, d2._sent, d3._sent), (True, True, False))
                await sub._flushed(st, pb.FlushReport(read_id=1, ok=True, settles=2))
            finally:
                writer.cancel()
            [ev] = events
            self.assertEqual((ev.settled, ev.abandoned, ev.deliveries), ([d1, d2], [d3],
                                                                         [d1, d2, d3]))
            # The same lists as an event made by hand, which finds them by what was sent.
            by_hand = window_client.FlushEvent(ev.report, [d3, d1, d2])
            self.assertEqual((by_hand.settled, by_hand.abandoned), ([d1, d2], [d3]))
            self.assertEqual((st.reads, st.slots, st.unsettled, st.handed_unsettled),
                             ({}, {}, 0, 1))
            # The read no longer holds its deliveries: nothing is left for the cyclic GC.
            self.assertEqual(d3._rd.deliveries, [])
            with self.assertLogs("window_client", "DEBUG") as logs:
                d3.queue("INCR", "n").ack()
            self.assertIn("settled after the sidecar abandoned it", logs.output[0])
            self.assertEqual((d3.outcome, d3._sent, st.handed_unsettled), ("ack", False, 0))
            self.assertEqual(_sent(st), [])
            self.assertEqual(sub.stats.outcomes, {"ack": 3})

    async def test_a_batch_acked_after_its_read_was_abandoned(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            sub = client.subscribe("orders", "g", linger=None)
            st = _Stream(1, call=None)
            sub._stream = st
            sub.batches()
            sub._read(st, pb.Read(read_id=1, deliveries=[
                pb.Delivery(slot=n, entry_id=f"{n}-0", payload=b"{}", delivery_count=1)
                for n in (1, 2)]))
            batch = sub._hand_out_batch(sub._ready.popleft())
            await sub._flushed(st, pb.FlushReport(read_id=1, ok=True))
            with self.assertLogs("window_client", "DEBUG") as logs:
                batch.ack()
            # (One message per delivery when they have spans, for the batch when not.)
            self.assertIn("settled after the sidecar abandoned", logs.output[0])
            self.assertEqual([d.outcome for d in batch], ["ack", "ack"])
            self.assertEqual((_sent(st), st.handed_unsettled), ([], 0))


class Linger(unittest.IsolatedAsyncioTestCase):
    """A read's outcomes go out once all of them are settled, or ``linger`` seconds after the
    first; acked one by one or all at once, the same."""

    async def asyncSetUp(self) -> None:
        self.client = WindowClient("127.0.0.1:1", token="")

    async def asyncTearDown(self) -> None:
        await self.client.close()

    def _read(self, sub: Subscription) -> Tuple[_Stream, List[Delivery]]:
        st = _Stream(1, call=None)
        sub._stream = st
        sub._read(st, pb.Read(read_id=1, deliveries=[
            pb.Delivery(slot=n, entry_id=f"{n}-0", payload=b"{}", delivery_count=1)
            for n in (1, 2, 3)]))
        return st, [sub._hand_out(sub._ready.popleft()) for _ in range(3)]

    async def test_the_first_outcome_starts_the_linger(self) -> None:
        st, (d1, d2, d3) = self._read(self.client.subscribe("orders", "g", linger=0.05))
        d1.ack()
        timer = st.reads[1].timer
        self.assertIsNotNone(timer)
        d2.queue("INCR", "n").ack()
        self.assertIs(st.reads[1].timer, timer)  # one per read, from its first outcome
        self.assertEqual(_sent(st), [])
        await asyncio.sleep(0.1)
        self.assertEqual(_sent(st), [([(2, "INCR", [b"n"])], [(1, pb.OUTCOME_KIND_ACK, None),
                                                              (2, pb.OUTCOME_KIND_ACK, None)])])
        d3.ack()  # the last one: at once
        self.assertEqual(_sent(st), [([], [(3, pb.OUTCOME_KIND_ACK, None)])])
        self.assertEqual((st.unsettled, st.handed_unsettled), (0, 0))

    async def test_without_linger_the_read_waits_for_all(self) -> None:
        st, (d1, d2, d3) = self._read(self.client.subscribe("orders", "g", linger=None))
        d1.ack()
        d2.drop("no")
        self.assertIsNone(st.reads[1].timer)
        self.assertEqual(_sent(st), [])
        d3.ack()
        [(_, outcomes)] = _sent(st)
        self.assertEqual([o[:2] for o in outcomes], [(1, pb.OUTCOME_KIND_ACK),
                                                      (2, pb.OUTCOME_KIND_DROP),
                                                      (3, pb.OUTCOME_KIND_ACK)])


class InlineAck(unittest.IsolatedAsyncioTestCase):
    """``Delivery.ack`` settles the usual delivery inline, without ``_settle`` and
    ``Subscription._settled``: for every shape of read, both ways queue the same batches and
    leave the same counts, the same linger timer and the same drain waker."""

    async def _run(self, inline: bool, options: Any, draining: bool,
                   steps: List[Tuple[int, bool]]) -> Any:
        # Without OpenTelemetry: a delivery with a span is never acked inline.
        with mock.patch.object(window_client.client.tracing, "AVAILABLE", False):
            return await self._steps(inline, options, draining, steps)

    async def _steps(self, inline: bool, options: Any, draining: bool,
                     steps: List[Tuple[int, bool]]) -> Any:
        async with WindowClient("127.0.0.1:1", token="") as client:
            sub = client.subscribe("orders", "g", **options)
            st = _Stream(1, call=None)
            sub._stream = st
            sub._read(st, pb.Read(read_id=1, deliveries=[
                pb.Delivery(slot=n, entry_id=f"{n}-0", payload=b"{}", delivery_count=1)
                for n in (1, 2, 3)]))
            ds = {d.slot: sub._hand_out(d) for d in
                  [sub._ready.popleft() for _ in range(3)]}
            st.draining = draining
            st.drained = asyncio.get_running_loop().create_future()
            seen = []
            for slot, queue in steps:
                d = ds[slot]
                if queue:
                    d.queue("INCR", f"n{slot}")
                if inline:
                    with mock.patch.object(Subscription, "_settled",
                                           side_effect=AssertionError("not inline")):
                        d.ack()
                else:
                    d._settle("ack", (d.slot, pb.OUTCOME_KIND_ACK, None))
                rd = st.reads.get(1)
                seen.append((_sent(st), st.unsettled, st.handed_unsettled, st.drained.done(),
                             rd is not None and rd.timer is not None,
                             dict(sub.stats.outcomes), d.outcome))
            return seen

    async def test_the_inline_ack_does_what_settle_does(self) -> None:
        shapes = {
            "one by one": {"linger": None},
            "linger": {"linger": 0.05},
            "ordered": {"linger": None, "ordering_header": "k"},
        }
        orders = [[(1, True), (2, False), (3, True)], [(3, False), (1, True), (2, True)]]
        for name, options in shapes.items():
            for draining in (False, True):
                for steps in orders:
                    with self.subTest(shape=name, draining=draining, steps=steps):
                        inline = await self._run(True, options, draining, steps)
                        slow = await self._run(False, options, draining, steps)
                        self.assertEqual(inline, slow)
                        self.assertEqual(inline[-1][1:4], (0, 0, True))


class PackedCommands(unittest.TestCase):
    def test_resp_of_every_size(self) -> None:
        from window_client.client import _pack

        long = b"v" * 1024
        packed, slots = _pack([
            (1, "PING", []),
            (1, "INCR", [b"count:7"]),
            (2, "SET", [b"k", b""]),
            (3, "HSET", [b"h", b"f" * 1023, long]),
        ])
        self.assertEqual(slots, [1, 1, 2, 3])
        self.assertEqual(packed, b"".join([
            b"*1\r\n$4\r\nPING\r\n",
            b"*2\r\n$4\r\nINCR\r\n$7\r\ncount:7\r\n",
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n",
            b"*4\r\n$4\r\nHSET\r\n$1\r\nh\r\n$1023\r\n" + b"f" * 1023
            + b"\r\n$1024\r\n" + long + b"\r\n",
        ]))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Unreachable(unittest.IsolatedAsyncioTestCase):
    async def test_publish_fails_fast_naming_the_address_and_the_cause(self) -> None:
        target = f"127.0.0.1:{_closed_port()}"
        async with WindowClient(target, token="", connect_timeout=0.5) as client:
            started = time.monotonic()
            with self.assertRaises(ConnectionError) as err:
                await client.publish("orders", [b"x"])
            self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(
            str(err.exception),
            f"cannot reach the sidecar at {target}: connection refused; nothing listens there: "
            "start the sidecar, or set WINDOW_SIDECAR_ADDR (or the client's address) to the "
            "sidecar's gRPC address, its --listen (127.0.0.1:50051 by default)",
        )
        self.assertIsInstance(err.exception, WindowError)
        self.assertIsInstance(err.exception, OSError)  # also the builtin ConnectionError


class _FakeRpcError:
    """What the classification reads of a grpc.aio.AioRpcError."""

    def __init__(self, code: Any, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> str:
        return self._details


async def _serve_once(reply: bytes) -> Tuple[asyncio.AbstractServer, str]:
    """A TCP server on a free port that answers any line with ``reply``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}"


class ErrorsByCause(unittest.IsolatedAsyncioTestCase):
    """Each cause has its own error, its message naming the address and the next step."""

    def test_the_sidecars_answer_about_redis_is_not_a_connection_error(self) -> None:
        import grpc
        from window_client import RedisUnavailableError
        from window_client.errors import from_rpc

        # The sidecar quotes Redis's own "Connection refused": still the sidecar's answer.
        err = from_rpc(_FakeRpcError(
            grpc.StatusCode.UNAVAILABLE,
            "Redis did not answer in time (XADD: Request timed out.; last connection error: "
            "Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" })",
        ), "127.0.0.1:50051", call="publish")
        self.assertIsInstance(err, RedisUnavailableError)
        self.assertNotIsInstance(err, ConnectionError)
        self.assertIn("the sidecar at 127.0.0.1:50051 answered publish that Redis is unavailable",
                      str(err))
        self.assertIn("--redis-url", str(err))

    def test_a_transport_unavailable_is_a_connection_error(self) -> None:
        import grpc
        from window_client.errors import from_rpc

        err = from_rpc(_FakeRpcError(
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
            "Failed to connect to remote host: Connection refused",
        ), "127.0.0.1:1")
        self.assertIsInstance(err, ConnectionError)
        self.assertIn("nothing listens there", str(err))

    def test_refusals_and_timeouts(self) -> None:
        import grpc
        from window_client import CallTimeoutError, RefusedError
        from window_client.errors import from_rpc

        refused = from_rpc(_FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "token, please"),
                           "127.0.0.1:50051", call="publish")
        self.assertIsInstance(refused, RefusedError)
        assert isinstance(refused, RefusedError)
        self.assertEqual(refused.reason, "UNAUTHENTICATED")
        self.assertIn("WINDOW_SIDECAR_TOKEN", str(refused))
        late = from_rpc(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
                        "127.0.0.1:50051", call="publish", timeout=30.0)
        self.assertIsInstance(late, CallTimeoutError)
        self.assertIsInstance(late, TimeoutError)  # also the builtin
        self.assertIn("did not answer publish within 30 s", str(late))
        self.assertIn("--redis-timeout", str(late))

    def test_what_answers_a_probe(self) -> None:
        from window_client.errors import what_answers

        self.assertIn("a Redis server answers there", what_answers(b"+PONG\r\n") or "")
        self.assertIn("a Redis server", what_answers(b"-NOAUTH Authentication required.") or "")
        self.assertIn("an HTTP/1 server answers there",
                      what_answers(b"HTTP/1.1 400 Bad Request\r\n") or "")
        self.assertIn("a TLS server", what_answers(b"\x15\x03\x03\x00\x02\x02\x46") or "")
        self.assertIsNone(what_answers(b"\x15\x03\x03\x00\x02\x02\x46", tls=True))
        self.assertIsNone(what_answers(b"\x00\x00\x12\x04"))  # an HTTP/2 server's SETTINGS

    async def test_a_publish_to_a_redis_port_says_so_at_once(self) -> None:
        server, target = await _serve_once(b"-ERR wrong number of arguments for 'ping'\r\n")
        async with server:
            async with WindowClient(target, token="", tls=False) as client:
                started = time.monotonic()
                with self.assertRaises(ConnectionError) as err:
                    await client.publish("orders", [b"x"])
                self.assertLess(time.monotonic() - started, 3)
        self.assertIn(f"cannot reach the sidecar at {target}: a Redis server answers there",
                      str(err.exception))

    async def test_a_publish_to_an_http1_port_says_so(self) -> None:
        server, target = await _serve_once(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        async with server:
            async with WindowClient(target, token="", tls=False) as client:
                with self.assertRaises(ConnectionError) as err:
                    await client.publish("orders", [b"x"])
        self.assertIn("an HTTP/1 server answers there", str(err.exception))
        self.assertIn("--metrics-listen", str(err.exception))

    def test_a_url_is_refused_at_once_naming_host_and_port(self) -> None:
        for url, want in (("http://127.0.0.1:50051", "give 127.0.0.1:50051"),
                          ("https://sidecar:443/", "give sidecar:443 and WINDOW_SIDECAR_TLS_CA"),
                          ("redis://127.0.0.1:6379", "a Redis URL")):
            with self.assertRaises(ConnectionError) as err:
                WindowClient(url, token="", tls=False)
            self.assertIn("the address is a", str(err.exception))
            self.assertIn(want, str(err.exception))
            self.assertNotIn("does not resolve", str(err.exception))
        # grpc's own URI schemes stay addresses.
        for target in ("dns:///localhost:50051", "unix:///tmp/sidecar.sock"):
            WindowClient(target, token="", tls=False)


class ImportPaths(unittest.TestCase):
    def test_sync_by_default_and_the_old_paths_with_a_warning(self) -> None:
        import window_client.aio as aio

        self.assertIsNot(window_client.WindowClient, aio.WindowClient)
        sys.modules.pop("window_client.sync", None)
        with self.assertWarns(DeprecationWarning):
            importlib.import_module("window_client.sync")
        with self.assertWarns(DeprecationWarning):
            self.assertIs(window_client.Handler, aio.Handler)  # type: ignore[attr-defined]

    def test_the_top_level_client_in_a_running_loop_is_the_asyncio_one(self) -> None:
        async def make() -> Any:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                client = window_client.WindowClient("127.0.0.1:1", token="")
            await client.close()
            return client, caught

        client, caught = asyncio.run(make())
        self.assertIsInstance(client, WindowClient)
        self.assertTrue(any(w.category is DeprecationWarning for w in caught))


class Options(unittest.IsolatedAsyncioTestCase):
    async def test_open_message(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            sub = client.subscribe("orders", "g", consumer="c", count=4, atomic=True,
                                   max_deliveries=3, dead_letter="orders:dead")
            o = sub._open
            self.assertEqual((o.stream.key, o.stream.group, o.stream.consumer, o.count),
                             ("orders", "g", "c", 4))
            self.assertEqual((o.mode, o.max_deliveries, o.dead_letter.stream, o.reports_in_reads),
                             (pb.MODE_ATOMIC, 3, "orders:dead", False))
            lst = client.subscribe_reliable_list("jobs", consumer="w", dead_after=10,
                                                 max_deliveries=2, dead_letter="jobs:dead")._open
            self.assertEqual((lst.reliable_list.key, lst.reliable_list.consumer,
                              lst.reliable_list.dead_after.seconds, lst.dead_letter.list),
                             ("jobs", "w", 10, "jobs:dead"))
            self.assertEqual(client.subscribe_list("q")._open.simple_list.key, "q")
            ps = client.subscribe_pubsub(["a"], patterns=["b.*"])._open.pubsub
            self.assertEqual((list(ps.channels), list(ps.patterns)), (["a"], ["b.*"]))
            with self.assertRaises(ValueError):
                client.subscribe("orders", "g", max_deliveries=2)

    async def test_ordering_key(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            self.assertFalse(client.subscribe("orders", "g")._open.HasField("ordering_key"))
            o = client.subscribe("orders", "g", ordering_header="customer")._open
            self.assertEqual(o.ordering_key.WhichOneof("source"), "header")
            self.assertEqual(o.ordering_key.header, "customer")
            o = client.subscribe("orders", "g", ordering_field="customer_id")._open
            self.assertEqual((o.ordering_key.WhichOneof("source"), o.ordering_key.field),
                             ("field", "customer_id"))
            lst = client.subscribe_reliable_list("jobs", ordering_header="customer")._open
            self.assertEqual(lst.ordering_key.header, "customer")
            with self.assertRaises(ValueError):
                client.subscribe("orders", "g", ordering_header="a", ordering_field="b")

    async def test_partitions(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            self.assertEqual(client.subscribe("orders", "g")._open.stream.partitions, 0)
            o = client.subscribe("orders", "g", consumer="w1", partitions=4,
                                 ordering_header="k")._open
            self.assertEqual((o.stream.key, o.stream.consumer, o.stream.partitions,
                              o.ordering_key.header), ("orders", "w1", 4, "k"))
            with self.assertRaises(ValueError) as err:
                client.subscribe("orders", "g", partitions=-1)
            self.assertEqual(str(err.exception), "partitions is how many partitions the stream "
                                                 "has (0: the stream itself), not -1")
            # Only a stream is partitioned: the other forms have no such option.
            with self.assertRaises(TypeError):
                client.subscribe_reliable_list("jobs", partitions=4)
            with self.assertRaises(TypeError):
                client.subscribe_list("q", partitions=4)

    async def test_a_partitioned_streams_reads_fill_a_window_per_partition(self) -> None:
        # The replica reads each of its partitions within max_in_flight of that partition's:
        # the window is max_in_flight per partition the sidecar says it shares out
        # (Opened.partitions), not per partition asked for.
        def read(sub: Subscription, partitions: int) -> None:
            st = _Stream(1, call=None)
            sub._stream = st
            sub._opened(st, pb.Opened(max_in_flight=2, partitions=partitions))
            sub._read(st, pb.Read(read_id=1, deliveries=[
                pb.Delivery(slot=n, entry_id=f"{n}-0", payload=b"x", delivery_count=1)
                for n in range(1, 6)]))

        async with WindowClient("127.0.0.1:1", token="") as client:
            with self.assertNoLogs("window_client", level="WARNING"):
                read(client.subscribe("orders", "g", partitions=4), 4)
            # Unpartitioned, or partitions asked of a sidecar older than them (it reads the
            # stream itself and says 0): one window.
            for sub in (client.subscribe("orders", "g"),
                        client.subscribe("orders", "g", partitions=4)):
                with self.assertLogs("window_client", level="WARNING") as logs:
                    read(sub, 0)
                self.assertIn("more than max_in_flight 2", logs.output[0])

    async def test_publish_by_partition(self) -> None:
        sent: List[pb.PublishRequest] = []

        async def unary(method: Any, request: Any, timeout: float, call: str = "") -> Any:
            sent.append(request)
            return pb.PublishResponse(ids=["1-0"])

        async with WindowClient("127.0.0.1:1", token="") as client:
            with mock.patch.object(client, "_unary", unary):
                await client.publish("orders", [b"x"], partitions=4, partition_header="k",
                                     max_len=100)
                await client.publish("orders", [b"x"], partitions=8,
                                     partition_field="customer_id")
                await client.publish("orders", [b"x"])
                for kwargs, message in (
                    ({"partitions": 4}, "^partitions needs partition_header or "
                                        "partition_field: where each entry's key is"),
                    ({"partition_header": "k"}, "^partition_header needs partitions: how many "
                                                "partitions the stream has"),
                    ({"partition_field": "f"}, "^partition_field needs partitions"),
                    ({"partitions": 4, "partition_header": "k", "partition_field": "f"},
                     "^partition_header and partition_field: one partition key, not both$"),
                    ({"partitions": -1, "partition_header": "k"}, "^partitions is how many"),
                ):
                    with self.subTest(**kwargs), self.assertRaisesRegex(ValueError, message):
                        await client.publish("orders", [b"x"], **kwargs)
                # Lists and channels are not partitioned: their calls have no such options.
                with self.assertRaises(TypeError):
                    await client.publish_list(  # type: ignore[call-arg]
                        "jobs", [b"x"], partitions=4, partition_header="k")
                with self.assertRaises(TypeError):
                    await client.publish_channel(  # type: ignore[call-arg]
                        "news", [b"x"], partitions=4, partition_header="k")
        by_header, by_field, plain = sent  # nothing refused was sent
        self.assertEqual((by_header.stream, by_header.partitions, by_header.max_len,
                          by_header.partition_by.WhichOneof("source"),
                          by_header.partition_by.header), ("orders", 4, 100, "header", "k"))
        self.assertEqual((by_field.partitions, by_field.partition_by.WhichOneof("source"),
                          by_field.partition_by.field), (8, "field", "customer_id"))
        self.assertEqual(plain.partitions, 0)
        self.assertFalse(plain.HasField("partition_by"))

    async def test_bearer_token_from_the_environment(self) -> None:
        with mock.patch.dict(os.environ, {TOKEN_ENV: "s3cret"}):
            async with WindowClient("127.0.0.1:1") as client:
                self.assertEqual(client.metadata, (("authorization", "Bearer s3cret"),))
        with mock.patch.dict(os.environ, {TOKEN_ENV: ""}):
            async with WindowClient("127.0.0.1:1") as client:
                self.assertEqual(client.metadata, ())


if __name__ == "__main__":
    unittest.main()
