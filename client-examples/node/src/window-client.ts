// The client over the generated @grpc/grpc-js stub of window-sidecar.
//
//   const client = new WindowClient("127.0.0.1:50051");
//   const sub = client.subscribe({ stream: "orders", group: "order-service", consumer: "worker-1", count: 16 });
//   for await (const delivery of sub) {
//     delivery.redis.incr("orders:seen");
//     delivery.ack();
//   }
//
// See README.md for the API and the guarantees.

import { readFileSync } from "node:fs";
import {
  connectivityState,
  credentials,
  makeClientConstructor,
  Metadata,
  status as Status,
  type ChannelCredentials,
  type ChannelOptions,
  type ServiceError,
  type ClientDuplexStream,
} from "@grpc/grpc-js";
import { service as healthService } from "grpc-health-check";
import {
  WindowServiceClient,
  OutcomeKind,
  Framing,
  Mode,
  RejectionReason,
  rejectionReasonToJSON,
  modeToJSON,
  type Delivery as DeliveryMsg,
  type Draining,
  type FlushReport,
  type Open,
  type Opened,
  type OrderingKey,
  type Outcome,
  type PublishEntry,
  type QueuedCommand,
  type Read,
  type Rejection,
  type SubscribeRequest,
  type SubscribeResponse,
  type TraceContext,
} from "./gen/window_sidecar/v1/window";
import type { Duration } from "./gen/google/protobuf/duration";
import { activeTrace, DeliverySpan } from "./tracing";
import { redisCommands, type RedisCommands } from "./commands";
import {
  AlreadySettledError,
  ConnectionError,
  RejectedError,
  RequeueRefusedError,
  SideEffectError,
  SubscriptionEndedError,
  WindowError,
  addressProblem,
  explain,
  notTheSidecar,
  probe,
  transportFailure,
  unreachableCause,
} from "./errors";

export const DEFAULT_TARGET = "127.0.0.1:50051";

/**
 * The first delay of the client's own retryAfter (a refused command or outcome settled with
 * retry_after, a `run` handler that threw): it doubles with each delivery of the entry, up to
 * MAX_RETRY_DELAY_MS (the options `retryDelayMs` and `maxRetryDelayMs`). The same in every
 * language's client.
 */
export const RETRY_DELAY_MS = 1_000;
export const MAX_RETRY_DELAY_MS = 60_000;
/** @deprecated The name of RETRY_DELAY_MS before the clients shared one vocabulary. */
export const REJECTED_RETRY_MS = RETRY_DELAY_MS;
/** Consecutive failed opens after which a subscription ends with SubscriptionEndedError (`maxAttempts`; 0: never). */
export const MAX_ATTEMPTS = 10;
/**
 * How long a call waits for a connection to the sidecar that is neither made nor refused (an
 * address that drops packets) before it fails with ConnectionError (`connectTimeoutMs`). A
 * refused connection fails the call at once.
 */
export const CONNECT_TIMEOUT_MS = 5_000;
// The causes after which a call fails at once: nothing listens there.
const REFUSED: ReadonlySet<string> = new Set(["connection refused", "no such socket"]);
/**
 * What the client does with a delivery one of whose commands the sidecar refused
 * (`rejectedOutcome`): "auto" settles it at once for a reason no retry fixes (UNFIXABLE), with
 * deadLetter when the subscription has a dead-letter target and drop when it has none, and with
 * retry_after otherwise; "drop" always drops it; "retry_after" always retries it after the
 * growing delay (so that with `maxDeliveries` it reaches the dead letter at the cap).
 */
export type RejectedOutcome = "auto" | "drop" | "retry_after";
/** The rejection reasons no retry can fix: the same command is refused again every time. */
export const UNFIXABLE: ReadonlySet<string> = new Set(["INVALID_COMMAND", "FORBIDDEN_COMMAND", "PERMISSION_DENIED"]);

/** A rejection reason's name without its prefix ("FORBIDDEN_COMMAND"). */
function reasonName(reason: RejectionReason): string {
  return rejectionReasonToJSON(reason).replace(/^REJECTION_REASON_/, "");
}

// The sidecar's advice in an INCOMPLETE_SEGMENT message: the client has already settled the
// delivery, so it never passes the advice on.
const ADVICE = /[;,.]?\s*settle it with [^;]*$/i;
const withoutAdvice = (message: string) => message.replace(ADVICE, "").trim();

/** Stream errors after which a subscription reconnects and resubscribes. */
export const RETRYABLE: ReadonlySet<number> = new Set([Status.UNAVAILABLE, Status.ALREADY_EXISTS, Status.ABORTED]);

// Outcome rejections after which the slot is still open on the sidecar.
const RESETTLE: ReadonlySet<number> = new Set([
  RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT,
  RejectionReason.REJECTION_REASON_INVALID_OUTCOME,
]);

export type Arg = string | number | bigint | Buffer | Uint8Array;

const NO_BYTES = Buffer.alloc(0);
export type OutcomeName = "ack" | "drop" | "retry" | "retry_after" | "dead_letter";

export interface Logger {
  debug(msg: string): void;
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

/** Logs to stderr; `WINDOW_CLIENT_DEBUG=1` adds debug lines. */
export const consoleLogger: Logger = {
  debug: (m) => {
    if (process.env.WINDOW_CLIENT_DEBUG) console.error(`${new Date().toISOString()} window-client DEBUG ${m}`);
  },
  info: (m) => console.error(`${new Date().toISOString()} window-client INFO ${m}`),
  warn: (m) => console.error(`${new Date().toISOString()} window-client WARN ${m}`),
  error: (m) => console.error(`${new Date().toISOString()} window-client ERROR ${m}`),
};

function duration(ms: number): Duration {
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

function arg(value: Arg): Buffer {
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value);
  if (typeof value === "string") return Buffer.from(value, "utf8");
  if (typeof value === "number" || typeof value === "bigint") return Buffer.from(String(value), "utf8");
  throw new TypeError(`unsupported Redis argument ${typeof value}`);
}

/**
 * One stream entry handed to the application. Queue side effects (`redis`: node-redis's
 * commands, recorded; `queue(name, ...args)`), then settle it once.
 */
export class Delivery {
  readonly slot: number;
  readonly entryId: string;
  readonly payload: Buffer;
  readonly headers: Record<string, string>;
  /** The entry's fields as they are, in order (entries not in the payload layout). */
  readonly rawFields: Array<{ name: Buffer; value: Buffer }>;
  readonly deliveryCount: number;
  /** The producer's W3C trace context, when the entry carries one. */
  readonly trace: TraceContext | undefined;
  /** Pub/sub: the channel the message arrived on (empty otherwise). */
  readonly channel: string;
  readonly readId: number;
  /**
   * On a partitioned stream (`partitions`): the partition the entry was read from (its stream is
   * `<stream>:{partition}`). Entry ids repeat across partitions, so `partition` with `entryId`
   * names an entry where `entryId` alone does not. Undefined on an unpartitioned stream, a list
   * or pub/sub.
   */
  readonly partition: number | undefined;
  /** Set once settled; undefined while open or when abandoned. */
  outcome: OutcomeName | undefined;
  /** The sidecar's rejection of this delivery's outcome, while the helper settles it again. */
  rejection: Rejection | undefined;
  /** The first of this delivery's commands the sidecar refused, if any: why it was not acked. */
  commandRejection: Rejection | undefined;
  /** @internal The error handed to onError for that rejection. */
  rejectedError: RejectedError | undefined;
  /** @internal */ commands: QueuedCommand[] = [];
  /** @internal */ sent = false;
  /**
   * @internal Done for its read: a flush report of its read came after its outcome was sent, or
   * the sidecar answered that outcome ALREADY_SETTLED (its slot is no longer outstanding there:
   * no report ever names it).
   */
  reported = false;
  /** @internal */ handed = false;
  /** @internal The OpenTelemetry span of its handling (with @opentelemetry/api installed). */
  span: DeliverySpan | undefined;

  /** @internal */
  constructor(
    private readonly sub: Subscription,
    /** @internal */ readonly stream: StreamState,
    readId: number,
    msg: DeliveryMsg,
    partition?: number,
  ) {
    this.slot = msg.slot;
    this.entryId = msg.entryId;
    this.payload = msg.payload;
    this.headers = msg.headers;
    this.rawFields = msg.fields;
    this.deliveryCount = msg.deliveryCount;
    this.trace = msg.trace;
    this.channel = msg.channel;
    this.readId = readId;
    this.partition = partition;
  }

  /**
   * True when the entry is in the payload layout (written by a window-sidecar client: a
   * `_payload` field and `h:<name>` headers); false for an entry another producer wrote with
   * plain fields (`XADD k * sku apple qty 2`), which has `fields` and no payload.
   */
  get inLayout(): boolean {
    return this.rawFields.length === 0;
  }

  /**
   * The entry's fields, name to value, when it is not in the payload layout; empty otherwise
   * (read `payload` and `headers`). A repeated name keeps its last value (all are in `rawFields`).
   */
  get fields(): Record<string, Buffer> {
    const out: Record<string, Buffer> = {};
    for (const f of this.rawFields) out[f.name.toString("utf8")] = f.value;
    return out;
  }

  /** `fields` with each value decoded as UTF-8. */
  get textFields(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const f of this.rawFields) out[f.name.toString("utf8")] = f.value.toString("utf8");
    return out;
  }

