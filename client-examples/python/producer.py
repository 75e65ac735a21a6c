#!/usr/bin/env python3
"""Publishes the known order set (../orders.json) to the `orders` stream through the sidecar's
Publish RPC: one PublishEntry per order (payload = the order's JSON), all in one call.

With the OpenTelemetry SDK installed, every order is created in its own span and carries its
trace context (PublishEntry.trace), which the worker continues. Environment:
WINDOW_SIDECAR_ADDR, WINDOW_SIDECAR_TOKEN (the bearer token), and with the OpenTelemetry SDK
the standard OTEL_* variables (OTEL_TRACES_EXPORTER=console prints every span on stdout)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys


from window_client import WindowError, tracing
from window_client.aio import WindowClient

# The default orders file: the repository's, next to this directory.
HERE = os.path.dirname(os.path.abspath(__file__))


def _tracer():
    """A tracer that records (so trace ids are real) when the SDK is installed, else None. The
    tracer provider is set up from the standard OTEL_* variables by the SDK's own configurator
    (the one `opentelemetry-instrument` runs): OTEL_TRACES_EXPORTER=console prints each span on
    stdout, otlp sends it to OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT (with
    opentelemetry-exporter-otlp installed), none or unset exports nothing; OTEL_SERVICE_NAME,
    OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG] and OTEL_SDK_DISABLED apply."""
    if not tracing.AVAILABLE:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk._configuration import _OTelSDKConfigurator
    except ImportError:
        return None
    try:
        _OTelSDKConfigurator().configure()
    except RuntimeError as err:  # an exporter or OTLP protocol the SDK does not have
        sys.exit(f"OpenTelemetry from the OTEL_* variables "
                 f"(OTEL_TRACES_EXPORTER={os.environ.get('OTEL_TRACES_EXPORTER', '')!r}): {err}")
    return trace.get_tracer("order-producer")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sidecar", default=os.environ.get("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"))
    ap.add_argument("--orders", default=os.path.join(HERE, "..", "orders.json"))
    ap.add_argument("--stream", help="stream key (default: the one in the orders file)")
    ap.add_argument("--traceparents-out", help="write {order id: traceparent} here (JSON)")
    args = ap.parse_args()

    with open(args.orders) as f:
        spec = json.load(f)
    stream = args.stream or spec.get("stream", "orders")
    tracer = _tracer()
    entries, traceparents = [], {}
    for order in spec["orders"]:
        payload = json.dumps(order, separators=(",", ":"))
        if tracer is not None:
            with tracer.start_as_current_span(f"create order {order['id']}"):
                trace = tracing.current_trace()
        else:
            trace = {}
        if trace:
            traceparents[order["id"]] = trace["traceparent"]
        entries.append({"payload": payload, "trace": trace})

    async with WindowClient(args.sidecar) as client:
        ids = await client.publish(stream, entries)
    print(f"published {len(ids)} orders to {stream!r} ({ids[0]} .. {ids[-1]})"
          + (", each with its trace context" if traceparents else ""))
    if args.traceparents_out:
        with open(args.traceparents_out, "w") as f:
            json.dump(traceparents, f)
    if tracer is not None:
        from opentelemetry import trace

        shutdown = getattr(trace.get_tracer_provider(), "shutdown", None)
        if shutdown is not None:
            shutdown()  # sends (or prints) the spans still batched
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except WindowError as err:
        status = err.status.name if err.status is not None else type(err).__name__
        print(f"publish failed: {status}: {err}", file=sys.stderr)
        sys.exit(1)
