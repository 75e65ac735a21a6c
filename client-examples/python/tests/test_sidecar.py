"""Unit tests of the client against a fake sidecar in the same process (a grpc.aio server
that plays the sidecar's side of the wire): TLS and the token from the environment, publishing
to a stream, a list and a channel, the Open's options, packed acks, reads handed out as
batches, the rule for a failed handler, the lifecycle events, draining and reconnecting. Run
against the installed package:

    python -m unittest discover -s tests        (from outside client-examples/python)
"""

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from typing import Any, Awaitable, Callable, Dict, List, Optional
from unittest import mock

import grpc
import redis

import window_client
from window_client import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    TOKEN_ENV,
    LifecycleEvent,
    SubscriptionEndedError,
    TLSConfig,
    WindowError,
    pb,
    pb_grpc,
)
from window_client.aio import Delivery, WindowClient

Script = Callable[["Stream"], Awaitable[None]]


class Stream:
    """The sidecar's side of one Subscribe call, for a test's script."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.requests: List[pb.SubscribeRequest] = []
        self.half_closed = False

    async def read(self) -> Optional[pb.SubscribeRequest]:
        msg = await self.context.read()
        if msg is grpc.aio.EOF:  # type: ignore[attr-defined]
            self.half_closed = True
            return None
        self.requests.append(msg)
        return msg  # type: ignore[no-any-return]

    async def write(self, **kind: Any) -> None:
        await self.context.write(pb.SubscribeResponse(**kind))

    async def batch(self) -> pb.Batch:
        msg = await self.read()
        assert msg is not None and msg.HasField("batch"), msg
        return msg.batch

    async def until_half_closed(self) -> List[pb.Batch]:
        batches = []
        while (msg := await self.read()) is not None:
            batches.append(msg.batch)
        return batches


def delivery(slot: int, payload: str, count: int = 1) -> pb.Delivery:
    return pb.Delivery(slot=slot, entry_id=f"{slot}-0", payload=payload.encode(),
                       delivery_count=count)


class FakeSidecar(pb_grpc.WindowServiceServicer):  # type: ignore[misc]
    def __init__(self, scripts: List[Script]) -> None:
        self.scripts = scripts
        self.streams: List[Stream] = []
        self.opens: List[pb.Open] = []
        self.publishes: List[pb.PublishRequest] = []
        self.metadata: List[Dict[str, str]] = []

    async def Publish(self, request: pb.PublishRequest, context: Any) -> pb.PublishResponse:
        self.publishes.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        n = len(request.entries)
        return pb.PublishResponse(ids=[f"{i}-0" for i in range(n)] if request.stream else [],
                                  receivers=[1] * n if not request.stream else [])

    async def Subscribe(self, request_iterator: Any, context: Any) -> None:
        self.metadata.append(dict(context.invocation_metadata()))
        st = Stream(context)
        self.streams.append(st)
        first = await st.read()
        assert first is not None and first.HasField("open")
        self.opens.append(first.open)
        script = self.scripts[min(len(self.streams), len(self.scripts)) - 1]
        await script(st)


async def opened(st: Stream, partitions: int = 0, packed_commands: bool = False) -> None:
    await st.write(opened=pb.Opened(subscription_id=f"sub-{id(st)}", consumer="c1", count=4,
                                    max_in_flight=8, partitions=partitions,
                                    packed_commands=packed_commands))


async def serve_until_closed(st: Stream) -> None:
    await opened(st)
    await st.until_half_closed()


def one_read(got: List[pb.Batch], *deliveries: pb.Delivery,
             packed_commands: bool = False) -> Script:
    """Opened, read 1 of `deliveries`, the client's first batch kept in `got`, then serving
    until the client half-closes."""
    async def script(st: Stream) -> None:
        await opened(st, packed_commands=packed_commands)
        await st.write(read=pb.Read(read_id=1, deliveries=deliveries))
        got.append(await st.batch())
        await st.until_half_closed()

    return script


async def partitioned_reads(st: Stream) -> None:
    """A subscription the sidecar shares 4 partitions out for: a read of partition 3 whose
    entry ids another partition could hold too, then a read without a partition (as an
    unpartitioned stream's)."""
    await opened(st, partitions=4)
    await st.write(read=pb.Read(read_id=1, partition=3, deliveries=[delivery(1, "a"),
                                                                      delivery(2, "b")]))
    await st.write(read=pb.Read(read_id=2, deliveries=[delivery(3, "c")]))
    await st.until_half_closed()


class SidecarTest(unittest.IsolatedAsyncioTestCase):
    async def start(self, scripts: List[Script], credentials: Any = None) -> str:
        self.fake = FakeSidecar(scripts)
        self.server = grpc.aio.server()
        pb_grpc.add_WindowServiceServicer_to_server(self.fake, self.server)
        if credentials is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            port = self.server.add_secure_port("127.0.0.1:0", credentials)
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def asyncTearDown(self) -> None:
        # A test that skipped before starting its fake sidecar has none to stop.
        server = getattr(self, "server", None)
        if server is not None:
            await server.stop(None)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@unittest.skipUnless(shutil.which("openssl"), "needs openssl to make the certificates")
class TLSFromTheEnvironment(SidecarTest):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        d = lambda name: os.path.join(self.dir, name)  # noqa: E731
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ca",
                 "-keyout", d("ca.key"), "-out", d("ca.pem"))
        with open(d("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:sidecar.test\n")
        with open(d("client.ext"), "w") as f:
            f.write("extendedKeyUsage=clientAuth\n")
        for name, ext in (("server", "server.ext"), ("client", "client.ext")):
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                     "-keyout", d(f"{name}.key"), "-out", d(f"{name}.csr"))
            _openssl("x509", "-req", "-in", d(f"{name}.csr"), "-CA", d("ca.pem"),
                     "-CAkey", d("ca.key"), "-CAcreateserial", "-days", "1",
                     "-extfile", d(ext), "-out", d(f"{name}.pem"))
        self.path = d

    def tearDown(self) -> None:
        shutil.rmtree(self.dir)

    def read(self, name: str) -> bytes:
        with open(self.path(name), "rb") as f:
            return f.read()

    async def test_mutual_tls_and_the_token_from_the_environment(self) -> None:
        creds = grpc.ssl_server_credentials(
            [(self.read("server.key"), self.read("server.pem"))],
            root_certificates=self.read("ca.pem"), require_client_auth=True,
        )
        target = await self.start([serve_until_closed], creds)
        env = {TLS_CA_ENV: self.path("ca.pem"), TLS_CERT_ENV: self.path("client.pem"),
               TLS_KEY_ENV: self.path("client.key"), TOKEN_ENV: "s3cret",
               "WINDOW_SIDECAR_ADDR": target}
        with mock.patch.dict(os.environ, env):
            async with WindowClient() as client:
                self.assertEqual(client.tls, TLSConfig(self.path("ca.pem"), self.path("client.pem"),
                                                       self.path("client.key")))
                self.assertEqual(await client.publish("s", [b"x"]), ["0-0"])
                sub = client.subscribe("s", "g")
                async with sub:
                    await sub.wait_opened(5)
        self.assertEqual(len(self.fake.publishes), 1)
        self.assertEqual([m["authorization"] for m in self.fake.metadata], ["Bearer s3cret"] * 2)

    async def test_the_server_name_to_verify(self) -> None:
        creds = grpc.ssl_server_credentials([(self.read("server.key"), self.read("server.pem"))])
        target = await self.start([serve_until_closed], creds)
        env = {TLS_CA_ENV: self.path("ca.pem"), TLS_SERVER_NAME_ENV: "sidecar.test"}
        with mock.patch.dict(os.environ, env):
            async with WindowClient(target.replace("127.0.0.1", "localhost"), token="") as client:
                self.assertEqual(client.tls.server_name if client.tls else None, "sidecar.test")
                await client.publish("s", [b"x"], timeout=5)
        # A name the certificate does not carry is refused.
        env = {TLS_CA_ENV: self.path("ca.pem"), TLS_SERVER_NAME_ENV: "elsewhere.test"}
        with mock.patch.dict(os.environ, env):
            async with WindowClient(target, token="") as client:
                with self.assertRaises(WindowError) as err:
                    await client.publish("s", [b"x"], timeout=1)
        self.assertIn(f"cannot reach the sidecar at {target}: ", str(err.exception))
        self.assertIn("Hostname Verification Check failed", str(err.exception))


