"""Unit tests of the helper that need no sidecar: the rule for a refused command, the options
of the Open message and the bearer token. Run against the installed package:

    python -m unittest discover -s tests        (from outside client-examples/python)
"""

import asyncio
import os
import unittest
from typing import Any, List, Tuple
from unittest import mock

from google.protobuf.duration_pb2 import Duration

from window_client import RETRY_DELAY, TOKEN_ENV, Delivery, WindowClient, pb
from window_client.client import Subscription, _Stream


def _one_delivery(sub: Subscription) -> Tuple[_Stream, Delivery]:
    """A stream with one read of one delivery (slot 7), handed out as the iterator would."""
    st = _Stream(1, call=None)
    sub._stream = st
    msg = pb.Delivery(slot=7, entry_id="1-0", payload=b"{}", delivery_count=1)
    sub._read(st, pb.Read(read_id=1, deliveries=[msg]))
    item = sub._ready.popleft()
    assert isinstance(item, Delivery)
    return st, sub._hand_out(item)


def _sent(st: _Stream) -> List[Any]:
    items = []
    while not st.outbox.empty():
        items.append(st.outbox.get_nowait())
    return items


class RejectedCommand(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = WindowClient("127.0.0.1:1", token="")
        self.seen: List[Any] = []
        self.sub = self.client.subscribe(
            "orders", "g", max_deliveries=2, dead_letter="orders:dead",
            on_rejection=lambda rej, d: self.seen.append((rej.reason, d.outcome if d else None)),
        )

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def test_a_refused_command_turns_the_ack_into_retry_after(self) -> None:
        st, d = _one_delivery(self.sub)
        d.queue("FLUSHALL").ack()
        [(commands, outcomes)] = _sent(st)
        self.assertEqual(commands, [(7, "FLUSHALL", [])])
        self.assertEqual(outcomes, [(7, pb.OUTCOME_KIND_ACK, None)])
        # What the sidecar answers for that batch: the command, then the ack it made incomplete.
        await self.sub._rejected(st, pb.Rejections(rejections=[
            pb.Rejection(slot=7, reason=pb.REJECTION_REASON_FORBIDDEN_COMMAND,
                         message="FLUSHALL is forbidden in a window", command="FLUSHALL"),
            pb.Rejection(slot=7, reason=pb.REJECTION_REASON_INCOMPLETE_SEGMENT,
                         message="a command of this slot was refused"),
        ]))
        delay = Duration()
        delay.FromNanoseconds(int(RETRY_DELAY * 1e9))
        self.assertEqual(_sent(st), [([], [(7, pb.OUTCOME_KIND_RETRY_AFTER, {
            "delay": delay, "reason": "rejected: FLUSHALL is forbidden in a window"})])])
        self.assertEqual(RETRY_DELAY, 1.0)
        self.assertEqual(d.outcome, "retry_after")
        self.assertIsNone(d.rejection)
        # The callback sees the delivery already settled by the helper, never dropped.
        self.assertEqual(self.seen, [
            (pb.REJECTION_REASON_FORBIDDEN_COMMAND, "ack"),
            (pb.REJECTION_REASON_INCOMPLETE_SEGMENT, "retry_after"),
        ])

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
                         (7, pb.OUTCOME_KIND_RETRY_AFTER, "rejected: REJECTION_REASON_INVALID_OUTCOME: bad"))


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

    async def test_bearer_token_from_the_environment(self) -> None:
        with mock.patch.dict(os.environ, {TOKEN_ENV: "s3cret"}):
            async with WindowClient("127.0.0.1:1") as client:
                self.assertEqual(client.metadata, (("authorization", "Bearer s3cret"),))
        with mock.patch.dict(os.environ, {TOKEN_ENV: ""}):
            async with WindowClient("127.0.0.1:1") as client:
                self.assertEqual(client.metadata, ())


if __name__ == "__main__":
    unittest.main()
