package window

import (
	"context"
	"testing"
	"time"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

func recvBatch(t *testing.T, sub *Subscription) *Batch {
	t.Helper()
	select {
	case b, ok := <-sub.Batches():
		if !ok {
			t.Fatalf("subscription ended: %v", sub.Err())
		}
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("no batch")
	}
	return nil
}

// Batches: each read handed out whole, reads that came before the receive one batch each; a
// delivery settled on its own, the rest with one call, which reaches the sidecar as settling
// each delivery would.
func TestBatches(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, batches(got, read(1, 1, "1-0", "2-0", "3-0"), read(2, 4, "4-0", "5-0")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	first := recvBatch(t, sub)
	if first.ReadID != 1 || len(first.Deliveries) != 3 || len(first.Unsettled()) != 3 {
		t.Fatalf("first batch: read %d, %d deliveries", first.ReadID, len(first.Deliveries))
	}
	first.Deliveries[1].Drop("bad")
	first.Deliveries[0].Queue("INCR", "n")
	if n := len(first.Unsettled()); n != 2 {
		t.Fatalf("unsettled after one drop: %d", n)
	}
	if err := first.Ack(); err != nil {
		t.Fatal(err)
	}
	second := recvBatch(t, sub)
	if second.ReadID != 2 || len(second.Deliveries) != 2 {
		t.Fatalf("second batch: read %d, %d deliveries", second.ReadID, len(second.Deliveries))
	}
	if err := second.Retry("later"); err != nil {
		t.Fatal(err)
	}
	if n := len(second.Unsettled()); n != 0 {
		t.Fatalf("unsettled after Retry: %d", n)
	}
	var outcomes []string
	commands := 0
	for len(outcomes) < 5 {
		b := nextBatch(t, got)
		commands += len(b.GetCommands())
		for _, o := range b.GetOutcomes() {
			outcomes = append(outcomes, o.GetKind().String()+" "+o.GetReason())
		}
	}
	want := []string{
		"OUTCOME_KIND_DROP bad", "OUTCOME_KIND_ACK ", "OUTCOME_KIND_ACK ",
		"OUTCOME_KIND_RETRY later", "OUTCOME_KIND_RETRY later",
	}
	for i := range want {
		if outcomes[i] != want[i] {
			t.Fatalf("outcomes %q, want %q", outcomes, want)
		}
	}
	if commands != 1 {
		t.Fatalf("%d commands, want the one queued", commands)
	}
	// Settled already: nothing more to settle, no error.
	if err := first.Ack(); err != nil {
		t.Fatal(err)
	}
}
