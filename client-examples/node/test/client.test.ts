// Unit tests of the helper against a fake sidecar: an in-process grpc-js server that speaks
// the window protocol as the test script says, so the rule for refused commands and the token
// are checked on the wire, without Redis or the real sidecar.
//
//   npm test
import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, ServerCredentials, type ServerDuplexStream } from "@grpc/grpc-js";
import {
  Framing,
  Mode,
  OutcomeKind,
  RejectionReason,
  SubscribeResponse,
  WindowServiceService,
  type Batch,
  type SubscribeRequest,
} from "../src/gen/window_sidecar/v1/window";
import { openMessage, RETRY_DELAY_MS, WindowClient, type Delivery, type Logger, type RejectedOutcome } from "../src/window-client";
import {
  CallTimeoutError,
  ConnectionError,
  RedisUnavailableError,
  RefusedError,
  RejectedError,
  RequeueRefusedError,
  SideEffectError,
  SubscriptionEndedError,
  WindowError,
  fromServiceError,
  whatAnswers,
} from "../src/errors";
import { status as GrpcStatus } from "@grpc/grpc-js";
import { createServer } from "node:net";

const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };
const FORBIDDEN = "FLUSHALL is forbidden in a window";

type Call = ServerDuplexStream<SubscribeRequest, SubscribeResponse>;