  private needPayload(what: string): void {
    if (this.rawFields.length === 0) return;
    const names = this.rawFields.slice(0, 8).map((f) => f.name.toString("utf8")).join(", ");
    throw new TypeError(
      `${what}: entry ${this.entryId} has no payload: it is not in the payload layout (a _payload field) ` +
        `but has the fields ${names}; read them with delivery.fields (Buffers) or delivery.textFields (strings)`,
    );
  }

  /** The payload decoded as UTF-8; throws a TypeError naming the fields for an entry with plain fields. */
  text(): string {
    this.needPayload("text()");
    return this.payload.toString("utf8");
  }

  /** The payload parsed as JSON; throws a TypeError naming the fields for an entry with plain fields. */
  json<T = unknown>(): T {
    this.needPayload("json()");
    return JSON.parse(this.payload.toString("utf8")) as T;
  }

  /**
   * node-redis's commands (@redis/client), each queued as a side effect of this delivery
   * instead of being sent: `d.redis.hIncrBy("totals", sku, 2)`, `d.redis.set(k, v, { EX: 60 })`.
   */
  get redis(): RedisCommands {
    return redisCommands((name, ...args) => this.queue(name, ...args));
  }

  get settled(): boolean {
    return this.outcome !== undefined;
  }

  /** False once its stream is gone: settling then does nothing, the entry comes back. */
  get live(): boolean {
    return this.stream.alive;
  }

  /**
   * Runs `fn` with the delivery's OpenTelemetry context active: a span ("process <source>", kind
   * CONSUMER) whose parent is the delivery's trace context, so spans the application starts in
   * `fn` join the producer's trace. `Subscription.run` calls the handler this way. Without
   * @opentelemetry/api installed it just calls `fn`.
   */
  runInContext<T>(fn: () => T): T {
    return this.span ? this.span.with(fn) : fn();
  }

  /** Queues a Redis command as a side effect: it runs only if the delivery is acked. */
  queue(name: string, ...args: Arg[]): this {
    if (this.outcome !== undefined) {
      throw new AlreadySettledError(`delivery ${this.entryId} (slot ${this.slot}) is already settled (${this.outcome})`, this.slot, this.outcome);
    }
    this.commands.push({ slot: this.slot, name, args: args.map(arg) });
    return this;
  }

  /**
   * Says the delivery is still being worked on (`Batch.extend`), so that another
   * consumer does not take it meanwhile: a stream entry is made idle again (claimed by another
   * consumer only `minIdleMs` from now), a reliable list's lease is renewed; simple lists and
   * pub/sub have nothing that could take it. Sent at once (as `Batch.extend`, with whatever else
   * goes out in the same turn of the event loop), any number of times before the outcome.
   * Returns false when the delivery's stream is gone (the entry comes back anyway); throws
   * `AlreadySettledError` once the delivery is settled.
   */
  extend(): boolean {
    if (this.outcome !== undefined) {
      throw new AlreadySettledError(`delivery ${this.entryId} (slot ${this.slot}) is already settled (${this.outcome})`, this.slot, this.outcome);
    }
    return this.sub._extend(this);
  }

  /** Keeps the queued commands and acknowledges the entry. */
  ack(): void {
    this.settle("ack", { slot: this.slot, kind: OutcomeKind.OUTCOME_KIND_ACK, reason: "" });
  }

  /** Discards the queued commands and acknowledges the entry: it is not delivered again. */
  drop(reason = ""): void {
    this.settle("drop", { slot: this.slot, kind: OutcomeKind.OUTCOME_KIND_DROP, reason });
  }

  /** Discards the queued commands; the entry is delivered again as soon as possible. */
  retry(reason = ""): void {
    this.settle("retry", { slot: this.slot, kind: OutcomeKind.OUTCOME_KIND_RETRY, reason });
  }

  /** Discards the queued commands; the entry is delivered again after `ms` (durable in Redis). */
  retryAfter(ms: number, reason = ""): void {
    if (!(ms >= 1)) throw new RangeError("retryAfter needs a delay of at least 1 ms");
    this.settle("retry_after", { slot: this.slot, kind: OutcomeKind.OUTCOME_KIND_RETRY_AFTER, delay: duration(ms), reason });
  }

  /**
   * Discards the queued commands and writes the entry to the subscription's dead-letter target
   * at once, whatever its delivery count, with `reason` (the dead letter's `x-window-reason`):
   * for an entry no retry can fix. Throws a TypeError on a subscription without a dead-letter
   * target (`maxDeliveries` and `deadLetter`), and on pub/sub, which has none.
   */
  deadLetter(reason = ""): void {
    if (!this.sub.hasDeadLetter) {
      throw new TypeError("deadLetter needs a dead-letter target: subscribe with maxDeliveries and deadLetter, or settle it with drop");
    }
    this.settle("dead_letter", { slot: this.slot, kind: OutcomeKind.OUTCOME_KIND_DEAD_LETTER, reason });
  }

  private settle(name: OutcomeName, outcome: Outcome): void {
    if (this.outcome !== undefined) {
      throw new AlreadySettledError(`delivery ${this.entryId} (slot ${this.slot}) is already settled (${this.outcome})`, this.slot, this.outcome);
    }
    this.outcome = name;
    if (this.span) {
      const trace = this.span.outcomeTrace();
      if (trace) outcome.trace = trace;
      this.span.end(name);
    }
    this.sub._settled(this, outcome);
  }
}

/**
 * One read's deliveries, handed out together by `Subscription.batches()`: a handler that can
 * take a read whole settles the deliveries it must on their own (`d.drop(reason)`,
 * `d.queue(...).ack()`) and the rest with one call. Iterable, and `deliveries` is the array.
 */
export class DeliveryBatch implements Iterable<Delivery> {
  constructor(
    /** The read these deliveries came in (as `Delivery.readId`). */
    readonly readId: number,
    readonly deliveries: readonly Delivery[],
    /**
     * On a partitioned stream: the partition the read came from, that of each of its deliveries
     * (as `Delivery.partition`; entry ids repeat across partitions). Undefined otherwise.
     */
    readonly partition?: number,
  ) {}
  get length(): number {
    return this.deliveries.length;
  }
  [Symbol.iterator](): Iterator<Delivery> {
    return this.deliveries[Symbol.iterator]();
  }
  /** The deliveries without an outcome yet. */
  get unsettled(): Delivery[] {
    return this.deliveries.filter((d) => !d.settled);
  }
  /** Acks every delivery without an outcome yet (with the commands queued on it). */
  ack(): void {
    for (const d of this.unsettled) d.ack();
  }
  /** Drops every delivery without an outcome yet. */
  drop(reason = ""): void {
    for (const d of this.unsettled) d.drop(reason);
  }
  /** Retries every delivery without an outcome yet. */
  retry(reason = ""): void {
    for (const d of this.unsettled) d.retry(reason);
  }
}

/** A flush report with the deliveries of its read that it covers (an ordered read may be flushed in parts, one event per part). */
export class FlushEvent {
  constructor(
    readonly report: FlushReport,
    readonly deliveries: Delivery[],
  ) {}
  get ok(): boolean {
    return this.report.ok;
  }
  /** Deliveries whose outcome reached the sidecar before this flush. */
  get settled(): Delivery[] {
    return this.deliveries.filter((d) => d.sent);
  }
  /** The others: they stay pending and come back. */
  get abandoned(): Delivery[] {
    return this.deliveries.filter((d) => !d.sent);
  }
}

export interface Stats {
  opens: number;
  reconnects: number;
  reads: number;
  deliveries: number;
  batches: number;
  flushes: number;
  failedFlushes: number;
  rejections: number;
  /** Flush reports that came inside a read (`reportsInReads`). */
  reportsInReads: number;
  /** Draining messages: sidecars that shut down gracefully under this subscription. */
  drains: number;
  /** Deliveries whose handler (`run`) threw: each was settled with retryAfter(REJECTED_RETRY_MS). */
  handlerFailures: number;
  outcomes: Record<string, number>;
}

/** What `onOpened` is told besides the `Opened` message. */
export interface OpenedInfo {
  /** False for the subscription's first open, true for every open after it (after a reconnect or a drain). */
  resubscribed: boolean;
  /** How many times the subscription has been opened, this one included. */
  opens: number;
}

/** What `onDisconnected` is told: a stream ended, or an attempt to open one failed, and the client tries again. */
export interface DisconnectedInfo {
  /** The error the stream ended with (a grpc-js ServiceError), or undefined when the sidecar ended it without one. */
  error: Error | undefined;
  /** How long the client waits before the next attempt. */
  retryInMs: number;
  /** Consecutive failed attempts so far (the subscription gives up at `maxAttempts`). */
  attempts: number;
}

/** A Redis Stream read through a consumer group (at least once). */
export interface StreamSourceOptions {
  stream: string;
  /** Created (with MKSTREAM) when it does not exist. */
  group: string;
  /** Stable per replica, so a restart gets its own pending entries back; empty: the sidecar's --consumer-name. */
  consumer?: string;
  /** Where a new group starts: "0" (default, the whole stream), "$" or an entry id. */
  startId?: string;
  /** Entries pending on any consumer for this long are claimed and delivered again (sidecar default 60 s). */
  minIdleMs?: number;
}

/** A list read reliably: a read moves entries to this consumer's processing list (at least once). */
export interface ReliableListSourceOptions {
  reliableList: string;
  /** Names the processing list, which survives a restart; empty: the sidecar's own name. */
  consumer?: string;
  /** A consumer silent for this long is dead and its processing list goes back (sidecar default 30 s). */
  deadAfterMs?: number;
}

