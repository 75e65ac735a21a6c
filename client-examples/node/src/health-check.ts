// Asks the sidecar's grpc.health.v1.Health service for the status of a service (default
// window_sidecar.v1.WindowService), again until it is SERVING or --timeout-ms has passed, and
// prints it. Exits 0 when SERVING, 1 otherwise (also when the call fails). --sidecar takes any
// grpc-js target: host:port, or unix:/path/to.sock for the sidecar's Unix socket.
import { credentials, makeClientConstructor, type ServiceError } from "@grpc/grpc-js";
import { service as healthService } from "grpc-health-check";
import { parseArgs } from "./args";

const HealthClient = makeClientConstructor(healthService, "grpc.health.v1.Health");

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2), {
    sidecar: process.env.WINDOW_SIDECAR_ADDR ?? "127.0.0.1:50051",
    service: "window_sidecar.v1.WindowService",
    "timeout-ms": "10000",
  });
  const client = new HealthClient(args.sidecar, credentials.createInsecure());
  const check = (): Promise<string> =>
    new Promise((resolve, reject) =>
      client.Check({ service: args.service }, { deadline: Date.now() + 5_000 },
        (err: ServiceError | null, res: { status: string }) => (err ? reject(err) : resolve(res.status))),
    );
  try {
    // The service is NOT_SERVING until the sidecar's first Redis ping: ask again for a while.
    const until = Date.now() + Number(args["timeout-ms"]);
    let status = await check();
    while (status !== "SERVING" && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 100));
      status = await check();
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