/** A fake sidecar: `onCall` gets each Subscribe call and the batches its client sends, in order. */
async function fakeSidecar(onCall: (call: Call, batches: AsyncIterator<Batch>) => void): Promise<{ target: string; server: Server }> {
  const server = new Server();
  server.addService(WindowServiceService, {
    subscribe: (call: Call) => {
      const batches: Batch[] = [];
      const waiting: Array<(b: IteratorResult<Batch>) => void> = [];
      call.on("data", (req: SubscribeRequest) => {
        if (req.open) {
          call.write(SubscribeResponse.fromPartial({ opened: { subscriptionId: "sub-1", consumer: "c", count: 1, maxInFlight: 2 } }));
          call.write(
            SubscribeResponse.fromPartial({
              read: { readId: 1, deliveries: [{ slot: 7, entryId: "1-0", payload: Buffer.from("{}"), deliveryCount: 1 }] },
            }),
          );
        } else if (req.batch) {
          const w = waiting.shift();
          if (w) w({ done: false, value: req.batch });
          else batches.push(req.batch);
        }
      });
      call.on("end", () => call.end());
      onCall(call, {
        next: () => {
          const b = batches.shift();
          return b ? Promise.resolve({ done: false, value: b }) : new Promise((r) => waiting.push(r));
        },
      });
    },
    publish: (call: { metadata: { get(k: string): unknown[] } }, cb: (e: null, r: { ids: string[]; receivers: number[] }) => void) =>
      cb(null, { ids: [String(call.metadata.get("authorization")[0] ?? "")], receivers: [] }),
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { target: `127.0.0.1:${port}`, server };
}

/** The command FLUSHALL refused and the ack of slot 7 refused with it, in either order. */
function rejections(commandFirst: boolean): SubscribeResponse {
  const command = { slot: 7, reason: RejectionReason.REJECTION_REASON_FORBIDDEN_COMMAND, message: FORBIDDEN, command: "FLUSHALL" };
  const ack = {
    slot: 7, reason: RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT, command: "",
    message: "slot 7 cannot be acked: one of its commands was refused, so its segment is incomplete; settle it with drop, retry or retry_after",
  };
  return SubscribeResponse.fromPartial({ rejections: { rejections: commandFirst ? [command, ack] : [ack, command] } });
}

for (const [commandFirst, rejectedOutcome, deadLetter] of [
  [true, "retry_after", false], [false, "retry_after", false], [true, undefined, false], [false, "drop", false],
  [true, undefined, true], [false, undefined, true], [true, "drop", true],
] as const) {
  const expected = rejectedOutcome === "retry_after" ? "retry_after" : rejectedOutcome === undefined && deadLetter ? "dead_letter" : "drop";
  test(`a refused command settles its delivery with ${expected} (rejectedOutcome ${rejectedOutcome ?? "auto, the default"}, ${deadLetter ? "a" : "no"} dead letter, command ${commandFirst ? "before" : "after"} the refused ack)`, async () => {
    let second: Batch | undefined;
    const seen: string[] = [];
    const errors: WindowError[] = [];
    const logged: string[] = [];
    const { target, server } = await fakeSidecar(async (call, batches) => {
      const first = (await batches.next()).value as Batch;
      assert.deepEqual(first.commands.map((c) => c.name), ["FLUSHALL"]);
      assert.deepEqual(first.outcomes.map((o) => o.kind), [OutcomeKind.OUTCOME_KIND_ACK]);
      call.write(rejections(commandFirst));
      second = (await batches.next()).value as Batch;
      call.write(SubscribeResponse.fromPartial({ flush: { readId: 1, settles: 1, ok: true } }));
    });
    const client = new WindowClient(target);
    const sub = client.subscribe({
      stream: "s", group: "g", count: 1, rejectedOutcome: rejectedOutcome as RejectedOutcome | undefined,
      ...(deadLetter ? { maxDeliveries: 5, deadLetter: "s:dead" } : {}),
      logger: { ...quiet, warn: (m) => logged.push(m), error: (m) => logged.push(m) },
      onRejection: (rej, d) => {
        seen.push(`${rej.reason}:${d?.outcome}`);
      },
      onError: (e) => {
        errors.push(e);
      },
      onFlush: () => sub.stop(),
    });
    for await (const d of sub) d.queue("FLUSHALL").ack();
    await sub.close();
    client.close();
    server.forceShutdown();

    assert.ok(second, "the helper settled the delivery again");
    assert.deepEqual(second.commands, []);
    assert.equal(second.outcomes.length, 1);
    const o = second.outcomes[0];
    assert.equal(o.slot, 7);
    if (expected === "retry_after") {
      assert.equal(o.kind, OutcomeKind.OUTCOME_KIND_RETRY_AFTER);
      assert.deepEqual(o.delay, { seconds: RETRY_DELAY_MS / 1000, nanos: 0 });
    } else if (expected === "dead_letter") {
      assert.equal(o.kind, OutcomeKind.OUTCOME_KIND_DEAD_LETTER);
    } else {
      assert.equal(o.kind, OutcomeKind.OUTCOME_KIND_DROP);
    }
    assert.equal(o.reason, `rejected: FORBIDDEN_COMMAND: ${FORBIDDEN}`);
    // The callback observes; by the refused ack the helper has already settled the delivery.
    assert.ok(seen.includes(`${RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT}:${expected}`), seen.join(" "));
    assert.equal(sub.stats.outcomes[expected], 1);
    // One RejectedError for the delivery, after the client settled it; the sidecar's advice is never repeated.
    assert.equal(errors.length, 1);
    const err = errors[0] as RejectedError;
    assert.ok(err instanceof RejectedError && err instanceof WindowError);
    assert.deepEqual([err.reason, err.slot, err.command, err.outcome], ["FORBIDDEN_COMMAND", 7, "FLUSHALL", expected]);
    assert.match(err.message, new RegExp(`the client settled it with ${expected}$`));
    assert.ok(!logged.some((m) => /settle it with/i.test(m)), logged.join("\n"));
  });
}

test("the client's retry delay doubles per delivery up to its cap", () => {
  const client = new WindowClient("127.0.0.1:1");
  const sub = client.subscribe({ stream: "s", group: "g" });
  assert.deepEqual([1, 2, 3, 4, 7, 8, 100].map((n) => sub.retryDelay(n)), [1000, 2000, 4000, 8000, 60000, 60000, 60000]);
  const small = client.subscribe({ stream: "s", group: "g", retryDelayMs: 10, maxRetryDelayMs: 25 });
  assert.deepEqual([1, 2, 3].map((n) => small.retryDelay(n)), [10, 20, 25]);
  assert.throws(() => openMessage({ stream: "s", group: "g", rejectedOutcome: "dead_letter" as RejectedOutcome }), RangeError);
  client.close();
});

function delivery(fields?: Record<string, string>): Delivery {
  // A Delivery as the subscription makes it, without a stream: enough for its own methods.
  const client = new WindowClient("127.0.0.1:1");
  const sub = client.subscribe({ stream: "s", group: "g" });
  client.close();
  const msg = {
    slot: 7, entryId: "1-0", payload: fields ? Buffer.alloc(0) : Buffer.from("{\"a\":1}"), headers: {}, deliveryCount: 1, channel: "", trace: undefined,
    fields: Object.entries(fields ?? {}).map(([name, value]) => ({ name: Buffer.from(name), value: Buffer.from(value) })),
  };
  const { Delivery: D } = require("../src/window-client") as typeof import("../src/window-client");
  return new D(sub, { alive: true } as never, 1, msg);
}

test("deadLetter needs a dead-letter target: without one it throws at the call and settles nothing", () => {
  const d = delivery();
  assert.throws(() => d.deadLetter("bad sku"), (e: Error) => e instanceof TypeError && /dead-letter target/.test(e.message));
  assert.equal(d.outcome, undefined);
  assert.equal(d.settled, false);
});

test("typed side effects: node-redis's commands, queued on the delivery; a wrong name fails at the call", () => {
  const d = delivery();
  d.redis.hIncrBy("totals", "apple", 2);
  d.redis.HINCRBY("totals", "pear", 1);
  d.redis.set("last", "apple", { expiration: { type: "EX", value: 60 } });
  d.redis.xAdd("audit", "*", { sku: "apple" });
  d.queue("HINCRBY", "totals", "fig", 1);
  assert.deepEqual(d.commands.map((c) => [c.name, ...c.args.map(String)]), [
    ["HINCRBY", "totals", "apple", "2"],
    ["HINCRBY", "totals", "pear", "1"],
    ["SET", "last", "apple", "EX", "60"],
    ["XADD", "audit", "*", "sku", "apple"],
    ["HINCRBY", "totals", "fig", "1"],
  ]);
  // @ts-expect-error: a misspelled command is a type error, and a TypeError at run time
  assert.throws(() => d.redis.hIncrByy("totals", "apple", 1), TypeError);
  // @ts-expect-error: a wrong argument type is a type error, and fails at the call where it can
  assert.throws(() => d.redis.hIncrBy("totals", "apple", undefined), TypeError);
  assert.equal(d.commands.length, 5);
});

test("an entry with plain fields: fields as Buffers and text, json() and text() say what to use", () => {
  const d = delivery({ sku: "apple", qty: "2" });
  assert.equal(d.inLayout, false);
  assert.deepEqual(d.fields, { sku: Buffer.from("apple"), qty: Buffer.from("2") });
  assert.deepEqual(d.textFields, { sku: "apple", qty: "2" });
  for (const call of [() => d.json(), () => d.text()]) {
    assert.throws(call, (e: Error) => e instanceof TypeError && /the fields sku, qty/.test(e.message) && /delivery\.fields/.test(e.message));
  }
  const p = delivery();
  assert.equal(p.inLayout, true);
  assert.deepEqual([p.json(), p.text(), p.fields], [{ a: 1 }, "{\"a\":1}", {}]);
});

/** A loopback address nothing listens on: a port the system gave out and was given back. */
async function closedTarget(): Promise<string> {
  const port = await new Promise<number>((resolve) => {
    const srv = createServer().listen(0, "127.0.0.1", () => {
      const p = (srv.address() as { port: number }).port;
      srv.close(() => resolve(p));
    });
  });
  return `127.0.0.1:${port}`;
}

test("publish to an address nothing listens on fails fast, naming the address and the cause", async () => {
  const target = await closedTarget();
  const client = new WindowClient(target, { connectTimeoutMs: 500 });
  const started = Date.now();
  await assert.rejects(client.publish("s", ["x"]), (e: Error) => {
    assert.ok(e instanceof ConnectionError && e instanceof WindowError);
    assert.equal(e.message, `cannot reach the sidecar at ${target}: connection refused; nothing listens there: start the sidecar, or set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its --listen (127.0.0.1:50051 by default)`);
    return true;
  });
  assert.ok(Date.now() - started < 3_000);
  client.close();
});

test("the sidecar's answer about Redis is a RedisUnavailableError, not a ConnectionError", () => {
  // The sidecar quotes Redis's own "Connection refused": still the sidecar's answer.
  const e = fromServiceError(
    { code: GrpcStatus.UNAVAILABLE, details: 'Redis did not answer in time (XADD: Request timed out.; last connection error: Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })' },
    "127.0.0.1:50051",
    "publish",
  );
  assert.ok(e instanceof RedisUnavailableError && !(e instanceof ConnectionError) && e instanceof WindowError);
  assert.match(e.message, /^the sidecar at 127\.0\.0\.1:50051 answered publish that Redis is unavailable: .*--redis-url/);
});

test("a refusal is a RefusedError with its reason, a deadline a CallTimeoutError", () => {
  const refused = fromServiceError({ code: GrpcStatus.UNAUTHENTICATED, details: "token, please" }, "127.0.0.1:50051", "publish");
  assert.ok(refused instanceof RefusedError);
  assert.equal((refused as RefusedError).reason, "UNAUTHENTICATED");
  assert.match(refused.message, /WINDOW_SIDECAR_TOKEN/);
  const late = fromServiceError({ code: GrpcStatus.DEADLINE_EXCEEDED, details: "Deadline exceeded" }, "127.0.0.1:50051", "publish", 30_000);
  assert.ok(late instanceof CallTimeoutError);
  assert.match(late.message, /did not answer publish within 30 s.*--redis-timeout/);
});

test("a probe's reply names what answers: Redis, an HTTP/1 server, TLS", () => {
  assert.match(whatAnswers(Buffer.from("+PONG\r\n")) ?? "", /^a Redis server answers there/);
  assert.match(whatAnswers(Buffer.from("-NOAUTH Authentication required.")) ?? "", /^a Redis server/);
  assert.match(whatAnswers(Buffer.from("HTTP/1.1 400 Bad Request\r\n")) ?? "", /^an HTTP\/1 server answers there/);
  assert.match(whatAnswers(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02])) ?? "", /^a TLS server/);
  assert.equal(whatAnswers(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02]), true), undefined);
  assert.equal(whatAnswers(Buffer.from([0x00, 0x00, 0x12, 0x04])), undefined); // an HTTP/2 server's SETTINGS
});

