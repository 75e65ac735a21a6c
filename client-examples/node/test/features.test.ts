// Unit tests of the client's options and lifecycle against a scripted fake sidecar: an
// in-process grpc-js server whose Subscribe calls a test plays message by message. TLS, packed
// acks, reports in reads, draining and resubscribing, the handler API and its rule for a failed
// handler, publish targets, partitioned streams, and OpenTelemetry context in and out.
//
//   npm test
import { test } from "node:test";
import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Metadata, Server, ServerCredentials, status, type ServerDuplexStream, type ServerUnaryCall } from "@grpc/grpc-js";
import * as otel from "@opentelemetry/api";
import {
  Framing,
  OutcomeKind,
  RejectionReason,
  SubscribeResponse,
  WindowServiceService,
  type Batch,
  type DeepPartial,
  type Opened,
  type PublishRequest,
  type PublishResponse,
  type SubscribeRequest,
} from "../src/gen/window_sidecar/v1/window";
import { channelSecurity, RETRY_DELAY_MS, tlsFromEnv, WindowClient, type Delivery, type FlushEvent, type Logger, type OpenedInfo } from "../src/window-client";
import { AlreadySettledError, SettledError, WindowError } from "../src/errors";

const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };

type Call = ServerDuplexStream<SubscribeRequest, SubscribeResponse>;

/** The messages a client sends on one Subscribe call, read one at a time. */
class Inbox {
  private readonly items: SubscribeRequest[] = [];
  private readonly waiting: Array<(r: SubscribeRequest | undefined) => void> = [];
  ended = false;
  constructor(call: Call) {
    call.on("data", (req: SubscribeRequest) => {
      const w = this.waiting.shift();
      if (w) w(req);
      else this.items.push(req);
    });
    call.on("end", () => {
      this.ended = true;
      for (const w of this.waiting.splice(0)) w(undefined);
    });
  }
  /** The next message, or undefined once the client half-closed. */
  next(): Promise<SubscribeRequest | undefined> {
    const r = this.items.shift();
    if (r) return Promise.resolve(r);
    if (this.ended) return Promise.resolve(undefined);
    return new Promise((resolve) => this.waiting.push(resolve));
  }
  async batch(): Promise<Batch> {
    const r = await this.next();
    assert.ok(r?.batch, `expected a batch, got ${JSON.stringify(r)}`);
    return r.batch;
  }
}

interface Fake {
  target: string;
  server: Server;
  published: PublishRequest[];
  metadata: Metadata[];
}

const send = (call: Call, msg: DeepPartial<SubscribeResponse>) => call.write(SubscribeResponse.fromPartial(msg));
const opened = (call: Call, extra: DeepPartial<Opened> = {}) =>
  send(call, { opened: { subscriptionId: "sub-1", consumer: "c", count: 4, maxInFlight: 8, ...extra } });
const delivery = (slot: number, payload: string, extra: Record<string, unknown> = {}) => ({
  slot, entryId: `${slot}-0`, payload: Buffer.from(payload), deliveryCount: 1, ...extra,
});

