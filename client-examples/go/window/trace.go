package window

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// The trace context travels as W3C traceparent/tracestate (TraceContext messages), converted
// from and to OpenTelemetry's span context with its W3C propagator, whatever global propagator
// the application configured.
var w3c = propagation.TraceContext{}

// TraceFromContext is the W3C trace context of ctx's OpenTelemetry span (trace.SpanContextFromContext),
// nil when ctx has no valid span context. Publish carries it with every message that has no
// Trace of its own; SetTrace attaches it to an outcome.
func TraceFromContext(ctx context.Context) *windowv1.TraceContext {
	if ctx == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := carrier{}
	w3c.Inject(ctx, c)
	if c["traceparent"] == "" {
		return nil
	}
	return &windowv1.TraceContext{Traceparent: c["traceparent"], Tracestate: c["tracestate"]}
}

// ContextWithTrace returns parent carrying tc as its remote OpenTelemetry span context, so that
// a span started from it (tracer.Start) continues tc's trace. parent unchanged when tc is
// empty or malformed.
func ContextWithTrace(parent context.Context, tc *windowv1.TraceContext) context.Context {
	if tc.GetTraceparent() == "" {
		return parent
	}
	return w3c.Extract(parent, carrier{
		"traceparent": tc.GetTraceparent(), "tracestate": tc.GetTracestate(),
	})
}

// Context is parent with the delivery's trace context (the producer's, or the sidecar's read
// span) as its remote span context: start the handling span from it.
func (d *Delivery) Context(parent context.Context) context.Context {
	return ContextWithTrace(parent, d.Trace)
}

// SetTrace attaches the trace context of ctx's span (the span that handled the delivery) to the
// delivery's outcome, given afterwards: the sidecar's flush span links to it. Without a valid
// span context in ctx it clears it. An acked delivery with a trace context is sent as an
// outcome even with PackedAcks.
func (d *Delivery) SetTrace(ctx context.Context) {
	tc := TraceFromContext(ctx)
	d.sess.mu.Lock()
	d.trace = tc
	d.sess.mu.Unlock()
}

// carrier is a map as a propagation.TextMapCarrier (otel's MapCarrier, newer than v1.1).
type carrier map[string]string

func (c carrier) Get(key string) string { return c[key] }

func (c carrier) Set(key, value string) { c[key] = value }

func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
