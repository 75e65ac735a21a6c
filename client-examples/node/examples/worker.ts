// The order service: consumes the `orders` stream in group `order-service` through the sidecar.
//
// Invalid order (no lines, or a line with qty <= 0) -> drop; "flaky" on its first delivery ->
// retryAfter 200 ms; otherwise LPUSH picks "<id>:<sku>:<qty>" and HINCRBY sku-totals <sku> <qty>
// per line, then ack. Exits once every order of the orders file is settled for good (its ack
// or drop flushed), or after --idle-exit seconds without a delivery.
//
// With --max-deliveries N --dead-letter KEY an order retried N times ends in the dead letter,
// which settles it for good too; --poison-command "NAME ARG…" queues that command for every
// order as well (a command the sidecar refuses shows the rejection rule: dropped at once by
// default, or with --rejected-outcome retry_after retried, then the dead letter). --atomic flushes each ack as one script. --reliable-list KEY reads the orders
// from that list (pushed with LPUSH) instead of the stream. --batches takes a read at a time
// (sub.batches()): drops and retries per order, the rest acked with one batch.ack().
//
// Environment: WINDOW_SIDECAR_ADDR, WINDOW_SIDECAR_TOKEN (read by the client), WINDOW_CONSUMER,
// WINDOW_ORDERS, WORKER_DELAY_MS (sleep per delivery).
import { readFileSync } from "node:fs";
import { Delivery, FlushEvent, Status, WindowClient, WindowError, type RejectedOutcome, type SourceOptions } from "@window-sidecar/client";
import { parseArgs } from "./args";
import { withOpenTelemetry } from "./otel";

interface Line {
  sku?: string;
  qty?: unknown;
}
interface Order {
  id?: string;
  lines?: Line[];
  flaky?: boolean;
}

const log = (msg: string) => console.error(`${new Date().toISOString()} worker INFO ${msg}`);

function invalidReason(order: Order): string | undefined {
  if (!Array.isArray(order.lines) || order.lines.length === 0) return "order has no lines";
  for (const line of order.lines) {
    if (typeof line.qty !== "number" || !Number.isInteger(line.qty) || line.qty <= 0) {
      return `line '${line.sku}' has qty ${JSON.stringify(line.qty)}`;
    }
    if (!line.sku) return "line without a sku";
  }
  return undefined;
}

