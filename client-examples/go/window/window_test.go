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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// fakeSidecar runs one scripted handler per Subscribe stream, in order.
type fakeSidecar struct {
	windowv1.UnimplementedWindowServiceServer
	mu       sync.Mutex
	attempts int
	scripts  []func(t *testing.T, s windowv1.WindowService_SubscribeServer) error
	t        *testing.T
}

func (f *fakeSidecar) Subscribe(s windowv1.WindowService_SubscribeServer) error {
	f.mu.Lock()
	n := f.attempts
	f.attempts++
	f.mu.Unlock()
	if n >= len(f.scripts) {
		<-s.Context().Done()
		return status.Error(codes.Unavailable, "no more scripts")
	}
	first, err := s.Recv()
	if err != nil {
		return err
	}
	if first.GetOpen() == nil {
		f.t.Errorf("stream %d: first message is not open: %v", n, first)
	}
	return f.scripts[n](f.t, s)
}

func start(t *testing.T, scripts ...func(t *testing.T, s windowv1.WindowService_SubscribeServer) error) (*Client, *fakeSidecar) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeSidecar{scripts: scripts, t: t}
	srv := grpc.NewServer()
	windowv1.RegisterWindowServiceServer(srv, fake)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, fake
}

func opened() *windowv1.SubscribeResponse {
	return &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Opened{Opened: &windowv1.Opened{Consumer: "c", Count: 16, MaxInFlight: 32}}}
}

func read(id uint64, firstSlot uint64, entries ...string) *windowv1.SubscribeResponse {
	r := &windowv1.Read{ReadId: id}
	for i, e := range entries {
		r.Deliveries = append(r.Deliveries, &windowv1.Delivery{Slot: firstSlot + uint64(i), EntryId: e, Payload: []byte(e), DeliveryCount: 1})
	}
	return &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Read{Read: r}}
}

func flushed(id uint64, settles uint32) *windowv1.SubscribeResponse {
	return &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Flush{Flush: &windowv1.FlushReport{ReadId: id, Settles: settles, Ok: true}}}
}

// refusedFlushall is the sidecar's answer to a batch whose slot queued FLUSHALL and acked it:
// the command refused (FORBIDDEN_COMMAND), then the ack (INCOMPLETE_SEGMENT), in one message.
func refusedFlushall(slot uint64) *windowv1.SubscribeResponse {
	return &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Rejections{Rejections: &windowv1.Rejections{Rejections: []*windowv1.Rejection{
		{Slot: slot, Reason: windowv1.RejectionReason_REJECTION_REASON_FORBIDDEN_COMMAND, Command: "FLUSHALL", Message: "forbidden"},
		{Slot: slot, Reason: windowv1.RejectionReason_REJECTION_REASON_INCOMPLETE_SEGMENT, Message: "incomplete"},
	}}}}
}

// answering is a script that sends opened and the given messages, then passes every batch on
// to got (unless got is nil) and answers the n-th with answers[n], while there is one.
func answering(got chan<- *windowv1.Batch, answers []*windowv1.SubscribeResponse, msgs ...*windowv1.SubscribeResponse) func(*testing.T, windowv1.WindowService_SubscribeServer) error {
	return func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		s.Send(opened())
		for _, m := range msgs {
			s.Send(m)
		}
		for n := 0; ; n++ {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if got != nil {
				got <- m.GetBatch()
			}
			if n < len(answers) {
				s.Send(answers[n])
			}
		}
	}
}

func recvDelivery(t *testing.T, sub *Subscription) *Delivery {
	t.Helper()
	select {
	case d, ok := <-sub.Deliveries():
		if !ok {
			t.Fatalf("subscription ended: %v", sub.Err())
		}
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
	}
	return nil
}

func quiet(string, ...any) {}

