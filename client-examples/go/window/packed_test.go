package window

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// batches is a script that sends opened and the given messages, then passes every batch on.
func batches(got chan<- *windowv1.Batch, msgs ...*windowv1.SubscribeResponse) func(*testing.T, windowv1.WindowService_SubscribeServer) error {
	return answering(got, nil, msgs...)
}

func nextBatch(t *testing.T, got <-chan *windowv1.Batch) *windowv1.Batch {
	t.Helper()
	select {
	case b := <-got:
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("no batch")
	}
	return nil
}

// PackedAcks: plain acks go as slot ids in `acks`, other outcomes (and acks with a reason or a
// trace context) as outcomes; the commands of acked deliveries go first either way.
func TestPackedAcks(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, batches(got, read(1, 1, "1-0", "2-0", "3-0")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, PackedAcks: true, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	d1, d2, d3 := recvDelivery(t, sub), recvDelivery(t, sub), recvDelivery(t, sub)
	d1.Queue("INCR", "a")
	d1.Ack()
	d2.Drop("bad")
	ctx := trace.ContextWithSpanContext(context.Background(), spanContext(t))
	d3.SetTrace(ctx)
	d3.Queue("INCR", "c")
	d3.Ack()
	b := nextBatch(t, got)
	if len(b.Acks) != 1 || b.Acks[0] != 1 || len(b.Commands) != 2 || len(b.Outcomes) != 2 ||
		b.Outcomes[0].GetKind() != windowv1.OutcomeKind_OUTCOME_KIND_DROP ||
		b.Outcomes[1].GetSlot() != 3 || b.Outcomes[1].GetTrace().GetTraceparent() == "" {
		t.Fatalf("batch: %v", b)
	}
}

// ReportsInReads: the Open asks for it, and a report carried in a read reaches OnFlush before
// the read's deliveries are handed out.
func TestReportsInReads(t *testing.T) {
	flushes := make(chan Flush, 2)
	c, _ := start(t, func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		s.Send(opened())
		s.Send(read(1, 1, "1-0"))
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		if len(m.GetBatch().GetOutcomes()) != 1 {
			t.Errorf("batch: %v", m)
		}
		r := read(2, 2, "2-0")
		r.GetRead().Flushed = &windowv1.FlushReport{ReadId: 1, Ok: true, Settles: 1}
		s.Send(r)
		for {
			if _, err := s.Recv(); err != nil {
				return nil
			}
		}
	})
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, ReportsInReads: true, Logf: quiet,
		OnFlush: func(f Flush) { flushes <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	if open, _ := sub.opts.open(); !open.GetReportsInReads() {
		t.Fatal("Open without reports_in_reads")
	}
	d := recvDelivery(t, sub)
	d.Ack()
	d2 := recvDelivery(t, sub)
	select {
	case f := <-flushes:
		if f.Report.GetReadId() != 1 || len(f.Settled) != 1 || f.Settled[0] != d {
			t.Fatalf("flush: %+v", f)
		}
	default:
		t.Fatal("the report in the read did not reach OnFlush before its deliveries")
	}
	if d2.EntryID != "2-0" {
		t.Fatalf("delivery %s", d2.EntryID)
	}
	d2.Ack()
}
