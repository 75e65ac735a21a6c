"""The Python client's conformance runner: plays the worker side of one scenario of
client-examples/conformance/scenarios with the installed ``window_client`` package, and
prints what it sees as JSON lines on stdout (see client-examples/conformance/README.md).

Everything the spec gives to the client is the package's: the target, the token and TLS from
the environment, reconnecting and resubscribing, the rule for a refused command and a failed
handler (``Subscription.run``), draining, and stopping on SIGTERM (``Subscription.stop``, then
the close that ``async with`` does). The runner only maps the scenario onto the package's
options and does what ``handle`` says with each delivery."""

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Dict, List, Optional

from window_client import (
    LifecycleEvent,
    RejectedError,
    RequeueRefusedError,
    SideEffectError,
    WindowError,
)
from window_client.aio import Delivery, LifecycleCallback, Subscription, WindowClient


#: The reason the action `dead_letter` gives (the dead letter's `x-window-reason`).
DEAD_LETTER_REASON = "conformance: dead_letter"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def on_lifecycle(event: LifecycleEvent) -> None:
    # "opened" (the first open), "resubscribed" (every later one), "draining", "disconnected".
    if event.kind in ("opened", "resubscribed", "draining"):
        emit(event.kind)


def on_replica_lifecycle(event: LifecycleEvent) -> None:
    """A replica's (`open.consumers`): its first open is not printed, the runner prints one
    `opened` once every replica's subscription is open."""
    if event.kind in ("resubscribed", "draining"):
        emit(event.kind)


def name_of(d: Delivery) -> str:
    """A delivery's name in the scenario: its payload, or for an entry without the payload
    layout the text of its `id` field."""
    if d.in_layout:
        return d.payload.decode()
    return d.text_fields.get("id", "")


def on_error(err: WindowError) -> None:
    if isinstance(err, RejectedError):
        emit("rejected", payload=name_of(err.delivery) if err.delivery is not None else "",
             reason=err.reason, error=type(err).__name__, message=str(err))
    elif isinstance(err, SideEffectError):
        emit("side_effect_error",
             payload=name_of(err.delivery) if err.delivery is not None else "",
             command=err.command, settled=err.settled, error=type(err).__name__,
             message=str(err))
    elif isinstance(err, RequeueRefusedError):
        emit("requeue_refused",
             payload=name_of(err.delivery) if err.delivery is not None else "",
             error=type(err).__name__, message=str(err))


def subscription(client: WindowClient, open_: Dict[str, Any], consumer: Optional[str] = None,
                 lifecycle: LifecycleCallback = on_lifecycle) -> Subscription:
    """The scenario's `open` as the client's options; absent fields take its defaults.
    ``consumer`` (one of `open.consumers`) stands for `open.consumer` when given."""
    options: Dict[str, Any] = {"on_lifecycle": lifecycle, "on_error": on_error}
    if consumer is None:
        consumer = open_.get("consumer", "")
    for name in ("count", "max_in_flight", "reports_in_reads", "packed_acks",
                 "rejected_outcome", "max_attempts", "ordering_header", "ordering_field"):
        if name in open_:
            options[name] = open_[name]
    if "block_ms" in open_:
        options["block"] = open_["block_ms"] / 1000
    if open_.get("mode") == "atomic":
        options["atomic"] = True
    if open_.get("max_deliveries"):
        options["max_deliveries"] = open_["max_deliveries"]
        options["dead_letter"] = open_["dead_letter"]
    form = open_["form"]
    if form == "stream":
        return client.subscribe(
            open_["key"], open_["group"], consumer=consumer,
            start_id=open_.get("start_id", ""), partitions=open_.get("partitions", 0), **options,
        )
    if form == "reliable_list":
        return client.subscribe_reliable_list(open_["key"], consumer=consumer, **options)
    if form == "simple_list":
        return client.subscribe_list(open_["key"], **options)
    if form == "pubsub":
        return client.subscribe_pubsub([open_["key"]], **options)
    raise SystemExit(f"unknown form {form!r}")


