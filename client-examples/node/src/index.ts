// @window-sidecar/client: the Node/TypeScript client of window-sidecar.
//
// WindowClient (publish, subscribe, health), its Subscription of Deliveries, the errors, and the generated
// protocol types, so a user needs no code of their own from the .proto file.
export {
  WindowClient,
  Subscription,
  Delivery,
  DeliveryBatch,
  FlushEvent,
  consoleLogger,
  openMessage,
  DEFAULT_TARGET,
  CONNECT_TIMEOUT_MS,
  MAX_ATTEMPTS,
  MAX_RETRY_DELAY_MS,
  REJECTED_RETRY_MS,
  RETRY_DELAY_MS,
  RETRYABLE,
  UNFIXABLE,
  tlsFromEnv,
  type RejectedOutcome,
  type Arg,
  type ClientOptions,
  type DisconnectedInfo,
  type OpenedInfo,
  type PublishOptions,
  type PublishResult,
  type PublishTarget,
  type TlsOptions,
  type Logger,
  type OutcomeName,
  type PublishInput,
  type Stats,
  type SubscribeOptions,
  type SourceOptions,
  type StreamSourceOptions,
  type ReliableListSourceOptions,
  type SimpleListSourceOptions,
  type PubSubSourceOptions,
  type WindowOptions,
} from "./window-client";
export {
  WindowError,
  ConnectionError,
  RedisUnavailableError,
  RefusedError,
  CallTimeoutError,
  RejectedError,
  SideEffectError,
  RequeueRefusedError,
  SubscriptionEndedError,
  AlreadySettledError,
  SettledError,
} from "./errors";
export type { RedisCommands } from "./commands";
export type { Draining, FlushReport, Opened, Rejection, TraceContext } from "./gen/window_sidecar/v1/window";
export { RejectionReason, rejectionReasonToJSON } from "./gen/window_sidecar/v1/window";
/** The generated messages and the raw @grpc/grpc-js stub (WindowServiceClient), for what the helper does not cover. */
export * as proto from "./gen/window_sidecar/v1/window";
/** gRPC status codes (a ServiceError's `code`), re-exported so users need not depend on @grpc/grpc-js themselves. */
export { status as Status } from "@grpc/grpc-js";
