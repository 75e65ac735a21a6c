package window

import (
	"context"
	"errors"
	"testing"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// Run: a handler that returns nil acks what it did not settle; an error or a panic settles it
// with retry_after 1 s and "handler failed: …"; a handler's own outcome stands.
func TestRunHandlerRule(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, batches(got, read(1, 1, "ok", "err", "panic", "drop")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(func(_ context.Context, d *Delivery) error {
			d.Queue("INCR", d.EntryID)
			switch d.EntryID {
			case "err":
				return errors.New("boom")
			case "panic":
				panic("kaboom")
			case "drop":
				return d.Drop("no")
			}
			return nil
		})
	}()
	b := nextBatch(t, got)
	if len(b.Outcomes) != 4 || len(b.Commands) != 1 || string(b.Commands[0].GetArgs()[0]) != "ok" {
		t.Fatalf("batch: %v", b)
	}
	want := []struct {
		kind   windowv1.OutcomeKind
		reason string
	}{
		{windowv1.OutcomeKind_OUTCOME_KIND_ACK, ""},
		{windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER, "handler failed: boom"},
		{windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER, "handler failed: panic: kaboom"},
		{windowv1.OutcomeKind_OUTCOME_KIND_DROP, "no"},
	}
	for i, o := range b.Outcomes {
		if o.GetKind() != want[i].kind || o.GetReason() != want[i].reason {
			t.Fatalf("outcome %d: %v", i, o)
		}
		if o.GetKind() == windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER && o.GetDelay().AsDuration() != RejectedRetryDelay {
			t.Fatalf("outcome %d: delay %v", i, o.GetDelay().AsDuration())
		}
	}
	if err := sub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