// One batch per read, sent when its last delivery is settled: commands, then the outcomes in
// the order they were given.
func TestOneBatchPerRead(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{flushed(1, 3)}, read(1, 1, "1-0", "2-0", "3-0")))
	flushes := make(chan Flush, 1)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		OnFlush: func(f Flush) { flushes <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	d1, d2, d3 := recvDelivery(t, sub), recvDelivery(t, sub), recvDelivery(t, sub)
	d2.Queue("INCR", "k", 5)
	if err := d2.Ack(); err != nil {
		t.Fatal(err)
	}
	d1.Queue("INCR", "dropped")
	d1.Drop("bad")
	select {
	case b := <-got:
		t.Fatalf("batch sent before the read was settled: %v", b)
	case <-time.After(100 * time.Millisecond):
	}
	if err := d3.RetryAfter(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d3.Ack(); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("second outcome: %v", err)
	}
	b := <-got
	if len(b.Commands) != 1 || b.Commands[0].GetSlot() != 2 || string(b.Commands[0].GetArgs()[1]) != "5" {
		t.Fatalf("commands: %v", b.Commands)
	}
	var slots []uint64
	for _, o := range b.Outcomes {
		slots = append(slots, o.GetSlot())
	}
	if len(slots) != 3 || slots[0] != 2 || slots[1] != 1 || slots[2] != 3 {
		t.Fatalf("outcomes not in settle order: %v", slots)
	}
	f := <-flushes
	if len(f.Settled) != 3 || f.Settled[0].Outcome() != windowv1.OutcomeKind_OUTCOME_KIND_ACK {
		t.Fatalf("flush: %+v", f)
	}
}

// A lost stream: its deliveries go stale (no outcome is resent on the next stream), the client
// reconnects, through ALREADY_EXISTS, and the entries come back.
func TestReconnectNeverResendsOldSlots(t *testing.T) {
	second := make(chan *windowv1.Batch, 4)
	c, fake := start(t,
		func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
			s.Send(opened())
			s.Send(read(1, 1, "1-0", "2-0"))
			time.Sleep(200 * time.Millisecond)
			return status.Error(codes.Unavailable, "shutting down")
		},
		func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
			return status.Error(codes.AlreadyExists, "consumer busy")
		},
		batches(second, read(1, 1, "2-0")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	old1, old2 := recvDelivery(t, sub), recvDelivery(t, sub)
	old1.Queue("SET", "old", "1")
	old1.Ack()                    // half of the read: nothing is sent yet
	again := recvDelivery(t, sub) // from the third stream, after the first one failed
	if again.sess == old1.sess || again.EntryID != "2-0" {
		t.Fatalf("unexpected delivery %+v", again)
	}
	if err := old2.Ack(); err != ErrStale {
		t.Fatalf("a delivery of the lost stream was settled: %v", err)
	}
	if err := old1.Drop("late"); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("old delivery: %v", err)
	}
	again.Queue("SET", "k", "v")
	if err := again.Ack(); err != nil {
		t.Fatal(err)
	}
	b := <-second
	if len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 1 || len(b.Commands) != 1 {
		t.Fatalf("second stream got %v", b)
	}
	select {
	case b := <-second:
		t.Fatalf("an old slot was resent: %v", b)
	case <-time.After(100 * time.Millisecond):
	}
	if sub.Reconnects() != 1 {
		t.Fatalf("reconnects: %d", sub.Reconnects())
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.attempts != 3 {
		t.Fatalf("attempts: %d", fake.attempts)
	}
}

