package window

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// Options configure a subscription. Count is required, and exactly one source: Stream with
// Group (a Redis stream through a consumer group), ReliableList, SimpleList or PubSub.
type Options struct {
	// Stream is the Redis stream key, Group the consumer group (created when missing).
	Stream, Group string
	// Consumer is the consumer name: stable per replica (the pod name), so a restarted worker
	// gets its own pending entries back first. Empty: the sidecar's --consumer-name.
	Consumer string
	// StartID is where a newly created group starts ("0", the default, or "$").
	StartID string
	// Count is the number of entries per read (1 to the sidecar's --max-count).
	Count uint32
	// MaxInFlight bounds the deliveries handed out and not settled. 0: twice Count.
	MaxInFlight uint32
	// Block is how long one read waits for new entries. 0: the sidecar's default (5 s).
	Block time.Duration
	// MinIdle: entries pending longer than this on any consumer are claimed. 0: 60 s.
	MinIdle time.Duration

	// ReliableList reads a list at least once, through a processing list of its consumer.
	ReliableList *ReliableList
	// SimpleList is a list key read by popping: at most once (a crash loses what is in flight).
	SimpleList string
	// PubSub reads channels and patterns: at most once, only while subscribed.
	PubSub *PubSub
	// Atomic flushes each acked delivery's commands with its own settle in one script
	// (MODE_ATOMIC), so a crash never leaves a delivery's side effects half applied; the
	// default pipelines the whole read's commands and settles in one round trip.
	Atomic bool
	// MaxDeliveries caps how many times an entry is delivered (streams and lists): an entry at the cap that is
	// retried again goes to DeadLetter instead, so a poison entry cannot loop for ever. 0: no
	// cap. Needs DeadLetter.
	MaxDeliveries uint32
	// DeadLetter is where entries past MaxDeliveries go: a stream for a Stream source, a list
	// for the list sources. On a cluster it must share the source's hash slot ({tag}).
	DeadLetter string
	// PackedAcks sends plain acks (no reason, no trace context) as slot ids in the batch's
	// `acks` rather than as outcomes: smaller batches, the same effect.
	PackedAcks bool
	// ReportsInReads asks the sidecar to carry the report of a flush that the next read rode on
	// in that read's message (Read.flushed): one message per read in each direction. Reports
	// reach OnFlush the same way.
	ReportsInReads bool
	// OrderingHeader (streams and reliable lists) names the header that is an entry's ordering
	// key: a stream entry's `h:<name>` field, a list value's frame header. Entries that share a
	// key are delivered one at a time, in the order read: the next waits in the sidecar until
	// the one before is settled and flushed; other keys flow meanwhile; Retry and RetryAfter
	// keep the entry in its place. On an ordered subscription each outcome is sent as soon as
	// it is given, not with the rest of its read. At most one of OrderingHeader and
	// OrderingField.
	OrderingHeader string
	// OrderingField (streams) names the field, as stored, that is an entry's ordering key (for
	// entries another producer wrote without the headers layout).
	OrderingField string
	// Partitions (streams) reads Stream as a partitioned stream of this many partitions, the
	// streams `<Stream>:{0}` … `<Stream>:{Partitions-1}` (Target.Partitions writes them). The
	// subscriptions of Group that open it with the same number share the partitions out, each
	// read by one of them at a time, so an ordering key's entries, all in one partition, are
	// handed out one at a time across the whole group rather than within one subscription
	// only; Consumer names this replica among them (stable, as ever). A partition moves to
	// another replica as replicas come and go (within the sidecar's --consumer-lease of one
	// dying): a delivery of a partition handed over before its outcome was sent is answered
	// ALREADY_SETTLED (a *RejectedError to OnError) and delivered again by its new reader; no
	// flush report names it, and the subscription counts it done for its read (the read is
	// dropped once the rest of it is done too). At most 1024. 0: Stream itself.
	Partitions uint32

	// RejectedOutcome is how a delivery is settled when the sidecar refuses one of its
	// commands or its outcome: RejectedAuto (the default) settles it at once for a reason no
	// retry fixes (INVALID_COMMAND, FORBIDDEN_COMMAND, PERMISSION_DENIED), with dead_letter
	// when the subscription has a DeadLetter and with drop when it has none, and with
	// retry_after otherwise; RejectedDrop always drops; RejectedRetryAfter always retries after
	// the delay (with MaxDeliveries and DeadLetter, a poison entry then ends in the dead
	// letter). Either way OnError gets a *RejectedError.
	RejectedOutcome RejectedOutcome
	// RetryDelay is the first delay of a retry_after the client gives (a refused command, a
	// failed handler): RetryDelay × 2^(DeliveryCount−1), at most MaxRetryDelay. 0: 1 s.
	RetryDelay time.Duration
	// MaxRetryDelay caps that delay. 0: 1 min.
	MaxRetryDelay time.Duration
	// MaxAttempts is how many consecutive opens may fail (the sidecar unreachable, a stream
	// that ends before `opened`) before the subscription gives up with a
	// *SubscriptionEndedError. 0: 10; negative: never give up.
	MaxAttempts int
	// OnError, when set, gets the errors of the subscription that the application did not
	// cause by a call: a *RejectedError for each delivery the sidecar refused something of
	// (after the client settled it), a *SideEffectError for each side effect Redis answered
	// with an error and a *RequeueRefusedError for each Retry, RetryAfter or dead letter Redis
	// did not write (both from a flush report, after OnFlush got it), and the
	// *SubscriptionEndedError it ends with. Called on
	// the subscription's goroutines: keep it short.
	OnError func(error)
	// OnDisconnected, when set, is called when a stream ended or could not be opened and the
	// subscription will try again after RetryIn.
	OnDisconnected func(Disconnected)

	// MinBackoff and MaxBackoff bound the wait between reconnection attempts (100 ms and 5 s
	// by default; the wait doubles after each failed attempt, with jitter).
	MinBackoff, MaxBackoff time.Duration
	// OpenTimeout bounds the wait for the sidecar's `opened` (10 s by default).
	OpenTimeout time.Duration
	// CloseTimeout bounds how long Close waits for the deliveries handed out to be settled, and
	// then how long it waits for the sidecar to flush (10 s each by default).
	CloseTimeout time.Duration

	// OnFlush, when set, is called with every flush report, on the subscription's receive
	// goroutine (keep it short). An ordered subscription's read may be flushed in parts, so
	// one read can have several reports.
	OnFlush func(Flush)
	// OnOpened, when set, is called each time the sidecar confirms the subscription: after the
	// first open and after every resubscription (Opened.Resubscribed), on the subscription's
	// goroutine, before any delivery of that stream is handed out.
	OnOpened func(Opened)
	// OnDraining, when set, is called when the sidecar reports its graceful shutdown, on the
	// subscription's receive goroutine (keep it short).
	OnDraining func(Draining)
	// Logf logs reconnections and rejections. nil: log.Printf.
	Logf func(format string, args ...any)
}

