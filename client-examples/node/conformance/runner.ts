// The Node client's conformance runner: plays the worker side of one scenario of
// client-examples/conformance/scenarios with the installed @window-sidecar/client package, and
// prints what it sees as JSON lines (see client-examples/conformance/README.md).
//
//   node dist/runner.js SCENARIO.json
//
// The address, the token and TLS come from the environment (WINDOW_SIDECAR_ADDR,
// WINDOW_SIDECAR_TOKEN, WINDOW_SIDECAR_TLS_*), read by the client itself; reconnecting,
// resubscribing, draining and the rules for a refused command and a failed handler are the
// client's too. The runner only maps the scenario onto the client's API.
import { readFileSync } from "node:fs";
import {
  RejectedError,
  RequeueRefusedError,
  SideEffectError,
  WindowClient,
  WindowError,
  type Delivery,
  type PublishOptions,
  type PublishTarget,
  type RejectedOutcome,
  type SubscribeOptions,
} from "@window-sidecar/client";

interface Scenario {
  open: {
    form: "stream" | "reliable_list" | "simple_list" | "pubsub";
    key: string;
    group?: string;
    consumer?: string;
    /** Replicas of one group: one subscription per name, each on a client of its own (instead of `consumer`). */
    consumers?: string[];
    count?: number;
    mode?: "pipeline" | "atomic";
    max_deliveries?: number;
    dead_letter?: string;
    reports_in_reads?: boolean;
    packed_acks?: boolean;
    rejected_outcome?: RejectedOutcome;
    max_attempts?: number;
    max_in_flight?: number;
    ordering_header?: string;
    ordering_field?: string;
    /** A partitioned stream: the client's `partitions`. */
    partitions?: number;
  };
  sidecar?: { listen?: string };
  side_effect?: "queue" | "typed";
  publish: Array<{ payload: string; headers?: Record<string, string> }>;
  /** The publish call's deadline (the client's `timeoutMs`); absent: the client's default. */
  publish_timeout_ms?: number;
  /** Publish to a partitioned stream: how many partitions, and the header or field each entry's key is in. */
  publish_partitions?: { partitions: number; header?: string; field?: string };
  handle: Record<string, string[]>;
  effects: string;
  /** The calls that must fail, and how (read here only for which calls to make). */
  expect?: { errors?: Array<{ call: string }> };
}