test("publish to a Redis port says so at once", async () => {
  const srv = createServer((sock) => {
    sock.once("data", () => sock.end("-ERR wrong number of arguments for 'ping' command\r\n"));
  });
  const port = await new Promise<number>((resolve) => srv.listen(0, "127.0.0.1", () => resolve((srv.address() as { port: number }).port)));
  const target = `127.0.0.1:${port}`;
  const client = new WindowClient(target, { tls: false });
  const started = Date.now();
  await assert.rejects(client.publish("s", ["x"]), (e: Error) => {
    assert.ok(e instanceof ConnectionError);
    assert.match(e.message, new RegExp(`^cannot reach the sidecar at ${target}: a Redis server answers there`));
    return true;
  });
  assert.ok(Date.now() - started < 3_000);
  client.close();
  srv.close();
});

test("a URL given as the address is refused at once, naming host:port", () => {
  for (const [url, want] of [
    ["http://127.0.0.1:50051", "give 127.0.0.1:50051"],
    ["https://sidecar:443/", "give sidecar:443 and WINDOW_SIDECAR_TLS_CA"],
    ["redis://127.0.0.1:6379", "a Redis URL"],
  ]) {
    assert.throws(() => new WindowClient(url, { tls: false }), (e: Error) => {
      assert.ok(e instanceof ConnectionError);
      assert.ok(e.message.includes("the address is a") && e.message.includes(want), e.message);
      assert.ok(!e.message.includes("does not resolve"));
      return true;
    });
  }
  new WindowClient("dns:///localhost:50051", { tls: false }).close();
});