/** A list read by popping: at most once, a crash loses what was in flight. */
export interface SimpleListSourceOptions {
  simpleList: string;
}

/** Pub/sub channels, patterns or sharded channels: at most once, only while subscribed. */
export interface PubSubSourceOptions {
  channels?: string[];
  patterns?: string[];
  shardedChannels?: string[];
  /** Messages buffered for a slow client before the oldest are dropped (sidecar default 10000). */
  buffer?: number;
}

/** What to read: exactly one kind of source. */
export type SourceOptions = StreamSourceOptions | ReliableListSourceOptions | SimpleListSourceOptions | PubSubSourceOptions;

/** How the subscription windows what it reads; shared by every kind of source. */
export interface WindowOptions {
  /** Entries per read (default 16). */
  count?: number;
  /** Most unsettled deliveries (0: twice count). */
  maxInFlight?: number;
  /** How long one read waits for new entries (sidecar default 5 s). */
  blockMs?: number;
  /** Each acked delivery's commands and its settle as one script, instead of one pipeline per read. */
  atomic?: boolean;
  /**
   * The most times an entry is delivered (streams and lists). An entry at the cap settled with
   * retry or retry_after goes to `deadLetter` instead. 0 or unset: no cap.
   */
  maxDeliveries?: number;
  /** Where entries past `maxDeliveries` go: a stream for a stream source, a list for a list source. */
  deadLetter?: string;
  /** Lists and pub/sub: values are opaque payloads, not frames with headers. */
  raw?: boolean;
  /**
   * Plain acks (no reason, no trace context) go in the packed `Batch.acks` field instead of one
   * `Outcome` each: smaller messages under load, the same effect. Default false.
   */
  packedAcks?: boolean;
  /**
   * Asks the sidecar for `Open.reports_in_reads`: a flush report that rode on the next read
   * comes inside that read's message (one message per read each way). The client handles such
   * reports exactly like the others (`onFlush`). Default false.
   */
  reportsInReads?: boolean;
  /**
   * Streams and reliable lists: the entry's ordering key is this header (a stream entry's
   * `h:<name>` field, a list value's frame header). Entries that share a key are delivered one
   * at a time, in the order read: the next waits in the sidecar until the one before is settled
   * and flushed; other keys flow meanwhile; `retry` and `retryAfter` keep the entry in its
   * place. At most one of `orderingHeader` and `orderingField`.
   */
  orderingHeader?: string;
  /** Streams: the entry's ordering key is this field as stored (entries another producer wrote). */
  orderingField?: string;
  /**
   * Streams: reads the stream as partitioned into this many streams, `<stream>:{0}` …
   * `<stream>:{partitions-1}` (as `publish` writes them with the same `partitions`). The
   * subscriptions of one group that open it with the same number share the partitions out, each
   * read by one of them at a time and handed over as replicas come and go; `consumer` names this
   * replica among them. With `orderingHeader` or `orderingField`, a key's entries (all in one
   * partition) are then delivered one at a time across the whole group, not just within this
   * subscription. At most 1024; 0 or unset: the stream itself. A `TypeError` for a list or
   * pub/sub source.
   */
  partitions?: number;
  /**
   * Each flush report, with the deliveries it covers. An ordered subscription's read may be
   * flushed in parts, so one read can have several reports.
   */
  onFlush?: (event: FlushEvent) => void | Promise<void>;
  /**
   * Called each time the sidecar confirms the subscription: after the first open and after every
   * resubscription (a reconnect, or the next sidecar after a drain; `info.resubscribed`).
   */
  onOpened?: (opened: Opened, info: OpenedInfo) => void | Promise<void>;
  /**
   * Called when the sidecar starts its graceful shutdown (a `Draining` message): the client
   * has stopped handing out this stream's deliveries, has sent what was settled, and sends each
   * outcome of what the application started (was handed) as soon as it is settled, within
   * `draining.grace`. Once those are settled it half-closes the stream, so the sidecar ends it
   * at once; deliveries the client received and never handed out stay pending and are
   * delivered again. The client then resubscribes (to the next sidecar).
   */
  onDraining?: (draining: Draining) => void | Promise<void>;
  /**
   * Called when a stream ended, or an attempt to open one failed, and the client tries again
   * after its backoff (not when the subscription ends for good: that goes to onError).
   */
  onDisconnected?: (info: DisconnectedInfo) => void | Promise<void>;
  /**
   * Called for each refused command or outcome with the sidecar's raw Rejection, after the
   * client has applied `rejectedOutcome`: observe, log, count. (`onError` gets the same as a
   * RejectedError, one per delivery.)
   */
  onRejection?: (rejection: Rejection, delivery: Delivery | undefined) => void | Promise<void>;
  /**
   * The errors of the subscription: a RejectedError for each delivery the sidecar refused a
   * command or outcome of (after the client settled it), a SideEffectError for each side effect
   * Redis answered with an error and a RequeueRefusedError for each retry, retryAfter or dead
   * letter Redis did not write (both from a flush report, after `onFlush` got it), and the
   * SubscriptionEndedError it ends with (also thrown by the iteration and `run`).
   */
  onError?: (error: WindowError) => void | Promise<void>;
  /**
   * What the client does with a delivery whose command the sidecar refused: "auto" (default:
   * for INVALID_COMMAND, FORBIDDEN_COMMAND and PERMISSION_DENIED, which no retry fixes,
   * deadLetter at once with a `deadLetter` target, else drop at once; retry_after otherwise), "drop" or "retry_after" (with maxDeliveries and deadLetter, a
   * poison entry then reaches the dead letter at the cap).
   */
  rejectedOutcome?: RejectedOutcome;
  /** The client's own retryAfter (refused command, failed handler): this delay doubled per delivery (default 1000)… */
  retryDelayMs?: number;
  /** …up to this (default 60000). */
  maxRetryDelayMs?: number;
  /** Consecutive failed opens before the subscription ends with SubscriptionEndedError (default 10; 0: never). */
  maxAttempts?: number;
  /** Send a read's settled outcomes after this long even if the read is not complete (default 250; null: only complete reads). An ordered subscription sends each outcome at once. */
  lingerMs?: number | null;
  backoff?: { initialMs: number; maxMs: number };
  /** How long close() waits for handed-out deliveries to be settled. */
  closeTimeoutMs?: number;
  logger?: Logger;
  /**
   * OpenTelemetry (with @opentelemetry/api installed): a span per delivery handed out, whose
   * parent is the delivery's trace context, ended when the delivery is settled. Default true;
   * false: no spans.
   */
  tracing?: boolean;
}

export type SubscribeOptions = SourceOptions & WindowOptions;

/** The Open message of a subscription: its source, its dead letter and its windowing. */
export function openMessage(o: SubscribeOptions): Open {
  if (o.rejectedOutcome !== undefined && !["auto", "drop", "retry_after"].includes(o.rejectedOutcome)) {
    throw new RangeError(`rejectedOutcome is "auto", "drop" or "retry_after", not ${JSON.stringify(o.rejectedOutcome)}`);
  }
  const ms = (v: number | undefined) => (v !== undefined ? duration(v) : undefined);
  const open: Open = {
    count: o.count ?? 16,
    block: ms(o.blockMs),
    mode: o.atomic ? Mode.MODE_ATOMIC : Mode.MODE_UNSPECIFIED,
    maxInFlight: o.maxInFlight ?? 0,
    maxDeliveries: o.maxDeliveries ?? 0,
    reportsInReads: o.reportsInReads ?? false,
    framing: o.raw ? Framing.FRAMING_RAW : Framing.FRAMING_UNSPECIFIED,
  };
  if ("stream" in o) {
    open.stream = {
      key: o.stream, group: o.group, consumer: o.consumer ?? "", startId: o.startId ?? "", minIdle: ms(o.minIdleMs),
      partitions: partitionCount(o.partitions, "partitions"),
    };
  } else if ("reliableList" in o) {
    open.reliableList = { key: o.reliableList, consumer: o.consumer ?? "", deadAfter: ms(o.deadAfterMs) };
  } else if ("simpleList" in o) {
    open.simpleList = { key: o.simpleList };
  } else {
    open.pubsub = { channels: o.channels ?? [], patterns: o.patterns ?? [], shardedChannels: o.shardedChannels ?? [], buffer: o.buffer ?? 0 };
  }
  if (o.deadLetter) open.deadLetter = "stream" in o ? { stream: o.deadLetter } : { list: o.deadLetter };
  if (o.orderingHeader && o.orderingField) {
    throw new TypeError("orderingHeader and orderingField: one ordering key, not both");
  }
  if (o.orderingHeader) open.orderingKey = { header: o.orderingHeader };
  else if (o.orderingField) open.orderingKey = { field: o.orderingField };
  if (!("stream" in o) && partitionCount(o.partitions, "partitions") > 0) {
    throw new TypeError(
      `partitions is for a stream: ${describe(o)} is not partitioned; drop partitions, or subscribe to the partitioned stream with stream and group`,
    );
  }
  return open;
}

/**
 * A number of partitions as the protocol takes it (0: not partitioned). A fraction or a negative
 * number would reach the sidecar as some other number, so it is refused here.
 */
function partitionCount(value: number | undefined, what: string): number {
  if (value === undefined) return 0;
  if (!Number.isInteger(value) || value < 0) {
    throw new RangeError(`${what} is a whole number of partitions (0: not partitioned), not ${value}`);
  }
  return value;
}

