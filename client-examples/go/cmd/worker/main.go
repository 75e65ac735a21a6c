// Command worker is the order service: it consumes the `orders` stream through the sidecar.
//
// For each order: an invalid one (no lines, or a line with qty <= 0) is dropped; a flaky one on
// its first delivery is retried after a delay; otherwise it queues, per line,
// `LPUSH picks "<id>:<sku>:<qty>"` and `HINCRBY sku-totals <sku> <qty>`, and acks. The side
// effects run in Redis only for acked orders, together with the XACK of their read.
//
// It exits when every order is settled for good (acked + dropped == number of orders, counted
// from the sidecar's flush reports), or after -idle-timeout without a delivery.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"example.invalid/window-sidecar/client-examples/go/orders"
	"example.invalid/window-sidecar/client-examples/go/window"
	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

func main() {
	addr := flag.String("addr", envOr("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"), "sidecar gRPC address (env WINDOW_SIDECAR_ADDR)")
	consumer := flag.String("consumer", envOr("WINDOW_CONSUMER", "worker-1"), "consumer name, stable per replica (env WINDOW_CONSUMER)")
	stream := flag.String("stream", "orders", "stream key")
	group := flag.String("group", "order-service", "consumer group")
	count := flag.Uint("count", 16, "entries per read")
	ordersPath := flag.String("orders", "../orders.json", "the order set, to know how many orders to expect")
	expect := flag.Int("expect", 0, "orders to settle before exiting (0: as many as in -orders; -1: run until idle)")
	retryDelay := flag.Duration("retry-delay", 200*time.Millisecond, "retry_after delay for a flaky order's first delivery")
	idleTimeout := flag.Duration("idle-timeout", 30*time.Second, "exit after this long without a delivery")
	workTime := flag.Duration("work-time", 0, "simulated handling time per order (to watch a sidecar restart mid-run)")
	atomic := flag.Bool("atomic", false, "flush each acked order's commands with its settle in one script")
	maxDeliveries := flag.Uint("max-deliveries", 0, "deliveries of an order before it goes to -dead-letter (0: no cap)")
	deadLetter := flag.String("dead-letter", "", "the dead-letter stream (with -max-deliveries)")
	batchMode := flag.Bool("batches", false, "take a read at a time (Batches): drops and retries per order, the rest acked with one Batch.Ack")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("worker: ")

	want := *expect
	if want == 0 {
		file, err := orders.Load(*ordersPath)
		if err != nil {
			log.Fatalf("%v (or pass -expect N, -1 to run until idle)", err)
		}
		want = len(file.Orders)
	}

	client, err := window.Dial(*addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	tally := newTally(want)
	// Ctrl-C and SIGTERM end the loop below; the subscription itself is not bound to them, so
	// that Close still sends what is settled and waits for its flush.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sub, err := client.Subscribe(context.Background(), window.Options{
		Stream:   *stream,
		Group:    *group,
		Consumer: *consumer,
		Count:    uint32(*count),
		Atomic:   *atomic,
		OnFlush:  tally.flushed,

		MaxDeliveries: uint32(*maxDeliveries),
		DeadLetter:    *deadLetter,
	})
	if err != nil {
		log.Fatal(err)
	}
	goal := fmt.Sprintf("until %d orders are settled", want)
	if want < 0 {
		goal = "until idle"
	}
	log.Printf("consuming %s as %s/%s via %s (atomic: %v), %s", *stream, *group, *consumer, *addr, *atomic, goal)

	idle := time.NewTimer(*idleTimeout)
	// One of the two is received from: a nil channel's case never runs.
	var deliveries <-chan *window.Delivery
	var batches <-chan *window.Batch
	if *batchMode {
		batches = sub.Batches()
	} else {
		deliveries = sub.Deliveries()
	}
	exit := 0