// A rejected command (FORBIDDEN_COMMAND, then the ack's INCOMPLETE_SEGMENT) reopens the
// delivery; with RejectedOutcome RejectedRetryAfter the helper settles it with retry_after 1 s
// (the first delivery's delay), "rejected: FORBIDDEN_COMMAND: <message>": never acked, its
// commands not sent again.
func TestRejectedCommandIsRetriedAfterASecond(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{refusedFlushall(1)}, read(1, 1, "1-0")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		RejectedOutcome: RejectedRetryAfter})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	d := recvDelivery(t, sub)
	d.Queue("FLUSHALL")
	d.Ack()
	if b := <-got; len(b.Commands) != 1 || b.Outcomes[0].GetKind() != windowv1.OutcomeKind_OUTCOME_KIND_ACK {
		t.Fatalf("first batch: %v", b)
	}
	b := <-got
	if len(b.Commands) != 0 || len(b.Outcomes) != 1 {
		t.Fatalf("after the rejection: %v", b)
	}
	o := b.Outcomes[0]
	if o.GetSlot() != 1 || o.GetKind() != windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER ||
		o.GetDelay().AsDuration() != time.Second || o.GetReason() != "rejected: FORBIDDEN_COMMAND: forbidden" {
		t.Fatalf("after the rejection: %v", o)
	}
	if d.Outcome() != windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER {
		t.Fatalf("outcome: %v", d.Outcome())
	}
}

// By default (RejectedAuto) a command no retry fixes dead-letters its delivery at once when the
// subscription has a dead letter, and drops it when it has none. DeadLetter itself needs one.
func TestRejectedCommandByDefault(t *testing.T) {
	for _, tc := range []struct {
		deadLetter string
		want       windowv1.OutcomeKind
		outcome    string
	}{
		{"s:dead", windowv1.OutcomeKind_OUTCOME_KIND_DEAD_LETTER, "dead_letter"},
		{"", windowv1.OutcomeKind_OUTCOME_KIND_DROP, "drop"},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			got := make(chan *windowv1.Batch, 4)
			c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{refusedFlushall(1)}, read(1, 1, "1-0")))
			errs := make(chan error, 4)
			opts := Options{Stream: "s", Group: "g", Count: 16, Logf: quiet, OnError: func(err error) { errs <- err }}
			if tc.deadLetter != "" {
				opts.MaxDeliveries, opts.DeadLetter = 5, tc.deadLetter
			}
			sub, err := c.Subscribe(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close(context.Background())
			d := recvDelivery(t, sub)
			if tc.deadLetter == "" {
				if err := d.DeadLetter("bad"); err == nil || d.Settled() {
					t.Fatalf("DeadLetter without a dead letter: %v, settled %v", err, d.Settled())
				}
			}
			d.Queue("FLUSHALL")
			d.Ack()
			<-got // the ack, which the sidecar refuses
			b := <-got
			if len(b.Commands) != 0 || len(b.Outcomes) != 1 {
				t.Fatalf("after the rejection: %v", b)
			}
			if o := b.Outcomes[0]; o.GetKind() != tc.want || o.GetReason() != "rejected: FORBIDDEN_COMMAND: forbidden" {
				t.Fatalf("after the rejection: %v", o)
			}
			var re *RejectedError
			if err := <-errs; !errors.As(err, &re) || re.Reason != "FORBIDDEN_COMMAND" || re.Outcome != tc.outcome {
				t.Fatalf("OnError: %v", err)
			}
		})
	}
}

// Extend goes out at once as the slot in Batch.extend, before the read's outcomes; after the
// outcome it is refused.
func TestExtendSendsTheSlotAtOnce(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, batches(got, read(1, 7, "1-0", "2-0")))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	d := recvDelivery(t, sub)
	if err := d.Extend(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; len(b.Extend) != 1 || b.Extend[0] != 7 || len(b.Outcomes) != 0 {
		t.Fatalf("extend batch: %v", b)
	}
	d.Ack()
	if err := d.Extend(); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("extend after ack: %v", err)
	}
}