/** A short name of the source, for logs. */
function describe(o: SubscribeOptions): string {
  if ("stream" in o) return `stream ${o.stream}/${o.group}${o.partitions ? ` (${o.partitions} partitions)` : ""}`;
  if ("reliableList" in o) return `reliable list ${o.reliableList}`;
  if ("simpleList" in o) return `list ${o.simpleList}`;
  return `pub/sub ${[...(o.channels ?? []), ...(o.patterns ?? []), ...(o.shardedChannels ?? [])].join(",")}`;
}

interface ReadState {
  readId: number;
  deliveries: Delivery[];
  unsettled: number;
  commands: QueuedCommand[];
  outcomes: Outcome[];
  timer: NodeJS.Timeout | undefined;
  /** A flush report of it came (an ordered read may have several). */
  reported: boolean;
}

/** @internal One Subscribe call. Slots and read ids mean something only on their own stream. */
export class StreamState {
  alive = true;
  halfClosed = false;
  opened: Opened | undefined;
  reads = new Map<number, ReadState>();
  slots = new Map<number, Delivery>();
  unsettled = 0;
  handedUnsettled = 0;
  outbox: Array<{ commands: QueuedCommand[]; outcomes: Outcome[]; extend: number[] }> = [];
  outboxScheduled = false;
  /** The sidecar sent Draining: nothing more is handed out, settled outcomes go out at once. */
  draining = false;
  drained: Array<() => void> = [];
  constructor(
    readonly gen: number,
    readonly call: ClientDuplexStream<SubscribeRequest, SubscribeResponse>,
  ) {}
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** An async iterable of deliveries over one subscription, reconnecting as needed. */
export class Subscription implements AsyncIterable<Delivery> {
  opened: Opened | undefined;
  readonly stats: Stats = {
    opens: 0, reconnects: 0, reads: 0, deliveries: 0, batches: 0, flushes: 0, failedFlushes: 0, rejections: 0,
    reportsInReads: 0, drains: 0, handlerFailures: 0, outcomes: {},
  };
  private readonly log: Logger;
  private readonly queue: Delivery[] = [];
  private waiter: (() => void) | undefined;
  private stream: StreamState | undefined;
  private gen = 0;
  private closing = false;
  private ended = false;
  private error: Error | undefined;
  private running: Promise<void> | undefined;
  private wakeBackoff: (() => void) | undefined;
  private drain = true;
  /** How the deliveries are taken: one at a time (iterating, `run()`) or a read at a time (`batches()`). */
  private way: "deliveries" | "batches" | undefined;

  /** @internal */
  constructor(
    private readonly client: WindowClient,
    private readonly opts: SubscribeOptions,
  ) {
    // Options the Open cannot carry fail here, at subscribe(), rather than ending the
    // subscription once it starts.
    openMessage(opts);
    this.log = opts.logger ?? consoleLogger;
  }

  /** An ordered subscription (`orderingHeader`, `orderingField`): its reads may be flushed in parts. */
  private get ordered(): boolean {
    return Boolean(this.opts.orderingHeader || this.opts.orderingField);
  }

  /**
   * How many partitions of the partitioned stream the sidecar shares out among the group's
   * replicas for this subscription (`Opened.partitions`), once it is open: 0 before that, on an
   * unpartitioned stream, a list or pub/sub, and from a sidecar older than the field, which then
   * reads the stream itself whatever `partitions` asked for. Its deliveries name their partition
   * (`Delivery.partition`).
   */
  get partitions(): number {
    return this.opened?.partitions ?? 0;
  }

  /** True when the subscription has a dead-letter target (`deadLetter`): Delivery.deadLetter needs one. */
  get hasDeadLetter(): boolean {
    const o = this.opts;
    return Boolean(o.deadLetter) && ("stream" in o || "reliableList" in o || "simpleList" in o);
  }

  /** Starts the subscription (iterating does it too). */
  start(): this {
    if (!this.running) this.running = this.loop();
    return this;
  }

  [Symbol.asyncIterator](): AsyncIterator<Delivery> {
    this.takenAs("deliveries");
    return {
      next: () => this.next(),
      return: async () => {
        this.stop();
        return { done: true, value: undefined };
      },
    };
  }

  /**
   * The reads as they came, each handed out whole as a {@link DeliveryBatch}:
   * `for await (const batch of sub.batches()) { ...; batch.ack(); }`. A subscription is taken
   * one way only, read by read or delivery by delivery (iterating it, `run()`): the other
   * throws a TypeError. Ending the loop (break, return, throw) stops the subscription.
   */
  batches(): AsyncIterable<DeliveryBatch> {
    this.takenAs("batches");
    return {
      [Symbol.asyncIterator]: () => ({
        next: () => this.nextBatch(),
        return: async () => {
          this.stop();
          return { done: true, value: undefined };
        },
      }),
    };
  }

  private takenAs(way: "deliveries" | "batches"): void {
    if (this.way !== undefined && this.way !== way) {
      const taken = this.way === "batches" ? "read by read (batches())" : "delivery by delivery";
      throw new TypeError(`this subscription is already taken ${taken}: take it one way only`);
    }
    this.way = way;
    this.start();
  }

  private async nextBatch(): Promise<IteratorResult<DeliveryBatch>> {
    const first = await this.next();
    if (first.done) return first;
    const d = first.value;
    const deliveries = [d];
    // A read's deliveries are queued together: the rest of it is at the head of the queue.
    for (;;) {
      const n = this.queue[0];
      if (n === undefined || n.readId !== d.readId || n.stream !== d.stream) break;
      this.queue.shift();
      if (n.stream.alive && !n.stream.draining) deliveries.push(this.handOut(n));
    }
    return { done: false, value: new DeliveryBatch(d.readId, deliveries, d.partition) };
  }

  private handOut(d: Delivery): Delivery {
    d.handed = true;
    d.stream.handedUnsettled += 1;
    if (this.opts.tracing !== false) d.span = this.startSpan(d);
    return d;
  }

  private async next(): Promise<IteratorResult<Delivery>> {
    for (;;) {
      if (this.closing || this.ended) {
        if (this.error && !this.closing) throw this.error;
        return { done: true, value: undefined };
      }
      const d = this.queue.shift();
      if (d === undefined) {
        await new Promise<void>((resolve) => (this.waiter = resolve));
        continue;
      }
      // From a lost or draining stream: not handed out, the sidecar delivers it again.
      if (!d.stream.alive || d.stream.draining) continue;
      return { done: false, value: this.handOut(d) };
    }
  }

  private startSpan(d: Delivery): DeliverySpan | undefined {
    const o = this.opts;
    const destination = "stream" in o ? o.stream : "reliableList" in o ? o.reliableList : "simpleList" in o ? o.simpleList : d.channel;
    const attributes: Record<string, string | number> = {
      "messaging.system": "redis",
      "messaging.operation.type": "process",
      "messaging.destination.name": destination,
      "messaging.message.id": d.entryId,
      "window.slot": d.slot,
      "window.delivery_count": d.deliveryCount,
    };
    if ("stream" in o) attributes["messaging.consumer.group.name"] = o.group;
    if (this.opened?.consumer) attributes["window.consumer"] = this.opened.consumer;
    return DeliverySpan.start(`process ${destination}`, d.trace, attributes);
  }

  /**
   * The handler style of `for await (const d of sub)`: calls `handler(d)` (plain or async) for
   * each delivery until `stop()` (or a subscription error, which it throws), with the
   * delivery's OpenTelemetry context active (`Delivery.runInContext`). At most `concurrency`
   * handlers run at once (default 1: one after the other).
   *
   * The rule for a failed handler, the same in every language's client: a delivery the handler
   * returns without settling is acked (so a handler may only queue commands); one whose handler
   * throws (or whose promise rejects) before settling it is settled with
   * `retryAfter(<the growing delay>, "handler failed: <error>")`: never acked, never dropped, so
   * with `maxDeliveries` and `deadLetter` a poison entry ends in the dead letter.
   */
  async run(handler: (delivery: Delivery) => void | Promise<void>, opts: { concurrency?: number } = {}): Promise<void> {
    const limit = Math.max(1, Math.floor(opts.concurrency ?? 1));
    const active = new Set<Promise<void>>();
    try {
      for await (const d of this) {
        const p: Promise<void> = this.handleOne(handler, d).finally(() => active.delete(p));
        active.add(p);
        if (active.size >= limit) await Promise.race(active);
      }
    } finally {
      await Promise.all(active);
    }
  }

  private async handleOne(handler: (delivery: Delivery) => void | Promise<void>, d: Delivery): Promise<void> {
    try {
      await d.runInContext(() => handler(d));
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      this.stats.handlerFailures += 1;
      this.log.warn(`handler failed on ${d.entryId} (slot ${d.slot}): ${e instanceof Error ? e.stack ?? message : message}`);
      if (!d.settled) d.retryAfter(this.retryDelay(d.deliveryCount), `handler failed: ${message}`);
      return;
    }
    if (!d.settled) d.ack();
  }

