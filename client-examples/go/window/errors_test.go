package window

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// Publishing to an address nothing listens on fails fast with a *ConnectionError naming the
// address and the cause, which carries the status underneath.
func TestPublishToAClosedPortFailsFast(t *testing.T) {
	addr := closedAddr(t)
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	_, err = c.Publish(context.Background(), "s", Message{Payload: []byte("a")})
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("took %v", took)
	}
	var ce *ConnectionError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConnection) || !errors.Is(err, ErrWindow) {
		t.Fatalf("err %T: %v", err, err)
	}
	want := "window: cannot reach the sidecar at " + addr + ": connection refused"
	if err.Error() != want || ce.Addr != addr {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	if status.Code(err) != codes.Unavailable || ce.Status().Code() != codes.Unavailable {
		t.Fatalf("status: %v", status.Code(err))
	}
}

// A subscription whose opens keep failing gives up after MaxAttempts with a
// *SubscriptionEndedError, given to OnError and returned by Run and Err.
func TestSubscriptionGivesUpAfterMaxAttempts(t *testing.T) {
	addr := closedAddr(t)
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reported := make(chan error, 4)
	var disconnects int
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 1, Logf: quiet,
		MaxAttempts: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		OnError:        func(err error) { reported <- err },
		OnDisconnected: func(Disconnected) { disconnects++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	runErr := sub.Run(func(context.Context, *Delivery) error { return nil })
	var ended *SubscriptionEndedError
	if !errors.As(runErr, &ended) || ended.Attempts != 3 || !errors.Is(runErr, ErrConnection) {
		t.Fatalf("Run: %T %v", runErr, runErr)
	}
	if !strings.Contains(runErr.Error(), addr) || !strings.Contains(runErr.Error(), "connection refused") {
		t.Fatalf("message: %v", runErr)
	}
	if got := <-reported; got != runErr {
		t.Fatalf("OnError got %v", got)
	}
	if disconnects != 2 {
		t.Fatalf("OnDisconnected called %d times, want 2", disconnects)
	}
}

// A refused command with the default RejectedOutcome: FORBIDDEN_COMMAND drops the delivery at
// once, with the reason, and OnError gets a *RejectedError naming the cause (not the ack's
// INCOMPLETE_SEGMENT). A reason a retry may fix (LIMIT_EXCEEDED) is retried after the delay,
// which doubles with the delivery count.
func TestRefusedCommandAuto(t *testing.T) {
	got := make(chan *windowv1.Batch, 8)
	c, _ := start(t, func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		s.Send(opened())
		r := read(1, 1, "1-0", "2-0")
		r.GetRead().Deliveries[1].DeliveryCount = 3
		s.Send(r)
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		got <- m.GetBatch()
		s.Send(&windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Rejections{Rejections: &windowv1.Rejections{Rejections: []*windowv1.Rejection{
			{Slot: 1, Reason: windowv1.RejectionReason_REJECTION_REASON_FORBIDDEN_COMMAND, Command: "FLUSHALL", Message: "FLUSHALL is forbidden"},
			{Slot: 1, Reason: windowv1.RejectionReason_REJECTION_REASON_INCOMPLETE_SEGMENT, Message: "settle it with drop, retry or retry_after instead"},
			{Slot: 2, Reason: windowv1.RejectionReason_REJECTION_REASON_LIMIT_EXCEEDED, Command: "SET", Message: "too large"},
			{Slot: 2, Reason: windowv1.RejectionReason_REJECTION_REASON_INCOMPLETE_SEGMENT, Message: "settle it with drop, retry or retry_after instead"},
		}}}})
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			got <- m.GetBatch()
		}
	})
	var logged []string
	errs := make(chan error, 4)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16,
		Logf:    func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) },
		OnError: func(err error) { errs <- err },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	d1, d2 := recvDelivery(t, sub), recvDelivery(t, sub)
	d1.Queue("FLUSHALL")
	d1.Ack()
	d2.Queue("SET", "k", "v")
	d2.Ack()
	<-got
	var outcomes []*windowv1.Outcome
	for len(outcomes) < 2 {
		outcomes = append(outcomes, nextBatch(t, got).Outcomes...)
	}
	if o := outcomes[0]; o.GetKind() != windowv1.OutcomeKind_OUTCOME_KIND_DROP || o.GetReason() != "rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden" {
		t.Fatalf("slot 1: %v", o)
	}
	if o := outcomes[1]; o.GetKind() != windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER || o.GetDelay().AsDuration() != 4*time.Second {
		t.Fatalf("slot 2 (third delivery): %v", o)
	}
	for i, want := range []string{"FORBIDDEN_COMMAND", "LIMIT_EXCEEDED"} {
		err := <-errs
		var re *RejectedError
		if !errors.As(err, &re) || re.Reason != want || re.Slot != uint64(i+1) || !errors.Is(err, ErrRejected) {
			t.Fatalf("OnError %d: %v", i, err)
		}
		if strings.Contains(err.Error(), "settle it with") {
			t.Fatalf("the sidecar's advice repeated: %v", err)
		}
	}
	sub.Close(context.Background())
	for _, l := range logged {
		if strings.Contains(l, "settle it with") {
			t.Fatalf("the sidecar's advice repeated in the log: %s", l)
		}
	}
}