class TLSConfiguration(unittest.TestCase):
    def test_from_the_environment(self) -> None:
        self.assertIsNone(TLSConfig.from_env({}))
        self.assertIsNone(TLSConfig.from_env({TLS_CA_ENV: ""}))
        self.assertEqual(
            TLSConfig.from_env({TLS_CA_ENV: "ca", TLS_CERT_ENV: "c", TLS_KEY_ENV: "k",
                                TLS_SERVER_NAME_ENV: "n"}),
            TLSConfig(ca_file="ca", cert_file="c", key_file="k", server_name="n"),
        )
        self.assertEqual(TLSConfig(server_name="n").channel_options(),
                         [("grpc.ssl_target_name_override", "n")])
        with self.assertRaisesRegex(ValueError, TLS_CA_ENV):
            TLSConfig.from_env({TLS_CERT_ENV: "c", TLS_KEY_ENV: "k"})

    def test_a_certificate_needs_its_key(self) -> None:
        with self.assertRaisesRegex(ValueError, "needs its key"):
            TLSConfig(cert_file="c").credentials()

    def test_plaintext_unless_asked(self) -> None:
        async def check() -> None:
            with mock.patch.dict(os.environ, {TLS_CA_ENV: ""}):
                async with WindowClient("127.0.0.1:1", token="") as client:
                    self.assertIsNone(client.tls)
            with mock.patch.dict(os.environ, {TLS_CA_ENV: "/nonexistent/ca.pem"}):
                async with WindowClient("127.0.0.1:1", token="", tls=False) as client:
                    self.assertIsNone(client.tls)
        asyncio.run(check())


class Publishing(SidecarTest):
    async def test_to_a_stream_a_list_and_a_channel(self) -> None:
        target = await self.start([serve_until_closed])
        async with WindowClient(target, token="") as client:
            entry = {"payload": "a", "headers": {"k": "v"}}
            self.assertEqual(await client.publish("s", [entry, b"b"], max_len=10), ["0-0", "1-0"])
            self.assertIsNone(await client.publish_list("l", [entry]))
            self.assertEqual(await client.publish_channel("c", [entry, "b"]), [1, 1])
            self.assertEqual(await client.publish_channel("sc", ["b"], sharded=True), [1])
            await client.publish_list("raw", [b"x"], framing="raw")
            with self.assertRaises(ValueError):
                await client.publish_list("l", [b"x"], framing="json")
        s, l, c, sc, raw = self.fake.publishes
        self.assertEqual((s.stream, s.max_len, s.entries[0].payload, dict(s.entries[0].headers)),
                         ("s", 10, b"a", {"k": "v"}))
        self.assertEqual((l.list, l.stream, dict(l.entries[0].headers)), ("l", "", {"k": "v"}))
        self.assertEqual((c.channel, c.sharded_channel, len(c.entries)), ("c", "", 2))
        self.assertEqual((sc.sharded_channel, sc.channel), ("sc", ""))
        self.assertEqual((raw.list, raw.framing), ("raw", pb.FRAMING_RAW))


