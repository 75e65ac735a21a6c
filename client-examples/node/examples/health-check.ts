// Asks the sidecar's grpc.health.v1.Health service for the status of a service (default
// window_sidecar.v1.WindowService), again until it is SERVING or --timeout-ms has passed, and
// prints it. Exits 0 when SERVING, 1 otherwise (also when the call fails). --sidecar takes any
// grpc-js target: host:port, or unix:/path/to.sock for the sidecar's Unix socket.
import { WindowClient } from "@window-sidecar/client";
import { parseArgs } from "./args";

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2), {
    sidecar: process.env.WINDOW_SIDECAR_ADDR ?? "127.0.0.1:50051",
    service: "window_sidecar.v1.WindowService",
    "timeout-ms": "10000",
  });
  const client = new WindowClient(args.sidecar);
  try {
    // The service is NOT_SERVING until the sidecar's first Redis ping: ask again for a while.
    const until = Date.now() + Number(args["timeout-ms"]);
    let status = await client.health(args.service);
    while (status !== "SERVING" && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 100));
      status = await client.health(args.service);
    }
    console.log(`health ${args.service}: ${status}`);
    return status === "SERVING" ? 0 : 1;
  } finally {
    client.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`health check failed: ${err?.message ?? err}`);
    process.exit(1);
  },
);