  /** The delay of the client's own retryAfter for a delivery with this count: retryDelayMs doubled per earlier delivery, at most maxRetryDelayMs. */
  retryDelay(deliveryCount: number): number {
    const base = this.opts.retryDelayMs ?? RETRY_DELAY_MS;
    const cap = this.opts.maxRetryDelayMs ?? MAX_RETRY_DELAY_MS;
    return Math.min(cap, base * 2 ** Math.min(Math.max(deliveryCount, 1) - 1, 52));
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  /**
   * Ends the iteration: no further deliveries are handed out. Handed-out ones can still be
   * settled (up to closeTimeoutMs; not at all with drain: false); then the stream is half-closed, the sidecar flushes and
   * reports what was settled, and the stream ends. Safe to call from callbacks.
   */
  stop(opts: { drain?: boolean } = {}): void {
    if (opts.drain === false) {
      this.drain = false;
      if (this.stream) for (const r of this.stream.drained.splice(0)) r();
    }
    if (this.closing) return;
    this.closing = true;
    this.wake();
    this.wakeBackoff?.();
    const st = this.stream;
    if (st && st.alive) void this.halfClose(st);
  }

  /** stop(), then waits until the stream has ended with its flush reports delivered. */
  async close(opts: { drain?: boolean } = {}): Promise<void> {
    this.stop(opts);
    if (!this.running) return;
    const timeout = (this.opts.closeTimeoutMs ?? 10_000) + 5_000;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<boolean>((r) => (timer = setTimeout(() => r(true), timeout)));
    const done = await Promise.race([this.running.then(() => false), expired]);
    clearTimeout(timer);
    if (done) {
      this.log.warn("subscription did not end in time; cancelling its stream");
      this.stream?.call.cancel();
      await this.running;
    }
  }

  /**
   * Waits (up to `limitMs`, closeTimeoutMs by default) until the deliveries handed out on `st`
   * are settled, sends what is settled and half-closes the stream: the sidecar flushes it,
   * reports and ends the stream; what has no outcome stays pending and comes back. Used by
   * stop() and when the sidecar drains (`limitMs` its grace).
   */
  private async halfClose(st: StreamState, limitMs?: number): Promise<void> {
    if (st.handedUnsettled > 0 && this.drain) {
      const limit = limitMs ?? this.opts.closeTimeoutMs ?? 10_000;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((r) => st.drained.push(r)),
        new Promise<void>((r) => (timer = setTimeout(r, limit))),
      ]);
      clearTimeout(timer);
      if (st.handedUnsettled > 0) {
        this.log.warn(`closing with ${st.handedUnsettled} unsettled deliveries: they stay pending and come back`);
      }
    }
    if (!st.alive || st.halfClosed) return;
    for (const rd of st.reads.values()) this.send(st, rd);
    this.flushOutbox(st);
    st.halfClosed = true;
    st.call.end();
  }

  // -- settling and batching --------------------------------------------------------------

  /** @internal */
  _settled(d: Delivery, outcome: Outcome): void {
    const st = d.stream;
    this.stats.outcomes[d.outcome!] = (this.stats.outcomes[d.outcome!] ?? 0) + 1;
    if (d.rejection !== undefined) {
      // A new outcome after the sidecar refused the first: the slot is still open.
      d.rejection = undefined;
      if (st.alive && !st.halfClosed) this.enqueue(st, d.commands.splice(0), [outcome]);
      return;
    }
    if (d.handed) {
      st.handedUnsettled -= 1;
      if (st.handedUnsettled === 0) for (const r of st.drained.splice(0)) r();
    }
    if (!st.alive || st.halfClosed) {
      this.log.debug(`delivery ${d.entryId} settled after its stream ended: it will be delivered again`);
      return;
    }
    const rd = st.reads.get(d.readId);
    if (rd === undefined) {
      this.log.debug(`delivery ${d.entryId} settled after the sidecar abandoned it: it will be delivered again`);
      return;
    }
    st.unsettled -= 1;
    rd.commands.push(...d.commands);
    rd.outcomes.push(outcome);
    rd.unsettled -= 1;
    const linger = this.opts.lingerMs === undefined ? 250 : this.opts.lingerMs;
    // Draining: the read will not complete (what was not handed out is abandoned), and the
    // grace is short, so every outcome goes out as soon as it is settled. Ordered: a key's
    // next entry waits in the sidecar for this one's flush, so the same.
    if (rd.unsettled === 0 || st.draining || this.ordered) this.send(st, rd);
    else if (rd.timer === undefined && linger !== null) rd.timer = setTimeout(() => this.send(st, rd), linger);
  }

  private send(st: StreamState, rd: ReadState): void {
    if (rd.timer !== undefined) clearTimeout(rd.timer);
    rd.timer = undefined;
    if ((rd.commands.length === 0 && rd.outcomes.length === 0) || !st.alive || st.halfClosed) return;
    this.enqueue(st, rd.commands, rd.outcomes);
    rd.commands = [];
    rd.outcomes = [];
  }

  /** @internal */
  _extend(d: Delivery): boolean {
    const st = d.stream;
    if (!st.alive || st.halfClosed) return false;
    this.enqueue(st, [], [], [d.slot]);
    return true;
  }

  // Everything enqueued in one turn of the event loop goes out as one message.
  private enqueue(st: StreamState, commands: QueuedCommand[], outcomes: Outcome[], extend: number[] = []): void {
    st.outbox.push({ commands, outcomes, extend });
    if (!st.outboxScheduled) {
      st.outboxScheduled = true;
      setImmediate(() => this.flushOutbox(st));
    }
  }

  private flushOutbox(st: StreamState): void {
    st.outboxScheduled = false;
    if (st.outbox.length === 0 || !st.alive) return;
    const commands: QueuedCommand[] = [];
    const outcomes: Outcome[] = [];
    const extend: number[] = [];
    for (const item of st.outbox.splice(0)) {
      commands.push(...item.commands);
      outcomes.push(...item.outcomes);
      extend.push(...item.extend);
    }
    for (const o of outcomes) {
      const d = st.slots.get(o.slot);
      if (d) d.sent = true;
    }
    // With packedAcks, plain acks (no reason, no trace) go as bare slots in `acks`. The sidecar
    // applies them after `outcomes`; outcomes of distinct slots do not depend on their order.
    const acks: number[] = [];
    let rest = outcomes;
    if (this.opts.packedAcks) {
      rest = [];
      for (const o of outcomes) {
        if (o.kind === OutcomeKind.OUTCOME_KIND_ACK && !o.reason && !o.trace) acks.push(o.slot);
        else rest.push(o);
      }
    }
    // A QueuedCommand per command: packed as RESP they cost more CPU here and more bytes
    // (see docs/development.md, "The Node and Go clients"); `packedCommands` is for clients
    // that pay more for a message than for the command in it (Python's protobuf objects).
    st.call.write({
      batch: { commands, outcomes: rest, acks, extend, packedCommands: NO_BYTES, packedCommandSlots: [] },
    });
    this.stats.batches += 1;
  }

  // -- the stream loop ----------------------------------------------------------------------