class Subscribing(SidecarTest):
    async def test_the_open_message(self) -> None:
        target = await self.start([serve_until_closed])
        async with WindowClient(target, token="") as client:
            for sub in (
                client.subscribe("s", "g", consumer="c1", start_id="$", min_idle=30, count=4,
                                 max_in_flight=12, block=2, atomic=True, max_deliveries=3,
                                 dead_letter="s:dead", reports_in_reads=True),
                client.subscribe_reliable_list("l", consumer="c1", dead_after=10,
                                               max_deliveries=2,
                                               dead_letter="l:dead", framing="raw"),
                client.subscribe_list("q"),
                client.subscribe_pubsub(["ch"], patterns=["p.*"], sharded_channels=["sh"],
                                        buffer=100),
            ):
                async with sub:
                    await sub.wait_opened(5)
        s, lst, q, ps = self.fake.opens
        self.assertEqual((s.stream.key, s.stream.group, s.stream.consumer, s.stream.start_id,
                          s.stream.min_idle.seconds), ("s", "g", "c1", "$", 30))
        self.assertEqual((s.count, s.max_in_flight, s.block.seconds, s.mode, s.max_deliveries,
                          s.dead_letter.stream, s.reports_in_reads),
                         (4, 12, 2, pb.MODE_ATOMIC, 3, "s:dead", True))
        self.assertEqual((lst.reliable_list.key, lst.reliable_list.dead_after.seconds,
                          lst.dead_letter.list, lst.reports_in_reads, lst.framing),
                         ("l", 10, "l:dead", False, pb.FRAMING_RAW))
        self.assertEqual((q.simple_list.key, q.count, q.mode), ("q", 16, pb.MODE_UNSPECIFIED))
        self.assertEqual((list(ps.pubsub.channels), list(ps.pubsub.patterns),
                          list(ps.pubsub.sharded_channels), ps.pubsub.buffer),
                         (["ch"], ["p.*"], ["sh"], 100))

    async def test_the_typed_commands_are_imported_off_the_loop_before_the_open(self) -> None:
        # Imported on a delivery's first d.redis, they held the event loop for 60-100 ms.
        from window_client import client as client_module

        loop_thread = threading.get_ident()
        loaded: List[int] = []
        real = client_module._redis_commands

        def recording() -> Any:
            loaded.append(threading.get_ident())
            return real()

        seen_at_open: List[List[int]] = []

        async def script(st: Stream) -> None:  # runs once the open has arrived
            seen_at_open.append(list(loaded))
            await serve_until_closed(st)

        target = await self.start([script])
        with mock.patch.object(client_module, "_REDIS_COMMANDS", None), \
                mock.patch.object(client_module, "_redis_commands", recording):
            async with WindowClient(target, token="") as client:
                async with client.subscribe("s", "g") as sub:
                    await sub.wait_opened(5)
        self.assertEqual(len(seen_at_open), 1)
        self.assertEqual(len(seen_at_open[0]), 1, "imported once, before the open was sent")
        self.assertNotEqual(seen_at_open[0][0], loop_thread, "imported off the event loop")

    async def outcomes(self, packed_acks: bool) -> pb.Batch:
        got: List[pb.Batch] = []
        target = await self.start([one_read(got, delivery(1, "a"), delivery(2, "b"))])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", packed_acks=packed_acks)
            async with sub:
                async for d in sub:
                    d.queue("INCR", "n").ack()
                    if d.slot == 2:
                        sub.stop()
        [batch] = got
        return batch

    async def test_packed_acks(self) -> None:
        batch = await self.outcomes(packed_acks=True)
        self.assertEqual((list(batch.acks), len(batch.outcomes), len(batch.commands)),
                         ([1, 2], 0, 2))

    async def test_acks_as_outcomes_without_packed_acks(self) -> None:
        batch = await self.outcomes(packed_acks=False)
        self.assertEqual(list(batch.acks), [])
        self.assertEqual([(o.slot, o.kind) for o in batch.outcomes],
                         [(1, pb.OUTCOME_KIND_ACK), (2, pb.OUTCOME_KIND_ACK)])

    async def commands(self, packed: bool) -> pb.Batch:
        got: List[pb.Batch] = []
        target = await self.start([one_read(got, delivery(1, "a"), delivery(2, "b"),
                                            packed_commands=packed)])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g")
            async with sub:
                async for d in sub:
                    d.queue("INCR", "n")
                    d.queue("HSET", "h", f"f{d.slot}", b"a\r\nb", 3)
                    d.redis.set("k", "v", ex=60)
                    d.ack()
                    if d.slot == 2:
                        sub.stop()
        [batch] = got
        return batch

    async def test_commands_packed_for_a_sidecar_that_reads_them(self) -> None:
        batch = await self.commands(packed=True)
        self.assertEqual(len(batch.commands), 0)
        one = (b"*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n"
               b"*5\r\n$4\r\nHSET\r\n$1\r\nh\r\n$2\r\nf%d\r\n$4\r\na\r\nb\r\n$1\r\n3\r\n"
               b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nEX\r\n$2\r\n60\r\n")
        self.assertEqual(batch.packed_commands, one % 1 + one % 2)
        self.assertEqual(list(batch.packed_command_slots), [1, 1, 1, 2, 2, 2])

    async def test_commands_one_message_each_for_an_older_sidecar(self) -> None:
        batch = await self.commands(packed=False)
        self.assertEqual((batch.packed_commands, list(batch.packed_command_slots)), (b"", []))
        self.assertEqual(
            [(c.slot, c.name, list(c.args)) for c in batch.commands],
            [(slot, name, args) for slot in (1, 2) for name, args in (
                ("INCR", [b"n"]),
                ("HSET", [b"h", b"f%d" % slot, b"a\r\nb", b"3"]),
                ("SET", [b"k", b"v", b"EX", b"60"]),
            )],
        )

    async def test_the_partitions_and_each_deliverys_partition(self) -> None:
        """Opened.partitions is the subscription's partitions once it is open; Read.partition
        is each delivery's partition, None for a read without one."""
        target = await self.start([partitioned_reads])
        seen = []
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", partitions=4)
            self.assertEqual(sub.partitions, 0)  # not open yet
            async with sub:
                await sub.wait_opened(5)
                partitions = sub.partitions
                async for d in sub:
                    seen.append((d.slot, d.read_id, d.partition))
                    d.ack()
                    if d.slot == 3:
                        sub.stop()
        self.assertEqual(partitions, 4)
        self.assertEqual(seen, [(1, 1, 3), (2, 1, 3), (3, 2, None)])

    async def test_an_ordered_read_flushed_in_parts(self) -> None:
        """Ordered: each outcome goes out at once (a key's next entry waits in the sidecar for
        its flush), and a read flushed in parts keeps its unsettled deliveries: the outcome
        given after the first report goes out too, and the second report covers it."""
        async def script(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "slow"),
                                                                 delivery(2, "fast")]))
            self.batches = [await st.batch()]
            await st.write(flush=pb.FlushReport(read_id=1, settles=1, ok=True))
            self.batches.append(await st.batch())
            await st.write(flush=pb.FlushReport(read_id=1, settles=1, ok=True))
            await st.until_half_closed()

        target = await self.start([script])
        events: List[window_client.FlushEvent] = []
        held: List[Delivery] = []
        async with WindowClient(target, token="") as client:
            def on_flush(ev: window_client.FlushEvent) -> None:
                events.append(ev)
                if len(events) == 1:
                    held[0].ack()
                else:
                    sub.stop()

            sub = client.subscribe("s", "g", ordering_header="k", linger=None,
                                   on_flush=on_flush)
            async with sub:
                async for d in sub:
                    if d.slot == 1:
                        held.append(d)
                    else:
                        d.ack()
        self.assertEqual(self.fake.opens[0].ordering_key.header, "k")
        self.assertEqual([[o.slot for o in b.outcomes] for b in self.batches], [[2], [1]])
        self.assertEqual([([d.slot for d in ev.settled], [d.slot for d in ev.abandoned])
                          for ev in events], [([2], []), ([1], [])])

    async def test_outcomes_refused_already_settled_end_their_read(self) -> None:
        """A partitioned stream whose partition was handed over while a read of it was out:
        the sidecar refuses the read's outcomes ALREADY_SETTLED and never reports the read (the
        new owner delivers the entries again). The refusals reach on_rejection and the log, the
        outcomes are not sent again, and the read and its slots are dropped at once rather than
        held until the stream ends."""
        p = 1 << 36  # a partition's range of read ids and slots

        async def script(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=p + 1, deliveries=[
                delivery(p + 1, "a"), delivery(p + 2, "b"), delivery(p + 3, "c")]))
            self.batches = [await st.batch()]
            await st.write(rejections=pb.Rejections(rejections=[
                pb.Rejection(slot=p + n, reason=pb.REJECTION_REASON_ALREADY_SETTLED,
                             message=f"slot {p + n} already has an outcome or was abandoned")
                for n in (1, 2, 3)]))
            self.batches += await st.until_half_closed()

        target = await self.start([script])
        refused: List[Any] = []
        errors: List[WindowError] = []
        flushes: List[window_client.FlushEvent] = []
        with self.assertLogs("window_client", level="WARNING") as logs:
            async with WindowClient(target, token="") as client:
                def on_rejection(rej: pb.Rejection, d: Optional[Delivery]) -> None:
                    refused.append((rej.slot, rej.reason, d.slot if d else None,
                                    d.outcome if d else None))
                    if len(refused) == 3:
                        sub.stop()

                sub = client.subscribe("s", "g", partitions=4, linger=None,
                                       on_rejection=on_rejection, on_error=errors.append,
                                       on_flush=flushes.append)
                async with sub:
                    async for d in sub:
                        d.ack()
        st = sub._stream
        assert st is not None
        self.assertEqual([[o.slot for o in b.outcomes] + list(b.acks) for b in self.batches],
                         [[p + 1, p + 2, p + 3]] + [[]] * (len(self.batches) - 1))
        self.assertEqual(refused, [(p + n, pb.REJECTION_REASON_ALREADY_SETTLED, p + n, "ack")
                                   for n in (1, 2, 3)])
        self.assertEqual(len([r for r in logs.output if "ALREADY_SETTLED" in r]), 3)
        self.assertEqual((errors, flushes), ([], []))
        self.assertEqual((st.reads, st.slots, st.unsettled, st.handed_unsettled), ({}, {}, 0, 0))

    async def test_a_read_reported_in_part_then_refused_already_settled_is_dropped(self) -> None:
        """Ordered and partitioned: the read's first outcome is flushed and reported, then its
        partition is handed over and the second outcome is refused ALREADY_SETTLED. The read
        is done: no report will come for the rest, and nothing of it is kept."""
        async def script(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "fast"),
                                                                 delivery(2, "slow")]))
            self.batches = [await st.batch()]
            await st.write(flush=pb.FlushReport(read_id=1, settles=1, ok=True))
            self.batches.append(await st.batch())
            await st.write(rejections=pb.Rejections(rejections=[
                pb.Rejection(slot=2, reason=pb.REJECTION_REASON_ALREADY_SETTLED,
                             message="slot 2 already has an outcome or was abandoned")]))
            self.batches += await st.until_half_closed()

        target = await self.start([script])
        events: List[window_client.FlushEvent] = []
        refused: List[Any] = []
        held: List[Delivery] = []
        with self.assertLogs("window_client", level="WARNING"):
            async with WindowClient(target, token="") as client:
                def on_flush(ev: window_client.FlushEvent) -> None:
                    events.append(ev)
                    held[0].ack()

                def on_rejection(rej: pb.Rejection, d: Optional[Delivery]) -> None:
                    refused.append((rej.slot, rej.reason, d))
                    sub.stop()

                sub = client.subscribe("s", "g", ordering_header="k", partitions=4,
                                       linger=None, on_flush=on_flush,
                                       on_rejection=on_rejection)
                async with sub:
                    async for d in sub:
                        if d.slot == 2:
                            held.append(d)
                        else:
                            d.ack()
        st = sub._stream
        assert st is not None
        self.assertEqual([[o.slot for o in b.outcomes] for b in self.batches][:2], [[1], [2]])
        self.assertTrue(all(not b.outcomes and not b.acks for b in self.batches[2:]))
        self.assertEqual([[d.slot for d in ev.settled] for ev in events], [[1]])
        self.assertEqual(refused, [(2, pb.REJECTION_REASON_ALREADY_SETTLED, held[0])])
        self.assertEqual((st.reads, st.slots, st.unsettled, st.handed_unsettled), ({}, {}, 0, 0))

    async def test_a_streams_retries_kept_in_place_settle_nothing(self) -> None:
        """A stream's retry stays pending in its group: a report that settled the rest of the
        read is as expected, and says nothing; one that settled less than that is warned of."""
        async def script(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "a"),
                                                                 delivery(2, "b"),
                                                                 delivery(3, "c")]))
            await st.batch()
            await st.write(flush=pb.FlushReport(read_id=1, settles=1, ok=True))
            await st.write(read=pb.Read(read_id=2, deliveries=[delivery(4, "d"),
                                                                 delivery(5, "e")]))
            await st.batch()
            await st.write(flush=pb.FlushReport(read_id=2, settles=0, ok=True))
            await st.until_half_closed()

        target = await self.start([script])
        flushes = 0
        with self.assertLogs("window_client", level="WARNING") as logs:
            async with WindowClient(target, token="") as client:
                def on_flush(_: window_client.FlushEvent) -> None:
                    nonlocal flushes
                    flushes += 1
                    if flushes == 2:
                        sub.stop()

                sub = client.subscribe("s", "g", on_flush=on_flush)
                async with sub:
                    async for batch in sub.batches():
                        if batch.read_id == 1:
                            batch[0].retry("later")
                            batch[1].retry_after(5.0)
                            batch[2].ack()
                        else:
                            batch[0].retry("later")
                            batch[1].ack()
        warnings = [r.getMessage() for r in logs.records if "outcomes were sent" in r.getMessage()]
        self.assertEqual(warnings, ["flush of read 2 settled 0 entries, but 2 outcomes were sent for it"])

    async def test_a_failed_handler_is_retried_after_a_second(self) -> None:
        got: List[pb.Batch] = []
        target = await self.start([one_read(got, delivery(1, "a"))])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g")

            def handler(d: Delivery) -> None:
                d.queue("INCR", "n")
                sub.stop()
                raise RuntimeError("boom")

            async with sub:
                await sub.run(handler)
        [batch] = got
        [outcome] = batch.outcomes
        self.assertEqual((outcome.slot, outcome.kind, outcome.delay.seconds),
                         (1, pb.OUTCOME_KIND_RETRY_AFTER, 1))
        self.assertEqual(outcome.reason, "handler failed: RuntimeError('boom')")

    async def test_extend_extends_the_slot(self) -> None:
        async def script(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "a")]))
            self.batches = [await st.batch(), await st.batch()]
            await st.until_half_closed()

        target = await self.start([script])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", packed_acks=True)
            async with sub:
                async for d in sub:
                    d.extend()
                    await asyncio.sleep(0.1)
                    with self.assertWarns(DeprecationWarning):
                        d.in_progress()  # the old name, for one release
                    d.ack()
                    with self.assertRaises(window_client.AlreadySettledError):
                        d.extend()
                    with self.assertRaises(window_client.SettledError):
                        d.extend()
                    sub.stop()
        first, second = self.batches
        self.assertEqual((list(first.extend), list(first.acks)), ([1], []))
        self.assertEqual((list(second.extend), list(second.acks)), ([1], [1]))

    async def test_the_handling_span_goes_back_with_the_outcome(self) -> None:
        try:
            from opentelemetry.sdk.trace import TracerProvider
        except ImportError:
            self.skipTest("needs opentelemetry-sdk")
        producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

        traced = delivery(1, "a")
        traced.trace.traceparent = producer
        got: List[pb.Batch] = []
        target = await self.start([one_read(got, traced, delivery(2, "b"))])
        tracer = TracerProvider().get_tracer("test")
        with mock.patch.object(window_client.tracing, "_tracer", return_value=tracer):
            async with WindowClient(target, token="") as client:
                sub = client.subscribe("s", "g")  # packed acks on: a traced ack is an outcome
                async with sub:
                    async for d in sub:
                        if d.slot == 1:
                            own = format(d.span.get_span_context().span_id, "016x")
                            d.ack()
                        else:
                            d.drop("no")
                            sub.stop()
        [batch] = got
        self.assertEqual(list(batch.acks), [])
        first, second = batch.outcomes
        self.assertEqual((first.slot, first.kind), (1, pb.OUTCOME_KIND_ACK))
        # The delivery's own span, a child of the producer's trace.
        self.assertEqual(first.trace.traceparent.split("-")[1:3],
                         ["0af7651916cd43dd8448eb211c80319c", own])
        self.assertEqual((second.slot, second.kind, second.reason), (2, pb.OUTCOME_KIND_DROP, "no"))
        self.assertTrue(second.trace.traceparent)

    async def test_an_error_that_is_not_retried_ends_it(self) -> None:
        async def refuse(st: Stream) -> None:
            await st.context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")

        target = await self.start([refuse])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g")
            with self.assertRaises(SubscriptionEndedError) as err:
                await sub.wait_opened(5)
            self.assertEqual(err.exception.status, grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("UNAUTHENTICATED: no token", str(err.exception))
            await sub.close()
            with self.assertRaises(WindowError):
                async for _ in sub:
                    pass

    async def test_gives_up_after_max_attempts_and_says_so(self) -> None:
        async def unavailable(st: Stream) -> None:
            await st.context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")

        target = await self.start([unavailable] * 3)
        errors: List[WindowError] = []
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", max_attempts=3, backoff=(0.01, 0.02),
                                   on_error=errors.append)
            with self.assertRaises(SubscriptionEndedError) as err:
                await sub.wait_opened(5)
            await sub.close()
        self.assertEqual((err.exception.attempts, err.exception.status),
                         (3, grpc.StatusCode.UNAVAILABLE))
        self.assertIn("ended after 3 failed attempts: UNAVAILABLE: not yet", str(err.exception))
        self.assertEqual(errors, [err.exception])
        self.assertEqual(len(self.fake.opens), 3)