// Dial sends WINDOW_SIDECAR_TOKEN, when set, as `authorization: Bearer <token>` with every call.
func TestDialSendsTheTokenOfTheEnvironment(t *testing.T) {
	auth := make(chan []string, 2)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	windowv1.RegisterWindowServiceServer(srv, &publishSpy{auth: auth})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	for _, token := range []string{"s3cret", ""} {
		t.Setenv(TokenEnv, token)
		c, err := Dial(lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(context.Background(), "s", Message{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		c.Close()
		want := "[Bearer " + token + "]"
		if token == "" {
			want = "[]"
		}
		if got := fmt.Sprint(<-auth); got != want {
			t.Fatalf("token %q: authorization %s, want %s", token, got, want)
		}
	}
}

type publishSpy struct {
	windowv1.UnimplementedWindowServiceServer
	auth chan []string
}

func (p *publishSpy) Publish(ctx context.Context, _ *windowv1.PublishRequest) (*windowv1.PublishResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	p.auth <- md.Get("authorization")
	return &windowv1.PublishResponse{Ids: []string{"1-0"}}, nil
}

// The Open message: exactly one source, atomic mode, the delivery cap and its dead letter.
func TestOpenOptions(t *testing.T) {
	o := Options{Stream: "s", Group: "g", Count: 4, Atomic: true, MaxDeliveries: 2, DeadLetter: "s:dead"}
	open, err := o.open()
	if err != nil {
		t.Fatal(err)
	}
	if open.GetMode() != windowv1.Mode_MODE_ATOMIC || open.GetMaxDeliveries() != 2 ||
		open.GetDeadLetter().GetStream() != "s:dead" || open.GetStream().GetGroup() != "g" {
		t.Fatalf("open: %v", open)
	}
	l := Options{ReliableList: &ReliableList{Key: "jobs", Consumer: "c1", DeadAfter: time.Minute}, Count: 4, MaxDeliveries: 3, DeadLetter: "jobs:dead"}
	if open, err = l.open(); err != nil || open.GetReliableList().GetConsumer() != "c1" ||
		open.GetReliableList().GetDeadAfter().AsDuration() != time.Minute || open.GetDeadLetter().GetList() != "jobs:dead" {
		t.Fatalf("reliable list: %v, %v", open, err)
	}
	p := Options{PubSub: &PubSub{Channels: []string{"news"}, Patterns: []string{"ev.*"}}, Count: 4}
	if open, err = p.open(); err != nil || len(open.GetPubsub().GetPatterns()) != 1 {
		t.Fatalf("pubsub: %v, %v", open, err)
	}
	for _, bad := range []Options{
		{Count: 4},
		{Stream: "s", Count: 4},
		{Stream: "s", Group: "g", SimpleList: "l", Count: 4},
	} {
		if _, err := bad.open(); err == nil {
			t.Fatalf("%+v: no error", bad)
		}
	}
	if _, err := (&Client{}).Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 1, MaxDeliveries: 2}); err == nil {
		t.Fatal("MaxDeliveries without DeadLetter: no error")
	}
}

// The ordering key: by header or by field, never both.
func TestOpenOrderingKey(t *testing.T) {
	o := Options{Stream: "s", Group: "g", Count: 4}
	if open, err := o.open(); err != nil || open.GetOrderingKey() != nil {
		t.Fatalf("unordered: %v, %v", open, err)
	}
	o.OrderingHeader = "customer"
	if open, err := o.open(); err != nil || open.GetOrderingKey().GetHeader() != "customer" {
		t.Fatalf("by header: %v, %v", open, err)
	}
	f := Options{Stream: "s", Group: "g", Count: 4, OrderingField: "customer_id"}
	if open, err := f.open(); err != nil || open.GetOrderingKey().GetField() != "customer_id" {
		t.Fatalf("by field: %v, %v", open, err)
	}
	l := Options{ReliableList: &ReliableList{Key: "jobs"}, Count: 4, OrderingHeader: "customer"}
	if open, err := l.open(); err != nil || open.GetOrderingKey().GetHeader() != "customer" {
		t.Fatalf("reliable list: %v, %v", open, err)
	}
	o.OrderingField = "customer_id"
	if _, err := o.open(); err == nil {
		t.Fatal("both OrderingHeader and OrderingField: no error")
	}
}

// Partitions reaches the stream source; a list or pub/sub source, which has none, refuses it
// at Subscribe, saying it is for a stream.
func TestOpenPartitions(t *testing.T) {
	o := Options{Stream: "s", Group: "g", Consumer: "w1", Count: 4, OrderingHeader: "k", Partitions: 4}
	open, err := o.open()
	if err != nil || open.GetStream().GetPartitions() != 4 || open.GetStream().GetKey() != "s" ||
		open.GetOrderingKey().GetHeader() != "k" {
		t.Fatalf("partitioned: %v, %v", open, err)
	}
	o.Partitions = 0
	if open, err := o.open(); err != nil || open.GetStream().GetPartitions() != 0 {
		t.Fatalf("unpartitioned: %v, %v", open, err)
	}
	for _, bad := range []Options{
		{ReliableList: &ReliableList{Key: "jobs"}, Count: 4, Partitions: 4},
		{SimpleList: "jobs", Count: 4, Partitions: 4},
		{PubSub: &PubSub{Channels: []string{"news"}}, Count: 4, Partitions: 4},
	} {
		if _, err := bad.open(); err == nil || !strings.Contains(err.Error(), "Partitions is for a stream source") {
			t.Fatalf("%+v: %v", bad, err)
		}
		if _, err := (&Client{}).Subscribe(context.Background(), bad); err == nil {
			t.Fatalf("Subscribe %+v: no error", bad)
		}
	}
}

// An ordered subscription sends each outcome as it is given (a key's next entry waits in the
// sidecar for its flush), and a read flushed in parts keeps its unsettled deliveries: the
// outcome given after the first report goes out too, and the second report covers it.
func TestOrderedReadFlushedInParts(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{flushed(1, 1), flushed(1, 1)}, read(1, 1, "1-0", "2-0")))
	flushes := make(chan Flush, 2)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		OrderingHeader: "k", OnFlush: func(f Flush) { flushes <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	slow, fast := recvDelivery(t, sub), recvDelivery(t, sub)
	if err := fast.Ack(); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 2 {
		t.Fatalf("first batch: %v", b)
	}
	f := <-flushes
	if len(f.Settled) != 1 || f.Settled[0] != fast {
		t.Fatalf("first report: %+v", f)
	}
	if err := slow.Ack(); err != nil {
		t.Fatalf("the rest of a read flushed in part: %v", err)
	}
	b = <-got
	if len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 1 {
		t.Fatalf("second batch: %v", b)
	}
	f = <-flushes
	if len(f.Settled) != 1 || f.Settled[0] != slow {
		t.Fatalf("second report: %+v", f)
	}
}

