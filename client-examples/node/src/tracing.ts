// Optional OpenTelemetry support, through @opentelemetry/api (an optional peer dependency).
//
// When the application has @opentelemetry/api installed, every delivery handed out is handled
// in a span whose parent is the delivery's W3C trace context (the producer's, or the sidecar's
// read span), and publish() carries the active context into the entries it sends. Without the
// package every function here is a cheap no-op. Spans are only recorded when the application
// registers an SDK tracer provider, and the active context only flows through async code when it
// registers a context manager (both as usual with OpenTelemetry).
//
// The W3C traceparent is read and written here rather than through a registered propagator, so
// the trace context goes in and out whatever propagator the application set up (or none).
// Nothing of @opentelemetry/api appears in this module's declarations: the package's types work
// without it.

import type * as OtelApi from "@opentelemetry/api";

type Api = typeof OtelApi;

let api: Api | null | undefined;

// @opentelemetry/api when the application has it installed, else null (looked up once).
function otel(): Api | null {
  if (api === undefined) {
    try {
      api = require("@opentelemetry/api") as Api;
    } catch {
      api = null;
    }
  }
  return api;
}

export interface W3CTrace {
  traceparent: string;
  tracestate: string;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** @internal The span context a traceparent names, or undefined when it is missing or malformed. */
function parse(o: Api, trace: W3CTrace | undefined): OtelApi.SpanContext | undefined {
  const m = trace?.traceparent ? TRACEPARENT.exec(trace.traceparent.trim().toLowerCase()) : null;
  if (!m || m[1] === "ff") return undefined;
  const sc: OtelApi.SpanContext = {
    traceId: m[2],
    spanId: m[3],
    traceFlags: parseInt(m[4], 16) & 1,
    isRemote: true,
  };
  if (trace!.tracestate) sc.traceState = o.createTraceState(trace!.tracestate);
  return o.isSpanContextValid(sc) ? sc : undefined;
}

/** @internal The W3C form of a span context (empty strings when it is not valid). */
function format(o: Api, sc: OtelApi.SpanContext | undefined): W3CTrace | undefined {
  if (!sc || !o.isSpanContextValid(sc)) return undefined;
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
  return { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}`, tracestate: sc.traceState?.serialize() ?? "" };
}

/** @internal The active context's trace (for PublishEntry.trace), or undefined. */
export function activeTrace(): W3CTrace | undefined {
  const o = otel();
  if (!o) return undefined;
  return format(o, o.trace.getSpanContext(o.context.active()));
}

/** @internal The span of one delivery: started when it is handed out, ended when it is settled. */
export class DeliverySpan {
  private ended = false;
  private constructor(
    private readonly o: Api,
    private readonly span: OtelApi.Span,
    /** The context to run the delivery's handling in: the span's, under the delivery's parent. */
    private readonly context: OtelApi.Context,
  ) {}

  static start(name: string, parent: W3CTrace | undefined, attributes: Record<string, string | number>): DeliverySpan | undefined {
    const o = otel();
    if (!o) return undefined;
    const sc = parse(o, parent);
    const parentCtx = sc ? o.trace.setSpanContext(o.ROOT_CONTEXT, sc) : o.ROOT_CONTEXT;
    const span = o.trace
      .getTracer("@window-sidecar/client")
      .startSpan(name, { kind: o.SpanKind.CONSUMER, attributes }, parentCtx);
    return new DeliverySpan(o, span, o.trace.setSpan(parentCtx, span));
  }

  /** Runs fn with the span's context active. */
  with<T>(fn: () => T): T {
    return this.o.context.with(this.context, fn);
  }

  /** The span's W3C trace context for Outcome.trace, when the span is recorded. */
  outcomeTrace(): W3CTrace | undefined {
    return this.span.isRecording() ? format(this.o, this.span.spanContext()) : undefined;
  }

  end(outcome: string, error?: string): void {
    if (this.ended) return;
    this.ended = true;
    this.span.setAttribute("window.outcome", outcome);
    if (error !== undefined) this.span.setStatus({ code: this.o.SpanStatusCode.ERROR, message: error });
    this.span.end();
  }
}