test("a refused command of a dropped delivery leaves the drop as it is", async () => {
  let extra = false;
  const { target, server } = await fakeSidecar(async (call, batches) => {
    await batches.next();
    call.write(SubscribeResponse.fromPartial({
      rejections: { rejections: [{ slot: 7, reason: RejectionReason.REJECTION_REASON_FORBIDDEN_COMMAND, message: FORBIDDEN, command: "FLUSHALL" }] },
    }));
    call.write(SubscribeResponse.fromPartial({ flush: { readId: 1, settles: 1, ok: true } }));
    void batches.next().then(() => (extra = true));
  });
  const client = new WindowClient(target);
  const sub = client.subscribe({ stream: "s", group: "g", count: 1, logger: quiet, onFlush: () => sub.stop() });
  for await (const d of sub) d.queue("FLUSHALL").drop("bad");
  await sub.close();
  client.close();
  server.forceShutdown();
  assert.equal(extra, false);
  assert.deepEqual(sub.stats.outcomes, { drop: 1 });
});

for (const [outcome, settles, warned] of [["retry", 0, false], ["retry_after", 0, false], ["ack", 0, true]] as const) {
  test(`a stream's ${outcome} settled ${settles} times is ${warned ? "" : "not "}warned of: a retry kept in place settles nothing`, async () => {
    const { target, server } = await fakeSidecar(async (call, batches) => {
      await batches.next();
      call.write(SubscribeResponse.fromPartial({ flush: { readId: 1, settles, ok: true } }));
    });
    const logged: string[] = [];
    const client = new WindowClient(target);
    const sub = client.subscribe({
      stream: "s", group: "g", count: 1, logger: { ...quiet, warn: (m) => logged.push(m) }, onFlush: () => sub.stop(),
    });
    for await (const d of sub) {
      if (outcome === "retry") d.retry("later");
      else if (outcome === "retry_after") d.retryAfter(5000);
      else d.ack();
    }
    await sub.close();
    client.close();
    server.forceShutdown();
    const warnings = logged.filter((m) => m.includes("outcomes were sent"));
    assert.deepEqual(warnings, warned ? ["flush of read 1 settled 0 entries, but 1 outcomes were sent for it"] : []);
  });
}

