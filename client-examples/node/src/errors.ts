// The errors of @window-sidecar/client: one small hierarchy, each carrying the gRPC status
// underneath (`status`, a grpc status code, and `details`) where there is one, so that catching
// them needs no import of @grpc/grpc-js.
//
//   WindowError
//   ├── ConnectionError          the sidecar cannot be reached
//   ├── RejectedError            the sidecar refused a command or an outcome of a delivery
//   ├── SideEffectError          Redis answered a side effect of an acked delivery with an error
//   ├── RequeueRefusedError      Redis refused to write a retry, retryAfter or dead letter
//   ├── SubscriptionEndedError   a subscription stopped for good
//   └── AlreadySettledError      a command or an outcome for a delivery already settled

import { status as Status } from "@grpc/grpc-js";
import type { Delivery } from "./window-client";

/** The base of every error of the client. */
export class WindowError extends Error {
  /** The gRPC status code of the call that failed (undefined when no call failed). */
  readonly status: number | undefined;
  /** The status's message. */
  readonly details: string;
  constructor(message: string, opts: { status?: number; details?: string; cause?: unknown } = {}) {
    super(message, opts.cause !== undefined ? { cause: opts.cause } : undefined);
    this.name = new.target.name;
    this.status = opts.status;
    this.details = opts.details ?? "";
  }
}

/**
 * The sidecar could not be reached at `address` within the client's `connectTimeoutMs`; the
 * message names the address and the cause: `cannot reach the sidecar at 127.0.0.1:50079:
 * connection refused`.
 */
export class ConnectionError extends WindowError {
  constructor(
    readonly address: string,
    readonly reason: string,
    opts: { status?: number; details?: string; cause?: unknown } = {},
  ) {
    super(`cannot reach the sidecar at ${address}: ${reason}`, { status: Status.UNAVAILABLE, ...opts });
  }
}

/**
 * The sidecar refused a command or an outcome of `delivery` (slot `slot`). `reason` is the
 * proto's RejectionReason name without its prefix (`FORBIDDEN_COMMAND`), `command` the refused
 * command's name (empty for an outcome), `outcome` what the client settled the delivery with
 * because of it ("drop", "retry_after", or undefined when the application's own drop or retry
 * stood).
 */
export class RejectedError extends WindowError {
  outcome: string | undefined;
  constructor(
    message: string,
    readonly reason: string,
    readonly slot: number,
    readonly command: string,
    readonly delivery: Delivery | undefined,
  ) {
    super(message);
  }
}

/** How a message names an entry: its stream id, else (a list value) its slot. */
function entryName(entryId: string, slot: number): string {
  return entryId ? `entry ${entryId}` : `the entry of slot ${slot}`;
}

/**
 * A side-effect command of an acked delivery that Redis answered with an error when it ran
 * (WRONGTYPE, `ERR value is not an integer or out of range`, …), from a flush report's
 * `sideEffectFailures`. `command` is the command's name, `error` Redis's error as Redis worded
 * it, `entryId` the stream entry id (empty for a list value or a message), `slot` the
 * delivery's slot, `delivery` the delivery when the client still has it.
 *
 * `settled` says what became of the entry: true in pipeline mode, where it was acked all the
 * same (Redis has no rollback: the other commands ran); false in atomic mode, where its segment
 * stopped at the failed command (the commands before it stay applied), the entry was not acked
 * and is delivered again with its count raised, and at `maxDeliveries` goes to the dead letter
 * with Redis's error as its reason.
 */
export class SideEffectError extends WindowError {
  constructor(
    readonly slot: number,
    readonly entryId: string,
    readonly command: string,
    readonly error: string,
    readonly settled: boolean,
    readonly delivery: Delivery | undefined,
  ) {
    super(
      `side effect ${command} of ${entryName(entryId, slot)} failed: ${error} (${
        settled
          ? "settled all the same: Redis has no rollback"
          : "not settled: delivered again, and dead-lettered with this error at maxDeliveries"
      })`,
    );
  }
}