/** A fake sidecar; `script(call, inbox, n)` plays the n-th Subscribe call (from 1). */
async function fake(
  script: (call: Call, inbox: Inbox, n: number) => void | Promise<void>,
  creds: ServerCredentials = ServerCredentials.createInsecure(),
): Promise<Fake> {
  const server = new Server();
  const f: Fake = { target: "", server, published: [], metadata: [] };
  let calls = 0;
  server.addService(WindowServiceService, {
    subscribe: (call: Call) => {
      calls += 1;
      f.metadata.push(call.metadata);
      void script(call, new Inbox(call), calls);
    },
    publish: (call: ServerUnaryCall<PublishRequest, PublishResponse>, cb: (e: null, r: PublishResponse) => void) => {
      f.published.push(call.request);
      f.metadata.push(call.metadata);
      cb(null, { ids: call.request.stream ? call.request.entries.map((_, i) => `1-${i}`) : [], receivers: call.request.channel ? call.request.entries.map(() => 2) : [] });
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", creds, (err, p) => (err ? reject(err) : resolve(p))),
  );
  f.target = `127.0.0.1:${port}`;
  return f;
}

test("packed acks: plain acks go as slots in Batch.acks, the other outcomes as outcomes", async () => {
  let batch: Batch | undefined;
  const f = await fake(async (call, inbox) => {
    const open = (await inbox.next())!.open!;
    assert.equal(open.reportsInReads, false);
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "a"), delivery(2, "b"), delivery(3, "c")] } });
    batch = await inbox.batch();
    send(call, { flush: { readId: 1, settles: 3, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target, { tls: false });
  const sub = client.subscribe({ stream: "s", group: "g", packedAcks: true, logger: quiet, onFlush: () => sub.stop() });
  for await (const d of sub) {
    if (d.slot === 2) d.drop("bad");
    else d.queue("INCR", "n").ack();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.ok(batch);
  assert.deepEqual(batch.acks, [1, 3]);
  assert.deepEqual(batch.outcomes.map((o) => [o.slot, o.kind, o.reason]), [[2, OutcomeKind.OUTCOME_KIND_DROP, "bad"]]);
  assert.deepEqual(batch.commands.map((c) => c.slot), [1, 3]);
});

test("batches(): each read handed out whole, settled on its own where needed and the rest in one call", async () => {
  const batches: Batch[] = [];
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "a"), delivery(2, "b"), delivery(3, "c")] } });
    send(call, { read: { readId: 2, deliveries: [delivery(4, "d"), delivery(5, "e")] } });
    // Outcomes settled in one turn of the event loop share a message.
    while (batches.flatMap((b) => b.outcomes).length < 5) batches.push(await inbox.batch());
    send(call, { flush: { readId: 1, settles: 3, ok: true } });
    send(call, { flush: { readId: 2, settles: 2, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target, { tls: false });
  let flushes = 0;
  const sub = client.subscribe({ stream: "s", group: "g", logger: quiet, onFlush: () => {
    if (++flushes === 2) sub.stop();
  } });
  // Both reads arrive before the loop asks: each is still a batch of its own.
  sub.start();
  while (sub.stats.reads < 2) await new Promise((r) => setTimeout(r, 10));
  const seen: Array<[number, number[], number]> = [];
  for await (const batch of sub.batches()) {
    seen.push([batch.readId, [...batch].map((d) => d.slot), batch.unsettled.length]);
    if (batch.readId === 1) {
      batch.deliveries[1].drop("bad");
      batch.deliveries[0].queue("INCR", "n");
      assert.equal(batch.unsettled.length, 2);
      batch.ack();
    } else {
      batch.retry("later");
    }
    assert.equal(batch.unsettled.length, 0);
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(seen, [[1, [1, 2, 3], 3], [2, [4, 5], 2]]);
  const { OUTCOME_KIND_ACK: ACK, OUTCOME_KIND_DROP: DROP, OUTCOME_KIND_RETRY: RETRY } = OutcomeKind;
  assert.deepEqual(batches.flatMap((b) => b.outcomes.map((o) => [o.slot, o.kind, o.reason])), [
    [2, DROP, "bad"], [1, ACK, ""], [3, ACK, ""], [4, RETRY, "later"], [5, RETRY, "later"],
  ]);
  assert.deepEqual(batches.flatMap((b) => b.commands.map((c) => c.slot)), [1]);
});

test("batches(): a subscription is taken one way only", async () => {
  const client = new WindowClient("127.0.0.1:1", { tls: false });
  const byRead = client.subscribe({ stream: "s", group: "g", logger: quiet });
  byRead.batches();
  assert.throws(() => byRead[Symbol.asyncIterator](), TypeError);
  await assert.rejects(byRead.run(() => {}), TypeError);
  const byDelivery = client.subscribe({ stream: "s", group: "g", logger: quiet });
  byDelivery[Symbol.asyncIterator]();
  assert.throws(() => byDelivery.batches(), /already taken delivery by delivery/);
  await byRead.close();
  await byDelivery.close();
  client.close();
});

test("extend: sent at once as Batch.extend before the outcome, refused once the delivery is settled", async () => {
  const batches: Batch[] = [];
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "slow"), delivery(2, "fast")] } });
    batches.push(await inbox.batch());
    batches.push(await inbox.batch());
    send(call, { flush: { readId: 1, settles: 2, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  const sub = client.subscribe({ stream: "s", group: "g", logger: quiet, lingerMs: null, onFlush: () => sub.stop() });
  await sub.run(
    async (d) => {
      if (d.slot === 1) {
        assert.equal(d.extend(), true);
        await new Promise((r) => setTimeout(r, 50));
        d.ack();
        assert.throws(() => d.extend(), AlreadySettledError);
        assert.throws(() => d.extend(), SettledError); // the old name, for one release
      }
    },
    { concurrency: 2 },
  );
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(batches[0].extend, [1]);
  assert.deepEqual(batches[0].outcomes, []);
  assert.deepEqual(batches[1].extend, []);
  assert.deepEqual(batches[1].outcomes.map((o) => [o.slot, o.kind]), [[2, OutcomeKind.OUTCOME_KIND_ACK], [1, OutcomeKind.OUTCOME_KIND_ACK]]);
});

test("reports in reads: asked for in the Open, and a read's flushed report reaches onFlush before its deliveries", async () => {
  const order: string[] = [];
  const f = await fake(async (call, inbox) => {
    const open = (await inbox.next())!.open!;
    assert.equal(open.reportsInReads, true);
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "a")] } });
    await inbox.batch();
    send(call, { read: { readId: 2, deliveries: [delivery(2, "b")], flushed: { readId: 1, settles: 1, ok: true, segmentsKept: 1 } } });
    await inbox.batch();
    send(call, { flush: { readId: 2, settles: 1, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  const sub = client.subscribe({
    stream: "s", group: "g", reportsInReads: true, logger: quiet,
    onFlush: (ev: FlushEvent) => {
      order.push(`flush ${ev.report.readId} ${ev.settled.map((d) => d.slot).join(",")}`);
      if (ev.report.readId === 2) sub.stop();
    },
  });
  for await (const d of sub) {
    order.push(`delivery ${d.slot}`);
    d.ack();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(order, ["delivery 1", "flush 1 1", "delivery 2", "flush 2 2"]);
  assert.equal(sub.stats.reportsInReads, 1);
});

test("ordered: the Open names the key, and a read flushed in parts keeps its unsettled deliveries", async () => {
  const batches: Batch[] = [];
  const flushes: string[] = [];
  const f = await fake(async (call, inbox) => {
    const open = (await inbox.next())!.open!;
    assert.equal(open.orderingKey?.header, "k");
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "slow"), delivery(2, "fast")] } });
    batches.push(await inbox.batch());
    // The fast key's delivery is flushed ahead of the rest of its read, then the rest.
    send(call, { flush: { readId: 1, settles: 1, ok: true, segmentsKept: 1 } });
    batches.push(await inbox.batch());
    send(call, { flush: { readId: 1, settles: 1, ok: true, segmentsKept: 1 } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  let held: Delivery | undefined;
  const sub = client.subscribe({
    stream: "s", group: "g", orderingHeader: "k", lingerMs: null, logger: quiet,
    onFlush: (ev: FlushEvent) => {
      flushes.push(`${ev.report.readId}: ${ev.settled.map((d) => d.slot).join(",")} / ${ev.abandoned.map((d) => d.slot).join(",")}`);
      if (flushes.length === 1) held!.ack();
      else sub.stop();
    },
  });
  for await (const d of sub) {
    if (d.slot === 1) held = d;
    else d.ack();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(batches.map((b) => b.outcomes.map((o) => o.slot)), [[2], [1]]);
  assert.deepEqual(flushes, ["1: 2 / ", "1: 1 / "]);
});

test("draining: nothing more is handed out, the held delivery's outcome goes out at once, then the client resubscribes", async () => {
  const handled: string[] = [];
  const events: string[] = [];
  let drainBatch: Batch | undefined;
  const f = await fake(async (call, inbox, n) => {
    await inbox.next(); // open
    opened(call);
    if (n === 1) {
      send(call, { read: { readId: 1, deliveries: [delivery(1, "held"), delivery(2, "queued")] } });
      await new Promise((r) => setTimeout(r, 50));
      send(call, { draining: { grace: { seconds: 5, nanos: 0 }, outstanding: 2 } });
      drainBatch = await inbox.batch();
      send(call, { flush: { readId: 1, settles: 1, ok: true } });
      call.emit("error", { code: status.UNAVAILABLE, details: "window-sidecar is shutting down" });
      return;
    }
    send(call, { read: { readId: 1, deliveries: [delivery(1, "queued", { deliveryCount: 2 })] } });
    await inbox.batch();
    send(call, { flush: { readId: 1, settles: 1, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  const sub = client.subscribe({
    stream: "s", group: "g", logger: quiet, backoff: { initialMs: 10, maxMs: 20 },
    lingerMs: null, // only the drain may send the held outcome before the read completes
    onOpened: (_o: Opened, info: OpenedInfo) => {
      events.push(info.resubscribed ? "resubscribed" : "opened");
    },
    onDraining: (d) => {
      events.push(`draining ${d.outstanding}`);
    },
    onFlush: (ev) => {
      if (ev.deliveries.some((d) => d.deliveryCount === 2)) sub.stop();
    },
  });
  await sub.run(async (d: Delivery) => {
    handled.push(`${d.payload} ${d.deliveryCount}`);
    if (d.payload.toString() === "held") await new Promise((r) => setTimeout(r, 200));
  });
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(handled, ["held 1", "queued 2"]);
  assert.deepEqual(events, ["opened", "draining 2", "resubscribed"]);
  assert.ok(drainBatch);
  assert.deepEqual(drainBatch.outcomes.map((o) => [o.slot, o.kind]), [[1, OutcomeKind.OUTCOME_KIND_ACK]]);
  assert.equal(sub.stats.drains, 1);
  assert.equal(sub.stats.opens, 2);
});

test("draining: once the started delivery is settled the client half-closes, long before the grace; the rest is never handed out", async () => {
  const handled: string[] = [];
  const events: string[] = [];
  const drainBatches: Batch[] = [];
  let halfClosedAfter = -1;
  const f = await fake(async (call, inbox, n) => {
    await inbox.next(); // open
    opened(call);
    if (n === 1) {
      send(call, { read: { readId: 1, deliveries: [delivery(1, "slow"), delivery(2, "b"), delivery(3, "c")] } });
      await new Promise((r) => setTimeout(r, 50));
      const began = Date.now();
      send(call, { draining: { grace: { seconds: 30, nanos: 0 }, outstanding: 3 } });
      for (let m = await inbox.next(); m !== undefined; m = await inbox.next()) if (m.batch) drainBatches.push(m.batch);
      halfClosedAfter = Date.now() - began;
      send(call, { flush: { readId: 1, settles: 1, ok: true } });
      call.end(); // the sidecar ends the subscription once the client half-closed
      return;
    }
    await inbox.next(); // until the client half-closes
    call.end();
  });
  const client = new WindowClient(f.target);
  const sub = client.subscribe({
    stream: "s", group: "g", logger: quiet, backoff: { initialMs: 10, maxMs: 20 }, lingerMs: null,
    onOpened: (_o: Opened, info: OpenedInfo) => {
      events.push(info.resubscribed ? "resubscribed" : "opened");
      if (info.resubscribed) sub.stop();
    },
    onDraining: () => {
      events.push("draining");
    },
  });
  await sub.run(async (d: Delivery) => {
    handled.push(d.payload.toString());
    await new Promise((r) => setTimeout(r, 300));
  });
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(handled, ["slow"]);
  assert.deepEqual(drainBatches.map((b) => b.outcomes.map((o) => o.slot)), [[1]]);
  assert.ok(halfClosedAfter >= 0 && halfClosedAfter < 5_000, `half-closed after ${halfClosedAfter} ms`);
  assert.deepEqual(events, ["opened", "draining", "resubscribed"]);
});

test("run(): a handler that returns acks, one that throws retries after 1 s with the reason, never acked", async () => {
  let batch: Batch | undefined;
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "ok"), delivery(2, "boom"), delivery(3, "async-boom"), delivery(4, "settled")] } });
    batch = await inbox.batch();
    send(call, { flush: { readId: 1, settles: 4, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  const sub = client.subscribe({ stream: "s", group: "g", logger: quiet, onFlush: () => sub.stop() });
  await sub.run(
    async (d) => {
      d.queue("INCR", d.payload.toString());
      const p = d.payload.toString();
      if (p === "boom") throw new Error("no such order");
      if (p === "async-boom") await Promise.reject(new Error("later"));
      if (p === "settled") {
        d.drop("gone");
        throw new Error("after the outcome");
      }
    },
    { concurrency: 4 },
  );
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.ok(batch);
  const bySlot = new Map(batch.outcomes.map((o) => [o.slot, o]));
  assert.equal(bySlot.get(1)?.kind, OutcomeKind.OUTCOME_KIND_ACK);
  for (const [slot, msg] of [[2, "no such order"], [3, "later"]] as const) {
    const o = bySlot.get(slot)!;
    assert.equal(o.kind, OutcomeKind.OUTCOME_KIND_RETRY_AFTER);
    assert.deepEqual(o.delay, { seconds: RETRY_DELAY_MS / 1000, nanos: 0 });
    assert.equal(o.reason, `handler failed: ${msg}`);
  }
  assert.equal(bySlot.get(4)?.kind, OutcomeKind.OUTCOME_KIND_DROP);
  assert.equal(sub.stats.handlerFailures, 3);
});

test("a subscription whose stream ends with UNAVAILABLE or ALREADY_EXISTS resubscribes with the same Open", async () => {
  const opens: string[] = [];
  const f = await fake(async (call, inbox, n) => {
    const open = (await inbox.next())!.open!;
    opens.push(JSON.stringify(open));
    if (n < 3) {
      call.emit("error", n === 1 ? { code: status.UNAVAILABLE, details: "gone" } : { code: status.ALREADY_EXISTS, details: "consumer c is held" });
      return;
    }
    opened(call);
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  const infos: OpenedInfo[] = [];
  const sub = client.subscribe({
    stream: "s", group: "g", consumer: "c", logger: quiet, backoff: { initialMs: 5, maxMs: 10 },
    onOpened: (_o, info) => {
      infos.push(info);
      sub.stop();
    },
  });
  await sub.run(() => {});
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.equal(opens.length, 3);
  assert.equal(new Set(opens).size, 1);
  assert.deepEqual(infos, [{ resubscribed: false, opens: 1 }]);
  assert.equal(sub.stats.reconnects, 2);
});

test("publish: to a stream, a list, a channel and a sharded channel, raw or framed", async () => {
  const f = await fake(() => {});
  const client = new WindowClient(f.target);
  try {
    assert.deepEqual(await client.publish("orders", ["a", { payload: "b", headers: { k: "v" } }], { maxLen: 10 }), ["1-0", "1-1"]);
    assert.deepEqual(await client.publish({ list: "jobs" }, ["j"]), []);
    assert.deepEqual(await client.publishResult({ channel: "events" }, ["e"], { raw: true }), { ids: [], receivers: [2] });
    await client.publish({ shardedChannel: "shard" }, ["s"]);
  } finally {
    client.close();
    f.server.forceShutdown();
  }
  const [stream, list, channel, sharded] = f.published;
  assert.deepEqual([stream.stream, stream.list, stream.channel, stream.shardedChannel, stream.maxLen], ["orders", "", "", "", 10]);
  assert.deepEqual(stream.entries[1].headers, { k: "v" });
  assert.deepEqual([list.stream, list.list], ["", "jobs"]);
  assert.deepEqual([channel.channel, channel.framing], ["events", Framing.FRAMING_RAW]);
  assert.equal(list.framing, Framing.FRAMING_UNSPECIFIED);
  assert.equal(sharded.shardedChannel, "shard");
});

test("publish: to a partitioned stream, by a header or a field; partition options that do not go together are refused", async () => {
  const f = await fake(() => {});
  const client = new WindowClient(f.target);
  try {
    await client.publish("orders", [{ payload: "a", headers: { customer: "c1" } }], { partitions: 4, partitionHeader: "customer" });
    await client.publish({ stream: "orders" }, ["b"], { partitions: 8, partitionField: "customer_id", maxLen: 100 });
    await client.publish("orders", ["c"]);
    const refused: Array<[string, Parameters<WindowClient["publish"]>]> = [
      ["publish: partitions needs partitionHeader or partitionField: the header or field holding each entry's key, which decides its partition",
        ["orders", ["x"], { partitions: 4 }]],
      ["publish: partitionHeader and partitionField: one partition key, not both",
        ["orders", ["x"], { partitions: 4, partitionHeader: "k", partitionField: "k" }]],
      ["publish: partitionHeader needs partitions: how many partitions the stream has (the number its subscribers open it with)",
        ["orders", ["x"], { partitionHeader: "k" }]],
      ["publish: partitionField needs partitions: how many partitions the stream has (the number its subscribers open it with)",
        ["orders", ["x"], { partitions: 0, partitionField: "k" }]],
      ["publish: partitions is for a stream; a list or channel is not partitioned: publish to the stream, or drop partitions",
        [{ list: "jobs" }, ["x"], { partitions: 4, partitionHeader: "k" }]],
      ["publish: partitions is for a stream; a list or channel is not partitioned: publish to the stream, or drop partitions",
        [{ channel: "events" }, ["x"], { partitions: 4, partitionHeader: "k" }]],
    ];
    for (const [message, args] of refused) {
      await assert.rejects(client.publish(...args), (e: Error) => e instanceof TypeError && e.message === message);
    }
    await assert.rejects(client.publish("orders", ["x"], { partitions: -4, partitionHeader: "k" }), RangeError);
  } finally {
    client.close();
    f.server.forceShutdown();
  }
  // Nothing refused reached the sidecar.
  assert.equal(f.published.length, 3);
  const [byHeader, byField, plain] = f.published;
  assert.deepEqual([byHeader.stream, byHeader.partitions, byHeader.partitionBy?.header, byHeader.partitionBy?.field], ["orders", 4, "customer", undefined]);
  assert.deepEqual([byField.stream, byField.partitions, byField.partitionBy?.field, byField.partitionBy?.header, byField.maxLen], ["orders", 8, "customer_id", undefined, 100]);
  assert.deepEqual([plain.partitions, plain.partitionBy], [0, undefined]);
});

test("partitions: the Open carries them, one stream carries every partition's slots", async () => {
  // Slots of a partitioned stream come from a range per partition, up to 2^53.
  const high = 2 ** 52 + 3;
  let open: SubscribeRequest["open"];
  let batch: Batch | undefined;
  const f = await fake(async (call, inbox) => {
    open = (await inbox.next())!.open;
    opened(call);
    send(call, { read: { readId: 2 ** 36, deliveries: [delivery(2 ** 36 + 1, "p1")] } });
    send(call, { read: { readId: 2 ** 52, deliveries: [delivery(high, "p2")] } });
    batch = await inbox.batch();
    while (batch.outcomes.length < 2) batch.outcomes.push(...(await inbox.batch()).outcomes);
    send(call, { flush: { readId: 2 ** 36, settles: 1, ok: true } });
    send(call, { flush: { readId: 2 ** 52, settles: 1, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  let flushes = 0;
  const sub = client.subscribe({
    stream: "s", group: "g", consumer: "w1", partitions: 4, orderingHeader: "k", logger: quiet,
    onFlush: () => {
      if (++flushes === 2) sub.stop();
    },
  });
  await sub.run(() => {}, { concurrency: 2 });
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual([open?.stream?.key, open?.stream?.consumer, open?.stream?.partitions, open?.orderingKey?.header], ["s", "w1", 4, "k"]);
  assert.deepEqual(batch!.outcomes.map((o) => o.slot).sort((a, b) => a - b), [2 ** 36 + 1, high]);
});

/**
 * A subscription the sidecar shares 4 partitions out for: a read of partition 3, then a read
 * without a partition (as an unpartitioned stream's); then it serves until the client half-closes.
 */
async function partitionedReads(call: Call, inbox: Inbox): Promise<void> {
  await inbox.next();
  opened(call, { partitions: 4 });
  send(call, { read: { readId: 1, partition: 3, deliveries: [delivery(1, "a"), delivery(2, "b")] } });
  send(call, { read: { readId: 2, deliveries: [delivery(3, "c")] } });
  while ((await inbox.next()) !== undefined);
  call.end();
}

test("partitions: the subscription's from Opened once open; each delivery's from its read, undefined without one", async () => {
  const f = await fake(partitionedReads);
  const client = new WindowClient(f.target, { tls: false });
  const sub = client.subscribe({ stream: "s", group: "g", partitions: 4, logger: quiet });
  const beforeOpen = sub.partitions;
  const seen: Array<[number, number, number | undefined, number]> = [];
  for await (const d of sub) {
    seen.push([d.slot, d.readId, d.partition, sub.partitions]);
    d.ack();
    if (d.slot === 3) sub.stop();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.equal(beforeOpen, 0);
  assert.deepEqual(seen, [[1, 1, 3, 4], [2, 1, 3, 4], [3, 2, undefined, 4]]);
});

test("partitions: a batch names its read's partition, as its deliveries do; undefined without one", async () => {
  const f = await fake(partitionedReads);
  const client = new WindowClient(f.target, { tls: false });
  const sub = client.subscribe({ stream: "s", group: "g", partitions: 4, logger: quiet });
  const seen: Array<[number, number | undefined, Array<number | undefined>]> = [];
  for await (const batch of sub.batches()) {
    seen.push([batch.readId, batch.partition, batch.deliveries.map((d) => d.partition)]);
    batch.ack();
    if (batch.readId === 2) sub.stop();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(seen, [[1, 3, [3, 3]], [2, undefined, [undefined]]]);
  assert.equal(sub.partitions, 4);
});

test("partitions: max_in_flight bounds each partition's window, so only more than it times the partitions is warned of", async () => {
  const p = 2 ** 36; // a partition's range of read ids and slots
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call, { partitions: 2, maxInFlight: 2 });
    // Each partition's window full (2 + 2 unsettled: within 2 × 2), then one more: beyond it.
    send(call, { read: { readId: 1, partition: 0, deliveries: [delivery(1, "a"), delivery(2, "b")] } });
    send(call, { read: { readId: p + 1, partition: 1, deliveries: [delivery(p + 1, "c"), delivery(p + 2, "d")] } });
    send(call, { read: { readId: 2, partition: 0, deliveries: [delivery(3, "e")] } });
    await untilEnd(inbox);
    call.end();
  });
  const client = new WindowClient(f.target, { tls: false });
  const warned: string[] = [];
  const sub = client.subscribe({ stream: "s", group: "g", partitions: 2, logger: { ...quiet, warn: (m) => warned.push(m) } });
  let held = 0;
  for await (const _d of sub) if (++held === 5) sub.stop({ drain: false }); // none settled: all five in flight
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(warned.filter((m) => m.includes("max_in_flight")), [
    "read 2 has 1 deliveries with 4 unsettled: more than max_in_flight 4",
  ]);
});

/** What the sidecar answers for the outcomes of slots whose partition was handed over. */
const alreadySettled = (...slots: number[]) => ({
  rejections: {
    rejections: slots.map((slot) => ({
      slot, reason: RejectionReason.REJECTION_REASON_ALREADY_SETTLED, message: `slot ${slot} already has an outcome or was abandoned`,
    })),
  },
});

/** The client's messages until it half-closes. */
async function untilEnd(inbox: Inbox): Promise<SubscribeRequest[]> {
  const rest: SubscribeRequest[] = [];
  for (let r = await inbox.next(); r; r = await inbox.next()) rest.push(r);
  return rest;
}

test("partitions: outcomes refused ALREADY_SETTLED (a partition handed over) end their read, which no report will", async () => {
  const p = 2 ** 36; // a partition's range of read ids and slots
  const batches: Batch[] = [];
  let rest: SubscribeRequest[] = [];
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, { read: { readId: p + 1, deliveries: [delivery(p + 1, "a"), delivery(p + 2, "b"), delivery(p + 3, "c")] } });
    batches.push(await inbox.batch());
    send(call, alreadySettled(p + 1, p + 2, p + 3));
    rest = await untilEnd(inbox);
    call.end();
  });
  const client = new WindowClient(f.target);
  const warned: string[] = [];
  const refused: Array<[number, RejectionReason, number | undefined, string | undefined]> = [];
  const errors: WindowError[] = [];
  let flushes = 0;
  let stream: Delivery["stream"] | undefined;
  const sub = client.subscribe({
    stream: "s", group: "g", partitions: 4, lingerMs: null,
    logger: { ...quiet, warn: (m) => warned.push(m) },
    onRejection: (rej, d) => {
      refused.push([rej.slot, rej.reason, d?.slot, d?.outcome]);
      if (refused.length === 3) sub.stop();
    },
    onError: (e) => void errors.push(e),
    onFlush: () => void (flushes += 1),
  });
  for await (const d of sub) {
    stream = d.stream;
    d.ack();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(batches.map((b) => b.outcomes.map((o) => o.slot)), [[p + 1, p + 2, p + 3]]);
  assert.deepEqual(rest.filter((r) => r.batch && (r.batch.outcomes.length || r.batch.acks.length)), [], "settled again");
  assert.deepEqual(refused, [1, 2, 3].map((n) => [p + n, RejectionReason.REJECTION_REASON_ALREADY_SETTLED, p + n, "ack"]));
  assert.equal(warned.filter((m) => m.includes("ALREADY_SETTLED")).length, 3);
  assert.deepEqual([errors, flushes], [[], 0]);
  assert.deepEqual([stream!.reads.size, stream!.slots.size, stream!.unsettled, stream!.handedUnsettled], [0, 0, 0, 0]);
});

test("partitions: a read reported in part, its rest then refused ALREADY_SETTLED, is dropped", async () => {
  const batches: Batch[] = [];
  const flushes: number[][] = [];
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "fast"), delivery(2, "slow")] } });
    batches.push(await inbox.batch());
    send(call, { flush: { readId: 1, settles: 1, ok: true, segmentsKept: 1 } });
    batches.push(await inbox.batch());
    send(call, alreadySettled(2));
    await untilEnd(inbox);
    call.end();
  });
  const client = new WindowClient(f.target);
  let held: Delivery | undefined;
  const refused: Array<[number, Delivery | undefined]> = [];
  const sub = client.subscribe({
    stream: "s", group: "g", orderingHeader: "k", partitions: 4, lingerMs: null, logger: quiet,
    onFlush: (ev: FlushEvent) => {
      flushes.push(ev.settled.map((d) => d.slot));
      held!.ack();
    },
    onRejection: (rej, d) => {
      refused.push([rej.slot, d]);
      sub.stop();
    },
  });
  for await (const d of sub) {
    if (d.slot === 2) held = d;
    else d.ack();
  }
  await sub.close();
  client.close();
  f.server.forceShutdown();
  assert.deepEqual(batches.map((b) => b.outcomes.map((o) => o.slot)), [[1], [2]]);
  assert.deepEqual(flushes, [[1]]);
  assert.deepEqual(refused, [[2, held]]);
  const st = held!.stream;
  assert.deepEqual([st.reads.size, st.slots.size, st.unsettled, st.handedUnsettled], [0, 0, 0, 0]);
});

test("TLS settings from the environment", () => {
  assert.equal(tlsFromEnv({}), undefined);
  assert.deepEqual(tlsFromEnv({ WINDOW_SIDECAR_TLS_CA: "/ca.pem", WINDOW_SIDECAR_TLS_SERVER_NAME: "sidecar" }), {
    caFile: "/ca.pem", certFile: undefined, keyFile: undefined, serverName: "sidecar",
  });
  assert.throws(() => channelSecurity({ cert: "x" }), /needs its key/);
  assert.throws(() => channelSecurity({ caFile: "/nonexistent/ca.pem" }), /cannot read the TLS CA/);
  assert.deepEqual(channelSecurity({ ca: "pem", serverName: "sidecar" }).options, {
    "grpc.ssl_target_name_override": "sidecar", "grpc.default_authority": "sidecar",
  });
});

function haveOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

test("mutual TLS from WINDOW_SIDECAR_TLS_CA/_CERT/_KEY, with the token beside it", { skip: !haveOpenssl() && "no openssl" }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "window-client-tls-"));
  const ssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
  try {
    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem");
    for (const [name, ext] of [["server", "subjectAltName=IP:127.0.0.1,DNS:localhost"], ["client", "extendedKeyUsage=clientAuth"]]) {
      ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", `/CN=${name}`, "-keyout", `${name}.key`, "-out", `${name}.csr`);
      writeFileSync(join(dir, `${name}.ext`), ext + "\n");
      ssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", `${name}.ext`, "-out", `${name}.pem`);
    }
    const file = (n: string) => readFileSync(join(dir, n));
    const f = await fake(() => {}, ServerCredentials.createSsl(file("ca.pem"), [{ private_key: file("server.key"), cert_chain: file("server.pem") }], true));
    const env = { WINDOW_SIDECAR_TLS_CA: join(dir, "ca.pem"), WINDOW_SIDECAR_TLS_CERT: join(dir, "client.pem"), WINDOW_SIDECAR_TLS_KEY: join(dir, "client.key"), WINDOW_SIDECAR_TOKEN: "t0ken" };
    Object.assign(process.env, env);
    const client = new WindowClient(`localhost:${f.target.split(":")[1]}`);
    const byName = new WindowClient(f.target, { tls: { caFile: env.WINDOW_SIDECAR_TLS_CA, certFile: env.WINDOW_SIDECAR_TLS_CERT, keyFile: env.WINDOW_SIDECAR_TLS_KEY, serverName: "localhost" } });
    for (const k of Object.keys(env)) delete process.env[k];
    const plain = new WindowClient(f.target, { tls: false });
    try {
      assert.equal(client.tls, true);
      assert.deepEqual(await client.publish("s", ["x"]), ["1-0"]);
      assert.equal(f.metadata.at(-1)?.get("authorization")[0], "Bearer t0ken");
      assert.deepEqual(await byName.publish("s", ["x"]), ["1-0"]);
      await assert.rejects(plain.publish("s", ["x"], { timeoutMs: 1_000 }), (e: WindowError) => e instanceof WindowError && (e.status === status.UNAVAILABLE || e.status === status.DEADLINE_EXCEEDED));
    } finally {
      for (const c of [client, byName, plain]) c.close();
      f.server.forceShutdown();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A context manager over AsyncLocalStorage (what @opentelemetry/context-async-hooks provides). */
class AlsContextManager implements otel.ContextManager {
  private readonly als = new AsyncLocalStorage<otel.Context>();
  active(): otel.Context {
    return this.als.getStore() ?? otel.ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: otel.Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    return this.als.run(ctx, () => fn.call(thisArg, ...args));
  }
  bind<T>(_ctx: otel.Context, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    return this;
  }
}

test("OpenTelemetry: the handler runs under the delivery's trace context; publish carries the active one", async () => {
  assert.ok(otel.context.setGlobalContextManager(new AlsContextManager()));
  const producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  let seen: otel.SpanContext | undefined;
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, { read: { readId: 1, deliveries: [delivery(1, "a", { trace: { traceparent: producer, tracestate: "k=v" } })] } });
    await inbox.batch();
    send(call, { flush: { readId: 1, settles: 1, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  try {
    const sub = client.subscribe({ stream: "s", group: "g", logger: quiet, onFlush: () => sub.stop() });
    await sub.run(async (d) => {
      await new Promise((r) => setImmediate(r));
      seen = otel.trace.getSpanContext(otel.context.active());
      // Published from the handler: the entry continues the delivery's trace.
      await client.publish("next", ["b"]);
    });
    await sub.close();
    const mine = otel.trace.setSpanContext(otel.ROOT_CONTEXT, {
      traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: 1, isRemote: false,
    });
    await otel.context.with(mine, () => client.publish("s", ["c", { payload: "d", trace: { traceparent: "given", tracestate: "" } }]));
    await client.publish("s", ["e"], { injectTrace: false });
  } finally {
    client.close();
    f.server.forceShutdown();
    otel.context.disable();
  }
  assert.equal(seen?.traceId, "0af7651916cd43dd8448eb211c80319c");
  assert.equal(seen?.traceState?.get("k"), "v");
  const [fromHandler, fromContext, none] = f.published;
  assert.match(fromHandler.entries[0].trace!.traceparent, /^00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01$/);
  assert.equal(fromContext.entries[0].trace!.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  assert.equal(fromContext.entries[1].trace!.traceparent, "given");
  assert.equal(none.entries[0].trace, undefined);
});

test("OpenTelemetry: a recorded delivery span ends with the outcome and its context goes with the outcome (not packed)", async () => {
  const ended: Array<{ name: string; parent: string | undefined; attrs: Record<string, unknown> }> = [];
  class FakeSpan {
    readonly attrs: Record<string, unknown> = {};
    private readonly sc: otel.SpanContext;
    constructor(readonly name: string, readonly parent: otel.SpanContext | undefined, attrs: otel.Attributes = {}) {
      Object.assign(this.attrs, attrs);
      this.sc = { traceId: parent?.traceId ?? "1".repeat(32), spanId: "abcdef0123456789", traceFlags: 1 };
    }
    spanContext() { return this.sc; }
    setAttribute(k: string, v: unknown) { this.attrs[k] = v; return this; }
    setAttributes() { return this; }
    addEvent() { return this; }
    addLink() { return this; }
    addLinks() { return this; }
    setStatus() { return this; }
    updateName() { return this; }
    end() { ended.push({ name: this.name, parent: this.parent?.spanId, attrs: this.attrs }); }
    isRecording() { return true; }
    recordException() {}
  }
  const tracer = {
    startSpan: (name: string, opts: otel.SpanOptions = {}, ctx?: otel.Context) =>
      new FakeSpan(name, ctx ? otel.trace.getSpanContext(ctx) : undefined, opts.attributes) as unknown as otel.Span,
    startActiveSpan: () => {
      throw new Error("not used");
    },
  } as unknown as otel.Tracer;
  assert.ok(otel.trace.setGlobalTracerProvider({ getTracer: () => tracer }));
  let batch: Batch | undefined;
  const f = await fake(async (call, inbox) => {
    await inbox.next();
    opened(call);
    send(call, {
      read: { readId: 1, deliveries: [delivery(1, "a", { trace: { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate: "" } })] },
    });
    batch = await inbox.batch();
    send(call, { flush: { readId: 1, settles: 1, ok: true } });
    await inbox.next();
    call.end();
  });
  const client = new WindowClient(f.target);
  try {
    const sub = client.subscribe({ stream: "orders", group: "g", packedAcks: true, logger: quiet, onFlush: () => sub.stop() });
    await sub.run(() => {});
    await sub.close();
  } finally {
    client.close();
    f.server.forceShutdown();
    otel.trace.disable();
  }
  assert.deepEqual(ended.map((s) => [s.name, s.parent, s.attrs["window.outcome"], s.attrs["messaging.destination.name"]]), [
    ["process orders", "b7ad6b7169203331", "ack", "orders"],
  ]);
  assert.ok(batch);
  assert.deepEqual(batch.acks, []);
  assert.equal(batch.outcomes[0].trace?.traceparent, "00-0af7651916cd43dd8448eb211c80319c-abcdef0123456789-01");
});