class Batches(SidecarTest):
    """A read handed out as one Batch: settled per delivery where the handler says so, the
    rest with one call; the batch message is the same as delivery by delivery."""

    async def two_reads(self, st: Stream) -> None:
        await opened(st)
        await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "a"), delivery(2, "b"),
                                                             delivery(3, "c")]))
        await st.write(read=pb.Read(read_id=2, deliveries=[delivery(4, "d")]))
        self.batches = await st.until_half_closed()

    async def test_a_read_is_one_batch_settled_in_one_call(self) -> None:
        target = await self.start([self.two_reads])
        seen = []
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", packed_acks=True)
            async with sub:
                async for batch in sub.batches():
                    seen.append((batch.read_id, [d.payload for d in batch], len(batch)))
                    for d in batch:
                        if d.payload == b"b":
                            d.drop("bad")
                        else:
                            d.queue("INCR", d.payload.decode())
                    self.assertEqual([d.slot for d in batch.unsettled],
                                     [d.slot for d in batch if d.payload != b"b"])
                    batch.ack()
                    self.assertEqual(batch.unsettled, [])
                    self.assertEqual(batch[0].outcome, "ack")
                    if batch.read_id == 2:
                        sub.stop()
        self.assertEqual(seen, [(1, [b"a", b"b", b"c"], 3), (2, [b"d"], 1)])
        commands = [(c.slot, c.name, list(c.args)) for b in self.batches for c in b.commands]
        self.assertEqual(commands, [(1, "INCR", [b"a"]), (3, "INCR", [b"c"]),
                                    (4, "INCR", [b"d"])])
        outcomes = [(o.slot, o.kind, o.reason) for b in self.batches for o in b.outcomes]
        acks = [slot for b in self.batches for slot in b.acks]
        # A read with a drop sends its acks as outcomes too; an all-ack read packs them.
        self.assertEqual(outcomes, [(2, pb.OUTCOME_KIND_DROP, "bad"), (1, pb.OUTCOME_KIND_ACK, ""),
                                    (3, pb.OUTCOME_KIND_ACK, "")])
        self.assertEqual(acks, [4])
        self.assertEqual(sub.stats.outcomes, {"drop": 1, "ack": 3})

    async def test_drop_and_retry_settle_the_rest(self) -> None:
        target = await self.start([self.two_reads])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", packed_acks=True)
            async with sub:
                async for batch in sub.batches():
                    if batch.read_id == 1:
                        batch[0].queue("INCR", "n").ack()
                        batch.drop("not ours")
                    else:
                        batch.retry("later")
                        sub.stop()
        outcomes = [(o.slot, o.kind, o.reason) for b in self.batches for o in b.outcomes]
        self.assertEqual(outcomes, [(1, pb.OUTCOME_KIND_ACK, ""),
                                    (2, pb.OUTCOME_KIND_DROP, "not ours"),
                                    (3, pb.OUTCOME_KIND_DROP, "not ours"),
                                    (4, pb.OUTCOME_KIND_RETRY, "later")])

    async def test_reads_that_came_before_are_regrouped(self) -> None:
        """``async with`` starts the subscription, so reads can arrive before ``batches()``:
        they are handed out as the batches they came in."""
        target = await self.start([self.two_reads])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g")
            async with sub:
                for _ in range(200):
                    if sub.stats.reads == 2:
                        break
                    await asyncio.sleep(0.01)
                self.assertEqual(sub.stats.reads, 2)
                sizes = []
                async for batch in sub.batches():
                    sizes.append((batch.read_id, len(batch)))
                    batch.ack()
                    if batch.read_id == 2:
                        sub.stop()
        self.assertEqual(sizes, [(1, 3), (2, 1)])

    async def test_a_batch_names_its_partition(self) -> None:
        """A read's partition is its batch's and each of its deliveries', also for the reads
        regrouped into batches after they came; None for a read without one."""
        for regrouped in (False, True):
            with self.subTest(regrouped=regrouped):
                target = await self.start([partitioned_reads])
                seen = []
                async with WindowClient(target, token="") as client:
                    sub = client.subscribe("s", "g", partitions=4)
                    async with sub:
                        for _ in range(200 if regrouped else 0):
                            if sub.stats.reads == 2:
                                break
                            await asyncio.sleep(0.01)
                        async for batch in sub.batches():
                            seen.append((batch.read_id, batch.partition,
                                         [d.partition for d in batch]))
                            batch.ack()
                            if batch.read_id == 2:
                                sub.stop()
                    self.assertEqual(sub.partitions, 4)
                await self.server.stop(None)
                self.assertEqual(seen, [(1, 3, [3, 3]), (2, None, [None])])

    async def test_each_delivery_has_its_span_and_it_goes_back_with_the_ack(self) -> None:
        try:
            from opentelemetry.sdk.trace import TracerProvider
        except ImportError:
            self.skipTest("needs opentelemetry-sdk")
        target = await self.start([self.two_reads])
        tracer = TracerProvider().get_tracer("test")
        spans = {}
        with mock.patch.object(window_client.tracing, "_tracer", return_value=tracer):
            async with WindowClient(target, token="") as client:
                sub = client.subscribe("s", "g")
                async with sub:
                    async for batch in sub.batches():
                        for d in batch:
                            spans[d.slot] = format(d.span.get_span_context().span_id, "016x")
                        batch.ack()
                        if batch.read_id == 2:
                            sub.stop()
        outcomes = {o.slot: o for b in self.batches for o in b.outcomes}
        self.assertEqual(sorted(outcomes), [1, 2, 3, 4])
        for slot, span_id in spans.items():
            self.assertEqual(outcomes[slot].kind, pb.OUTCOME_KIND_ACK)
            self.assertEqual(outcomes[slot].trace.traceparent.split("-")[2], span_id)

    async def test_one_way_or_the_other(self) -> None:
        target = await self.start([serve_until_closed, serve_until_closed])
        async with WindowClient(target, token="") as client:
            async with client.subscribe("s", "g") as sub:
                sub.batches()
                with self.assertRaisesRegex(TypeError, "iterate sub.batches"):
                    sub.__aiter__()
            async with client.subscribe("s", "g") as sub:
                sub.__aiter__()
                with self.assertRaisesRegex(TypeError, "delivery by delivery"):
                    sub.batches()