for (const settled of [true, false]) {
  test(`a side effect Redis failed reaches onError as a SideEffectError after onFlush (settled ${settled})`, async () => {
    const { target, server } = await fakeSidecar(async (call, batches) => {
      await batches.next();
      call.write(SubscribeResponse.fromPartial({
        flush: {
          readId: 1, settles: settled ? 1 : 0, ok: false,
          sideEffectFailures: [{ slot: 7, entryId: "1-0", command: "HINCRBY", error: "ERR hash value is not an integer", settled }],
        },
      }));
    });
    const calls: Array<string | WindowError> = [];
    const client = new WindowClient(target);
    const sub = client.subscribe({
      stream: "s", group: "g", count: 1, logger: quiet,
      onFlush: () => { calls.push("flush"); sub.stop(); },
      onError: (e) => { calls.push(e); },
    });
    let delivery: Delivery | undefined;
    for await (const d of sub) {
      delivery = d;
      d.queue("HINCRBY", "h", "f", 1).ack();
    }
    await sub.close();
    client.close();
    server.forceShutdown();
    assert.equal(calls[0], "flush");
    assert.equal(calls.length, 2);
    const err = calls[1] as SideEffectError;
    assert.ok(err instanceof SideEffectError && err instanceof WindowError);
    assert.deepEqual([err.slot, err.entryId, err.command, err.settled, err.delivery], [7, "1-0", "HINCRBY", settled, delivery]);
    assert.equal(
      err.message,
      `side effect HINCRBY of entry 1-0 failed: ERR hash value is not an integer (${
        settled ? "settled all the same: Redis has no rollback" : "not settled: delivered again, and dead-lettered with this error at maxDeliveries"
      })`,
    );
  });
}

test("a retry Redis did not write reaches onError as a RequeueRefusedError", async () => {
  const { target, server } = await fakeSidecar(async (call, batches) => {
    await batches.next();
    call.write(SubscribeResponse.fromPartial({
      flush: { readId: 1, ok: false, settleFailed: true, requeueRefused: [{ slot: 7, entryId: "1-0", error: "OOM command not allowed" }] },
    }));
  });
  const errors: WindowError[] = [];
  const client = new WindowClient(target);
  const sub = client.subscribe({ stream: "s", group: "g", count: 1, logger: quiet, onFlush: () => sub.stop(), onError: (e) => { errors.push(e); } });
  for await (const d of sub) d.retry("later");
  await sub.close();
  client.close();
  server.forceShutdown();
  assert.equal(errors.length, 1);
  const err = errors[0] as RequeueRefusedError;
  assert.ok(err instanceof RequeueRefusedError && err instanceof WindowError);
  assert.deepEqual([err.slot, err.entryId, err.error, err.outcome], [7, "1-0", "OOM command not allowed", "retry"]);
  assert.equal(err.message, "retry of entry 1-0 not written: OOM command not allowed; it stays pending and is delivered again");
});

test("the bearer token comes from WINDOW_SIDECAR_TOKEN and goes out as authorization metadata", async () => {
  const { target, server } = await fakeSidecar(() => {});
  process.env.WINDOW_SIDECAR_TOKEN = "s3cret";
  const withToken = new WindowClient(target);
  delete process.env.WINDOW_SIDECAR_TOKEN;
  const without = new WindowClient(target);
  const explicit = new WindowClient(target, { token: "given" });
  try {
    assert.deepEqual(await withToken.publish("s", ["x"]), ["Bearer s3cret"]);
    assert.deepEqual(await without.publish("s", ["x"]), [""]);
    assert.deepEqual(await explicit.publish("s", ["x"]), ["Bearer given"]);
  } finally {
    for (const c of [withToken, without, explicit]) c.close();
    server.forceShutdown();
  }
});

