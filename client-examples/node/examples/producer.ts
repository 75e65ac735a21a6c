// Publishes the known order set (../orders.json) to the `orders` stream through the sidecar's
// Publish RPC: one PublishEntry per order (payload = the order's JSON), all in one call.
import { readFileSync } from "node:fs";
import { WindowClient } from "@window-sidecar/client";
import { parseArgs } from "./args";
import { withOpenTelemetry } from "./otel";

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2), {
    sidecar: process.env.WINDOW_SIDECAR_ADDR ?? "127.0.0.1:50051",
    orders: process.env.WINDOW_ORDERS ?? "orders.json",
    stream: "",
  });
  const spec = JSON.parse(readFileSync(args.orders, "utf8"));
  const stream: string = args.stream || spec.stream || "orders";
  const client = new WindowClient(args.sidecar);
  try {
    const ids = await client.publish(
      stream,
      spec.orders.map((order: unknown) => JSON.stringify(order)),
    );
    console.log(`published ${ids.length} orders to '${stream}' (${ids[0]} .. ${ids[ids.length - 1]})`);
    return 0;
  } finally {
    client.close();
  }
}

withOpenTelemetry(main).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`producer failed: ${err?.stack ?? err}`);
    process.exit(1);
  },
);