class Lifecycle(SidecarTest):
    async def test_draining_then_resubscribed(self) -> None:
        """The sidecar drains while the handler holds one delivery of a read of two: the
        client reports the drain, hands the other out no more and sends the held one's ack at
        once (not waiting for the rest of its read); the sidecar ends the stream with
        UNAVAILABLE and the client opens again."""
        first_batches: List[pb.Batch] = []

        async def draining(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "slow"),
                                                                 delivery(2, "other")]))
            await asyncio.sleep(0.1)  # "slow" is being handled
            grace = pb.Draining(outstanding=2)
            grace.grace.FromSeconds(5)
            await st.write(draining=grace)
            first_batches.append(await st.batch())
            await st.context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")

        events: List[LifecycleEvent] = []
        handled: List[str] = []
        target = await self.start([draining, serve_until_closed])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", packed_acks=True, backoff=(0.01, 0.05), linger=None,
                                   on_lifecycle=events.append)

            async def handler(d: Delivery) -> None:
                handled.append(d.payload.decode())
                await asyncio.sleep(0.4)
                d.queue("INCR", "n")  # and run() acks it

            async with sub:
                task = asyncio.create_task(sub.run(handler))
                for _ in range(200):
                    if sub.stats.opens == 2:
                        break
                    await asyncio.sleep(0.02)
                sub.stop()
                await task
        self.assertEqual([e.kind for e in events],
                         ["opened", "draining", "disconnected", "resubscribed"])
        self.assertEqual(events[1].draining.outstanding if events[1].draining else None, 2)
        disconnected = events[2].error
        self.assertIsInstance(disconnected, grpc.aio.AioRpcError)
        assert isinstance(disconnected, grpc.aio.AioRpcError)
        self.assertEqual(disconnected.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(handled, ["slow"])  # "other" was not handed out after the drain
        self.assertEqual([(list(b.acks), [c.name for c in b.commands]) for b in first_batches],
                         [([1], ["INCR"])])
        self.assertEqual([o.stream.key for o in self.fake.opens], ["s", "s"])

    async def test_draining_half_closes_once_the_started_are_settled(self) -> None:
        """The sidecar drains with a long grace while the handler holds the first delivery of
        a read of three: once that one is settled, the client sends its ack and half-closes the
        stream (well before the grace), never starting the other two (they stay with the
        sidecar, pending, and come back); the sidecar then ends the stream and the client opens
        again. With nothing started, it half-closes at once."""
        first: List[pb.Batch] = []
        half_closed_after: List[float] = []

        async def draining(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[
                delivery(1, "slow"), delivery(2, "b"), delivery(3, "c")]))
            await asyncio.sleep(0.1)  # "slow" is being handled
            grace = pb.Draining(outstanding=3)
            grace.grace.FromSeconds(30)
            began = asyncio.get_running_loop().time()
            await st.write(draining=grace)
            first.extend(await st.until_half_closed())
            half_closed_after.append(asyncio.get_running_loop().time() - began)
            # The sidecar's engine ends the subscription once the client half-closed: OK.

        async def idle_then_draining(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(4, "d")]))
            await asyncio.sleep(0.1)
            grace = pb.Draining(outstanding=1)
            grace.grace.FromSeconds(30)
            began = asyncio.get_running_loop().time()
            await st.write(draining=grace)
            await st.until_half_closed()
            half_closed_after.append(asyncio.get_running_loop().time() - began)

        events: List[LifecycleEvent] = []
        handled: List[str] = []
        target = await self.start([draining, serve_until_closed])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", backoff=(0.01, 0.05), linger=None,
                                   on_lifecycle=events.append)

            async def handler(d: Delivery) -> None:
                handled.append(d.payload.decode())
                await asyncio.sleep(0.4)

            async with sub:
                task = asyncio.create_task(sub.run(handler))
                for _ in range(200):
                    if sub.stats.opens == 2:
                        break
                    await asyncio.sleep(0.02)
                sub.stop()
                await task
        self.assertEqual(handled, ["slow"])
        self.assertEqual([[o.slot for o in b.outcomes] for b in first], [[1]])
        self.assertLess(half_closed_after[0], 5.0)
        self.assertEqual([e.kind for e in events],
                         ["opened", "draining", "disconnected", "resubscribed"])
        self.assertIsNone(events[2].error)

        # Nothing started (the one delivery still waits in the client): half-closed at once.
        await self.server.stop(None)
        target = await self.start([idle_then_draining, serve_until_closed])
        async with WindowClient(target, token="") as client:
            async with client.subscribe("s", "g", backoff=(0.01, 0.05)) as sub:
                for _ in range(200):
                    if sub.stats.opens == 2:
                        break
                    await asyncio.sleep(0.02)
        self.assertEqual(len(half_closed_after), 2)
        self.assertLess(half_closed_after[1], 5.0)
        self.assertEqual(sub.stats.opens, 2)

    async def test_reconnects_with_the_same_open_when_the_stream_is_lost(self) -> None:
        async def lost(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "a")]))
            await st.context.abort(grpc.StatusCode.UNAVAILABLE, "gone")

        async def busy(st: Stream) -> None:
            await st.context.abort(grpc.StatusCode.ALREADY_EXISTS, "consumer is busy")

        async def again(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(9, "a", count=2)]))
            await st.until_half_closed()

        events: List[str] = []
        target = await self.start([lost, busy, again])
        async with WindowClient(target, token="") as client:
            sub = client.subscribe("s", "g", consumer="c1", backoff=(0.01, 0.05),
                                   on_lifecycle=lambda e: events.append(e.kind))
            counts = []
            async with sub:
                async for d in sub:
                    counts.append(d.delivery_count)
                    if d.delivery_count == 2:
                        d.ack()
                        sub.stop()
        self.assertEqual(counts, [1, 2])
        self.assertEqual(events, ["opened", "disconnected", "disconnected", "resubscribed"])
        self.assertEqual(len(self.fake.opens), 3)
        self.assertTrue(all(o == self.fake.opens[0] for o in self.fake.opens))
        self.assertEqual(sub.stats.reconnects, 2)


