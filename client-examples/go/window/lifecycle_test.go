package window

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// Draining: OnDraining is called, what was settled goes out at once, nothing more is handed
// out, each later outcome is sent as it is given, and the subscription resubscribes when the
// stream ends (OnOpened with Resubscribed).
func TestDraining(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	draining := make(chan struct{})
	c, _ := start(t,
		func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
			s.Send(opened())
			s.Send(read(1, 1, "1-0", "2-0", "3-0"))
			<-draining
			s.Send(&windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Draining{Draining: &windowv1.Draining{
				Grace: durationpb.New(5 * time.Second), Outstanding: 3}}})
			for i := 0; i < 2; i++ {
				m, err := s.Recv()
				if err != nil {
					return nil
				}
				got <- m.GetBatch()
			}
			return status.Error(codes.Unavailable, "shutting down")
		},
		batches(got, read(1, 1, "3-0")),
	)
	opens := make(chan Opened, 2)
	drains := make(chan Draining, 1)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Logf: quiet,
		OnOpened: func(o Opened) { opens <- o }, OnDraining: func(d Draining) { drains <- d }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	if o := <-opens; o.Resubscribed || o.Consumer != "c" {
		t.Fatalf("first open: %+v", o)
	}
	d1, d2 := recvDelivery(t, sub), recvDelivery(t, sub)
	d1.Ack()
	close(draining)
	select {
	case dr := <-drains:
		if dr.Grace != 5*time.Second || dr.Outstanding != 3 {
			t.Fatalf("draining: %+v", dr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no OnDraining")
	}
	if b := nextBatch(t, got); len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 1 {
		t.Fatalf("settled before the drain: %v", b)
	}
	d2.Retry("later")
	if b := nextBatch(t, got); len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 2 {
		t.Fatalf("settled during the drain: %v", b)
	}
	select {
	case o := <-opens:
		if !o.Resubscribed {
			t.Fatalf("second open: %+v", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no resubscription")
	}
	// The third delivery of the drained stream was never handed out; the new stream's is.
	d3 := recvDelivery(t, sub)
	if d3.EntryID != "3-0" || d3.sess == d1.sess {
		t.Fatalf("after the drain: %s", d3.EntryID)
	}
	d3.Ack()
}

// Close waits for a delivery handed out to be settled, sends its outcome, then half-closes.
func TestCloseWaitsForHeldDeliveries(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, batches(got, read(1, 1, "1-0", "2-0")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	d := recvDelivery(t, sub)
	closed := make(chan error, 1)
	go func() { closed <- sub.Close(context.Background()) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-closed:
		t.Fatalf("Close returned with a delivery held: %v", err)
	default:
	}
	if err := d.Ack(); err != nil {
		t.Fatal(err)
	}
	if b := nextBatch(t, got); len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 1 {
		t.Fatalf("batch: %v", b)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, ok := <-sub.Deliveries(); ok {
		t.Fatal("a delivery after Close")
	}
}

// Draining with a long grace: once the one delivery the application started is settled, the
// client sends its outcome and half-closes the stream at once (the sidecar then ends the
// subscription), never handing out the two it received behind it; with nothing started it
// half-closes at once. Both well before the grace.
func TestDrainingHalfClosesOnceTheStartedAreSettled(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	halfClosed := make(chan time.Duration, 2)
	drain := func(entries ...string) func(*testing.T, windowv1.WindowService_SubscribeServer) error {
		return func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
			s.Send(opened())
			s.Send(read(1, 1, entries...))
			time.Sleep(100 * time.Millisecond)
			began := time.Now()
			s.Send(&windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Draining{Draining: &windowv1.Draining{
				Grace: durationpb.New(30 * time.Second), Outstanding: uint32(len(entries))}}})
			for {
				m, err := s.Recv()
				if err != nil {
					// io.EOF: the client half-closed. The engine ends the subscription then.
					halfClosed <- time.Since(began)
					return nil
				}
				got <- m.GetBatch()
			}
		}
	}
	c, _ := start(t, drain("1-0", "2-0", "3-0"), drain("4-0"), batches(got))
	opens := make(chan Opened, 3)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Logf: quiet,
		OnOpened: func(o Opened) { opens <- o }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	<-opens
	d1 := recvDelivery(t, sub) // started; 2-0 and 3-0 wait behind it
	time.Sleep(300 * time.Millisecond)
	select {
	case <-halfClosed:
		t.Fatal("half-closed while a started delivery was unsettled")
	default:
	}
	d1.Ack()
	if b := nextBatch(t, got); len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 1 {
		t.Fatalf("outcomes of the drained stream: %v", b)
	}
	for i := 0; i < 2; i++ {
		select {
		case after := <-halfClosed:
			if after > 5*time.Second {
				t.Fatalf("half-closed %v after the drain began", after)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d: no half-close", i+1)
		}
		select {
		case o := <-opens:
			if !o.Resubscribed {
				t.Fatalf("open after the drain: %+v", o)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no resubscription")
		}
	}
	select {
	case b := <-got:
		t.Fatalf("an outcome of a delivery never started: %v", b)
	default:
	}
}