loop:
	for {
		var ds []*window.Delivery
		var batch *window.Batch
		select {
		case d, ok := <-deliveries:
			if !ok {
				log.Printf("subscription ended: %v", sub.Err())
				exit = 1
				break loop
			}
			ds = []*window.Delivery{d}
		case b, ok := <-batches:
			if !ok {
				log.Printf("subscription ended: %v", sub.Err())
				exit = 1
				break loop
			}
			ds, batch = b.Deliveries, b
		case <-tally.done:
			break loop
		case <-idle.C:
			if want > 0 {
				log.Printf("idle for %v before every order was settled", *idleTimeout)
				exit = 2
			} else {
				log.Printf("idle for %v: done", *idleTimeout)
			}
			break loop
		case <-ctx.Done():
			log.Printf("interrupted")
			exit = 130
			break loop
		}
		if !idle.Stop() {
			<-idle.C
		}
		idle.Reset(*idleTimeout)
		for _, d := range ds {
			time.Sleep(*workTime)
			handle(d, *retryDelay, batch == nil)
		}
		if batch != nil {
			if err := batch.Ack(); err != nil {
				log.Printf("read %d: the batch's acks not sent: %v", batch.ReadID, err)
			}
		}
	}
	if err := sub.Close(context.Background()); err != nil && ctx.Err() == nil && exit != 1 {
		log.Printf("closing the subscription: %v", err)
	}
	acked, dropped, retried := tally.counts()
	fmt.Printf("summary: acked=%d dropped=%d retried=%d reconnects=%d\n", acked, dropped, retried, sub.Reconnects())
	os.Exit(exit)
}

// handle decides one delivery; an ack is left to its batch unless ackNow. Errors from Queue and
// the outcome are only ErrStale (the stream was lost; the entry comes back) or a bug.
func handle(d *window.Delivery, retryDelay time.Duration, ackNow bool) {
	o, err := orders.Parse(d.Payload)
	if err != nil {
		report(d, "?", "drop", d.Drop("payload is not an order: "+err.Error()))
		return
	}
	if reason := o.Invalid(); reason != "" {
		report(d, o.ID, "drop ("+reason+")", d.Drop(reason))
		return
	}
	if o.Flaky && d.DeliveryCount == 1 {
		report(d, o.ID, "retry_after "+retryDelay.String(), d.RetryAfterReason(retryDelay, "flaky: first attempt fails"))
		return
	}
	for _, l := range o.Lines {
		// The typed command API (generated from Redis's command specification): a misspelled
		// name or a wrong argument type does not compile.
		if err := d.Redis().LPUSH("picks", fmt.Sprintf("%s:%s:%d", o.ID, l.SKU, l.Qty)); err != nil {
			report(d, o.ID, "ack", err)
			return
		}
		if err := d.Redis().HINCRBY("sku-totals", l.SKU, l.Qty); err != nil {
			report(d, o.ID, "ack", err)
			return
		}
	}
	err = nil
	if ackNow {
		err = d.Ack()
	}
	report(d, o.ID, fmt.Sprintf("ack (%d lines)", len(o.Lines)), err)
}

func report(d *window.Delivery, id, what string, err error) {
	if err != nil {
		log.Printf("%s %s (delivery %d): %s not sent: %v", id, d.EntryID, d.DeliveryCount, what, err)
		return
	}
	log.Printf("%s %s (delivery %d) -> %s", id, d.EntryID, d.DeliveryCount, what)
}

// tally counts outcomes confirmed by the sidecar's flush reports, once per order.
type tally struct {
	mu      sync.Mutex
	want    int
	final   map[string]windowv1.OutcomeKind // order (or entry) -> ack or drop
	retried int
	done    chan struct{}
	closed  bool
}

func newTally(want int) *tally {
	return &tally{want: want, final: map[string]windowv1.OutcomeKind{}, done: make(chan struct{})}
}

func (t *tally) flushed(f window.Flush) {
	r := f.Report
	if !r.GetOk() && r.GetSettleFailed() {
		// The entries are still pending and will be delivered again: nothing is final.
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, d := range f.Settled {
		key := d.EntryID
		if o, err := orders.Parse(d.Payload); err == nil && o.ID != "" {
			key = o.ID
		}
		switch kind := d.Outcome(); kind {
		case windowv1.OutcomeKind_OUTCOME_KIND_ACK, windowv1.OutcomeKind_OUTCOME_KIND_DROP:
			if prev, seen := t.final[key]; seen {
				log.Printf("%s settled again (%v, before %v): delivered more than once", key, kind, prev)
				continue
			}
			t.final[key] = kind
		case windowv1.OutcomeKind_OUTCOME_KIND_RETRY, windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER:
			t.retried++
		}
	}
	if t.want > 0 && len(t.final) >= t.want && !t.closed {
		t.closed = true
		close(t.done)
	}
}

func (t *tally) counts() (acked, dropped, retried int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range t.final {
		if k == windowv1.OutcomeKind_OUTCOME_KIND_ACK {
			acked++
		} else {
			dropped++
		}
	}
	return acked, dropped, t.retried
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
