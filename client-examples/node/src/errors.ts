// The errors of @window-sidecar/client: one small hierarchy, each carrying the gRPC status
// underneath (`status`, a grpc status code, and `details`) where there is one, so that catching
// them needs no import of @grpc/grpc-js.
//
//   WindowError
//   ├── ConnectionError          the sidecar cannot be reached: nothing listens, the name does
//   │                            not resolve, TLS fails, or what answers is not the sidecar
//   │                            (Redis, an HTTP/1 server, a URL given as the address)
//   ├── RedisUnavailableError    the sidecar answered, and said that Redis is unavailable
//   ├── RefusedError             the sidecar refused the call (token, policy, request, limit)
//   ├── CallTimeoutError         the sidecar was reached but did not answer within the timeout
//   ├── RejectedError            the sidecar refused a command or an outcome of a delivery
//   ├── SideEffectError          Redis answered a side effect of an acked delivery with an error
//   ├── RequeueRefusedError      Redis refused to write a retry, retryAfter or dead letter
//   ├── SubscriptionEndedError   a subscription stopped for good
//   └── AlreadySettledError      a command or an outcome for a delivery already settled

import { connect } from "node:net";
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
    const step = nextStep(reason);
    super(`cannot reach the sidecar at ${address}: ${reason}${step ? `; ${step}` : ""}`, { status: Status.UNAVAILABLE, ...opts });
  }
}

/** @internal Whether `e` is a ConnectionError whose probe found something else than the sidecar at the address (Redis, an HTTP/1 server, a TLS server reached in plaintext): no retry fixes it. */
export function notTheSidecar(e: unknown): boolean {
  return e instanceof ConnectionError && /^(a Redis server|an HTTP\/1 server|a TLS server|an HTTP server) answers/.test(e.reason);
}

/** Where a message tells the user to point the client. */
const LISTEN_HINT =
  "set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its --listen (127.0.0.1:50051 by default)";

/** What to do about an unreachable sidecar, by its cause. */
function nextStep(cause: string): string {
  const text = cause.toLowerCase();
  if (/^(a redis server|an http\/1 server|a tls server|an http server|the address is a)/.test(text)) return "";
  if (text.includes("connection refused") || text.includes("no such socket")) return `nothing listens there: start the sidecar, or ${LISTEN_HINT}`;
  if (text.includes("does not resolve")) return "check the host name in the address";
  if (/tls|ssl|certificate|handshake/.test(text)) {
    return "check WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY) against the sidecar's --tls-cert, or unset them for a plaintext sidecar";
  }
  if (text.includes("no connection within") || text.includes("timed out")) return "check the address, and that no firewall drops the connection";
  return `is the sidecar running there? ${LISTEN_HINT}`;
}

/**
 * The sidecar at `address` answered the call, and its answer is that Redis is unavailable
 * (UNAVAILABLE from the sidecar: Redis is unreachable, did not answer within the sidecar's
 * --redis-timeout, or refused its credentials); `details` is the sidecar's message. The sidecar
 * itself is reachable: the fault is between it and Redis.
 */
export class RedisUnavailableError extends WindowError {
  constructor(
    readonly address: string,
    details: string,
    readonly call = "the call",
    opts: { cause?: unknown } = {},
  ) {
    super(
      `the sidecar at ${address} answered ${call} that Redis is unavailable: ${details}; check that Redis is up and that the sidecar's --redis-url reaches it (the sidecar's log says more)`,
      { status: Status.UNAVAILABLE, details, ...opts },
    );
  }
}

/** What a refused call's reason (its status) asks the caller to do. */
const REFUSAL_STEPS: Record<string, string> = {
  UNAUTHENTICATED: "set WINDOW_SIDECAR_TOKEN to the token of the sidecar's --auth-token-file",
  PERMISSION_DENIED: "the sidecar's policy or Redis's ACL does not allow it",
  INVALID_ARGUMENT: "the request is not one the sidecar accepts; fix it, retrying will not help",
  FAILED_PRECONDITION: "Redis holds something else at that key, or refuses the command; retrying will not help",
  RESOURCE_EXHAUSTED: "a limit of the sidecar: send less, or raise the limit",
  OUT_OF_RANGE: "a limit of the sidecar: send less, or raise the limit",
  ALREADY_EXISTS: "the name is taken",
};

/**
 * The sidecar at `address` refused the call: `reason` is the status's name (UNAUTHENTICATED,
 * PERMISSION_DENIED, INVALID_ARGUMENT, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, …) and
 * `details` the sidecar's reason. The same call gets the same answer. (A command or an outcome
 * of a delivery the sidecar refuses is a RejectedError.)
 */