  private async loop(): Promise<void> {
    let attempt = 0;
    let lastError: ServiceError | undefined;
    let disconnectedBy: Error | undefined;
    try {
      while (!this.closing) {
        const opensBefore = this.stats.opens;
        disconnectedBy = undefined;
        try {
          await this.session();
          if (this.closing) break;
          this.log.warn("the sidecar ended the subscription stream; resubscribing");
        } catch (e) {
          const err = e as ServiceError;
          if (this.closing && (err.code === Status.CANCELLED || err.code === Status.UNAVAILABLE)) break;
          if (typeof err.code !== "number" || !RETRYABLE.has(err.code)) {
            await this.end(err, attempt + 1);
            break;
          }
          if (transportFailure(err)) {
            // Redis or an HTTP server at the address: no retry fixes that, say so now.
            const explained = await explain(err, this.client.target, "the subscription", undefined, this.client.tls);
            if (notTheSidecar(explained)) {
              await this.end(err, attempt + 1, explained);
              break;
            }
          }
          if (this.stats.opens > opensBefore) attempt = 0;
          lastError = err;
          disconnectedBy = err;
          const st = this.stream!;
          const lost = [...st.reads.values()].flatMap((rd) => rd.deliveries).filter((d) => !d.sent);
          const held = lost.filter((d) => d.outcome !== undefined).length;
          this.log.warn(
            `subscription stream ended with ${Status[err.code]} (${err.details}); ${lost.length} deliveries without an ` +
              `outcome on the sidecar (${held} settled here but not sent yet) stay pending and come back; resubscribing`,
          );
        } finally {
          this.loseStream();
        }
        if (this.closing) break;
        attempt += 1;
        const maxAttempts = this.opts.maxAttempts ?? MAX_ATTEMPTS;
        if (maxAttempts > 0 && attempt >= maxAttempts && lastError !== undefined) {
          await this.end(lastError, attempt);
          break;
        }
        lastError = undefined;
        const { initialMs, maxMs } = this.opts.backoff ?? { initialMs: 100, maxMs: 5_000 };
        const delay = Math.min(maxMs, initialMs * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2);
        if (this.opts.onDisconnected) {
          const info: DisconnectedInfo = { error: disconnectedBy, retryInMs: delay, attempts: attempt };
          await this.callback(() => this.opts.onDisconnected!(info));
        }
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, delay);
          this.wakeBackoff = () => {
            clearTimeout(t);
            resolve();
          };
        });
        this.wakeBackoff = undefined;
        this.stats.reconnects += 1;
      }
    } finally {
      this.ended = true;
      this.wake();
    }
  }

  /** Ends the subscription for good with a SubscriptionEndedError made of `err`, the last attempt's, and hands it to onError. */
  private async end(err: ServiceError, attempts: number, known?: WindowError): Promise<void> {
    const explained = known ?? (await explain(err, this.client.target, "the subscription", undefined, this.client.tls));
    const what = `the subscription to ${describe(this.opts)}`;
    const why = explained.message;
    const message = typeof err.code === "number" && RETRYABLE.has(err.code) && attempts > 1 ? `${what} ended after ${attempts} failed attempts: ${why}` : `${what} ended: ${why}`;
    this.log.error(message);
    const ended = new SubscriptionEndedError(message, attempts, { status: err.code, details: err.details, cause: explained });
    this.error = ended;
    await this.report(ended);
  }

  private async report(err: WindowError): Promise<void> {
    if (this.opts.onError) await this.callback(() => this.opts.onError!(err));
  }

  private session(): Promise<void> {
    this.gen += 1;
    const call = this.client.stub.subscribe(this.client.metadata());
    const st = new StreamState(this.gen, call);
    this.stream = st;
    call.write({ open: openMessage(this.opts) });
    if (this.closing) void this.halfClose(st);
    return new Promise<void>((resolve, reject) => {
      // Messages are handled one at a time, in order, even when a callback is async.
      let chain = Promise.resolve();
      call.on("data", (msg: SubscribeResponse) => {
        chain = chain.then(() => this.handle(st, msg)).catch((e) => this.log.error(`handling a message failed: ${e}`));
      });
      call.on("error", (err: ServiceError) => {
        chain.then(() => reject(err));
      });
      call.on("status", (s) => {
        if (s.code === Status.OK) chain.then(() => resolve());
      });
    });
  }

  private async handle(st: StreamState, msg: SubscribeResponse): Promise<void> {
    if (msg.opened) await this.onOpened(st, msg.opened);
    else if (msg.read) {
      if (msg.read.flushed) {
        // The report of the flush this read rode on (reportsInReads): an earlier read's.
        this.stats.reportsInReads += 1;
        await this.onFlush(st, msg.read.flushed);
      }
      this.onRead(st, msg.read);
    } else if (msg.flush) await this.onFlush(st, msg.flush);
    else if (msg.rejections) await this.onRejections(st, msg.rejections.rejections);
    else if (msg.draining) await this.onDraining(st, msg.draining);
  }

  /**
   * The sidecar is shutting down: no more reads come, and outcomes sent within the grace are
   * still flushed. Deliveries not handed out yet are not handed out; what is settled goes out
   * now, and what the application started (was handed) goes out as soon as it is settled. Once
   * every started delivery is settled, or the grace is over, the stream is half-closed: the
   * sidecar then ends the subscription at once instead of waiting out its grace for the
   * deliveries the client holds and will never hand out (they stay pending and are delivered
   * again, to the next subscription), and the subscription resubscribes, to the next sidecar.
   */
  private async onDraining(st: StreamState, draining: Draining): Promise<void> {
    st.draining = true;
    this.stats.drains += 1;
    const grace = draining.grace ? draining.grace.seconds * 1000 + Math.round(draining.grace.nanos / 1e6) : 0;
    this.log.info(
      `the sidecar is draining (grace ${grace} ms, ${draining.outstanding} outstanding, ${st.handedUnsettled} started here): ` +
        `sending settled outcomes now, half-closing once the started ones are settled`,
    );
    for (let i = this.queue.length - 1; i >= 0; i--) if (this.queue[i].stream === st) this.queue.splice(i, 1);
    for (const rd of st.reads.values()) this.send(st, rd);
    // A drain without a grace (none given) is bounded by closeTimeoutMs instead.
    if (st.alive && !st.halfClosed) void this.halfClose(st, grace > 0 ? grace : undefined);
    if (this.opts.onDraining) await this.callback(() => this.opts.onDraining!(draining));
  }

  private async onOpened(st: StreamState, opened: Opened): Promise<void> {
    st.opened = opened;
    this.opened = opened;
    this.stats.opens += 1;
    this.log.info(
      `${this.stats.opens === 1 ? "subscribed" : "resubscribed"} as consumer '${opened.consumer}' on ` +
        `${describe(this.opts)} (count ${opened.count}, max in flight ${opened.maxInFlight}, ` +
        `mode ${modeToJSON(opened.mode)}, ${opened.subscriptionId})`,
    );
    const info: OpenedInfo = { resubscribed: this.stats.opens > 1, opens: this.stats.opens };
    if (this.opts.onOpened) await this.callback(() => this.opts.onOpened!(opened, info));
  }

  private onRead(st: StreamState, read: Read): void {
    const { readId, partition } = read;
    const deliveries = read.deliveries.map((m) => new Delivery(this, st, readId, m, partition));
    if (deliveries.length === 0) return;
    // The sidecar only reads while fewer than max_in_flight are out, per window: on a
    // partitioned stream each partition this subscription holds has a window of its own (all of
    // them on this one stream), so the bound is max_in_flight times the partitions.
    const windows = Math.max(1, st.opened?.partitions ?? 0);
    const limit = (st.opened?.maxInFlight ?? 0) * windows;
    if (limit && st.unsettled + deliveries.length > limit) {
      this.log.warn(`read ${read.readId} has ${deliveries.length} deliveries with ${st.unsettled} unsettled: more than max_in_flight ${limit}`);
    }
    st.unsettled += deliveries.length;
    st.reads.set(read.readId, { readId: read.readId, deliveries, unsettled: deliveries.length, commands: [], outcomes: [], timer: undefined, reported: false });
    for (const d of deliveries) st.slots.set(d.slot, d);
    this.stats.reads += 1;
    this.stats.deliveries += deliveries.length;
    if (this.closing) return; // not handed out: abandoned on close, delivered again later
    this.queue.push(...deliveries);
    this.wake();
  }

  /**
   * A flush report. An ordered subscription's read may be flushed in parts (a settled delivery
   * whose key has a later entry waiting goes ahead of the rest of its read), so a read can have
   * several reports: each covers the read's deliveries sent since the last one, and the read is
   * done once all of them were (or, the stream closing, the sidecar abandoned the rest).
   */
  private async onFlush(st: StreamState, report: FlushReport): Promise<void> {
    const rd = st.reads.get(report.readId);
    const deliveries: Delivery[] = [];
    let whole = false;
    if (rd !== undefined) {
      const first = !rd.reported;
      rd.reported = true;
      for (const d of rd.deliveries) {
        if (d.sent && !d.reported) {
          d.reported = true;
          st.slots.delete(d.slot);
          deliveries.push(d);
        }
      }
      const part = this.ordered && st.alive && !st.halfClosed && rd.deliveries.some((d) => !d.reported);
      if (!part) {
        // Done: every delivery was sent, or the rest is abandoned (drain or close).
        st.reads.delete(report.readId);
        whole = first;
        if (rd.timer !== undefined) clearTimeout(rd.timer);
        rd.timer = undefined;
        for (const d of rd.deliveries) {
          if (d.reported) continue;
          st.slots.delete(d.slot);
          if (d.outcome === undefined) st.unsettled -= 1; // abandoned by the sidecar
          deliveries.push(d);
        }
      }
    }
    this.stats.flushes += 1;
    const sent = deliveries.filter((d) => d.sent).length;
    // A retry kept in place settles nothing: every retry of a stream (unless it went to the
    // dead letter at max_deliveries), and on an ordered subscription a keyed entry's.
    const retried = "stream" in this.opts
      ? deliveries.filter((d) => d.sent && (d.outcome === "retry" || d.outcome === "retry_after")).length
      : 0;
    if (whole && !this.ordered && (report.settles > sent || report.settles < sent - retried)) {
      this.log.warn(`flush of read ${report.readId} settled ${report.settles} entries, but ${sent} outcomes were sent for it`);
    }
    if (!report.ok) {
      this.stats.failedFlushes += 1;
      this.log.warn(`flush of read ${report.readId} failed: ${report.error} (${report.failed} failed, settle failed: ${report.settleFailed})`);
    }
    if (this.opts.onFlush) await this.callback(() => this.opts.onFlush!(new FlushEvent(report, deliveries)));
    if (report.sideEffectFailures.length > 0 || report.requeueRefused.length > 0) {
      await this.flushErrors(report, deliveries);
    }
  }

  /**
   * What a flush report says Redis refused, each as an error for onError: a side effect that
   * failed when it ran (SideEffectError) and a retry, retryAfter or dead letter Redis did not
   * write (RequeueRefusedError).
   */
  private async flushErrors(report: FlushReport, deliveries: Delivery[]): Promise<void> {
    const bySlot = new Map(deliveries.map((d) => [d.slot, d] as const));
    const errors: WindowError[] = [];
    for (const f of report.sideEffectFailures) {
      errors.push(new SideEffectError(f.slot, f.entryId, f.command, f.error, f.settled, bySlot.get(f.slot)));
    }
    for (const r of report.requeueRefused) {
      const d = r.slot ? bySlot.get(r.slot) : undefined;
      errors.push(new RequeueRefusedError(r.slot, r.entryId, r.error, d?.outcome, d));
    }
    for (const error of errors) {
      this.log.warn(error.message);
      await this.report(error);
    }
  }

  /**
   * The rejection rule, the same in every language's client: a delivery one of whose commands
   * was refused is never acked (its segment is incomplete); the client settles it as
   * `rejectedOutcome` says ("auto": dead-lettered at once for a reason no retry fixes, or
   * dropped without a dead-letter target; else retryAfter with the growing delay) and hands onError a RejectedError. The client sends a
   * delivery's commands with its outcome, so the sidecar has refused the ack too
   * (INCOMPLETE_SEGMENT) and the slot is open again; a drop or retry was accepted and stands.
   * An outcome refused ALREADY_SETTLED (on a partitioned stream: its partition was handed over,
   * or fenced, before the outcome came) is not settled again: the entry is the partition's new
   * reader's, and no flush report will name the slot, so the delivery is done for its read here.
   */
  private async onRejections(st: StreamState, rejections: Rejection[]): Promise<void> {
    const reported: RejectedError[] = [];
    // Commands first: the refused ack may come before or after its command in the message.
    for (const rej of rejections) {
      const d = st.slots.get(rej.slot);
      if (d !== undefined && rej.command && d.commandRejection === undefined) {
        d.commandRejection = rej;
        d.rejectedError = new RejectedError(
          `the sidecar refused ${rej.command} of entry ${d.entryId} (slot ${rej.slot}): ${reasonName(rej.reason)}: ${withoutAdvice(rej.message)}`,
          reasonName(rej.reason), rej.slot, rej.command, d,
        );
        reported.push(d.rejectedError);
      }
    }
    for (const rej of rejections) {
      this.stats.rejections += 1;
      const d = st.slots.get(rej.slot);
      const reason = reasonName(rej.reason);
      if (d !== undefined && !rej.command && RESETTLE.has(rej.reason) && st.alive) {
        const cause = d.commandRejection ?? rej;
        const causeReason = reasonName(cause.reason);
        d.rejection = rej;
        d.outcome = undefined;
        d.sent = false;
        d.commands = [];
        const policy = this.opts.rejectedOutcome ?? "auto";
        const why = `rejected: ${causeReason}: ${withoutAdvice(cause.message)}`;
        const unfixable = policy === "auto" && UNFIXABLE.has(causeReason);
        if (unfixable && this.hasDeadLetter) d.deadLetter(why);
        else if (policy === "drop" || unfixable) d.drop(why);
        else d.retryAfter(this.retryDelay(d.deliveryCount), why);
        let error = d.rejectedError;
        if (error === undefined) {
          error = new RejectedError(
            `the sidecar refused the outcome of entry ${d.entryId} (slot ${rej.slot}): ${reason}: ${withoutAdvice(rej.message)}`,
            reason, rej.slot, "", d,
          );
          reported.push(error);
        }
        error.outcome = d.outcome;
        error.message = `${error.message}; the client settled it with ${d.outcome}`;
      } else if (d === undefined || !rej.command) {
        if (d !== undefined && rej.reason === RejectionReason.REJECTION_REASON_ALREADY_SETTLED && d.sent && !d.reported) {
          this.unreported(st, d);
        }
        this.log.warn(`the sidecar refused an outcome for slot ${rej.slot} (${reason}): ${withoutAdvice(rej.message)}`);
      }
      if (this.opts.onRejection) await this.callback(() => this.opts.onRejection!(rej, d));
    }
    for (const error of reported) {
      this.log.warn(error.message);
      await this.report(error);
    }
  }

  /**
   * The sidecar answered `d`'s outcome ALREADY_SETTLED: the slot is no longer outstanding there
   * (its partition was handed over to another replica, or fenced itself), so no flush report
   * will ever name it, and its entry is delivered again by the partition's new reader. It is
   * done for its read as a reported delivery is; once every delivery of the read is, the read
   * is dropped as its last report would have dropped it. Its outcome already took it off the
   * unsettled counts.
   */
  private unreported(st: StreamState, d: Delivery): void {
    d.reported = true;
    st.slots.delete(d.slot);
    const rd = st.reads.get(d.readId);
    if (rd === undefined || rd.deliveries.some((x) => !x.reported)) return;
    st.reads.delete(d.readId);
    if (rd.timer !== undefined) clearTimeout(rd.timer);
    rd.timer = undefined;
  }

  private async callback(fn: () => void | Promise<void>): Promise<void> {
    try {
      await fn();
    } catch (e) {
      this.log.error(`callback failed: ${e instanceof Error ? e.stack : e}`);
    }
  }

  private loseStream(): void {
    const st = this.stream;
    if (!st || !st.alive) return;
    st.alive = false;
    for (const r of st.drained.splice(0)) r();
    for (const rd of st.reads.values()) {
      if (rd.timer !== undefined) clearTimeout(rd.timer);
      for (const d of rd.deliveries) if (d.outcome === undefined) d.span?.end("abandoned");
    }
    st.outbox = [];
  }
}