// RejectedOutcome says how the client settles a delivery whose command or outcome the sidecar
// refused (Options.RejectedOutcome).
type RejectedOutcome int

const (
	// RejectedAuto dead-letters the delivery at once for INVALID_COMMAND, FORBIDDEN_COMMAND
	// and PERMISSION_DENIED (no retry can fix them), or drops it when the subscription has no
	// DeadLetter, and retries it after the delay otherwise.
	RejectedAuto RejectedOutcome = iota
	// RejectedDrop always drops the delivery at once.
	RejectedDrop
	// RejectedRetryAfter always settles it with retry_after: with MaxDeliveries and
	// DeadLetter a poison entry ends in the dead letter at the cap.
	RejectedRetryAfter
)

// Disconnected is a stream that ended, or an open that failed, and will be tried again.
type Disconnected struct {
	// Err is why: a *ConnectionError, or the stream's gRPC status error.
	Err error
	// RetryIn is the wait before the next attempt; Attempts the consecutive failed opens.
	RetryIn  time.Duration
	Attempts int
}

// Opened is the sidecar's confirmation of a subscription stream.
type Opened struct {
	// SubscriptionID is the sidecar's id of this stream; Consumer the consumer name in use.
	SubscriptionID, Consumer string
	// Resubscribed is true on every open after the first (a reconnection).
	Resubscribed bool
	// Settings are the settings in effect (defaults filled in).
	Settings *windowv1.Opened
}

// Draining is the sidecar's notice that it shuts down: no more reads come on this stream, and
// outcomes sent within Grace are still flushed. The helper stops handing out deliveries it has
// not handed out yet, sends every outcome at once from then on, and once every delivery the
// application started (took from Deliveries or Batches) is settled, or Grace is over,
// half-closes the stream, so that the sidecar ends it at once: the deliveries it received and
// never handed out stay pending and are delivered again (their count raised once more). It then
// resubscribes (to the next sidecar).
type Draining struct {
	// Grace is how long outcomes are still accepted.
	Grace time.Duration
	// Outstanding counts the deliveries handed out and not settled when the drain began.
	Outstanding uint32
}

// ReliableList is a list consumed at least once: a read moves entries to the consumer's
// processing list, and the settle removes them from there.
type ReliableList struct {
	// Key is the list producers LPUSH to.
	Key string
	// Consumer names the processing list; a restarted consumer of the same name gets it back
	// first. Empty: the sidecar's --consumer-name.
	Consumer string
	// DeadAfter: a consumer silent for longer is dead and its processing list goes back to
	// Key. 0: 30 s.
	DeadAfter time.Duration
}

// PubSub is a set of channels, patterns and sharded channels (Redis 7) read while subscribed.
type PubSub struct {
	Channels, Patterns, ShardedChannels []string
	// Buffer is how many messages the sidecar holds for a slow client before it drops the
	// oldest. 0: 10000.
	Buffer uint32
}

// RejectedRetryDelay is the default of Options.RetryDelay.
//
// Deprecated: set Options.RetryDelay; the delay now doubles with each delivery.
const RejectedRetryDelay = time.Second

// hasDeadLetter says whether the subscription has a dead-letter target (Delivery.DeadLetter
// needs one).
func (o *Options) hasDeadLetter() bool { return o.DeadLetter != "" && o.PubSub == nil }

// retryDelay is the delay of a retry_after the client gives for the count-th delivery.
func (o *Options) retryDelay(count uint32) time.Duration {
	d := o.RetryDelay
	for i := uint32(1); i < count && d < o.MaxRetryDelay; i++ {
		d *= 2
	}
	if d > o.MaxRetryDelay {
		d = o.MaxRetryDelay
	}
	return d
}

// Flush is the result of one read's flush.
type Flush struct {
	Report *windowv1.FlushReport
	// Settled are the read's deliveries whose outcome reached the sidecar, in outcome order
	// (since its previous report, when an ordered read is flushed in parts).
	// When Report.Ok is false and Report.SettleFailed is true, their entries are still pending
	// and come back.
	Settled []*Delivery
}

// Subscription delivers entries until it is closed, its context ends, or it fails for good.
type Subscription struct {
	client *Client
	opts   Options
	ctx    context.Context
	logf   func(string, ...any)

	out       chan *Delivery
	batches   chan *Batch
	closing   chan struct{}
	closeOnce sync.Once
	finished  chan struct{}

	mu         sync.Mutex
	err        error
	reconnects int
	opens      int
	consumer   string
	partitions uint32
}

