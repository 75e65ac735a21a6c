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
	want := "window: cannot reach the sidecar at " + addr + ": connection refused; " + "nothing listens there: start the sidecar, or set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its --listen (127.0.0.1:50051 by default)"
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
	r := read(1, 1, "1-0", "2-0")
	r.GetRead().Deliveries[1].DeliveryCount = 3
	refused := &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Rejections{Rejections: &windowv1.Rejections{Rejections: []*windowv1.Rejection{
		{Slot: 1, Reason: windowv1.RejectionReason_REJECTION_REASON_FORBIDDEN_COMMAND, Command: "FLUSHALL", Message: "FLUSHALL is forbidden"},
		{Slot: 1, Reason: windowv1.RejectionReason_REJECTION_REASON_INCOMPLETE_SEGMENT, Message: "settle it with drop, retry or retry_after instead"},
		{Slot: 2, Reason: windowv1.RejectionReason_REJECTION_REASON_LIMIT_EXCEEDED, Command: "SET", Message: "too large"},
		{Slot: 2, Reason: windowv1.RejectionReason_REJECTION_REASON_INCOMPLETE_SEGMENT, Message: "settle it with drop, retry or retry_after instead"},
	}}}}
	c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{refused}, r))
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
	report := &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Flush{Flush: &windowv1.FlushReport{
		ReadId: 1, Settles: 1, Ok: true,
		SideEffectFailures: []*windowv1.SideEffectFailure{
			{Slot: 1, EntryId: "1-0", Command: "HINCRBY", Error: "ERR hash value is not an integer", Settled: true},
		},
		RequeueRefused: []*windowv1.RequeueRefusal{{Slot: 2, EntryId: "2-0", Error: "OOM command not allowed"}},
	}}}
	c, _ := start(t, answering(nil, []*windowv1.SubscribeResponse{report}, read(1, 1, "1-0", "2-0")))
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

// The sidecar's answer about Redis (quoting Redis's own "Connection refused") is a
// *RedisUnavailableError, not a *ConnectionError; a refusal a *RefusedError; a deadline a
// *CallTimeoutError.
func TestErrorsByCause(t *testing.T) {
	addr := "127.0.0.1:50051"
	err := classify("publish", addr, false, 0, status.Error(codes.Unavailable,
		`Redis did not answer in time (XADD: Request timed out.; last connection error: Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })`))
	var ru *RedisUnavailableError
	if !errors.As(err, &ru) || errors.Is(err, ErrConnection) || !errors.Is(err, ErrRedisUnavailable) || !errors.Is(err, ErrWindow) {
		t.Fatalf("err %T: %v", err, err)
	}
	if !strings.Contains(err.Error(), "the sidecar at "+addr+" answered publish that Redis is unavailable") ||
		!strings.Contains(err.Error(), "--redis-url") || status.Code(err) != codes.Unavailable {
		t.Fatalf("message %q", err.Error())
	}
	err = classify("publish", addr, false, 0, status.Error(codes.Unauthenticated, "token, please"))
	var rf *RefusedError
	if !errors.As(err, &rf) || rf.Reason != "UNAUTHENTICATED" || !strings.Contains(err.Error(), "WINDOW_SIDECAR_TOKEN") {
		t.Fatalf("err %T: %v", err, err)
	}
	err = classify("publish", addr, false, 30*time.Second, status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
	var ct *CallTimeoutError
	if !errors.As(err, &ct) || !errors.Is(err, ErrCallTimeout) || !strings.Contains(err.Error(), "within 30s") {
		t.Fatalf("err %T: %v", err, err)
	}
}

// A TLS handshake that failed is named so, as the other clients name it, with grpc-go's words
// in parentheses and the TLS settings as the next step.
func TestATLSHandshakeThatFailed(t *testing.T) {
	addr := "127.0.0.1:50051"
	err := classify("publish", addr, true, 0, status.Error(codes.Unavailable,
		`connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`))
	var ce *ConnectionError
	want := "window: cannot reach the sidecar at " + addr + ": the TLS handshake failed (tls: first record does not look like a TLS handshake); check WINDOW_SIDECAR_TLS_CA"
	if !errors.As(err, &ce) || !errors.Is(err, ErrConnection) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err %T: %v", err, err)
	}
}

func TestWhatAnswersAProbe(t *testing.T) {
	for reply, want := range map[string]string{
		"+PONG\r\n":                       "a Redis server answers there",
		"-NOAUTH Authentication required": "a Redis server answers there",
		"HTTP/1.1 400 Bad Request\r\n":    "an HTTP/1 server answers there",
		"\x15\x03\x03\x00\x02":            "a TLS server answers there",
		"\x00\x00\x12\x04":                "",
	} {
		if got := whatAnswers([]byte(reply), false); !strings.HasPrefix(got, want) || (want == "") != (got == "") {
			t.Errorf("%q: %q, want %q", reply, got, want)
		}
	}
	if got := whatAnswers([]byte("\x15\x03\x03\x00\x02"), true); got != "" {
		t.Errorf("a TLS client: %q", got)
	}
}

// A client pointed at a Redis port says so at once.
func TestPublishToARedisPort(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256)
				_, _ = c.Read(buf)
				_, _ = c.Write([]byte("-ERR wrong number of arguments for 'ping' command\r\n"))
			}()
		}
	}()
	c, err := Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Publish(context.Background(), "s", Message{Payload: []byte("a")})
	var ce *ConnectionError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cannot reach the sidecar at "+lis.Addr().String()+": a Redis server answers there") {
		t.Fatalf("err %T: %v", err, err)
	}
}

func TestAURLIsRefusedAtDial(t *testing.T) {
	for url, want := range map[string]string{
		"http://127.0.0.1:50051": "give 127.0.0.1:50051",
		"https://sidecar:443/":   "give sidecar:443 and WINDOW_SIDECAR_TLS_CA",
		"redis://127.0.0.1:6379": "a Redis URL",
	} {
		_, err := Dial(url)
		var ce *ConnectionError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "the address is a") || !strings.Contains(err.Error(), want) ||
			strings.Contains(err.Error(), "resolve") {
			t.Errorf("%s: %v", url, err)
		}
	}
}