export class RefusedError extends WindowError {
  readonly reason: string;
  constructor(
    readonly address: string,
    code: number,
    details: string,
    readonly call = "the call",
    opts: { cause?: unknown } = {},
  ) {
    const reason = Status[code] ?? String(code);
    const step = REFUSAL_STEPS[reason];
    super(`the sidecar at ${address} refused ${call}: ${reason}: ${details}${step ? ` (${step})` : ""}`, { status: code, details, ...opts });
    this.reason = reason;
  }
}

/**
 * The sidecar at `address` was reached, but no answer to the call came within its timeout
 * (`timeoutMs`). The sidecar answers within its --redis-timeout (5 s by default) even when Redis
 * does not, and the client's call timeouts are longer, so this means a sidecar too busy to
 * answer, or a timeout shorter than its --redis-timeout. A publish that timed out may have been
 * written.
 */
export class CallTimeoutError extends WindowError {
  constructor(
    readonly address: string,
    readonly timeoutMs: number | undefined,
    readonly call = "the call",
    opts: { details?: string; cause?: unknown } = {},
  ) {
    const within = timeoutMs !== undefined ? ` within ${timeoutMs / 1000} s` : " in time";
    super(
      `the sidecar at ${address} did not answer ${call}${within}; the sidecar itself waits up to its --redis-timeout (5 s by default) for Redis, so a longer silence means it is overloaded or stuck (see its log and metrics), or the call's timeout is shorter than its --redis-timeout; a publish may have been written`,
      { status: Status.DEADLINE_EXCEEDED, ...opts },
    );
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
  const details = err.details ?? err.message ?? "";
  // (The sidecar's answer about Redis may quote Redis's own "Connection refused".)
  if (err.code !== Status.UNAVAILABLE || REDIS_UNAVAILABLE.some((m) => details.includes(m))) return undefined;
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
  const cause = m ? m[1] : details;
  if (/ssl|tls|handshake|certificate/.test(text)) return `the TLS handshake failed (${cause})`;
  return cause;
}

/** The sidecar's own messages for an unavailable Redis (its UNAVAILABLE answers), as opposed to an UNAVAILABLE grpc-js makes up for a broken transport. */
export const REDIS_UNAVAILABLE = ["Redis is unreachable", "Redis did not answer in time", "authentication to Redis failed"];

/** The causes that need no probe of the address: nothing listens there, or no such host. */
const PLAIN_CAUSES: ReadonlySet<string> = new Set(["connection refused", "no such socket", "the host name does not resolve"]);

// What grpc-js says when what answered does not speak the sidecar's HTTP/2 gRPC (a Redis
// server, an HTTP/1 server, an HTTP server's 404) or the connection broke.
const TRANSPORT = /http2|http\/2|http status code|content-type|protocol error|socket closed|connection reset|econnreset|stream removed|goaway|bad http|unexpected eof|connection closed|premature close/i;

/** @internal Whether a call failed below the sidecar's answers (gRPC saw something else than the sidecar's HTTP/2, or the connection broke). */
export function transportFailure(err: { code?: number; details?: string; message?: string }): boolean {
  if (unreachableCause(err) !== undefined) return true;
  const details = err.details ?? err.message ?? "";
  if (REDIS_UNAVAILABLE.some((m) => details.includes(m))) return false; // the sidecar's own answer
  return (
    (err.code === Status.UNAVAILABLE || err.code === Status.UNIMPLEMENTED || err.code === Status.INTERNAL || err.code === Status.UNKNOWN) &&
    TRANSPORT.test(details)
  );
}

/** The probe's line: Redis reads an inline PING (with arguments it refuses: -ERR), an HTTP/1 server a request line (HTTP/1.x 4xx). */
export const PROBE = "PING / HTTP/1.0\r\n\r\n";

/** @internal What kind of server sent `reply` to the probe's line, as a ConnectionError's cause; undefined when it is none the client knows. */
export function whatAnswers(reply: Buffer, tls = false): string | undefined {
  const text = reply.toString("latin1");
  if (/^(\+PONG|-ERR|-NOAUTH|-WRONGPASS|-NOPERM|-DENIED|-LOADING|-MISCONF|-READONLY|-MASTERDOWN)/.test(text)) {
    return `a Redis server answers there, not the sidecar; ${LISTEN_HINT} (the sidecar reaches Redis through its own --redis-url)`;
  }
  if (text.startsWith("HTTP/1.")) {
    return `an HTTP/1 server answers there (the sidecar's metrics and probes port, --metrics-listen?), not the sidecar's gRPC port; ${LISTEN_HINT}`;
  }
  if (!tls && reply[0] === 0x15 && reply[1] === 0x03) {
    return "a TLS server answers there and the client speaks plaintext; set WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY for mutual TLS) to connect with TLS";
  }
  return undefined;
}

/** @internal Where to probe a target: a host and port, or a Unix socket's path; undefined for a target the probe does not understand. */
function probeAddress(target: string): { host: string; port: number } | { path: string } | undefined {
  if (target.startsWith("unix:")) {
    const path = target.slice("unix:".length);
    return { path: path.startsWith("//") ? "/" + path.replace(/^\/+/, "") : path };
  }
  const bare = target.replace(/^(dns:\/\/\/|dns:|ipv4:|ipv6:)/, "");
  const i = bare.lastIndexOf(":");
  if (i < 0 || !/^\d+$/.test(bare.slice(i + 1))) return undefined;
  return { host: bare.slice(0, i).replace(/^\[|\]$/g, "") || "127.0.0.1", port: Number(bare.slice(i + 1)) };
}

/**
 * @internal Connects to `target` once with a raw socket, sends PROBE and reads the reply: the
 * cause to report when a Redis server, an HTTP/1 server (the sidecar's metrics port) or a TLS
 * server answers there; undefined when it cannot tell.
 */
export function probe(target: string, tls = false, timeoutMs = 1_000): Promise<string | undefined> {
  const where = probeAddress(target);
  if (where === undefined) return Promise.resolve(undefined);
  return new Promise((resolve) => {
    const socket = connect(where);
    let reply = Buffer.alloc(0);
    const finish = (answer: string | undefined) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(answer);
    };
    const timer = setTimeout(() => finish(reply.length ? whatAnswers(reply, tls) : undefined), timeoutMs);
    socket.on("connect", () => socket.write(PROBE));
    socket.on("data", (chunk: Buffer) => {
      reply = Buffer.concat([reply, chunk]);
      if (reply.length >= 8) finish(whatAnswers(reply, tls));
    });
    socket.on("error", () => finish(undefined));
    socket.on("close", () => finish(reply.length ? whatAnswers(reply, tls) : undefined));
  });
}