function orderId(d: Delivery): string {
  try {
    return String(d.json<Order>().id ?? d.entryId);
  } catch {
    return d.entryId;
  }
}

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2), {
    sidecar: process.env.WINDOW_SIDECAR_ADDR ?? "127.0.0.1:50051",
    consumer: process.env.WINDOW_CONSUMER ?? "worker-1",
    orders: process.env.WINDOW_ORDERS ?? "orders.json",
    stream: "",
    group: "",
    count: "16",
    "max-in-flight": "0",
    "idle-exit": "0",
    atomic: "",
    "max-deliveries": "0",
    "dead-letter": "",
    "poison-command": "",
    "rejected-outcome": "auto",
    "reliable-list": "",
    batches: "",
  });
  const spec = JSON.parse(readFileSync(args.orders, "utf8"));
  const expected = new Set<string>(spec.orders.map((o: Order) => String(o.id)));
  const delayMs = Number(process.env.WORKER_DELAY_MS ?? "0");
  const idleExitMs = Number(args["idle-exit"]) * 1000;
  const acked = new Set<string>();
  const dropped = new Set<string>();
  const deadLettered = new Set<string>();
  const maxDeliveries = Number(args["max-deliveries"]);
  const poison = args["poison-command"].split(" ").filter((w) => w !== "");
  let retried = 0;
  let lastDelivery = Date.now();
  let idle = false;
  const settled = (id: string) => acked.has(id) || dropped.has(id) || deadLettered.has(id);
  const done = () => [...expected].every(settled);

  const client = new WindowClient(args.sidecar);
  // The orders file's stream through its group, or with --reliable-list a list read reliably.
  const source: SourceOptions = args["reliable-list"]
    ? { reliableList: args["reliable-list"], consumer: args.consumer }
    : { stream: args.stream || spec.stream || "orders", group: args.group || spec.group || "order-service", consumer: args.consumer };
  const sub = client.subscribe({
    ...source,
    count: Number(args.count),
    maxInFlight: Number(args["max-in-flight"]),
    atomic: args.atomic === "true",
    maxDeliveries,
    deadLetter: args["dead-letter"] || undefined,
    rejectedOutcome: args["rejected-outcome"] as RejectedOutcome,
    onFlush: (ev: FlushEvent) => {
      const r = ev.report;
      log(
        `flush of read ${r.readId}: ok=${r.ok} kept=${r.segmentsKept} dropped=${r.segmentsDropped} commands=${r.commands} ` +
          `settles=${r.settles} dead-lettered=${r.deadLettered}`,
      );
      if (!ev.ok) return; // what was not settled comes back
      for (const d of ev.settled) {
        if (d.outcome === "ack") acked.add(orderId(d));
        else if (d.outcome === "drop") dropped.add(orderId(d));
        // A retry at the cap: the sidecar moved the entry to the dead letter.
        else if (maxDeliveries > 0 && d.deliveryCount >= maxDeliveries && r.deadLettered > 0) deadLettered.add(orderId(d));
        else retried += 1;
      }
      if (done()) {
        log("every order is settled for good");
        sub.stop();
      }
    },
  });

  const watchdog = setInterval(() => {
    if (idleExitMs > 0 && Date.now() - lastDelivery > idleExitMs) {
      log(`no delivery for ${idleExitMs / 1000} s: stopping`);
      idle = true;
      sub.stop();
    }
  }, 200);

  // Ctrl-C (SIGINT) and SIGTERM stop the subscription as the idle exit does: nothing more is
  // handed out, what is settled is flushed, and the worker ends with its summary.
  let signalled = false;
  const onSignal = (sig: NodeJS.Signals) => {
    log(`${sig}: stopping; what is settled is flushed`);
    signalled = true;
    sub.stop();
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);

  let failed = false;
  try {
    // Settles `d`, except a plain ack when `ackLater` (its batch acks the rest in one call).
    const handle = async (d: Delivery, ackLater: boolean) => {
      lastDelivery = Date.now();
      if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
      let order: Order;
      try {
        order = d.json<Order>();
      } catch {
        d.drop("payload is not JSON");
        return;
      }
      const id = String(order.id ?? d.entryId);
      const reason = invalidReason(order);
      if (reason !== undefined) {
        log(`drop ${id} (${d.entryId}): ${reason}`);
        d.drop(reason);
      } else if (order.flaky && d.deliveryCount === 1) {
        log(`retry ${id} (${d.entryId}) in 200 ms: flaky on its first delivery`);
        d.retryAfter(200, "flaky: fails on its first delivery");
      } else {
        if (poison.length > 0) d.queue(poison[0], ...poison.slice(1));
        for (const line of order.lines!) {
          d.redis.lPush("picks", `${id}:${line.sku}:${line.qty}`);
          d.redis.hIncrBy("sku-totals", line.sku!, line.qty as number);
        }
        log(`ack ${id} (${d.entryId}, delivery ${d.deliveryCount})`);
        if (!ackLater) d.ack();
      }
    };
    if (args.batches === "true") {
      for await (const batch of sub.batches()) {
        for (const d of batch) await handle(d, true);
        batch.ack();
      }
    } else {
      for await (const d of sub) await handle(d, false);
    }
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    clearInterval(watchdog);
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    // After an error, don't wait for the delivery that was being handled: it comes back.
    await sub.close({ drain: !failed });
    client.close();
  }
  const s = sub.stats;
  console.log(
    `${args.consumer}: acked ${acked.size}, dropped ${dropped.size}, retried ${retried}` +
      (maxDeliveries > 0 ? `, dead-lettered ${deadLettered.size} ` : " ") +
      `(deliveries ${s.deliveries}, reads ${s.reads}, batches ${s.batches}, flushes ${s.flushes}, reconnects ${s.reconnects})`,
  );
  if (done() || signalled) return 0;
  const missing = [...expected].filter((id) => !settled(id));
  console.log(`not settled${idle ? " (idle exit)" : ""}: ${missing.join(", ")}`);
  return 3;
}

withOpenTelemetry(main).then(
  (code) => process.exit(code),
  (err) => {
    if (err instanceof WindowError) {
      console.error(`subscription failed: ${err.status !== undefined ? Status[err.status] : err.name}: ${err.message}`);
    } else {
      console.error(`worker failed: ${err?.stack ?? err}`);
    }
    process.exit(1);
  },
);