test("openMessage: each kind of source, its dead letter and the window options", () => {
  const stream = openMessage({ stream: "s", group: "g", maxDeliveries: 3, deadLetter: "s:dead", atomic: true });
  assert.equal(stream.stream?.key, "s");
  assert.deepEqual(stream.deadLetter, { stream: "s:dead" });
  assert.equal(stream.mode, Mode.MODE_ATOMIC);
  assert.equal(stream.maxDeliveries, 3);
  const list = openMessage({ reliableList: "jobs", consumer: "c1", deadAfterMs: 1500, deadLetter: "jobs:dead", raw: true });
  assert.deepEqual(list.reliableList, { key: "jobs", consumer: "c1", deadAfter: { seconds: 1, nanos: 500_000_000 } });
  assert.deepEqual(list.deadLetter, { list: "jobs:dead" });
  assert.equal(list.framing, Framing.FRAMING_RAW);
  assert.deepEqual(openMessage({ simpleList: "q" }).simpleList, { key: "q" });
  const pubsub = openMessage({ channels: ["a"], patterns: ["b.*"] }).pubsub;
  assert.deepEqual(pubsub, { channels: ["a"], patterns: ["b.*"], shardedChannels: [], buffer: 0 });
});

test("openMessage: an ordering key by header or by field, never both", () => {
  assert.equal(openMessage({ stream: "s", group: "g" }).orderingKey, undefined);
  assert.deepEqual(openMessage({ stream: "s", group: "g", orderingHeader: "customer" }).orderingKey, { header: "customer" });
  assert.deepEqual(openMessage({ stream: "s", group: "g", orderingField: "customer_id" }).orderingKey, { field: "customer_id" });
  assert.deepEqual(openMessage({ reliableList: "jobs", orderingHeader: "customer" }).orderingKey, { header: "customer" });
  assert.throws(() => openMessage({ stream: "s", group: "g", orderingHeader: "a", orderingField: "b" }), TypeError);
});

test("openMessage: partitions open a partitioned stream, and only a stream", () => {
  assert.equal(openMessage({ stream: "s", group: "g" }).stream?.partitions, 0);
  const open = openMessage({ stream: "s", group: "g", consumer: "w1", orderingHeader: "k", partitions: 4 });
  assert.equal(open.stream?.partitions, 4);
  assert.deepEqual(open.orderingKey, { header: "k" });
  for (const source of [{ reliableList: "jobs" }, { simpleList: "q" }, { channels: ["a"] }]) {
    assert.throws(() => openMessage({ ...source, partitions: 4 }), (e: Error) =>
      e instanceof TypeError && /^partitions is for a stream: .* is not partitioned; drop partitions, or subscribe to the partitioned stream with stream and group$/.test(e.message));
  }
  for (const bad of [-1, 2.5, Number.NaN]) {
    assert.throws(() => openMessage({ stream: "s", group: "g", partitions: bad }), (e: Error) =>
      e instanceof RangeError && e.message === `partitions is a whole number of partitions (0: not partitioned), not ${bad}`);
  }
  // Refused at subscribe(), not once the subscription runs.
  const client = new WindowClient("127.0.0.1:1");
  assert.throws(() => client.subscribe({ reliableList: "jobs", partitions: 4 }), TypeError);
  client.close();
});

test("a subscription that cannot open gives up after maxAttempts and says why, to onError and the iteration", async () => {
  const target = await closedTarget();
  const client = new WindowClient(target);
  const errors: WindowError[] = [];
  const disconnects: number[] = [];
  const sub = client.subscribe({
    stream: "s", group: "g", maxAttempts: 3, backoff: { initialMs: 10, maxMs: 20 }, logger: quiet,
    onError: (e) => {
      errors.push(e);
    },
    onDisconnected: (info) => {
      assert.ok(info.error instanceof Error && info.retryInMs > 0);
      disconnects.push(info.attempts);
    },
  });
  await assert.rejects(
    (async () => {
      for await (const _ of sub) void _;
    })(),
    (e: Error) => {
      assert.ok(e instanceof SubscriptionEndedError);
      assert.equal(e.attempts, 3);
      assert.equal(e.message, `the subscription to stream s/g ended after 3 failed attempts: cannot reach the sidecar at ${target}: connection refused; nothing listens there: start the sidecar, or set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its --listen (127.0.0.1:50051 by default)`);
      return true;
    },
  );
  assert.equal(errors.length, 1);
  assert.equal(sub.stats.reconnects, 2);
  assert.deepEqual(disconnects, [1, 2]); // the third failure ends it: onError, not onDisconnected
  client.close();
});