async def publish(client: WindowClient, scenario: Dict[str, Any],
                  entries: List[Dict[str, Any]]) -> None:
    """Publishes to the form's target, with the scenario's `publish_timeout_ms` as the call's
    ``timeout`` (the client's default when absent); to a stream's partitions by key with
    `publish_partitions`."""
    form, key = scenario["open"]["form"], scenario["open"]["key"]
    options: Dict[str, Any] = {}
    if "publish_timeout_ms" in scenario:
        options["timeout"] = scenario["publish_timeout_ms"] / 1000
    if form == "stream":
        by = scenario.get("publish_partitions")
        if by:
            options["partitions"] = by["partitions"]
            options["partition_header"] = by.get("header")
            options["partition_field"] = by.get("field")
        await client.publish(key, entries, **options)
    elif form in ("reliable_list", "simple_list"):
        await client.publish_list(key, entries, **options)
    else:
        await client.publish_channel(key, entries, **options)


def action_for(handle: Dict[str, List[str]], payload: str, n: int) -> str:
    """The n-th delivery of a payload takes the n-th action of its list; past the end, the
    last one."""
    actions = handle.get(payload) or handle.get("*") or ["ack"]
    return actions[min(n, len(actions)) - 1]


async def without_sidecar(scenario: Dict[str, Any]) -> None:
    """A scenario of failing calls (`expect.errors`): make the client, publish once, then
    subscribe until the client gives up; print each call's error (only the calls the scenario
    expects an error of)."""
    open_ = scenario["open"]
    calls = {e["call"] for e in scenario.get("expect", {}).get("errors", [])}
    entries = [{"payload": e["payload"]} for e in scenario["publish"]]
    started = time.monotonic()
    try:
        client = WindowClient()
    except WindowError as err:
        emit("error", call="connect", error=type(err).__name__, message=str(err),
             elapsed_ms=round((time.monotonic() - started) * 1000))
        return
    async with client:
        if "publish" in calls:
            started = time.monotonic()
            try:
                await publish(client, scenario, entries)
                emit("published", count=len(entries))
            except WindowError as err:
                emit("error", call="publish", error=type(err).__name__, message=str(err),
                     elapsed_ms=round((time.monotonic() - started) * 1000))
        if "subscribe" in calls:
            started = time.monotonic()
            async with subscription(client, open_) as sub:
                try:
                    await sub.wait_opened(timeout=50)
                except WindowError as err:
                    emit("error", call="subscribe", error=type(err).__name__, message=str(err),
                         elapsed_ms=round((time.monotonic() - started) * 1000))


