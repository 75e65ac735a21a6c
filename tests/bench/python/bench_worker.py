#!/usr/bin/env python3
"""One Python contender of the window-sidecar benchmark (driven by `window-sidecar-bench`).

    bench_worker.py MODE --expect N [--redis-url URL | --sidecar HOST:PORT [--max-in-flight M]]
                    [--latency]

MODE is one of:

* ``redis-py-per-message``: XREADGROUP COUNT 64, then per message INCR and XACK (what most
  users write).
* ``redis-py-pipelined``: XREADGROUP COUNT 64, then one pipeline (transaction=False) with the
  64 INCRs and one XACK.
* ``sidecar-python``: through the sidecar with the helper of client-examples/python
  (``delivery.queue("INCR", ...)``, ``delivery.ack()``).
* ``sidecar-python-typed``: the same, its side effect through redis-py's command method
  (``delivery.redis.incr(...)``) instead of ``delivery.queue("INCR", ...)``.
* ``sidecar-python-batches``: the same helper, a read handled as one batch
  (``async for batch in sub.batches()``, ``delivery.queue("INCR", ...)`` per delivery, one
  ``batch.ack()``), as the hand-pipelined loop handles its reads.

Per entry: decode the JSON payload, ``INCR count:<id mod 1000>``, acknowledge.

Protocol with the driver, one line each on stdout: ``ready`` once imports and connections are
done; then it waits for ``go`` on stdin; ``done`` the moment the last of ``--expect`` entries is
acknowledged (the driver times ``go`` to ``done``); finally ``result {json}`` with its counters
and latency samples (microseconds). Latency: with ``--latency`` from the entry's XADD (its
payload's ``ts``, microseconds since the epoch) to the reply that settled it; without, from the
moment the consumer received the entry's read to that reply.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
PY_CLIENT = os.path.join(ROOT, "client-examples", "python")


def now_us() -> int:
    return time.time_ns() // 1000


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected 'go' on stdin, got {line!r}")


# ------------------------------------------------------------------------------------------
# redis-py baselines (synchronous: the faster of redis-py's two APIs)


def redis_py(args: argparse.Namespace, pipelined: bool) -> dict:
    import redis

    r = redis.Redis.from_url(args.redis_url)
    r.ping()
    stream, group, consumer = args.stream, args.group, args.consumer
    streams = {stream: ">"}
    lat: list[int] = []
    reads = round_trips = acked = 0
    emit("ready")
    wait_go()
    cpu0 = time.process_time()
    while acked < args.expect:
        resp = r.xreadgroup(group, consumer, streams, count=args.count, block=1000)
        round_trips += 1
        if not resp:
            continue
        entries = resp[0][1]
        if not entries:
            continue
        reads += 1
        t_read = now_us()
        if pipelined:
            pipe = r.pipeline(transaction=False)
            ids = []
            sent = []
            for entry_id, fields in entries:
                p = json.loads(fields[b"_payload"])
                pipe.incr(f"count:{p['id'] % 1000}")
                ids.append(entry_id)
                sent.append(p["ts"])
            pipe.xack(stream, group, *ids)
            replies = pipe.execute()
            round_trips += 1
            if replies[-1] != len(ids):
                raise SystemExit(f"XACK acknowledged {replies[-1]} of {len(ids)}")
            t = now_us()
            if args.latency:
                lat.extend(t - ts for ts in sent)
            else:
                lat.extend([t - t_read] * len(ids))
            acked += len(ids)
        else:
            for entry_id, fields in entries:
                p = json.loads(fields[b"_payload"])
                r.incr(f"count:{p['id'] % 1000}")
                n = r.xack(stream, group, entry_id)
                round_trips += 2
                if n != 1:
                    raise SystemExit(f"XACK of {entry_id!r} acknowledged {n}")
                t = now_us()
                lat.append(t - (p["ts"] if args.latency else t_read))
                acked += 1
    emit("done")
    cpu = time.process_time() - cpu0
    return {"acked": acked, "reads": reads, "round_trips": round_trips, "cpu_s": cpu, "lat_us": lat}


# ------------------------------------------------------------------------------------------
# Through the sidecar with the client-examples/python helper


async def sidecar_python(args: argparse.Namespace, mode: str) -> dict:
    sys.path.insert(0, PY_CLIENT)
    import grpc
    from window_client.aio import WindowClient

    typed = mode == "sidecar-python-typed"
    if typed:
        # redis-py's command modules (60-100 ms): imports come before `ready`, as the redis-py
        # contenders import redis before theirs. The helper imports them before its first
        # open; without this, that import would be timed, and the entries written meanwhile
        # would wait for it in the latency phase.
        import window_client.commands  # noqa: F401

    channel = grpc.aio.insecure_channel(args.sidecar)
    await asyncio.wait_for(channel.channel_ready(), 30)
    emit("ready")
    await asyncio.get_running_loop().run_in_executor(None, wait_go)
    cpu0 = time.process_time()

    lat: list[int] = []
    read_at: dict[int, int] = {}
    state = {"settled": 0, "failed": 0, "reads": 0, "cpu": 0.0}
    sub = None

    def on_flush(ev) -> None:
        t = now_us()
        if not ev.ok:
            state["failed"] += 1
            return
        settled = ev.settled
        state["settled"] += ev.report.settles
        if args.latency:
            for d in settled:
                lat.append(t - json.loads(d.payload)["ts"])
        else:
            t_read = read_at.pop(ev.read_id, t)
            lat.extend([t - t_read] * len(settled))
        if state["settled"] >= args.expect and sub is not None:
            state["cpu"] = time.process_time() - cpu0
            emit("done")
            sub.stop()

    async with WindowClient(channel=channel) as client:
        sub = client.subscribe(
            args.stream, args.group, consumer=args.consumer, count=args.count,
            max_in_flight=args.max_in_flight, block=1.0, on_flush=on_flush,
            reports_in_reads=True, packed_acks=True,
        )
        if not args.latency:
            # Stamp each read when it reaches the helper (flat-out latency starts there).
            original = sub._read

            def stamped(st, read):
                read_at[read.read_id] = now_us()
                state["reads"] += 1
                original(st, read)

            sub._read = stamped
        async with sub:
            if mode == "sidecar-python-batches":
                async for batch in sub.batches():
                    for delivery in batch:
                        p = json.loads(delivery.payload)
                        delivery.queue("INCR", f"count:{p['id'] % 1000}")
                    batch.ack()
            else:
                async for delivery in sub:
                    p = json.loads(delivery.payload)
                    if typed:
                        # redis-py's command method, recorded: the typed API a user writes.
                        delivery.redis.incr(f"count:{p['id'] % 1000}")
                    else:
                        delivery.queue("INCR", f"count:{p['id'] % 1000}")
                    delivery.ack()
        stats = sub.stats
    if state["failed"]:
        raise SystemExit(f"{state['failed']} flushes failed")
    return {
        "acked": state["settled"], "reads": stats.reads, "round_trips": 0,
        "batches": stats.batches, "cpu_s": state["cpu"], "lat_us": lat,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "mode",
        choices=[
            "redis-py-per-message", "redis-py-pipelined", "sidecar-python", "sidecar-python-typed",
            "sidecar-python-batches",
        ],
    )
    ap.add_argument("--redis-url")
    ap.add_argument("--sidecar")
    ap.add_argument("--stream", default="bench")
    ap.add_argument("--group", default="g")
    ap.add_argument("--consumer", default="c1")
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--max-in-flight", type=int, default=0, help="sidecar-python: 0 is twice --count")
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--latency", action="store_true")
    args = ap.parse_args()
    if args.mode.startswith("sidecar-python"):
        result = asyncio.run(sidecar_python(args, args.mode))
    else:
        result = redis_py(args, pipelined=args.mode == "redis-py-pipelined")
    emit("result " + json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