/** @internal Why `target` is not an address the client can use (a URL where host:port or unix:/path is expected); undefined otherwise. */
export function addressProblem(target: string): string | undefined {
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/(.*)$/.exec(target);
  if (!m || ["dns", "unix", "unix-abstract", "ipv4", "ipv6"].includes(m[1].toLowerCase())) return undefined;
  const scheme = m[1].toLowerCase();
  const rest = m[2].split("/")[0].split("@").pop() ?? "";
  if (scheme === "redis" || scheme === "rediss") {
    return `the address is a Redis URL; ${LISTEN_HINT}, not Redis's (that one goes to the sidecar's --redis-url)`;
  }
  let hint = rest ? `give ${rest}` : "give host:port";
  if (scheme === "https") hint += " and WINDOW_SIDECAR_TLS_CA for TLS";
  return `the address is a URL, and the sidecar takes host:port or unix:/path: ${hint} (WINDOW_SIDECAR_ADDR or the client's address)`;
}

type RpcError = { code?: number; details?: string; message?: string };

/**
 * @internal The library's error for a failed call, by its cause; a failure below the sidecar's
 * answers probes the address once to say what answers there instead (Redis, an HTTP/1 server, TLS).
 */
export async function explain(err: RpcError, address: string, call = "the call", timeoutMs?: number, tls = false): Promise<WindowError> {
  const cause = unreachableCause(err);
  const tlsFailed = cause !== undefined && cause.startsWith("the TLS handshake failed");
  if ((cause === undefined || !PLAIN_CAUSES.has(cause)) && !tlsFailed && transportFailure(err)) {
    const seen = await probe(address, tls);
    const details = err.details ?? err.message ?? "";
    if (seen !== undefined) return new ConnectionError(address, seen, { status: err.code, details, cause: err });
    let why = cause;
    if (why === undefined) {
      const m = /(?:http2 header with status:|HTTP status code) (\d+)/i.exec(details);
      why = m ? `an HTTP server answers there with ${m[1]}, not the sidecar's gRPC service` : `the connection failed (${details})`;
    }
    return new ConnectionError(address, why, { status: err.code, details, cause: err });
  }
  return fromServiceError(err, address, call, timeoutMs);
}

/** @internal The library's error for a failed call of @grpc/grpc-js, without a probe. */
export function fromServiceError(err: RpcError, address: string, call = "the call", timeoutMs?: number): WindowError {
  const reason = unreachableCause(err);
  if (reason !== undefined) return new ConnectionError(address, reason, { details: err.details, cause: err });
  const name = err.code !== undefined ? (Status[err.code] ?? String(err.code)) : "UNKNOWN";
  const details = err.details ?? err.message ?? "";
  if (err.code === Status.UNAVAILABLE && REDIS_UNAVAILABLE.some((m) => details.includes(m))) {
    return new RedisUnavailableError(address, details, call, { cause: err });
  }
  if (err.code === Status.DEADLINE_EXCEEDED) return new CallTimeoutError(address, timeoutMs, call, { details, cause: err });
  if (err.code !== undefined && name in REFUSAL_STEPS) return new RefusedError(address, err.code, details, call, { cause: err });
  return new WindowError(details ? `${name}: ${details}` : name, { status: err.code, details, cause: err });
}
