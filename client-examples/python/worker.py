#!/usr/bin/env python3
"""The order service: consumes the `orders` stream in group `order-service` through the sidecar.

For each order: invalid (no lines, or a line with qty <= 0) -> drop; "flaky" on its first
delivery -> retry_after 200 ms; otherwise LPUSH picks "<id>:<sku>:<qty>" and HINCRBY sku-totals
<sku> <qty> per line, then ack. With --batches each read is handled as one batch: the drops and
retries are settled per order, the rest acked with one batch.ack(). Exits once every order of the orders file is settled for good
(its ack or drop flushed), or after --idle-exit seconds without a delivery.

Environment: WINDOW_SIDECAR_ADDR, WINDOW_SIDECAR_TOKEN (the bearer token), WINDOW_CONSUMER,
WORKER_DELAY_MS (sleep per delivery, for
the restart test), WORKER_SPANS_FILE (with the OpenTelemetry SDK: write finished spans there as
JSON lines), and with the OpenTelemetry SDK the standard OTEL_* variables
(OTEL_TRACES_EXPORTER=console prints every span on stdout; see setup_tracing)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import List


from window_client import FlushEvent, WindowError, tracing
from window_client.aio import Batch, Delivery, WindowClient

# The default orders file: the repository's, next to this directory.
HERE = os.path.dirname(os.path.abspath(__file__))

log = logging.getLogger("worker")


def invalid_reason(order: dict) -> str | None:
    lines = order.get("lines")
    if not isinstance(lines, list) or not lines:
        return "order has no lines"
    for line in lines:
        qty = line.get("qty")
        if not isinstance(qty, int) or qty <= 0:
            return f"line {line.get('sku')!r} has qty {qty!r}"
        if not line.get("sku"):
            return "line without a sku"
    return None


def setup_tracing(spans_file: str | None):
    """With the OpenTelemetry SDK installed: the tracer provider, set up from the standard OTEL_*
    variables by the SDK's own configurator (the one `opentelemetry-instrument` runs).
    OTEL_TRACES_EXPORTER=console prints each span on stdout, otlp sends it to
    OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT (with opentelemetry-exporter-otlp installed), none or
    unset exports nothing; OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG]
    and OTEL_SDK_DISABLED apply. With WORKER_SPANS_FILE every finished span is also written
    there as a JSON line. Returns the provider (shut it down at exit: that flushes), or None."""
    if not tracing.AVAILABLE:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk._configuration import _OTelSDKConfigurator
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        log.info("opentelemetry-sdk is not installed: no spans recorded")
        return None

    try:
        _OTelSDKConfigurator().configure()
    except RuntimeError as err:  # an exporter or OTLP protocol the SDK does not have
        sys.exit(f"OpenTelemetry from the OTEL_* variables "
                 f"(OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER', '')!r}): {err}")
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return None
    if not spans_file:
        return provider

    class JsonLines(SpanExporter):
        def __init__(self, file_path: str) -> None:
            self.f = open(file_path, "a")

        def export(self, spans):
            for s in spans:
                self.f.write(json.dumps({
                    "name": s.name,
                    "trace_id": format(s.context.trace_id, "032x"),
                    "span_id": format(s.context.span_id, "016x"),
                    "parent_span_id": format(s.parent.span_id, "016x") if s.parent else None,
                    "attributes": dict(s.attributes or {}),
                }) + "\n")
            self.f.flush()
            return SpanExportResult.SUCCESS

        def shutdown(self):
            self.f.close()

    provider.add_span_processor(SimpleSpanProcessor(JsonLines(spans_file)))
    return provider


class Worker:
    def __init__(self, expected_ids: set[str], delay: float) -> None:
        self.expected = expected_ids
        self.delay = delay
        self.acked: set[str] = set()
        self.dropped: set[str] = set()
        self.retried = 0
        self.handled = 0
        self.last_delivery = time.monotonic()
        self.sub = None
        self.tracer = None
        if tracing.AVAILABLE:
            from opentelemetry import trace

            self.tracer = trace.get_tracer("order-worker")

    @property
    def done(self) -> bool:
        return self.expected <= (self.acked | self.dropped)

    async def handle(self, d: Delivery, ack: bool = True) -> None:
        self.last_delivery = time.monotonic()
        self.handled += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.tracer is not None:
            # The delivery's span is current here: this span is its child.
            with self.tracer.start_as_current_span("handle order"):
                self._handle(d, ack)
        else:
            self._handle(d, ack)

    async def handle_batch(self, batch: Batch) -> None:
        for d in batch:
            await self.handle(d, ack=False)
        batch.ack()

    def _handle(self, d: Delivery, ack: bool) -> None:
        try:
            order = d.json()
        except ValueError:
            d.drop("payload is not JSON")
            return
        oid = str(order.get("id", d.entry_id))
        if d.span is not None:
            d.span.set_attribute("order.id", oid)
        reason = invalid_reason(order)
        if reason is not None:
            log.info("drop %s (%s): %s", oid, d.entry_id, reason)
            d.drop(reason)
        elif order.get("flaky") and d.delivery_count == 1:
            log.info("retry %s (%s) in 200 ms: flaky on its first delivery", oid, d.entry_id)
            d.retry_after(0.2, "flaky: fails on its first delivery")
        else:
            for line in order["lines"]:
                d.redis.lpush("picks", f"{oid}:{line['sku']}:{line['qty']}")
                d.redis.hincrby("sku-totals", line["sku"], line["qty"])
            log.info("ack %s (%s, delivery %d)", oid, d.entry_id, d.delivery_count)
            if ack:
                d.ack()

    def on_flush(self, ev: FlushEvent) -> None:
        r = ev.report
        log.info(
            "flush of read %d: ok=%s kept=%d dropped=%d commands=%d settles=%d",
            r.read_id, r.ok, r.segments_kept, r.segments_dropped, r.commands, r.settles,
        )
        if not ev.ok:
            return  # what was not settled comes back; the worker keeps going
        for d in ev.settled:
            try:
                oid = str(d.json().get("id", d.entry_id))
            except ValueError:
                oid = d.entry_id
            if d.outcome == "ack":
                self.acked.add(oid)
            elif d.outcome == "drop":
                self.dropped.add(oid)
            else:
                self.retried += 1
        if self.done and self.sub is not None:
            log.info("every order is settled for good")
            self.sub.stop()

    def summary(self, consumer: str) -> str:
        s = self.sub.stats
        return (
            f"{consumer}: acked {len(self.acked)}, dropped {len(self.dropped)}, "
            f"retried {self.retried} (deliveries {s.deliveries}, reads {s.reads}, "
            f"batches {s.batches}, flushes {s.flushes}, reconnects {s.reconnects})"
        )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sidecar", default=os.environ.get("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"))
    ap.add_argument("--consumer", default=os.environ.get("WINDOW_CONSUMER", "worker-1"))
    ap.add_argument("--orders", default=os.path.join(HERE, "..", "orders.json"))
    ap.add_argument("--stream", help="stream key (default: the one in the orders file)")
    ap.add_argument("--group", help="consumer group (default: the one in the orders file)")
    ap.add_argument("--count", type=int, default=16, help="entries per read")
    ap.add_argument("--max-in-flight", type=int, default=0, help="0: twice count")
    ap.add_argument("--atomic", action="store_true",
                    help="each acked order's commands and settle in one script")
    ap.add_argument("--max-deliveries", type=int, default=0,
                    help="an order retried this many times goes to --dead-letter (0: no cap)")
    ap.add_argument("--dead-letter", default="", help="the dead-letter stream")
    ap.add_argument("--idle-exit", type=float, default=0.0,
                    help="exit after this many seconds without a delivery (0: never)")
    ap.add_argument("--batches", action="store_true",
                    help="handle each read as one batch (Subscription.batches)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("asyncio").setLevel(logging.WARNING)

    with open(args.orders) as f:
        spec = json.load(f)
    provider = setup_tracing(os.environ.get("WORKER_SPANS_FILE"))
    log.info("tracing: %s", "on" if tracing.AVAILABLE else "off (opentelemetry not installed)")
    worker = Worker({o["id"] for o in spec["orders"]}, float(os.environ.get("WORKER_DELAY_MS", "0")) / 1000)
    idle = False

    async with WindowClient(args.sidecar) as client:
        sub = client.subscribe(
            args.stream or spec.get("stream", "orders"),
            args.group or spec.get("group", "order-service"),
            consumer=args.consumer,
            count=args.count,
            max_in_flight=args.max_in_flight,
            atomic=args.atomic,
            max_deliveries=args.max_deliveries,
            dead_letter=args.dead_letter,
            on_flush=worker.on_flush,
        )
        worker.sub = sub

        async def watchdog() -> None:
            nonlocal idle
            while args.idle_exit > 0:
                await asyncio.sleep(0.2)
                if time.monotonic() - worker.last_delivery > args.idle_exit:
                    log.warning("no delivery for %.1f s: stopping", args.idle_exit)
                    idle = True
                    sub.stop()
                    return

        # Ctrl-C (SIGINT) and SIGTERM stop the subscription the way idle_exit does: it hands
        # out nothing more, flushes what is settled and ends the iteration, without a traceback.
        signalled: List[str] = []

        def on_signal(sig: signal.Signals) -> None:
            log.info("%s: stopping; what is settled is flushed", sig.name)
            signalled.append(sig.name)
            sub.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        dog = asyncio.create_task(watchdog())
        try:
            async with sub:
                if args.batches:
                    async for batch in sub.batches():
                        await worker.handle_batch(batch)
                else:
                    async for delivery in sub:
                        await worker.handle(delivery)
        finally:
            dog.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    if provider is not None:
        provider.shutdown()
    print(worker.summary(args.consumer), flush=True)
    if worker.done or signalled:
        return 0
    missing = sorted(worker.expected - worker.acked - worker.dropped)
    print(f"not settled{' (idle exit)' if idle else ''}: {', '.join(missing)}", flush=True)
    return 3


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except WindowError as err:
        status = err.status.name if err.status is not None else type(err).__name__
        print(f"subscription failed: {status}: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
