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
import { openMessage, REJECTED_RETRY_MS, WindowClient, type Logger } from "../src/window-client";

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
  const ack = { slot: 7, reason: RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT, message: "slot 7 has a refused command", command: "" };
  return SubscribeResponse.fromPartial({ rejections: { rejections: commandFirst ? [command, ack] : [ack, command] } });
}

for (const commandFirst of [true, false]) {
  test(`a refused command settles its delivery with retry_after 1 s (command ${commandFirst ? "before" : "after"} the refused ack)`, async () => {
    let second: Batch | undefined;
    const seen: string[] = [];
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
      stream: "s", group: "g", count: 1, logger: quiet,
      onRejection: (rej, d) => {
        seen.push(`${rej.reason}:${d?.outcome}`);
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
    assert.equal(o.kind, OutcomeKind.OUTCOME_KIND_RETRY_AFTER);
    assert.deepEqual(o.delay, { seconds: REJECTED_RETRY_MS / 1000, nanos: 0 });
    assert.equal(o.reason, `rejected: ${FORBIDDEN}`);
    // The callback observes; by the refused ack the helper has already settled the delivery.
    assert.ok(seen.includes(`${RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT}:retry_after`), seen.join(" "));
    assert.equal(sub.stats.outcomes.retry_after, 1);
  });
}

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