function emit(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** The scenario's `open` as the client's subscribe options, and where its entries are published. */
function subscription(
  open: Scenario["open"],
  consumer: string | undefined = open.consumer,
): { source: SubscribeOptions; target: PublishTarget } {
  switch (open.form) {
    case "stream":
      return { source: { stream: open.key, group: open.group ?? "", consumer }, target: { stream: open.key } };
    case "reliable_list":
      return { source: { reliableList: open.key, consumer }, target: { list: open.key } };
    case "simple_list":
      return { source: { simpleList: open.key }, target: { list: open.key } };
    case "pubsub":
      return { source: { channels: [open.key] }, target: { channel: open.key } };
    default:
      throw new Error(`unknown form ${String((open as { form: unknown }).form)}`);
  }
}

/** The runner's publish options: the scenario's deadline and, for a partitioned stream, its partitions and key. */
function publishOptions(scenario: Scenario): PublishOptions {
  const parts = scenario.publish_partitions;
  return {
    timeoutMs: scenario.publish_timeout_ms,
    ...(parts && { partitions: parts.partitions, partitionHeader: parts.header, partitionField: parts.field }),
  };
}

/** A delivery's name in the scenario: its payload, or for an entry without the payload layout the text of its `id` field. */
function nameOf(d: Delivery): string {
  return d.inLayout ? d.payload.toString("utf8") : (d.textFields.id ?? "");
}

function onError(err: WindowError): void {
  if (err instanceof RejectedError) {
    emit("rejected", { payload: err.delivery ? nameOf(err.delivery) : "", reason: err.reason, error: err.name, message: err.message });
  } else if (err instanceof SideEffectError) {
    emit("side_effect_error", {
      payload: err.delivery ? nameOf(err.delivery) : "", command: err.command, settled: err.settled,
      error: err.name, message: err.message,
    });
  } else if (err instanceof RequeueRefusedError) {
    emit("requeue_refused", { payload: err.delivery ? nameOf(err.delivery) : "", error: err.name, message: err.message });
  }
}

/**
 * A scenario of failing calls (`expect.errors`): make the client, publish once, then subscribe
 * until the client gives up; print each call's error (only the calls the scenario expects an
 * error of).
 */
async function withoutSidecar(scenario: Scenario): Promise<void> {
  const { source, target } = subscription(scenario.open);
  const calls = new Set((scenario.expect?.errors ?? []).map((e) => e.call));
  let started = Date.now();
  let client: WindowClient;
  try {
    client = new WindowClient();
  } catch (e) {
    if (!(e instanceof WindowError)) throw e;
    emit("error", { call: "connect", error: e.name, message: e.message, elapsed_ms: Date.now() - started });
    return;
  }
  if (calls.has("publish")) {
    started = Date.now();
    try {
      await client.publish(target, scenario.publish.map((e) => ({ payload: e.payload })), publishOptions(scenario));
      emit("published", { count: scenario.publish.length });
    } catch (e) {
      if (!(e instanceof WindowError)) throw e;
      emit("error", { call: "publish", error: e.name, message: e.message, elapsed_ms: Date.now() - started });
    }
  }
  if (calls.has("subscribe")) {
    started = Date.now();
    const sub = client.subscribe({ ...source, maxAttempts: scenario.open.max_attempts, closeTimeoutMs: 5_000 });
    try {
      await sub.run(() => undefined);
    } catch (e) {
      if (!(e instanceof WindowError)) throw e;
      emit("error", { call: "subscribe", error: e.name, message: e.message, elapsed_ms: Date.now() - started });
    }
    await sub.close();
  }
  client.close();
}

function actionFor(handle: Record<string, string[]>, payload: string, n: number): string {
  const actions = handle[payload] ?? handle["*"] ?? ["ack"];
  return actions[Math.min(n, actions.length) - 1];
}

async function main(path: string): Promise<void> {
  const scenario = JSON.parse(readFileSync(path, "utf8")) as Scenario;
  if ((scenario.expect?.errors ?? []).length > 0) return withoutSidecar(scenario);
  const open = scenario.open;
  const typed = scenario.side_effect === "typed";
  const seen = new Map<string, number>();
  const { target } = subscription(open);

  // `open.consumers`: replicas of one group, each a subscription on a client (a connection) of
  // its own as separate processes would have, all handled here, their lines naming the
  // consumer; else the one `open.consumer`.
  const several = (open.consumers ?? []).length > 0;
  const replicas: Array<string | undefined> = several ? open.consumers! : [open.consumer];
  const subscribed = replicas.map((consumer) => {
    const { source } = subscription(open, consumer);
    let opened!: () => void;
    const firstOpen = new Promise<void>((r) => (opened = r));
    const client = new WindowClient();
    const sub = client.subscribe({
      ...source,
      count: open.count ?? 16,
      maxInFlight: open.max_in_flight,
      orderingHeader: open.ordering_header,
      orderingField: open.ordering_field,
      partitions: open.partitions,
      atomic: open.mode === "atomic",
      maxDeliveries: open.max_deliveries,
      deadLetter: open.dead_letter,
      reportsInReads: open.reports_in_reads,
      packedAcks: open.packed_acks,
      rejectedOutcome: open.rejected_outcome,
      maxAttempts: open.max_attempts,
      onError,
      closeTimeoutMs: 5_000,
      onOpened: (_opened, info) => {
        if (info.resubscribed) emit("resubscribed");
        else opened();
      },
      onDraining: () => emit("draining"),
    });
    // The name its lines carry: only with `open.consumers`.
    return { client, sub, firstOpen, named: several ? consumer : undefined };
  });
  process.on("SIGTERM", () => subscribed.forEach(({ sub }) => sub.stop()));

  // `hold_until:P`: resolved once the delivery named P is acked.
  const acked = new Map<string, { promise: Promise<void>; resolve: () => void }>();
  const ackedOf = (name: string) => {
    let a = acked.get(name);
    if (!a) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      a = { promise, resolve };
      acked.set(name, a);
    }
    return a;
  };
  // The line before an outcome the runner gives (run.sh checks the order with it).
  const settle = (d: Delivery, payload: string, consumer?: string) =>
    emit("settle", { payload, count: d.deliveryCount, ...(consumer !== undefined && { consumer }) });
  const holds = Object.values(scenario.handle).some((actions) => actions.some((a) => a.startsWith("hold_until:")));

  // `consumer`: the replica's name with `open.consumers`, else undefined (and not printed).
  const handle = async (d: Delivery, consumer?: string): Promise<void> => {
    const payload = nameOf(d);
    const n = (seen.get(payload) ?? 0) + 1;
    seen.set(payload, n);
    const extra: Record<string, unknown> = {};
    if (!d.inLayout) {
      extra.fields = d.textFields;
      try {
        d.json();
        extra.json_error = null;
      } catch (e) {
        extra.json_error = e instanceof Error ? e.message : String(e);
      }
    }
    emit("delivery", {
      payload, count: d.deliveryCount, headers: d.headers, ...extra, ...(consumer !== undefined && { consumer }),
      ...(d.partition !== undefined && { partition: d.partition }),
    });
    const action = actionFor(scenario.handle, payload, n);
    if (typed) d.redis.hIncrBy(scenario.effects, payload, 1);
    else d.queue("HINCRBY", scenario.effects, payload, 1);
    if (action === "ack") {
      settle(d, payload, consumer);
      d.ack();
      ackedOf(payload).resolve();
    } else if (action === "drop") {
      settle(d, payload, consumer);
      d.drop();
    } else if (action === "retry") {
      settle(d, payload, consumer);
      d.retry();
    } else if (action === "dead_letter") {
      settle(d, payload, consumer);
      d.deadLetter("conformance: dead_letter");
    } else if (action.startsWith("retry_after:")) {
      settle(d, payload, consumer);
      d.retryAfter(Number(action.split(":")[1]));
    } else if (action.startsWith("hold_until:")) {
      // Unsettled until that delivery is acked; run's other handlers go on meanwhile.
      await ackedOf(action.slice("hold_until:".length)).promise;
      settle(d, payload, consumer);
      d.ack();
      ackedOf(payload).resolve();
    }
    else if (action === "reject" || action.startsWith("reject:")) {
      // A command the sidecar refuses (FLUSHALL, or the one named): the client's rule applies.
      const [name, ...args] = action.startsWith("reject:") ? action.slice("reject:".length).split(" ") : ["FLUSHALL"];
      d.queue(name, ...args).ack();
    }
    else if (action.startsWith("queue:")) {
      // A command the sidecar accepts and Redis may fail when it runs, then an ack.
      const [name, ...args] = action.slice("queue:".length).split(" ");
      d.queue(name, ...args);
      settle(d, payload, consumer);
      d.ack();
      ackedOf(payload).resolve();
    }
    else if (action === "fail") throw new Error("the scenario's handler fails");
    else if (action === "typo") {
      // A name known only at run time, looked up as JavaScript does: a literal typo would not compile.
      const commands = d.redis as unknown as Record<string, (...args: unknown[]) => void>;
      try {
        commands["hIncrByy"](scenario.effects, payload, 1);
      } catch (e) {
        emit("call_error", { payload, message: e instanceof Error ? e.message : String(e) });
      }
      d.ack();
    }
    else if (action.startsWith("slow_ack:")) {
      await sleep(Number(action.split(":")[1]));
      // Its settle line too, right before the ack, so that a slow key's order is checked like any other's.
      settle(d, payload, consumer);
      d.ack();
    } else throw new Error(`unknown action ${action}`);
  };

  // With `hold_until`, a held delivery must not stop the others: several handlers at a time.
  const workers = subscribed.map(({ sub, named }) =>
    sub.run((d) => handle(d, named), { concurrency: holds ? 8 : 1 }),
  );
  // Until every subscription's first Opened, or one failing first.
  await Promise.race([Promise.all(subscribed.map(({ firstOpen }) => firstOpen)), ...workers]);
  if (subscribed.every(({ sub }) => sub.stats.opens > 0)) {
    emit("opened");
    const entries = scenario.publish.map((e) => ({ payload: e.payload, headers: e.headers ?? {} }));
    await subscribed[0].client.publish(target, entries, publishOptions(scenario));
    emit("published", { count: entries.length });
  }
  await Promise.all(workers);
  for (const { sub } of subscribed) await sub.close();
  for (const { client } of subscribed) client.close();
}

main(process.argv[2]).then(
  () => process.exit(0),
  (e: unknown) => {
    process.stderr.write(`runner failed: ${e instanceof Error ? e.stack : String(e)}\n`);
    process.exit(1);
  },
);
