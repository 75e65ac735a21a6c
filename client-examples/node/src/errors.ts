// The errors of @window-sidecar/client: one small hierarchy, each carrying the gRPC status
// underneath (`status`, a grpc status code, and `details`) where there is one, so that catching
// them needs no import of @grpc/grpc-js.
//
//   WindowError
//   ├── ConnectionError          the sidecar cannot be reached
//   ├── RejectedError            the sidecar refused a command or an outcome of a delivery
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
