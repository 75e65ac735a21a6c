"""Unit tests of the helper that need no sidecar: the options of the Open message and the
bearer token. Run against the installed package:

    python -m unittest discover -s tests        (from outside client-examples/python)
"""

import os
import unittest
from unittest import mock

from window_client import TOKEN_ENV, WindowClient, pb


class Options(unittest.IsolatedAsyncioTestCase):
    async def test_open_message(self) -> None:
        async with WindowClient("127.0.0.1:1", token="") as client:
            sub = client.subscribe("orders", "g", consumer="c", count=4, atomic=True,
                                   max_deliveries=3, dead_letter="orders:dead")
            o = sub._open
            self.assertEqual((o.stream.key, o.stream.group, o.stream.consumer, o.count),
                             ("orders", "g", "c", 4))
            self.assertEqual((o.mode, o.max_deliveries, o.dead_letter.stream, o.reports_in_reads),
                             (pb.MODE_ATOMIC, 3, "orders:dead", True))
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