// Subscribe starts a subscription. Deliveries arrive on Deliveries(); the channel is closed when
// the subscription ends (after Close, when ctx is done, or on an error that retrying cannot fix,
// then reported by Err). Connecting and reconnecting happen in the background.
//
// When the sidecar rejects a command or the outcome of a delivery (a forbidden or malformed
// command makes its ack INCOMPLETE_SEGMENT), the helper settles the delivery again with
// RetryAfter(RejectedRetryDelay) and the reason "rejected: <the rejection's message>": never
// dropped (the entry is not lost), never acked without its commands. With MaxDeliveries and
// DeadLetter set, an entry whose handler keeps queuing a refused command reaches the dead
// letter once the cap is reached.
func (c *Client) Subscribe(ctx context.Context, opts Options) (*Subscription, error) {
	if _, err := opts.open(); err != nil {
		return nil, err
	}
	if opts.Count == 0 {
		return nil, errors.New("window: Subscribe needs a count")
	}
	if (opts.MaxDeliveries == 0) != (opts.DeadLetter == "") {
		return nil, errors.New("window: MaxDeliveries and DeadLetter go together")
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = 5 * time.Second
		if opts.MaxBackoff < opts.MinBackoff {
			opts.MaxBackoff = opts.MinBackoff
		}
	}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = 10 * time.Second
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = 10 * time.Second
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = time.Second
	}
	if opts.MaxRetryDelay <= 0 {
		opts.MaxRetryDelay = time.Minute
	}
	if opts.MaxRetryDelay < opts.RetryDelay {
		opts.MaxRetryDelay = opts.RetryDelay
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = 10
	}
	sub := &Subscription{
		client:   c,
		opts:     opts,
		ctx:      ctx,
		logf:     opts.Logf,
		out:      make(chan *Delivery),
		batches:  make(chan *Batch),
		closing:  make(chan struct{}),
		finished: make(chan struct{}),
	}
	if sub.logf == nil {
		sub.logf = log.Printf
	}
	go sub.run()
	return sub, nil
}

// Deliveries is the channel of deliveries. Settle every delivery you receive: a read is sent to
// the sidecar when all its deliveries are settled, and the sidecar reads no more than the
// in-flight limit ahead.
func (sub *Subscription) Deliveries() <-chan *Delivery { return sub.out }

// Batches is the channel of reads, each handed out whole as a Batch: a handler that can take a
// read at a time settles the deliveries it must on their own and the rest with one call
// (Batch.Ack, Drop, Retry). Receive from Batches or from Deliveries (Run does), not both: each
// delivery goes to whichever channel is received from first, alone or with the rest of its
// read. Closed when the subscription ends, as Deliveries is.
func (sub *Subscription) Batches() <-chan *Batch { return sub.batches }

// Err is the error that ended the subscription, once Deliveries is closed (nil after Close).
func (sub *Subscription) Err() error {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.err
}

// Reconnects counts the streams opened after the first one.
func (sub *Subscription) Reconnects() int {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.reconnects
}

// Consumer is the consumer name the sidecar confirmed (empty before the first `opened`).
func (sub *Subscription) Consumer() string {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.consumer
}

// Partitions is how many partitions of the partitioned stream the sidecar shares out among the
// group's replicas for this subscription (Opened.partitions), once it is open: 0 before the
// first `opened`, on an unpartitioned stream, a list or pub/sub, and from a sidecar older than
// the field, which then reads the stream itself whatever Options.Partitions asked for. Its
// deliveries name their partition (Delivery.Partition).
func (sub *Subscription) Partitions() uint32 {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.partitions
}

// Stop starts Close's graceful end and returns at once: no delivery is handed out any more;
// Run returns and Deliveries is closed once it is done. Safe from any goroutine, more than once.
func (sub *Subscription) Stop() { sub.closeOnce.Do(func() { close(sub.closing) }) }

// Done is closed when the subscription has ended.
func (sub *Subscription) Done() <-chan struct{} { return sub.finished }

