// OpenTelemetry for the example programs, set up the standard way. The client package uses only
// @opentelemetry/api, as a library should; the application sets up the SDK. When the
// application has @opentelemetry/sdk-node installed, its NodeSDK starts here and configures
// itself from the standard OTEL_* variables: OTEL_TRACES_EXPORTER (otlp, console, none, or a
// comma-separated list; console prints each span on stdout), OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG], OTEL_SDK_DISABLED and
// OTEL_EXPORTER_OTLP_*. Without the package nothing is recorded and nothing changes.

/** What the examples use of NodeSDK, typed here so that they compile without the package. */
interface NodeSdk {
  start(): void;
  shutdown(): Promise<void>;
}
interface SdkNodeModule {
  NodeSDK: new (config?: Record<string, unknown>) => NodeSdk;
}

/** The OTEL_TRACES_EXPORTER values NodeSDK knows. */
const EXPORTERS = new Set(["otlp", "console", "none", "zipkin", "jaeger"]);

/** Starts NodeSDK from the environment, or returns undefined without @opentelemetry/sdk-node. */
export function startOpenTelemetry(): NodeSdk | undefined {
  let sdkNode: SdkNodeModule;
  try {
    sdkNode = require("@opentelemetry/sdk-node") as SdkNodeModule;
  } catch {
    return undefined;
  }
  // NodeSDK skips an exporter it does not know, and says so only through OpenTelemetry's own
  // diagnostic logger, which nothing has set up yet: say it here, naming the variable.
  const unknown = (process.env.OTEL_TRACES_EXPORTER ?? "")
    .split(",")
    .map((e) => e.trim().toLowerCase())
    .filter((e) => e !== "" && !EXPORTERS.has(e));
  if (unknown.length > 0) {
    console.error(
      `OTEL_TRACES_EXPORTER=${JSON.stringify(process.env.OTEL_TRACES_EXPORTER)}: ` +
        `${unknown.join(", ")} is not an exporter of @opentelemetry/sdk-node (otlp, console, none); ignored`,
    );
  }
  const sdk = new sdkNode.NodeSDK();
  sdk.start();
  return sdk;
}

/** Runs `main` with NodeSDK started (when installed), then shuts it down: that sends or prints
 * the spans still batched before the program exits. */
export async function withOpenTelemetry<T>(main: () => Promise<T>): Promise<T> {
  const sdk = startOpenTelemetry();
  try {
    return await main();
  } finally {
    await sdk?.shutdown().catch((err: unknown) => console.error(`OpenTelemetry shutdown: ${err}`));
  }
}