export interface PublishInput {
  payload: string | Buffer;
  headers?: Record<string, string>;
  /** The entry's W3C trace context; default: the active OpenTelemetry context, if any (see `injectTrace`). */
  trace?: TraceContext;
}

/**
 * Where publish() writes: a string is a stream key; otherwise exactly one of a stream (XADD), a
 * list (LPUSH, where list subscriptions read), a channel (PUBLISH) or a sharded channel (SPUBLISH).
 */
export type PublishTarget = string | { stream: string } | { list: string } | { channel: string } | { shardedChannel: string };

export interface PublishOptions {
  /** Streams: trims the stream to about this many entries (XADD MAXLEN ~). */
  maxLen?: number;
  /** How long the whole call may take (default 30000); reaching the sidecar is bounded by the client's connectTimeoutMs. */
  timeoutMs?: number;
  /** Lists and channels: write the payload alone, no frame with headers (`FRAMING_RAW`; headers are refused). */
  raw?: boolean;
  /**
   * Streams: the stream is partitioned into this many streams, `<stream>:{0}` …
   * `<stream>:{partitions-1}`, the number its subscribers open it with (`partitions` of
   * subscribe). Each entry goes to the partition of its key, `partitionHeader` or
   * `partitionField` (exactly one of them), so a key's entries stay in one partition in the
   * order published: the 32-bit FNV-1a hash of the key's bytes modulo `partitions`. Entries
   * without the key go to the partitions in turn. `maxLen` trims each partition. At most 1024;
   * 0 or unset: the stream itself.
   */
  partitions?: number;
  /** With `partitions`: each entry's key is this header (usually the subscribers' `orderingHeader`). */
  partitionHeader?: string;
  /** With `partitions`: each entry's key is this field as stored (entries given as fields by another producer). */
  partitionField?: string;
  /**
   * With @opentelemetry/api installed, entries that carry no `trace` get the active context's
   * (so a consumer's span continues the producer's trace). Default true.
   */
  injectTrace?: boolean;
}

/**
 * Where a partitioned publish finds each entry's key (`PublishRequest.partition_by`), or
 * undefined for an unpartitioned one. Refuses what the sidecar would, before anything is sent.
 */
function partitionKey(partitions: number, toStream: boolean, opts: PublishOptions): OrderingKey | undefined {
  const { partitionHeader: header, partitionField: field } = opts;
  if (partitions === 0) {
    if (header || field) {
      throw new TypeError(
        `publish: ${header ? "partitionHeader" : "partitionField"} needs partitions: how many partitions the stream has (the number its subscribers open it with)`,
      );
    }
    return undefined;
  }
  if (!toStream) {
    throw new TypeError("publish: partitions is for a stream; a list or channel is not partitioned: publish to the stream, or drop partitions");
  }
  if (header && field) throw new TypeError("publish: partitionHeader and partitionField: one partition key, not both");
  if (header) return { header };
  if (field) return { field };
  throw new TypeError(
    "publish: partitions needs partitionHeader or partitionField: the header or field holding each entry's key, which decides its partition",
  );
}

/** What the sidecar answers to a publish. */
export interface PublishResult {
  /** Streams: the id of each entry, in order. */
  ids: string[];
  /** Channels: how many subscribers received each entry, in order. */
  receivers: number[];
}

/** TLS to the sidecar. PEM contents (`ca`, `cert`, `key`) or the files holding them (`caFile`, …). */
export interface TlsOptions {
  /** The CA to verify the sidecar's certificate against (default: the system's roots). */
  ca?: string | Buffer;
  caFile?: string;
  /** The client certificate and its key, for a sidecar that requires one (mutual TLS). */
  cert?: string | Buffer;
  certFile?: string;
  key?: string | Buffer;
  keyFile?: string;
  /** The name to verify in the sidecar's certificate instead of the target's host. */
  serverName?: string;
}

export interface ClientOptions {
  /**
   * The bearer token of a sidecar started with --auth-token-file, sent on every call as
   * `authorization: Bearer <token>`. Default: the environment variable WINDOW_SIDECAR_TOKEN,
   * so a deployment sets it next to WINDOW_SIDECAR_ADDR without code changes.
   */
  token?: string;
  /**
   * TLS to the sidecar. Default: from the environment, TLS when WINDOW_SIDECAR_TLS_CA (a PEM
   * CA file) is set, with WINDOW_SIDECAR_TLS_CERT and WINDOW_SIDECAR_TLS_KEY (PEM files) as the
   * client certificate for mutual TLS and WINDOW_SIDECAR_TLS_SERVER_NAME as the name to verify;
   * else plaintext. `false`: plaintext whatever the environment says.
   */
  tls?: TlsOptions | false;
  /**
   * How long a call waits for a connection to the sidecar that is neither made nor refused
   * before it fails with ConnectionError, which names the address and the cause (default
   * CONNECT_TIMEOUT_MS, 5000). A refused connection fails the call at once.
   */
  connectTimeoutMs?: number;
}

/** The TLS settings the environment gives (WINDOW_SIDECAR_TLS_*), or undefined for plaintext. */
export function tlsFromEnv(env: NodeJS.ProcessEnv = process.env): TlsOptions | undefined {
  const caFile = env.WINDOW_SIDECAR_TLS_CA || undefined;
  const certFile = env.WINDOW_SIDECAR_TLS_CERT || undefined;
  const keyFile = env.WINDOW_SIDECAR_TLS_KEY || undefined;
  const serverName = env.WINDOW_SIDECAR_TLS_SERVER_NAME || undefined;
  if (!caFile && !certFile && !keyFile) return undefined;
  return { caFile, certFile, keyFile, serverName };
}