// Close ends the subscription gracefully: it stops handing out deliveries, waits for the ones
// already handed out to be settled (their outcomes are sent at once), sends the outcomes already
// given (also of reads not completely settled), half-closes the stream and waits for the sidecar
// to flush them and end the stream: up to CloseTimeout for the deliveries handed out, and up to
// CloseTimeout for the sidecar. Deliveries without an outcome
// by then, and those never handed out, stay pending in Redis and are delivered again. Deliveries
// is closed when Close returns. Safe to call from any goroutine (a SIGTERM handler), more than
// once. ctx bounds the wait: when it ends first, Close returns ctx's error and the end goes on in
// the background (Done tells when).
func (sub *Subscription) Close(ctx context.Context) error {
	sub.Stop()
	select {
	case <-sub.finished:
		return sub.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// end records the error the subscription ends with and hands it to OnError (the caller's to
// report: Err and Run return it too, so it is not logged here).
func (sub *Subscription) end(err error) {
	sub.setErr(err)
	sub.onError(err)
}

func (sub *Subscription) onError(err error) {
	if sub.opts.OnError != nil {
		sub.opts.OnError(err)
	}
}

// describe names the subscription's source, for log lines.
func (sub *Subscription) describe() string {
	o := sub.opts
	switch {
	case o.Stream != "" && o.Partitions > 0:
		return fmt.Sprintf("%s/%s (%d partitions)", o.Stream, o.Group, o.Partitions)
	case o.Stream != "":
		return o.Stream + "/" + o.Group
	case o.ReliableList != nil:
		return "reliable list " + o.ReliableList.Key
	case o.SimpleList != "":
		return "list " + o.SimpleList
	case o.PubSub != nil:
		return "pub/sub"
	}
	return "?"
}

func (sub *Subscription) setErr(err error) {
	sub.mu.Lock()
	sub.err = err
	sub.mu.Unlock()
}

func (sub *Subscription) run() {
	defer close(sub.finished)
	defer close(sub.out)
	defer close(sub.batches)
	backoff := sub.opts.MinBackoff
	failedOpens := 0
	for attempt := 0; ; attempt++ {
		s, err := sub.open()
		if err != nil {
			failedOpens++
			err = classify("subscribe", sub.client.addr, sub.client.tls, 0, err)
		}
		if err == nil {
			failedOpens = 0
			sub.mu.Lock()
			if attempt > 0 {
				sub.reconnects++
			}
			sub.opens++
			resubscribed := sub.opens > 1
			sub.consumer = s.opened.GetConsumer()
			sub.partitions = s.opened.GetPartitions()
			sub.mu.Unlock()
			backoff = sub.opts.MinBackoff
			if sub.opts.OnOpened != nil {
				sub.opts.OnOpened(Opened{
					SubscriptionID: s.opened.GetSubscriptionId(), Consumer: s.opened.GetConsumer(),
					Resubscribed: resubscribed, Settings: s.opened,
				})
			}
			go s.receive()
			go s.sendLoop()
			if sub.serve(s) {
				s.shutdown(sub.opts.CloseTimeout)
				if err := s.endErr(); err != nil {
					sub.setErr(classify("subscribe", sub.client.addr, sub.client.tls, 0, err))
				}
				return
			}
			err = s.endErr()
			if err == nil {
				err = errors.New("the sidecar ended the stream")
			}
		}
		if sub.ctx.Err() != nil {
			sub.setErr(sub.ctx.Err())
			return
		}
		if !retryable(unwrapStatus(err)) || notTheSidecar(err) {
			sub.end(&SubscriptionEndedError{Attempts: failedOpens, Err: err})
			return
		}
		if sub.opts.MaxAttempts > 0 && failedOpens >= sub.opts.MaxAttempts {
			sub.end(&SubscriptionEndedError{Attempts: failedOpens, Err: err})
			return
		}
		wait := backoff/2 + time.Duration(rand.Int63n(int64(backoff/2)+1))
		sub.logf("window: subscription %s: %v; reconnecting in %v", sub.describe(), errString(err), wait.Round(time.Millisecond))
		if sub.opts.OnDisconnected != nil {
			sub.opts.OnDisconnected(Disconnected{Err: err, RetryIn: wait, Attempts: failedOpens})
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-sub.closing:
			t.Stop()
			return
		case <-sub.ctx.Done():
			t.Stop()
			sub.setErr(sub.ctx.Err())
			return
		}
		if backoff *= 2; backoff > sub.opts.MaxBackoff {
			backoff = sub.opts.MaxBackoff
		}
	}
}

// serve hands the session's deliveries to the application until the session ends (false) or
// Close is called (true).
func (sub *Subscription) serve(s *session) bool {
	for {
		d := s.next()
		if d == nil {
			select {
			case <-s.notify:
				continue
			case <-s.done:
				return false
			case <-sub.closing:
				return true
			case <-sub.ctx.Done():
				<-s.done // the stream's context is the subscription's: it ends too
				return false
			}
		}
		// d alone on Deliveries, or its whole read on Batches. Both are counted as handed out
		// before they are offered: the application may settle them as soon as it has them.
		batch := s.readOf(d)
		rest := batch.Deliveries[1:]
		s.hand(batch.Deliveries...)
		select {
		case sub.out <- d:
			s.unhand(rest...)
		case sub.batches <- batch:
			s.dequeue(rest)
		case <-s.drain:
			// The sidecar drains: deliveries not handed out yet stay pending and come back.
			s.unhand(batch.Deliveries...)
		case <-s.done:
			// Undelivered deliveries of a lost stream are dropped here: their entries are
			// pending in Redis and come back on the next stream.
			s.unhand(batch.Deliveries...)
			return false
		case <-sub.closing:
			s.unhand(batch.Deliveries...)
			return true
		case <-sub.ctx.Done():
			s.unhand(batch.Deliveries...)
			<-s.done
			return false
		}
	}
}

// Handler handles one delivery: it queues the delivery's commands and may settle it. ctx is the
// subscription's context carrying the delivery's trace context (d.Context): start the handling
// span from it. A handler that returns nil without settling the delivery acks it; one that
// returns an error (or panics) without settling it has it settled with retry_after (the
// growing delay of Options.RetryDelay) and the reason "handler failed: <error>".
type Handler func(ctx context.Context, d *Delivery) error

// HandlerWithoutContext adapts a handler of the earlier signature.
//
// Deprecated: write a Handler, which gets a context.
func HandlerWithoutContext(h func(d *Delivery) error) Handler {
	return func(_ context.Context, d *Delivery) error { return h(d) }
}

// Run hands every delivery to handler, one at a time, until the subscription ends (Close, the
// context, an error that retrying cannot fix), and returns Err. Call it from several goroutines
// to handle deliveries concurrently.
//
// A failed handler follows the rule of every window-sidecar client: the delivery is retried
// after the growing delay (Options.RetryDelay) with the reason "handler failed: <error>",
// never acked, never dropped, so with MaxDeliveries and DeadLetter a poison entry ends in the
// dead letter.
func (sub *Subscription) Run(handler Handler) error {
	for d := range sub.out {
		sub.handle(d, handler)
	}
	return sub.Err()
}

func (sub *Subscription) handle(d *Delivery, handler Handler) {
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return handler(d.Context(sub.ctx), d)
	}()
	if d.Outcome() != windowv1.OutcomeKind_OUTCOME_KIND_UNSPECIFIED {
		if err != nil {
			sub.logf("window: the handler failed on %s after settling it: %v", d.EntryID, err)
		}
		return
	}
	if err != nil {
		delay := sub.opts.retryDelay(d.DeliveryCount)
		sub.logf("window: the handler failed on %s: %v; retrying it in %v", d.EntryID, err, delay)
		err = d.RetryAfterReason(delay, "handler failed: "+err.Error())
	} else {
		err = d.Ack()
	}
	if err != nil && !errors.Is(err, ErrAlreadySettled) {
		sub.logf("window: %s: the outcome after the handler was not sent: %v", d.EntryID, err)
	}
}

// open is the subscription's Open message, or an error unless exactly one source is set.
func (o *Options) open() (*windowv1.Open, error) {
	open := &windowv1.Open{
		Count:          o.Count,
		Block:          optDuration(o.Block),
		MaxInFlight:    o.MaxInFlight,
		MaxDeliveries:  o.MaxDeliveries,
		ReportsInReads: o.ReportsInReads,
	}
	sources := 0
	if o.Stream != "" || o.Group != "" {
		if o.Stream == "" || o.Group == "" {
			return nil, errors.New("window: Subscribe needs a stream and a group")
		}
		sources++
		open.Source = &windowv1.Open_Stream{Stream: &windowv1.StreamSource{
			Key: o.Stream, Group: o.Group, Consumer: o.Consumer, StartId: o.StartID,
			MinIdle: optDuration(o.MinIdle), Partitions: o.Partitions,
		}}
	} else if o.Partitions > 0 {
		// Only a stream is partitioned: dropping the number silently would leave replicas that
		// believe they share partitions reading one list or channel.
		return nil, errors.New("window: Partitions is for a stream source (Stream and Group); a list or pub/sub source has no partitions")
	}
	if l := o.ReliableList; l != nil {
		sources++
		open.Source = &windowv1.Open_ReliableList{ReliableList: &windowv1.ReliableListSource{
			Key: l.Key, Consumer: l.Consumer, DeadAfter: optDuration(l.DeadAfter),
		}}
	}
	if o.SimpleList != "" {
		sources++
		open.Source = &windowv1.Open_SimpleList{SimpleList: &windowv1.SimpleListSource{Key: o.SimpleList}}
	}
	if p := o.PubSub; p != nil {
		sources++
		open.Source = &windowv1.Open_Pubsub{Pubsub: &windowv1.PubSubSource{
			Channels: p.Channels, Patterns: p.Patterns, ShardedChannels: p.ShardedChannels, Buffer: p.Buffer,
		}}
	}
	if sources != 1 {
		return nil, errors.New("window: Subscribe needs exactly one source: Stream and Group, ReliableList, SimpleList or PubSub")
	}
	if o.Atomic {
		open.Mode = windowv1.Mode_MODE_ATOMIC
	}
	switch {
	case o.OrderingHeader != "" && o.OrderingField != "":
		return nil, errors.New("window: OrderingHeader and OrderingField: one ordering key, not both")
	case o.OrderingHeader != "":
		open.OrderingKey = &windowv1.OrderingKey{Source: &windowv1.OrderingKey_Header{Header: o.OrderingHeader}}
	case o.OrderingField != "":
		open.OrderingKey = &windowv1.OrderingKey{Source: &windowv1.OrderingKey_Field{Field: o.OrderingField}}
	}
	if o.DeadLetter != "" {
		if open.GetStream() != nil {
			open.DeadLetter = &windowv1.DeadLetter{Target: &windowv1.DeadLetter_Stream{Stream: o.DeadLetter}}
		} else {
			open.DeadLetter = &windowv1.DeadLetter{Target: &windowv1.DeadLetter_List{List: o.DeadLetter}}
		}
	}
	return open, nil
}

func (sub *Subscription) open() (*session, error) {
	ctx, cancel := context.WithCancel(sub.ctx)
	stream, err := sub.client.stub.Subscribe(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	open, _ := sub.opts.open() // checked by Subscribe
	if err := stream.Send(&windowv1.SubscribeRequest{Kind: &windowv1.SubscribeRequest_Open{Open: open}}); err != nil {
		// The status is on the receiving side.
		_, rerr := stream.Recv()
		cancel()
		if rerr != nil && rerr != io.EOF {
			return nil, rerr
		}
		return nil, err
	}
	o := sub.opts
	timer := time.AfterFunc(o.OpenTimeout, cancel)
	msg, err := stream.Recv()
	if !timer.Stop() {
		// The timer fired: the stream is cancelled, whatever Recv returned.
		cancel()
		return nil, status.Errorf(codes.DeadlineExceeded, "no `opened` from the sidecar within %v", o.OpenTimeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	opened := msg.GetOpened()
	if opened == nil {
		cancel()
		return nil, status.Errorf(codes.Internal, "the sidecar's first message is not `opened`: %v", msg)
	}
	s := &session{
		sub:    sub,
		stream: stream,
		cancel: cancel,
		opened: opened,
		reads:  map[uint64]*readState{},
		slots:  map[uint64]*Delivery{},
		notify: make(chan struct{}, 1),
		wake:   make(chan struct{}, 1),
		idle:   make(chan struct{}, 1),
		drain:  make(chan struct{}),
		done:   make(chan struct{}),
		sent:   make(chan struct{}),
	}
	return s, nil
}

// session is one Subscribe stream.
type session struct {
	sub    *Subscription
	stream windowv1.WindowService_SubscribeClient
	cancel context.CancelFunc
	opened *windowv1.Opened

	mu       sync.Mutex
	reads    map[uint64]*readState
	slots    map[uint64]*Delivery
	queue    []*Delivery                  // received, not yet handed to the application
	outbox   []*windowv1.SubscribeRequest // batches for the send loop
	closing  bool                         // no more batches: the send loop half-closes
	stopping bool                         // Close: nothing more handed out, outcomes sent at once
	draining bool                         // the sidecar drains: the same
	handed   int                          // deliveries handed out and not settled
	dead     bool                         // the stream ended
	err      error                        // why (nil: a clean end after our half-close)

	notify chan struct{} // a delivery was queued
	wake   chan struct{} // the outbox changed
	idle   chan struct{} // handed went down
	drain  chan struct{} // closed on the sidecar's Draining
	done   chan struct{} // the receive loop ended
	sent   chan struct{} // the send loop ended
}

func (s *session) next() *Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil
	}
	d := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	return d
}

// readOf is d's read as a Batch: d and the deliveries of its read queued right behind it (a
// read's deliveries are queued together), which stay queued until the batch is taken.
func (s *session) readOf(d *Delivery) *Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &Batch{ReadID: d.read.id, Deliveries: []*Delivery{d}, read: d.read}
	for _, n := range s.queue {
		if n.read != d.read {
			break
		}
		b.Deliveries = append(b.Deliveries, n)
	}
	return b
}

// dequeue takes off the queue the rest of a read the application took as a batch (still at
// its head, unless the queue was emptied meanwhile).
func (s *session) dequeue(ds []*Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range ds {
		if len(s.queue) > 0 && s.queue[0] == d {
			s.queue[0] = nil
			s.queue = s.queue[1:]
		}
	}
}

// hand counts deliveries as handed out (before they are offered to the application).
func (s *session) hand(ds ...*Delivery) {
	s.mu.Lock()
	for _, d := range ds {
		d.handed = true
		s.handed++
	}
	s.mu.Unlock()
}

// unhand takes back deliveries offered and not taken (those settled meanwhile are done).
func (s *session) unhand(ds ...*Delivery) {
	s.mu.Lock()
	for _, d := range ds {
		if d.handed {
			d.handed = false
			s.handed--
		}
	}
	s.mu.Unlock()
	// A shutdown may be waiting for the count to fall.
	select {
	case s.idle <- struct{}{}:
	default:
	}
}

// settledLocked notes that d has an outcome. Called with s.mu held.
func (s *session) settledLocked(d *Delivery) {
	if d.handed {
		d.handed = false
		s.handed--
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// sendEachLocked: every outcome goes out as it is given, not per read (the sidecar drains, or
// the subscription closes: the rest of a read will not be handed out; or the subscription is
// ordered: a key's next entry waits in the sidecar for this one's flush).
func (s *session) sendEachLocked() bool { return s.draining || s.stopping || s.sub.ordered() }

// ordered: the subscription has an ordering key.
func (sub *Subscription) ordered() bool {
	return sub.opts.OrderingHeader != "" || sub.opts.OrderingField != ""
}

// sendLocked hands a message to the send loop (nil: nothing). Called with s.mu held.
func (s *session) sendLocked(req *windowv1.SubscribeRequest) {
	if req == nil {
		return
	}
	s.outbox = append(s.outbox, req)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sendLoop sends the outbox in order; one goroutine sends, as gRPC requires.
func (s *session) sendLoop() {
	defer close(s.sent)
	for {
		s.mu.Lock()
		batch, closing := s.outbox, s.closing
		s.outbox = nil
		s.mu.Unlock()
		for _, req := range batch {
			if err := s.stream.Send(req); err != nil {
				// The stream is broken; the receive loop gets the status.
				return
			}
		}
		if len(batch) > 0 {
			continue
		}
		if closing {
			_ = s.stream.CloseSend()
			return
		}
		select {
		case <-s.wake:
		case <-s.done:
			return
		}
	}
}

func (s *session) receive() {
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			s.mu.Lock()
			s.dead = true
			if err != io.EOF {
				s.err = err
			} else if !s.closing {
				s.err = io.ErrUnexpectedEOF
			}
			s.queue = nil
			s.mu.Unlock()
			s.cancel()
			close(s.done)
			return
		}
		switch kind := msg.Kind.(type) {
		case *windowv1.SubscribeResponse_Read:
			if f := kind.Read.GetFlushed(); f != nil {
				// Reports in reads: the report is about an earlier read, handled first.
				s.onFlush(f)
			}
			s.onRead(kind.Read)
		case *windowv1.SubscribeResponse_Draining:
			s.onDraining(kind.Draining)
		case *windowv1.SubscribeResponse_Flush:
			s.onFlush(kind.Flush)
		case *windowv1.SubscribeResponse_Rejections:
			s.onRejections(kind.Rejections.GetRejections())
		}
	}
}

func (s *session) onRead(r *windowv1.Read) {
	rs := &readState{id: r.GetReadId(), unsettled: len(r.GetDeliveries()),
		partition: r.GetPartition(), partitioned: r.Partition != nil}
	for _, pd := range r.GetDeliveries() {
		d := &Delivery{
			Slot:          pd.GetSlot(),
			EntryID:       pd.GetEntryId(),
			Payload:       pd.GetPayload(),
			Headers:       pd.GetHeaders(),
			Fields:        fieldMap(pd.GetFields()),
			RawFields:     pd.GetFields(),
			DeliveryCount: pd.GetDeliveryCount(),
			Trace:         pd.GetTrace(),
			Channel:       pd.GetChannel(),
			sess:          s,
			read:          rs,
		}
		rs.deliveries = append(rs.deliveries, d)
	}
	if len(rs.deliveries) == 0 {
		return
	}
	s.mu.Lock()
	s.reads[rs.id] = rs
	for _, d := range rs.deliveries {
		s.slots[d.Slot] = d
	}
	if !s.closing && !s.stopping && !s.draining {
		s.queue = append(s.queue, rs.deliveries...)
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *session) onDraining(dr *windowv1.Draining) {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = true
	s.queue = nil
	close(s.drain)
	s.sendLocked(s.batchOf(s.settledUnsentLocked()))
	s.mu.Unlock()
	info := Draining{Grace: dr.GetGrace().AsDuration(), Outstanding: dr.GetOutstanding()}
	s.sub.logf("window: the sidecar is draining (grace %v, %d outstanding): sending settled outcomes now, half-closing once the started ones are settled",
		info.Grace, info.Outstanding)
	go s.halfCloseWhenSettled(info.Grace)
	if s.sub.opts.OnDraining != nil {
		s.sub.opts.OnDraining(info)
	}
}

// halfCloseWhenSettled is the client's end of a drain: it waits (up to grace) until every
// delivery the application started (took from Deliveries or Batches) is settled, sends the
// outcomes not sent yet and half-closes the stream. The sidecar then ends the subscription at
// once rather than waiting out its grace for deliveries this client received and never handed
// out: their entries stay pending and are delivered again, to the next subscription.
func (s *session) halfCloseWhenSettled(grace time.Duration) {
	if grace <= 0 {
		grace = s.sub.opts.CloseTimeout // a drain without a grace (none given)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
wait:
	for {
		s.mu.Lock()
		n, dead, closing := s.handed, s.dead, s.closing
		s.mu.Unlock()
		if n == 0 || dead || closing {
			break
		}
		select {
		case <-s.idle:
		case <-s.done:
			return
		case <-t.C:
			s.sub.logf("window: the drain's grace is over with %d started deliveries unsettled: they stay pending and come back", n)
			break wait
		}
	}
	s.mu.Lock()
	if s.dead || s.closing {
		s.mu.Unlock()
		return
	}
	s.sendLocked(s.batchOf(s.settledUnsentLocked()))
	s.closing = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	// Close may be waiting on idle too: it sees the count it waits for, or the stream's end.
	select {
	case s.idle <- struct{}{}:
	default:
	}
}

// settledUnsentLocked: the deliveries with an outcome not sent yet, read by read. Called with
// s.mu held.
func (s *session) settledUnsentLocked() []*Delivery {
	var pending []*Delivery
	for _, rs := range s.reads {
		for _, d := range rs.settled {
			if !d.sent {
				pending = append(pending, d)
			}
		}
	}
	return pending
}

// onFlush handles a flush report. An ordered subscription's read may be flushed in parts (a
// settled delivery whose key has a later entry waiting goes ahead of the rest of its read), so
// a read can have several reports: each covers the read's outcomes sent since the last one,
// and the read is done once all of them were (or, the stream closing, the sidecar abandoned
// the rest).
func (s *session) onFlush(report *windowv1.FlushReport) {
	s.mu.Lock()
	// What the report says Redis refused, as errors for OnError, with their deliveries (known
	// until this report is handled).
	var errs []error
	for _, f := range report.GetSideEffectFailures() {
		errs = append(errs, &SideEffectError{Slot: f.GetSlot(), EntryID: f.GetEntryId(), Command: f.GetCommand(),
			RedisError: f.GetError(), Settled: f.GetSettled(), Delivery: s.slots[f.GetSlot()], Failure: f})
	}
	for _, r := range report.GetRequeueRefused() {
		rerr := &RequeueRefusedError{Slot: r.GetSlot(), EntryID: r.GetEntryId(), RedisError: r.GetError(), Refusal: r}
		if d := s.slots[r.GetSlot()]; r.GetSlot() != 0 && d != nil {
			rerr.Delivery = d
			if d.outcome != nil {
				rerr.Outcome = outcomeName(d.outcome.GetKind())
			}
		}
		errs = append(errs, rerr)
	}
	rs := s.reads[report.GetReadId()]
	var settled []*Delivery
	if rs != nil {
		for _, d := range rs.settled {
			if d.sent && !d.reported {
				d.reported = true
				settled = append(settled, d)
			}
		}
		done := !s.sub.ordered() || s.dead || s.closing
		if !done {
			done = true
			for _, d := range rs.deliveries {
				if !d.reported {
					done = false
					break
				}
			}
		}
		if done {
			delete(s.reads, rs.id)
			for _, d := range rs.deliveries {
				delete(s.slots, d.Slot)
			}
		} else {
			for _, d := range settled {
				delete(s.slots, d.Slot)
			}
		}
	}
	s.mu.Unlock()
	if !report.GetOk() {
		s.sub.logf("window: flush of read %d failed: %s (failed=%d settle_failed=%v)",
			report.GetReadId(), report.GetError(), report.GetFailed(), report.GetSettleFailed())
	}
	if s.sub.opts.OnFlush != nil {
		s.sub.opts.OnFlush(Flush{Report: report, Settled: settled})
	}
	for _, err := range errs {
		s.sub.logf("%v", err)
		s.sub.onError(err)
	}
}

func (s *session) onRejections(rejections []*windowv1.Rejection) {
	bySlot := map[uint64][]*windowv1.Rejection{}
	var order []uint64
	for _, r := range rejections {
		if _, seen := bySlot[r.GetSlot()]; !seen {
			order = append(order, r.GetSlot())
		}
		bySlot[r.GetSlot()] = append(bySlot[r.GetSlot()], r)
	}
	for _, slot := range order {
		rs := bySlot[slot]
		s.mu.Lock()
		d := s.slots[slot]
		reopened := false
		var why *windowv1.Rejection
		for _, r := range rs {
			if r.GetCommand() != "" && why == nil {
				why = r
			}
			switch r.GetReason() {
			case windowv1.RejectionReason_REJECTION_REASON_INCOMPLETE_SEGMENT,
				windowv1.RejectionReason_REJECTION_REASON_INVALID_OUTCOME:
				// The outcome was refused: the slot is still open on the sidecar.
				if d != nil && d.outcome != nil && d.sent {
					d.outcome, d.sent, d.commands, reopened = nil, false, nil, true
					d.read.settled = removeDelivery(d.read.settled, d)
					if !d.read.sent {
						d.read.unsettled++ // sent on its own while draining or closing
					}
				}
			case windowv1.RejectionReason_REJECTION_REASON_ALREADY_SETTLED:
				// The slot is not outstanding on the sidecar any more (its partition was handed
				// over, or fenced): no flush report will name it.
				if d != nil && d.outcome != nil && d.sent && !d.reported {
					s.unreportedLocked(d)
				}
			}
		}
		if d != nil {
			// A refused command explains the refused ack that follows, also in a later message.
			if why != nil {
				d.rejection = why
			} else if d.rejection != nil {
				why = d.rejection
			}
		}
		if why == nil {
			why = rs[0]
		}
		reason := strings.TrimPrefix(why.GetReason().String(), "REJECTION_REASON_")
		rerr := &RejectedError{Reason: reason, Slot: slot, Command: why.GetCommand(), Message: why.GetMessage(),
			Delivery: d, Rejection: why}
		var err error
		if reopened {
			// The caller's error, not a retry loop: settled as RejectedOutcome says, under the
			// lock that reopened it (the handler's return must not find it open and ack it
			// again), and reported to OnError; the sidecar's advice (settle it otherwise) is
			// what this does.
			err = s.resettleLocked(d, why, reason, rerr)
		}
		s.mu.Unlock()
		if !reopened {
			if why.GetCommand() != "" && d != nil && d.Outcome() == windowv1.OutcomeKind_OUTCOME_KIND_ACK {
				// The ack's refusal (INCOMPLETE_SEGMENT) follows in its own message: reported then.
				continue
			}
			s.sub.logf("window: %v", rerr)
			s.sub.onError(rerr)
			continue
		}
		if err != nil {
			rerr.Outcome = ""
			s.sub.logf("window: slot %d: the outcome after the rejection was not sent: %v", d.Slot, err)
		}
		s.sub.logf("%v", rerr)
		s.sub.onError(rerr)
	}
}

// unreportedLocked: the sidecar answered d's outcome ALREADY_SETTLED, so the slot is no longer
// outstanding there (its partition was handed over to another replica, or fenced itself), no
// flush report will ever name it, and its entry is delivered again by the partition's new
// reader. It is done for its read as a reported delivery is; once every delivery of the read
// is, the read is dropped as its last report would have dropped it. Its outcome already took
// it off the handed-out count. Called with s.mu held.
func (s *session) unreportedLocked(d *Delivery) {
	d.reported = true
	delete(s.slots, d.Slot)
	rs := d.read
	for _, x := range rs.deliveries {
		if !x.reported {
			return
		}
	}
	if s.reads[rs.id] == rs {
		delete(s.reads, rs.id)
	}
}

// resettleLocked settles a reopened delivery as RejectedOutcome says and names the outcome in
// rerr. Called with the session lock held.
func (s *session) resettleLocked(d *Delivery, why *windowv1.Rejection, reason string, rerr *RejectedError) error {
	opts := &s.sub.opts
	settleReason := "rejected: " + reason + ": " + why.GetMessage()
	drop := opts.RejectedOutcome == RejectedDrop
	deadLetter := false
	if opts.RejectedOutcome == RejectedAuto {
		switch why.GetReason() {
		case windowv1.RejectionReason_REJECTION_REASON_INVALID_COMMAND,
			windowv1.RejectionReason_REJECTION_REASON_FORBIDDEN_COMMAND,
			windowv1.RejectionReason_REJECTION_REASON_PERMISSION_DENIED:
			deadLetter = opts.hasDeadLetter()
			drop = !deadLetter
		}
	}
	switch {
	case deadLetter:
		rerr.Outcome = "dead_letter"
		return d.settleLocked(windowv1.OutcomeKind_OUTCOME_KIND_DEAD_LETTER, 0, settleReason)
	case drop:
		rerr.Outcome = "drop"
		return d.settleLocked(windowv1.OutcomeKind_OUTCOME_KIND_DROP, 0, settleReason)
	default:
		delay := opts.retryDelay(d.DeliveryCount)
		rerr.Outcome = fmt.Sprintf("retry_after %v", delay)
		return d.settleLocked(windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER, delay, settleReason)
	}
}

func removeDelivery(ds []*Delivery, d *Delivery) []*Delivery {
	out := ds[:0]
	for _, x := range ds {
		if x != d {
			out = append(out, x)
		}
	}
	return out
}

// shutdown stops handing out deliveries, waits (up to timeout) for those handed out to be
// settled, sends the outcomes not sent yet (of reads still partly unsettled), half-closes the
// stream and waits (up to timeout again) for the sidecar to flush and end it.
func (s *session) shutdown(timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	s.mu.Lock()
	s.stopping = true
	s.queue = nil
	s.mu.Unlock()
wait:
	for {
		s.mu.Lock()
		n, dead := s.handed, s.dead
		s.mu.Unlock()
		if n == 0 || dead {
			break
		}
		select {
		case <-s.idle:
		case <-s.done:
			break wait
		case <-t.C:
			s.sub.logf("window: closing with %d unsettled deliveries: they stay pending and come back", n)
			break wait
		}
	}
	s.mu.Lock()
	if !s.dead {
		s.sendLocked(s.batchOf(s.settledUnsentLocked()))
	}
	s.closing = true
	s.queue = nil
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(timeout)
	select {
	case <-s.done:
	case <-t.C:
		// The sidecar did not end the stream in time (seen with a simple list whose blocking
		// read is waiting). Nothing is lost when every outcome sent has its flush report;
		// otherwise say so.
		s.sub.logf("window: the sidecar did not end the stream within %v of the half-close; cancelling it", timeout)
		s.cancel()
		<-s.done
		s.mu.Lock()
		unreported := 0
		for _, rs := range s.reads {
			for _, d := range rs.deliveries {
				// Reported already: part of an ordered read, or refused ALREADY_SETTLED.
				if d.sent && !d.reported {
					unreported++
				}
			}
		}
		if unreported == 0 {
			s.err = nil
		} else {
			s.err = status.Errorf(codes.DeadlineExceeded,
				"the sidecar did not end the stream within %v of the half-close: the flush reports of %d outcomes were not received (their effects may or may not have been applied; unsettled entries come back)",
				timeout, unreported)
		}
		s.mu.Unlock()
	}
}

// endErr is why the stream ended (nil: cleanly, after Close).
func (s *session) endErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// retryable says whether a new stream may succeed where this one failed.
func retryable(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	st, ok := status.FromError(err)
	if !ok {
		return true // not a gRPC status: a transport error
	}
	switch st.Code() {
	case codes.Unavailable, // the sidecar is shutting down or unreachable, or Redis is
		codes.AlreadyExists, // our consumer name is still held by the previous stream
		codes.Aborted, codes.ResourceExhausted, codes.DeadlineExceeded,
		codes.Internal, codes.Unknown, codes.Canceled: // broken connections surface as these
		return true
	}
	// InvalidArgument, FailedPrecondition, Unimplemented, PermissionDenied...: fix the request.
	return false
}

func describe(err error) string {
	if st, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", st.Code(), st.Message())
	}
	return err.Error()
}

func optDuration(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}