class Synchronous(unittest.TestCase):
    """window_client.sync against the fake sidecar, which runs on a loop of its own."""

    def start(self, scripts: List[Script]) -> str:
        from window_client._sync import _Loop

        self.fake = FakeSidecar(scripts)
        self.server_loop = _Loop()

        async def serve() -> int:
            self.server = grpc.aio.server()
            pb_grpc.add_WindowServiceServicer_to_server(self.fake, self.server)
            port = self.server.add_insecure_port("127.0.0.1:0")
            await self.server.start()
            return port

        port = self.server_loop.run(serve())
        self.addCleanup(self.server_loop.stop)
        self.addCleanup(lambda: self.server_loop.run(self.server.stop(None)))
        return f"127.0.0.1:{port}"

    def test_publish_iterate_settle_and_stop(self) -> None:
        import window_client as sync

        got: List[pb.Batch] = []
        target = self.start([one_read(got, delivery(1, "a"), delivery(2, "b"))])
        events: List[str] = []
        with sync.WindowClient(target, token="t") as client:
            self.assertEqual(client.publish("s", ["x"]), ["0-0"])
            self.assertEqual(client.publish_channel("c", ["x"]), [1])
            client.publish_list("l", ["x"])
            with client.subscribe("s", "g", on_lifecycle=lambda e: events.append(e.kind)) as sub:
                self.assertEqual(sub.wait_opened(5).consumer, "c1")
                seen = []
                for d in sub:
                    seen.append((d.payload, d.delivery_count))
                    self.assertIs(d.subscription, sub)
                    if d.slot == 1:
                        d.queue("INCR", "n").ack()
                    else:
                        d.retry_after(0.5, "later")
                        with self.assertRaises(window_client.SettledError):
                            d.ack()
                        threading.Timer(0.05, sub.stop).start()  # from another thread
        self.assertEqual(seen, [(b"a", 1), (b"b", 1)])
        self.assertEqual(events, ["opened"])
        [batch] = got
        self.assertEqual(list(batch.commands)[0].name, "INCR")
        self.assertEqual([(o.slot, o.kind, o.reason) for o in batch.outcomes],
                         [(1, pb.OUTCOME_KIND_ACK, ""), (2, pb.OUTCOME_KIND_RETRY_AFTER, "later")])
        self.assertEqual([(p.stream, p.channel, p.list) for p in self.fake.publishes],
                         [("s", "", ""), ("", "c", ""), ("", "", "l")])
        self.assertEqual(self.fake.metadata[0]["authorization"], "Bearer t")

    def test_a_partitioned_stream(self) -> None:
        import window_client as sync

        target = self.start([serve_until_closed])
        with sync.WindowClient(target, token="") as client:
            client.publish("s", [{"payload": "x", "headers": {"k": "a"}}], partitions=4,
                           partition_header="k")
            with self.assertRaisesRegex(ValueError, "partitions needs partition_header"):
                client.publish("s", ["x"], partitions=4)
            with client.subscribe("s", "g", partitions=4, ordering_header="k") as sub:
                sub.wait_opened(5)
                # Its Opened leaves partitions 0, as a sidecar older than the field does.
                self.assertEqual(sub.partitions, 0)
        [p] = self.fake.publishes
        self.assertEqual((p.stream, p.partitions, p.partition_by.header), ("s", 4, "k"))
        [o] = self.fake.opens
        self.assertEqual((o.stream.key, o.stream.partitions, o.ordering_key.header),
                         ("s", 4, "k"))

    def test_the_partitions_and_each_batchs_partition(self) -> None:
        import window_client as sync

        target = self.start([partitioned_reads])
        seen = []
        with sync.WindowClient(target, token="") as client:
            with client.subscribe("s", "g", partitions=4) as sub:
                sub.wait_opened(5)
                self.assertEqual(sub.partitions, 4)
                for batch in sub.batches():
                    seen.append((batch.partition, [d.partition for d in batch]))
                    batch.ack()
                    if batch.read_id == 2:
                        sub.stop()
        self.assertEqual(seen, [(3, [3, 3]), (None, [None])])

    def test_batches(self) -> None:
        import window_client as sync

        got: List[pb.Batch] = []
        target = self.start([one_read(got, delivery(1, "a"), delivery(2, "b"))])
        with sync.WindowClient(target, token="") as client:
            with client.subscribe("s", "g", packed_acks=True) as sub:
                for batch in sub.batches():
                    self.assertIsInstance(batch, sync.Batch)
                    self.assertEqual([(d.slot, d.payload) for d in batch], [(1, b"a"), (2, b"b")])
                    batch[1].retry("later")
                    for d in batch.unsettled:
                        d.queue("INCR", d.payload)
                    batch.ack()
                    self.assertEqual([d.outcome for d in batch], ["ack", "retry"])
                    sub.stop()
                with self.assertRaisesRegex(TypeError, "iterate sub.batches"):
                    iter(sub)
        [sent] = got
        self.assertEqual([(c.slot, list(c.args)) for c in sent.commands], [(1, [b"a"])])
        self.assertEqual([(o.slot, o.kind) for o in sent.outcomes],
                         [(2, pb.OUTCOME_KIND_RETRY), (1, pb.OUTCOME_KIND_ACK)])

    @unittest.skipUnless(window_client.tracing.AVAILABLE, "needs opentelemetry-api")
    def test_the_span_is_current_in_the_callers_thread(self) -> None:
        from opentelemetry import trace

        import window_client as sync

        async def script(st: Stream) -> None:
            await opened(st)
            await st.write(read=pb.Read(read_id=1, deliveries=[delivery(1, "a"), delivery(2, "b")]))
            await st.until_half_closed()

        target = self.start([script])
        current = []
        with self.assertNoLogs("opentelemetry.context", level="ERROR"):
            with sync.WindowClient(target, token="") as client:
                with client.subscribe("s", "g") as sub:
                    for d in sub:
                        current.append(trace.get_current_span() is d.span)
                        d.ack()
                        if d.slot == 2:
                            sub.stop()
        self.assertEqual(current, [True, True])

    def test_the_handler_rules(self) -> None:
        import window_client as sync

        got: List[pb.Batch] = []
        target = self.start([one_read(got, delivery(1, "ok"), delivery(2, "boom"))])
        with sync.WindowClient(target, token="") as client:
            def handler(d: sync.Delivery) -> None:
                d.queue("INCR", "n")
                if d.payload == b"boom":
                    d.subscription.stop()
                    raise ValueError("bad")

            stats = client.consume("s", "g", handler)
        self.assertEqual(stats.outcomes, {"ack": 1, "retry_after": 1})
        [batch] = got
        self.assertEqual([(o.slot, o.kind, o.reason) for o in batch.outcomes],
                         [(1, pb.OUTCOME_KIND_ACK, ""),
                          (2, pb.OUTCOME_KIND_RETRY_AFTER, "handler failed: ValueError('bad')")])


