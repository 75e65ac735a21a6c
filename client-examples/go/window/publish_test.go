package window

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

type publishTargets struct {
	windowv1.UnimplementedWindowServiceServer
	reqs chan *windowv1.PublishRequest
}

func (p *publishTargets) Publish(_ context.Context, r *windowv1.PublishRequest) (*windowv1.PublishResponse, error) {
	p.reqs <- r
	return &windowv1.PublishResponse{Receivers: []uint64{1}}, nil
}

// Publish to a list, a channel and a sharded channel; the trace context of the context (an
// OpenTelemetry span) rides with every message without one of its own. Dial("") takes
// WINDOW_SIDECAR_ADDR.
func TestPublishTargetsAndTheAddressOfTheEnvironment(t *testing.T) {
	spy := &publishTargets{reqs: make(chan *windowv1.PublishRequest, 4)}
	t.Setenv(AddrEnv, serve(t, spy))
	c, err := Dial("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := trace.ContextWithSpanContext(context.Background(), spanContext(t))
	own := &windowv1.TraceContext{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	if err := c.PublishList(ctx, "jobs", Message{Payload: []byte("a"), Headers: map[string]string{"k": "v"}}, Message{Payload: []byte("b"), Trace: own}); err != nil {
		t.Fatal(err)
	}
	r := <-spy.reqs
	if r.GetList() != "jobs" || r.GetStream() != "" || len(r.Entries) != 2 || r.Entries[0].GetHeaders()["k"] != "v" ||
		r.Entries[0].GetTrace().GetTraceparent() != "00-"+spanContext(t).TraceID().String()+"-"+spanContext(t).SpanID().String()+"-01" ||
		r.Entries[1].GetTrace().GetTraceparent() != own.GetTraceparent() {
		t.Fatalf("list: %v", r)
	}
	if n, err := c.PublishChannel(context.Background(), "news", Message{Payload: []byte("x")}); err != nil || len(n) != 1 {
		t.Fatalf("channel: %v %v", n, err)
	}
	if r := <-spy.reqs; r.GetChannel() != "news" || r.Entries[0].GetTrace() != nil {
		t.Fatalf("channel: %v", r)
	}
	if _, err := c.PublishShardedChannel(context.Background(), "{t}news", Message{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if r := <-spy.reqs; r.GetShardedChannel() != "{t}news" {
		t.Fatalf("sharded: %v", r)
	}
	if _, err := c.PublishTo(context.Background(), Target{Stream: "s", List: "l"}); err == nil {
		t.Fatal("two targets: no error")
	}
}

// A partitioned publish carries the number and the key it is routed by (a header or a field);
// a combination that cannot route is refused before the call, saying what is missing.
func TestPublishPartitioned(t *testing.T) {
	spy := &publishTargets{reqs: make(chan *windowv1.PublishRequest, 4)}
	c, err := Dial(serve(t, spy))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	msg := Message{Payload: []byte("a"), Headers: map[string]string{"customer": "c1"}}
	if _, err := c.PublishTo(ctx, Target{Stream: "orders", Partitions: 4, PartitionHeader: "customer", MaxLen: 100}, msg); err != nil {
		t.Fatal(err)
	}
	if r := <-spy.reqs; r.GetStream() != "orders" || r.GetPartitions() != 4 || r.GetPartitionBy().GetHeader() != "customer" ||
		r.GetMaxLen() != 100 || len(r.GetEntries()) != 1 {
		t.Fatalf("by header: %v", r)
	}
	if _, err := c.PublishTo(ctx, Target{Stream: "orders", Partitions: 8, PartitionField: "customer_id"}, msg); err != nil {
		t.Fatal(err)
	}
	if r := <-spy.reqs; r.GetPartitions() != 8 || r.GetPartitionBy().GetField() != "customer_id" {
		t.Fatalf("by field: %v", r)
	}
	if _, err := c.Publish(ctx, "orders", msg); err != nil {
		t.Fatal(err)
	}
	if r := <-spy.reqs; r.GetPartitions() != 0 || r.GetPartitionBy() != nil {
		t.Fatalf("unpartitioned: %v", r)
	}
	for _, tc := range []struct {
		target Target
		says   string
	}{
		{Target{Stream: "orders", Partitions: 4}, "PartitionHeader"},
		{Target{Stream: "orders", Partitions: 4, PartitionHeader: "customer", PartitionField: "customer_id"}, "not both"},
		{Target{Stream: "orders", PartitionHeader: "customer"}, "set Partitions too"},
		{Target{Stream: "orders", PartitionField: "customer_id"}, "set Partitions too"},
		{Target{List: "jobs", Partitions: 4, PartitionHeader: "customer"}, "for a stream"},
		{Target{Channel: "news", Partitions: 4, PartitionHeader: "customer"}, "for a stream"},
		{Target{ShardedChannel: "{t}news", Partitions: 4, PartitionHeader: "customer"}, "for a stream"},
	} {
		if _, err := c.PublishTo(ctx, tc.target, msg); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("%+v: %v, want an error saying %q", tc.target, err, tc.says)
		}
	}
	select {
	case r := <-spy.reqs:
		t.Fatalf("a refused publish was sent: %v", r)
	default:
	}
}

// The delivery's trace context becomes the remote parent of the handling context.
func TestDeliveryContext(t *testing.T) {
	sc := spanContext(t)
	d := &Delivery{Trace: &windowv1.TraceContext{Traceparent: "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01", Tracestate: "k=v"}}
	got := trace.SpanContextFromContext(d.Context(context.Background()))
	if !got.IsRemote() || got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || got.TraceState().Get("k") != "v" {
		t.Fatalf("span context: %+v", got)
	}
	if ctx := (&Delivery{}).Context(context.Background()); trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("a span context without a trace")
	}
}

func spanContext(t *testing.T) trace.SpanContext {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
}
