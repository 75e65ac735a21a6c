"""The Python client's conformance runner: plays the worker side of one scenario of
client-examples/conformance/scenarios with the installed ``window_client`` package, and
prints what it sees as JSON lines (see client-examples/conformance/README.md)."""

import asyncio
import json
import signal
import sys
from collections import Counter
from typing import Any, Dict, List

from window_client import Delivery, Subscription, WindowClient


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def subscription(client: WindowClient, open_: Dict[str, Any]) -> Subscription:
    options: Dict[str, Any] = {"count": open_.get("count", 16)}
    if open_.get("mode") == "atomic":
        options["atomic"] = True
    if open_.get("max_deliveries"):
        options["max_deliveries"] = open_["max_deliveries"]
        options["dead_letter"] = open_["dead_letter"]
    form = open_["form"]
    if form == "stream":
        return client.subscribe(
            open_["key"], open_["group"], consumer=open_.get("consumer", ""), **options
        )
    if form == "reliable_list":
        return client.subscribe_reliable_list(
            open_["key"], consumer=open_.get("consumer", ""), **options
        )
    if form == "simple_list":
        return client.subscribe_list(open_["key"], **options)
    if form == "pubsub":
        return client.subscribe_pubsub([open_["key"]], **options)
    raise SystemExit(f"unknown form {form!r}")


def action_for(handle: Dict[str, List[str]], payload: str, n: int) -> str:
    actions = handle.get(payload) or handle.get("*") or ["ack"]
    return actions[min(n, len(actions)) - 1]


async def main(path: str) -> None:
    with open(path) as f:
        scenario = json.load(f)
    open_ = scenario["open"]
    handle: Dict[str, List[str]] = scenario["handle"]
    effects: str = scenario["effects"]
    seen: Counter[str] = Counter()
    async with WindowClient() as client:
        sub = subscription(client, open_)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, sub.stop)
        async with sub:
            worker = asyncio.create_task(
                sub.run(lambda d: handle_one(d, handle, effects, seen))
            )
            while sub.opened is None and not worker.done():
                await asyncio.sleep(0.01)
            emit("opened")
            entries = [
                {"payload": e["payload"], "headers": e.get("headers", {})}
                for e in scenario["publish"]
            ]
            await client.publish(open_["key"], entries)
            emit("published", count=len(entries))
            await worker


async def handle_one(
    d: Delivery, handle: Dict[str, List[str]], effects: str, seen: "Counter[str]"
) -> None:
    payload = d.payload.decode()
    seen[payload] += 1
    emit("delivery", payload=payload, count=d.delivery_count, headers=d.headers)
    action = action_for(handle, payload, seen[payload])
    d.queue("HINCRBY", effects, payload, 1)
    if action == "ack":
        d.ack()
    elif action == "drop":
        d.drop()
    elif action == "retry":
        d.retry()
    elif action.startswith("retry_after:"):
        d.retry_after(int(action.split(":")[1]) / 1000)
    elif action == "reject":
        d.queue("FLUSHALL")
        d.ack()
    elif action == "fail":
        raise RuntimeError("the scenario's handler fails")
    elif action.startswith("slow_ack:"):
        await asyncio.sleep(int(action.split(":")[1]) / 1000)
        d.ack()
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