# ---- against a real sidecar -------------------------------------------------------------------

#: The sidecar binary: WINDOW_SIDECAR_BIN, or the one cargo builds in this repository.
SIDECAR_BIN = os.environ.get("WINDOW_SIDECAR_BIN") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "target", "debug",
    "window-sidecar",
)
HAVE_SIDECAR = os.access(SIDECAR_BIN, os.X_OK) and shutil.which("redis-server") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@unittest.skipUnless(HAVE_SIDECAR, "needs redis-server and the sidecar (WINDOW_SIDECAR_BIN)")
class RealSidecar(unittest.IsolatedAsyncioTestCase):
    """A redis-server and the sidecar of WINDOW_SIDECAR_BIN, each on a free port of its own,
    for what only the real sidecar does."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        redis_port = _free_port()
        self.spawn("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", self.dir])
        self.redis = redis.Redis(port=redis_port, decode_responses=True)
        self.addCleanup(self.redis.close)
        self.wait_for("redis", self.redis.ping)
        port = _free_port()
        self.target = f"127.0.0.1:{port}"
        # --consumer-lease 2s: the replicas of a partitioned stream renew their membership
        # every third of it, so that partitions move to a newcomer within a second or two.
        self.spawn("sidecar", [SIDECAR_BIN, "--listen", self.target,
                               "--redis-url", f"redis://127.0.0.1:{redis_port}",
                               "--consumer-lease", "2s", "--promote-interval", "100ms",
                               "--shutdown-grace", "2s"])
        self.wait_for("sidecar", lambda: socket.create_connection(("127.0.0.1", port)).close())

    def spawn(self, name: str, argv: List[str]) -> None:
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

        def stop() -> None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

        self.addCleanup(stop)

    def wait_for(self, name: str, ready: Callable[[], Any]) -> None:
        """Until ``ready()`` raises no connection error; else fails with the end of the log."""
        deadline = time.monotonic() + 15
        while True:
            try:
                ready()
                return
            except (OSError, redis.ConnectionError):
                if time.monotonic() > deadline:
                    with open(os.path.join(self.dir, f"{name}.log")) as f:
                        self.fail(f"{name} did not come up:\n{f.read()[-2000:]}")
                time.sleep(0.05)

    async def test_a_partitioned_stream_shared_by_two_replicas_in_order_per_key(self) -> None:
        stream, partitions, keys = "parts", 4, [f"key-{i}" for i in range(20)]
        delivered: Dict[str, List[str]] = {key: [] for key in keys}  # per key, as handed out
        by_consumer: Dict[str, int] = {"w1": 0, "w2": 0}
        counts: List[int] = []
        out: set[str] = set()  # keys with a delivery handed out and not yet settled
        overlaps: List[str] = []
        acked = 0

        async def consume(name: str, sub: Any) -> None:
            nonlocal acked
            async with sub:  # leaving it flushes what was settled
                async for d in sub:
                    key = d.headers["k"]
                    if key in out:
                        overlaps.append(f"{d.payload.decode()} to {name} while {key} was out")
                    out.add(key)
                    delivered[key].append(d.payload.decode())
                    by_consumer[name] += 1
                    counts.append(d.delivery_count)
                    # Settled a moment later, so that a key's next entry would have the chance
                    # to overtake it were the group not ordering across its replicas.
                    await asyncio.sleep(0.005)
                    d.redis.hincrby("effects", d.payload.decode(), 1)
                    out.discard(key)
                    d.ack()
                    acked += 1

        async with WindowClient(self.target, token="") as client:
            subs = {name: client.subscribe(stream, "g", consumer=name, partitions=partitions,
                                           ordering_header="k", count=8)
                    for name in ("w1", "w2")}
            workers = [asyncio.create_task(consume("w1", subs["w1"]))]
            await subs["w1"].wait_opened(10)
            # A round (one entry per key) at a time. w2 joins after the third, while w1 reads
            # every partition, so that some partitions are handed over with entries flowing:
            # at least ten rounds, and on until both have had deliveries.
            loop = asyncio.get_running_loop()
            rounds = published = 0
            deadline = loop.time() + 20
            while rounds < 10 or (not all(by_consumer.values()) and loop.time() < deadline):
                if rounds == 3:
                    workers.append(asyncio.create_task(consume("w2", subs["w2"])))
                entries = [{"payload": f"{key}/{rounds}", "headers": {"k": key}}
                           for key in keys]
                ids = await client.publish(stream, entries, partitions=partitions,
                                           partition_header="k")
                self.assertEqual(len(ids), len(keys))
                published += len(entries)
                rounds += 1
                await asyncio.sleep(0.2)
            deadline = loop.time() + 30
            while acked < published and loop.time() < deadline:
                await asyncio.sleep(0.05)
            for sub in subs.values():
                sub.stop()
            await asyncio.gather(*workers)

        # Each key's entries went to the partition its hash names, and nothing else did.
        for n in range(partitions):
            part = f"{stream}:{{{n}}}"
            keys_there = {fields["h:k"] for _, fields in self.redis.xrange(part)}
            self.assertEqual(keys_there, {key for key in keys
                                          if _fnv1a32(key.encode()) % partitions == n}, part)
            self.assertEqual(self.redis.xpending(part, "g")["pending"], 0, part)
        self.assertEqual(self.redis.exists(stream), 0)
        # Every entry delivered once and acked once (its side effect ran once, with the ack),
        # each key's in the order published, never two of a key out at once.
        self.assertEqual(published, rounds * len(keys))
        self.assertEqual((len(counts), set(counts)), (published, {1}))
        effects = self.redis.hgetall("effects")
        self.assertEqual(len(effects), published)
        self.assertEqual(set(effects.values()), {"1"})
        for key in keys:
            self.assertEqual(delivered[key], [f"{key}/{r}" for r in range(rounds)], key)
        self.assertEqual(overlaps, [])
        # Both replicas had partitions: the group shared them out.
        self.assertTrue(all(by_consumer.values()), by_consumer)


if __name__ == "__main__":
    unittest.main()