// The client's retry delay doubles with each delivery, from RetryDelay up to MaxRetryDelay.
func TestRetryDelayDoublesUpToTheCap(t *testing.T) {
	o := Options{RetryDelay: time.Second, MaxRetryDelay: 5 * time.Second}
	for count, want := range map[uint32]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 60: 5 * time.Second} {
		if got := o.retryDelay(count); got != want {
			t.Errorf("delivery %d: %v, want %v", count, got, want)
		}
	}
}

// A flush report's side-effect failures and refused requeues reach OnError, after OnFlush got
// the report: a *SideEffectError per failed command (settled or not, as the report says) and a
// *RequeueRefusedError per refused requeue, each with its delivery and the outcome given.
func TestFlushReportErrors(t *testing.T) {
	c, _ := start(t, func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		s.Send(opened())
		s.Send(read(1, 1, "1-0", "2-0"))
		if _, err := s.Recv(); err != nil {
			return nil
		}
		s.Send(&windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Flush{Flush: &windowv1.FlushReport{
			ReadId: 1, Settles: 1, Ok: true,
			SideEffectFailures: []*windowv1.SideEffectFailure{
				{Slot: 1, EntryId: "1-0", Command: "HINCRBY", Error: "ERR hash value is not an integer", Settled: true},
			},
			RequeueRefused: []*windowv1.RequeueRefusal{{Slot: 2, EntryId: "2-0", Error: "OOM command not allowed"}},
		}}})
		for {
			if _, err := s.Recv(); err != nil {
				return nil
			}
		}
	})
	var order []string
	var mu sync.Mutex
	errs := make(chan error, 4)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16,
		Logf: func(string, ...any) {},
		OnFlush: func(Flush) {
			mu.Lock()
			order = append(order, "flush")
			mu.Unlock()
		},
		OnError: func(err error) {
			mu.Lock()
			order = append(order, "error")
			mu.Unlock()
			errs <- err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	d1, d2 := recvDelivery(t, sub), recvDelivery(t, sub)
	d1.Queue("HINCRBY", "h", "f", 1)
	d1.Ack()
	d2.Retry("later")
	var se *SideEffectError
	if err := <-errs; !errors.As(err, &se) || !errors.Is(err, ErrSideEffect) || !errors.Is(err, ErrWindow) ||
		se.Command != "HINCRBY" || !se.Settled || se.Delivery != d1 ||
		err.Error() != "window: side effect HINCRBY of entry 1-0 failed: ERR hash value is not an integer (settled all the same: Redis has no rollback)" {
		t.Fatalf("first error: %v", err)
	}
	var re *RequeueRefusedError
	if err := <-errs; !errors.As(err, &re) || !errors.Is(err, ErrRequeueRefused) || re.Delivery != d2 || re.Outcome != "retry" ||
		err.Error() != "window: Retry of entry 2-0 not written: OOM command not allowed; it stays pending and is delivered again" {
		t.Fatalf("second error: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(order, ",") != "flush,error,error" {
		t.Fatalf("callbacks in the order %v", order)
	}
}