// alreadySettled is the sidecar's answer to outcomes of slots whose partition was handed over.
func alreadySettled(slots ...uint64) *windowv1.SubscribeResponse {
	var rs []*windowv1.Rejection
	for _, slot := range slots {
		rs = append(rs, &windowv1.Rejection{Slot: slot, Reason: windowv1.RejectionReason_REJECTION_REASON_ALREADY_SETTLED,
			Message: fmt.Sprintf("slot %d already has an outcome or was abandoned", slot)})
	}
	return &windowv1.SubscribeResponse{Kind: &windowv1.SubscribeResponse_Rejections{Rejections: &windowv1.Rejections{Rejections: rs}}}
}

// nextRejected is the next error OnError got, which must be a *RejectedError ALREADY_SETTLED
// of d's slot naming d.
func nextRejected(t *testing.T, errs <-chan error, d *Delivery) {
	t.Helper()
	select {
	case err := <-errs:
		var re *RejectedError
		if !errors.As(err, &re) || re.Reason != "ALREADY_SETTLED" || re.Slot != d.Slot || re.Delivery != d {
			t.Fatalf("OnError for slot %d: %v", d.Slot, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("OnError got nothing for slot %d", d.Slot)
	}
}

// held is what the session still keeps: its reads, its slots and its deliveries handed out and
// unsettled.
func held(s *session) (reads, slots, handed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reads), len(s.slots), s.handed
}

// A partitioned stream whose partition was handed over while a read of it was out: the sidecar
// refuses the read's outcomes ALREADY_SETTLED and never reports the read (the new owner
// delivers the entries again). OnError gets each refusal, nothing settles them again, and the
// read and its slots are dropped at once rather than kept until the stream ends.
func TestOutcomesRefusedAlreadySettledEndTheirRead(t *testing.T) {
	const p = uint64(1) << 36 // a partition's range of read ids and slots
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{alreadySettled(p+1, p+2, p+3)}, read(p+1, p+1, "1-0", "2-0", "3-0")))
	errs := make(chan error, 8)
	flushes := make(chan Flush, 1)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Partitions: 4, Logf: quiet,
		OnError: func(err error) { errs <- err }, OnFlush: func(f Flush) { flushes <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	ds := []*Delivery{recvDelivery(t, sub), recvDelivery(t, sub), recvDelivery(t, sub)}
	for _, d := range ds {
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if b := <-got; len(b.Outcomes) != 3 || b.Outcomes[0].GetSlot() != p+1 {
		t.Fatalf("batch: %v", b)
	}
	for _, d := range ds {
		nextRejected(t, errs, d)
	}
	if reads, slots, handed := held(ds[0].sess); reads != 0 || slots != 0 || handed != 0 {
		t.Fatalf("held after ALREADY_SETTLED: %d reads, %d slots, %d handed out", reads, slots, handed)
	}
	select {
	case b := <-got:
		t.Fatalf("settled again after ALREADY_SETTLED: %v", b)
	case f := <-flushes:
		t.Fatalf("a flush: %+v", f)
	case err := <-errs:
		t.Fatalf("another error: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// Ordered and partitioned: a read's first outcome is flushed and reported, then its partition
// is handed over and the second outcome is refused ALREADY_SETTLED. The read is done: no report
// will come for the rest, and nothing of it is kept.
func TestReadReportedInPartThenRefusedAlreadySettledIsDropped(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	c, _ := start(t, answering(got, []*windowv1.SubscribeResponse{flushed(1, 1), alreadySettled(1)}, read(1, 1, "1-0", "2-0")))
	errs := make(chan error, 4)
	flushes := make(chan Flush, 2)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		OrderingHeader: "k", Partitions: 4,
		OnError: func(err error) { errs <- err }, OnFlush: func(f Flush) { flushes <- f }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	slow, fast := recvDelivery(t, sub), recvDelivery(t, sub)
	if err := fast.Ack(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != fast.Slot {
		t.Fatalf("first batch: %v", b)
	}
	if f := <-flushes; len(f.Settled) != 1 || f.Settled[0] != fast {
		t.Fatalf("first report: %+v", f)
	}
	if err := slow.Ack(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != slow.Slot {
		t.Fatalf("second batch: %v", b)
	}
	nextRejected(t, errs, slow)
	if reads, slots, handed := held(slow.sess); reads != 0 || slots != 0 || handed != 0 {
		t.Fatalf("held after ALREADY_SETTLED: %d reads, %d slots, %d handed out", reads, slots, handed)
	}
}

// Close sends the outcomes given so far, also of a read not completely settled (after waiting
// CloseTimeout for a delivery held unsettled), then half-closes and waits for the end of the
// stream.
func TestCloseSendsPartialOutcomes(t *testing.T) {
	got := make(chan *windowv1.Batch, 4)
	ended := make(chan struct{})
	c, _ := start(t, func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		s.Send(opened())
		s.Send(read(1, 1, "1-0", "2-0"))
		for {
			m, err := s.Recv()
			if err != nil {
				close(ended)
				s.Send(flushed(1, 1))
				return nil
			}
			got <- m.GetBatch()
		}
	})
	var mu sync.Mutex
	var settled []*Delivery
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		CloseTimeout: 300 * time.Millisecond,
		OnFlush:      func(f Flush) { mu.Lock(); settled = f.Settled; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	d := recvDelivery(t, sub)
	recvDelivery(t, sub) // left unsettled: stays pending
	d.Ack()
	if err := sub.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-ended
	b := <-got
	if len(b.Outcomes) != 1 || b.Outcomes[0].GetSlot() != 1 {
		t.Fatalf("close sent %v", b)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(settled) != 1 {
		t.Fatalf("flush after close: %v", settled)
	}
	if err := d.Drop("x"); !errors.Is(err, ErrAlreadySettled) {
		t.Fatal(err)
	}
}

// INVALID_ARGUMENT is not retried: the subscription ends with it.
func TestInvalidArgumentEnds(t *testing.T) {
	c, _ := start(t, func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		return status.Error(codes.InvalidArgument, "count too big")
	})
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 1 << 20, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := <-sub.Deliveries(); ok {
		t.Fatal("a delivery")
	}
	if status.Code(sub.Err()) != codes.InvalidArgument {
		t.Fatalf("err: %v", sub.Err())
	}
}

// A rejection that arrives while the handler is still running after its ack: the helper
// settles the reopened delivery anew under the lock that reopened it, so the handler never
// finds it open (its return would ack it a second time, which the sidecar refuses again, and
// the helper's own outcome would then not be sent). Each round the handler acks, then watches
// its delivery until the rejection is reported; the sidecar must see exactly one drop after
// each refused ack, and nothing else.
func TestARejectionRacingTheHandlerNeverShowsItOpen(t *testing.T) {
	const rounds = 200
	errs := make(chan string, 2*rounds)
	c, _ := start(t, func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		s.Send(opened())
		for i := uint64(1); i <= rounds; i++ {
			s.Send(read(i, i, fmt.Sprintf("%d-0", i)))
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if b := m.GetBatch(); len(b.GetCommands()) != 1 || len(b.GetOutcomes())+len(b.GetAcks()) != 1 {
				errs <- fmt.Sprintf("round %d: the handler's batch: %v", i, b)
			}
			s.Send(refusedFlushall(i))
			m, err = s.Recv()
			if err != nil {
				return nil
			}
			b := m.GetBatch()
			if len(b.GetCommands()) != 0 || len(b.GetAcks()) != 0 || len(b.GetOutcomes()) != 1 ||
				b.Outcomes[0].GetSlot() != i || b.Outcomes[0].GetKind() != windowv1.OutcomeKind_OUTCOME_KIND_DROP {
				errs <- fmt.Sprintf("round %d: after the rejection: %v", i, b)
			}
			s.Send(flushed(i, 1))
		}
		close(errs)
		for {
			if _, err := s.Recv(); err != nil {
				return nil
			}
		}
	})
	reported := make(chan *RejectedError, 1)
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 16, Logf: quiet,
		OnError: func(err error) {
			var rerr *RejectedError
			if errors.As(err, &rerr) {
				reported <- rerr
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	go sub.Run(func(_ context.Context, d *Delivery) error {
		d.Queue("FLUSHALL")
		if err := d.Ack(); err != nil {
			return err
		}
		for {
			select {
			case rerr := <-reported:
				if rerr.Outcome != "drop" {
					errs <- fmt.Sprintf("slot %d: reported %q", d.Slot, rerr.Error())
				}
				return nil
			default:
			}
			if d.Outcome() == windowv1.OutcomeKind_OUTCOME_KIND_UNSPECIFIED {
				errs <- fmt.Sprintf("slot %d: the handler found its delivery open after its ack", d.Slot)
				return nil
			}
		}
	})
	select {
	case <-time.After(30 * time.Second):
		t.Fatal("the rounds did not finish")
	case msg, ok := <-errs:
		if ok {
			t.Fatal(msg)
		}
	}
}