async def main(path: str) -> None:
    with open(path) as f:
        scenario = json.load(f)
    if scenario.get("expect", {}).get("errors"):
        await without_sidecar(scenario)
        return
    open_ = scenario["open"]
    handle: Dict[str, List[str]] = scenario["handle"]
    effects: str = scenario["effects"]
    typed = scenario.get("side_effect", "queue") == "typed"
    seen: "Counter[str]" = Counter()
    # `hold_until:P`: the deliveries acked so far, by name, for the held ones to wait on.
    acked: Dict[str, asyncio.Event] = {}

    def acked_event(name: str) -> asyncio.Event:
        return acked.setdefault(name, asyncio.Event())

    def settle(d: Delivery, payload: str, consumer: Optional[str]) -> None:
        """The line before an outcome the runner gives (run.sh checks the order with it);
        ``consumer`` names the replica with `open.consumers`, else None."""
        emit("settle", payload=payload, count=d.delivery_count,
             **({} if consumer is None else {"consumer": consumer}))

    async def hold(d: Delivery, payload: str, until: str, consumer: Optional[str]) -> None:
        await acked_event(until).wait()
        settle(d, payload, consumer)
        d.ack()
        acked_event(payload).set()

    async def handle_one(d: Delivery, consumer: Optional[str]) -> None:
        """One delivery; ``consumer`` names its replica with `open.consumers`, else None."""
        payload = name_of(d)
        seen[payload] += 1
        extra: Dict[str, Any] = {}
        if not d.in_layout:
            extra["fields"] = d.text_fields
            try:
                d.json()
                extra["json_error"] = None
            except ValueError as err:
                extra["json_error"] = str(err)
        if consumer is not None:
            extra["consumer"] = consumer
        if d.partition is not None:
            extra["partition"] = d.partition
        emit("delivery", payload=payload, count=d.delivery_count, headers=d.headers, **extra)
        action = action_for(handle, payload, seen[payload])
        if typed:
            d.redis.hincrby(effects, payload, 1)
        else:
            d.queue("HINCRBY", effects, payload, 1)
        if action == "ack":
            settle(d, payload, consumer)
            d.ack()
            acked_event(payload).set()
        elif action == "drop":
            settle(d, payload, consumer)
            d.drop()
        elif action == "retry":
            settle(d, payload, consumer)
            d.retry()
        elif action == "dead_letter":
            settle(d, payload, consumer)
            d.dead_letter(DEAD_LETTER_REASON)
        elif action.startswith("retry_after:"):
            settle(d, payload, consumer)
            d.retry_after(int(action.split(":")[1]) / 1000)
        elif action.startswith("hold_until:"):
            # Unsettled until that delivery is acked; the others go on meanwhile.
            await hold(d, payload, action.split(":", 1)[1], consumer)
        elif action == "reject" or action.startswith("reject:"):
            # A command the sidecar refuses (FLUSHALL, or the one named): the client's rule applies.
            name, *args = action.split(":", 1)[1].split(" ") if ":" in action else ["FLUSHALL"]
            d.queue(name, *args)
            d.ack()
        elif action.startswith("queue:"):
            # A command the sidecar accepts and Redis may fail when it runs, then an ack.
            name, *args = action.split(":", 1)[1].split(" ")
            d.queue(name, *args)
            settle(d, payload, consumer)
            d.ack()
            acked_event(payload).set()
        elif action == "fail":
            raise RuntimeError("the scenario's handler fails")
        elif action == "typo":
            try:
                getattr(d.redis, "hincrbyy")(effects, payload, 1)
            except AttributeError as err:  # the call site's error: nothing was queued
                emit("call_error", payload=payload, message=str(err))
            d.ack()
        elif action.startswith("slow_ack:"):
            await asyncio.sleep(int(action.split(":")[1]) / 1000)
            # Its settle line too (after the wait), so that a slow key's order is checked like
            # any other's.
            settle(d, payload, consumer)
            d.ack()
        else:
            raise SystemExit(f"unknown action {action!r}")

    # `open.consumers`: replicas of one group, each a subscription on a client (a gRPC
    # connection) of its own as separate processes would have, all handled here side by side,
    # their lines naming the consumer; else the one `open.consumer`, its lines naming none.
    replicas: List[str] = list(open_.get("consumers") or [])
    several = bool(replicas)
    consumers: List[Optional[str]] = list(replicas) if several else [None]
    holds = any(a.startswith("hold_until:") for acts in handle.values() for a in acts)

    def handler(consumer: Optional[str]) -> Callable[[Delivery], Awaitable[None]]:
        async def handle(d: Delivery) -> None:
            await handle_one(d, consumer)
        return handle

    async def concurrently(sub: Subscription, consumer: Optional[str]) -> None:
        """With `hold_until`, a held delivery must not stop the others: each delivery is
        handled in a task of its own (Subscription.run handles one at a time)."""
        tasks = set()
        async for d in sub:
            task = asyncio.create_task(handle_one(d, consumer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    # Leaving the stack closes each subscription (flushed, reported, ended), then its client.
    async with contextlib.AsyncExitStack() as stack:
        subs: List[Subscription] = []
        clients: List[WindowClient] = []
        for consumer in consumers:
            # Target, token and TLS from the environment.
            client = await stack.enter_async_context(WindowClient())
            clients.append(client)
            subs.append(subscription(
                client, open_, consumer, on_replica_lifecycle if several else on_lifecycle))
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            for sub in subs:
                sub.stop()  # hands nothing more out; the close sends and flushes what is held

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        for sub in subs:
            await stack.enter_async_context(sub)
        workers = [
            asyncio.create_task(
                concurrently(sub, consumer) if holds else sub.run(handler(consumer)))
            for sub, consumer in zip(subs, consumers)
        ]
        results = await asyncio.gather(*(sub.wait_opened() for sub in subs),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if not isinstance(err, (RuntimeError, WindowError)) or not stopped:
                raise err
        if not errors:
            if several:
                emit("opened")  # once, every replica's subscription open
            entries = [
                {"payload": e["payload"], "headers": e.get("headers", {})}
                for e in scenario["publish"]
            ]
            await publish(clients[0], scenario, entries)
            emit("published", count=len(entries))
        await asyncio.gather(*workers)


if __name__ == "__main__":
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(main(sys.argv[1]))