function pem(value: string | Buffer | undefined, file: string | undefined, what: string): Buffer | null {
  if (value !== undefined) return Buffer.isBuffer(value) ? value : Buffer.from(value, "utf8");
  if (file === undefined) return null;
  try {
    return readFileSync(file);
  } catch (e) {
    throw new Error(`cannot read the TLS ${what} ${file}: ${e instanceof Error ? e.message : e}`);
  }
}

/** @internal The channel credentials and options for a TLS setting. */
export function channelSecurity(tls: TlsOptions | undefined): { creds: ChannelCredentials; options: ChannelOptions } {
  if (!tls) return { creds: credentials.createInsecure(), options: {} };
  const ca = pem(tls.ca, tls.caFile, "CA");
  const cert = pem(tls.cert, tls.certFile, "certificate");
  const key = pem(tls.key, tls.keyFile, "key");
  if ((cert === null) !== (key === null)) {
    throw new Error("TLS: a client certificate needs its key and a key its certificate (WINDOW_SIDECAR_TLS_CERT and WINDOW_SIDECAR_TLS_KEY)");
  }
  const options: ChannelOptions = {};
  if (tls.serverName) {
    options["grpc.ssl_target_name_override"] = tls.serverName;
    options["grpc.default_authority"] = tls.serverName;
  }
  return { creds: credentials.createSsl(ca, key, cert), options };
}

const HealthClient = makeClientConstructor(healthService, "grpc.health.v1.Health");

/** A channel to the sidecar: publish(), subscribe() and health(). */
export class WindowClient {
  /** @internal */ readonly stub: WindowServiceClient;
  readonly target: string;
  /** Whether the channel uses TLS. */
  readonly tls: boolean;
  private readonly token: string | undefined;
  private readonly creds: ChannelCredentials;
  private readonly connectTimeoutMs: number;

  /**
   * `target`: any grpc-js target (`host:port`, `unix:/path/to.sock`); default WINDOW_SIDECAR_ADDR,
   * then 127.0.0.1:50051. The token and TLS come from the environment unless given in `opts`.
   */
  constructor(target?: string, opts: ClientOptions = {}) {
    this.target = target || process.env.WINDOW_SIDECAR_ADDR || DEFAULT_TARGET;
    const problem = addressProblem(this.target);
    if (problem !== undefined) throw new ConnectionError(this.target, problem, { status: undefined });
    this.token = opts.token ?? (process.env.WINDOW_SIDECAR_TOKEN || undefined);
    this.connectTimeoutMs = opts.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    const tls = opts.tls === false ? undefined : (opts.tls ?? tlsFromEnv());
    const { creds, options } = channelSecurity(tls);
    this.tls = tls !== undefined;
    this.creds = creds;
    this.stub = new WindowServiceClient(this.target, creds, {
      "grpc.initial_reconnect_backoff_ms": 100,
      "grpc.max_reconnect_backoff_ms": 2_000,
      ...options,
    });
  }

  /**
   * The metadata of every call: the bearer token, when there is one. (grpc-js refuses call
   * credentials on an insecure channel, and the sidecar is often reached in plaintext on
   * localhost or a Unix socket, so the header is set by hand, with or without TLS.)
   */
  metadata(opts: { waitForReady?: boolean } = {}): Metadata {
    const md = new Metadata(opts);
    if (this.token) md.set("authorization", `Bearer ${this.token}`);
    return md;
  }

  /**
   * One grpc.health.v1 Check of `service` over the same channel: "SERVING", "NOT_SERVING"
   * (the sidecar has not reached Redis yet), … Health needs no token on the sidecar.
   */
  health(service = "window_sidecar.v1.WindowService", opts: { timeoutMs?: number } = {}): Promise<string> {
    const health = new HealthClient(this.target, this.creds, { channelOverride: this.stub.getChannel() });
    return new Promise((resolve, reject) =>
      health.Check({ service }, this.metadata(), { deadline: Date.now() + (opts.timeoutMs ?? 5_000) },
        (err: ServiceError | null, res?: { status: string }) => (err ? reject(err) : resolve(res!.status))),
    );
  }

  /**
   * Writes entries in one call: appends them to a stream (a string `to` is a stream key; with
   * `partitions`, to its partitions by each entry's key), pushes them onto a list or publishes
   * them on a channel, and returns the stream ids (empty for lists and channels). Fails with
   * ConnectionError when the sidecar cannot be reached within the client's connectTimeoutMs,
   * with WindowError (its `status`) otherwise, and with a TypeError, before anything is sent,
   * for partition options that do not go together; never retried once sent, since XADD, LPUSH
   * and PUBLISH are not idempotent.
   */
  async publish(to: PublishTarget, entries: Array<string | Buffer | PublishInput>, opts: PublishOptions = {}): Promise<string[]> {
    return (await this.publishResult(to, entries, opts)).ids;
  }

  /** publish(), answering with the whole result: the stream ids, or the receivers per channel message. */
  async publishResult(to: PublishTarget, entries: Array<string | Buffer | PublishInput>, opts: PublishOptions = {}): Promise<PublishResult> {
    const target = typeof to === "string" ? { stream: to } : to;
    const partitions = partitionCount(opts.partitions, "publish: partitions");
    const partitionBy = partitionKey(partitions, "stream" in target, opts);
    const current = opts.injectTrace === false ? undefined : activeTrace();
    const msgs: PublishEntry[] = entries.map((e) => {
      const input: PublishInput = typeof e === "string" || Buffer.isBuffer(e) ? { payload: e } : e;
      return {
        fields: [],
        payload: Buffer.isBuffer(input.payload) ? input.payload : Buffer.from(input.payload, "utf8"),
        headers: input.headers ?? {},
        trace: input.trace ?? current,
      };
    });
    const request = {
      stream: "stream" in target ? target.stream : "",
      list: "list" in target ? target.list : "",
      channel: "channel" in target ? target.channel : "",
      shardedChannel: "shardedChannel" in target ? target.shardedChannel : "",
      entries: msgs,
      maxLen: opts.maxLen ?? 0,
      framing: opts.raw ? Framing.FRAMING_RAW : Framing.FRAMING_UNSPECIFIED,
      partitions,
      partitionBy,
    };
    return this.unary(opts.timeoutMs ?? 30_000, (deadline, done) =>
      this.stub.publish(request, this.metadata(), { deadline }, (err, res) =>
        done(err, res ? { ids: res.ids, receivers: res.receivers } : undefined)),
    );
  }

  /**
   * One unary call, failing fast: a refused connection (nothing listens at the target) fails it
   * at once; a connection that is neither made nor refused is waited for connectTimeoutMs; any
   * other failure of a call that could not connect (it never left the client) is tried again
   * until then. Then, or on any other failure, the library's error (never retried once sent).
   */
  private async unary<T>(
    timeoutMs: number,
    call: (deadline: number, done: (err: ServiceError | null, res: T | undefined) => void) => { cancel(): void } | void,
    what = "publish",
  ): Promise<T> {
    const end = Date.now() + timeoutMs;
    const connectBy = Date.now() + Math.min(this.connectTimeoutMs, timeoutMs);
    const channel = this.stub.getChannel();
    let pause = 50;
    for (;;) {
      const ready = channel.getConnectivityState(true) === connectivityState.READY;
      // Reaching the sidecar is bounded by connectTimeoutMs, its answer by the call's own
      // timeout alone (longer than the sidecar's --redis-timeout, so that the sidecar's answer
      // about Redis arrives).
      let timer: NodeJS.Timeout | undefined;
      const handle: { call?: { cancel(): void } } = {};
      try {
        const answer = new Promise<T>((resolve, reject) => {
          const c = call(end, (err, res) => (err ? reject(err) : resolve(res as T)));
          if (c) handle.call = c;
        });
        if (ready) return await answer;
        const unconnected = new Promise<"unconnected">((resolve) => {
          const check = () => {
            if (channel.getConnectivityState(false) === connectivityState.READY) return;
            resolve("unconnected");
          };
          timer = setTimeout(check, Math.max(0, connectBy - Date.now()));
        });
        const first = await Promise.race([answer, unconnected]);
        if (first === "unconnected") {
          // Neither made nor refused within connectTimeoutMs.
          handle.call?.cancel();
          answer.catch(() => undefined);
          const seen = await probe(this.target, this.tls);
          throw new ConnectionError(this.target, seen ?? `no connection within ${this.connectTimeoutMs / 1000} s`, {
            status: Status.DEADLINE_EXCEEDED,
          });
        }
        return first;
      } catch (e) {
        if (e instanceof WindowError) throw e;
        const err = e as ServiceError;
        const cause = unreachableCause(err);
        if (cause !== undefined && !REFUSED.has(cause) && !cause.includes("TLS")) {
          // Something answers there that is not the sidecar: say what, at once.
          const seen = await probe(this.target, this.tls);
          if (seen !== undefined) throw new ConnectionError(this.target, seen, { details: err.details, cause: err });
          if (Date.now() + pause < connectBy) {
            await sleep(pause);
            pause = Math.min(pause * 2, 500);
            continue;
          }
        }
        throw await explain(err, this.target, what, timeoutMs, this.tls);
      } finally {
        if (timer !== undefined) clearTimeout(timer);
      }
    }
  }

  subscribe(opts: SubscribeOptions): Subscription {
    return new Subscription(this, opts);
  }

  close(): void {
    this.stub.close();
  }
}