/**
 * Redis refused to write the retry, retryAfter or dead letter of an entry (out of memory, an
 * ACL without the write, a key of the wrong type, a read-only replica), from a flush report's
 * `requeueRefused`. The entry was not settled: it stays pending and is delivered again. `error`
 * is Redis's error as Redis worded it, `entryId` the stream entry id (empty for a list value),
 * `slot` the delivery's slot (0 for an entry moved to the dead letter past `maxDeliveries`
 * without being delivered), `outcome` the outcome whose write was refused ("retry",
 * "retry_after", "dead_letter"; undefined when the client does not know it), `delivery` the
 * delivery when the client still has it.
 */
export class RequeueRefusedError extends WindowError {
  constructor(
    readonly slot: number,
    readonly entryId: string,
    readonly error: string,
    readonly outcome: string | undefined,
    readonly delivery: Delivery | undefined,
  ) {
    const what =
      outcome === "retry" ? "retry"
      : outcome === "retry_after" ? "retryAfter"
      : outcome === "dead_letter" || slot === 0 ? "dead letter"
      : "requeue";
    super(`${what} of ${entryName(entryId, slot)} not written: ${error}; it stays pending and is delivered again`);
  }
}

/**
 * A subscription stopped for good: `attempts` consecutive opens failed (`maxAttempts`), or the
 * sidecar answered with a status no retry fixes (UNAUTHENTICATED, INVALID_ARGUMENT, …).
 */
export class SubscriptionEndedError extends WindowError {
  constructor(
    message: string,
    readonly attempts: number,
    opts: { status?: number; details?: string; cause?: unknown } = {},
  ) {
    super(message, opts);
  }
}

/** A command was queued for, or an outcome given to, a delivery that is already settled. */
export class AlreadySettledError extends WindowError {
  constructor(
    message: string,
    readonly slot: number,
    readonly outcome: string | undefined,
  ) {
    super(message);
  }
}

/** @deprecated The name of AlreadySettledError before the clients shared one vocabulary. */
export const SettledError = AlreadySettledError;
/** @deprecated The name of AlreadySettledError before the clients shared one vocabulary. */
export type SettledError = AlreadySettledError;

/** @internal The cause, in a few words, when a call's error says it could not connect; else undefined. */
export function unreachableCause(err: { code?: number; details?: string; message?: string }): string | undefined {
  if (err.code !== Status.UNAVAILABLE) return undefined;
  const details = err.details ?? err.message ?? "";
  const text = details.toLowerCase();
  const connecting =
    text.includes("failed to connect") ||
    text.includes("connect failed") ||
    text.includes("connection refused") ||
    text.includes("no connection established") ||
    text.includes("dns resolution failed") ||
    text.includes("name resolution failed") ||
    text.includes("errors resolving") ||
    text.includes("no such file or directory") ||
    text.includes("econnrefused") ||
    text.includes("enoent");
  if (!connecting) return undefined;
  if (text.includes("connection refused") || text.includes("econnrefused")) return "connection refused";
  if (text.includes("no such file or directory") || text.includes("enoent")) return "no such socket";
  if (text.includes("resolution failed") || text.includes("errors resolving") || text.includes("enotfound")) return "the host name does not resolve";
  const m = /last error: (?:Error: )?(.*)$/i.exec(details);
  return m ? m[1] : details;
}

/** @internal The library's error for a failed unary call of @grpc/grpc-js. */
export function fromServiceError(err: { code?: number; details?: string; message?: string }, address: string): WindowError {
  const reason = unreachableCause(err);
  if (reason !== undefined) return new ConnectionError(address, reason, { details: err.details, cause: err });
  const name = err.code !== undefined ? (Status[err.code] ?? String(err.code)) : "UNKNOWN";
  const details = err.details ?? err.message ?? "";
  return new WindowError(details ? `${name}: ${details}` : name, { status: err.code, details, cause: err });
}
