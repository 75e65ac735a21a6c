package window

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// ErrStale: the stream that delivered this is gone (the sidecar restarted, the connection
// broke, or the subscription was closed). Nothing is sent for it: the entry stays pending in
// Redis and is delivered again on the next stream.
var ErrStale = errors.New("window: the stream that delivered this is gone; the entry stays pending and will be delivered again")

// Delivery is one stream entry handed to the application. Queue commands for it, then settle it
// exactly once with Ack, Drop, Retry or RetryAfter (Extend it meanwhile when handling is long). Its methods are safe for concurrent use.
type Delivery struct {
	// Slot is the sidecar's id for this delivery within its stream.
	Slot uint64
	// EntryID is the Redis entry id.
	EntryID string
	// Payload and Headers: the entry in the payload-and-headers layout (what Publish writes:
	// the stream fields `_payload` and `h:<name>`).
	Payload []byte
	Headers map[string]string
	// Fields: an entry not in the payload layout (another producer's `XADD k * sku apple qty
	// 2`), its fields by name (the last value of a repeated name); nil for an entry in the
	// layout. TextFields has them as text.
	Fields map[string][]byte
	// RawFields: the same fields as received, in order, repeated names included.
	RawFields []*windowv1.Field
	// DeliveryCount: deliveries of this entry and its earlier retried copies, this one
	// included (1 on the first delivery).
	DeliveryCount uint32
	// Trace is the producer's trace context, when the entry carries one.
	Trace *windowv1.TraceContext
	// Channel: pub/sub, the channel the message arrived on.
	Channel string

	sess     *session
	read     *readState
	commands []*windowv1.QueuedCommand
	outcome  *windowv1.Outcome
	sent     bool // the outcome went to the sidecar
	// reported: done for its read. A flush report of its read came after that, or the sidecar
	// answered the outcome ALREADY_SETTLED (its slot is no longer outstanding there: no report
	// ever names it).
	reported bool
	handed   bool // handed to the application and not settled
	trace    *windowv1.TraceContext
	// rejection is the sidecar's refusal of one of its commands, kept to explain the refused
	// ack that follows it.
	rejection *windowv1.Rejection
}

// readState is one Read: its deliveries and whether its batch was sent.
type readState struct {
	id         uint64
	deliveries []*Delivery
	unsettled  int
	settled    []*Delivery // in the order of their outcomes (the sidecar keeps acks in this order)
	sent       bool
	// partition is the read's partition on a partitioned stream (Read.partition), when
	// partitioned.
	partition   uint32
	partitioned bool
}

// Batch is one read's deliveries in stream order, handed out together by
// Subscription.Batches. Settle a delivery on its own where the handler must (d.Drop(reason),
// d.Queue(…) then d.Ack()), and the rest with one call.
type Batch struct {
	// ReadID is the read these deliveries came in.
	ReadID     uint64
	Deliveries []*Delivery

	read *readState
}

// Partition is, on a partitioned stream, the partition the read came from, that of each of its
// deliveries (Delivery.Partition; entry ids repeat across partitions), and true; 0 and false
// on an unpartitioned stream.
func (b *Batch) Partition() (uint32, bool) { return b.read.partitionOf() }

// Unsettled is the deliveries without an outcome yet.
func (b *Batch) Unsettled() []*Delivery {
	var out []*Delivery
	for _, d := range b.Deliveries {
		if !d.Settled() {
			out = append(out, d)
		}
	}
	return out
}

// Ack acks every delivery without an outcome yet, with the commands queued on it.
func (b *Batch) Ack() error { return b.each((*Delivery).Ack) }

// Drop drops every delivery without an outcome yet.
func (b *Batch) Drop(reason string) error {
	return b.each(func(d *Delivery) error { return d.Drop(reason) })
}

// Retry retries every delivery without an outcome yet.
func (b *Batch) Retry(reason string) error {
	return b.each(func(d *Delivery) error { return d.Retry(reason) })
}

// each settles the unsettled deliveries, all of them whatever fails, and returns the first
// error.
func (b *Batch) each(settle func(*Delivery) error) error {
	var first error
	for _, d := range b.Unsettled() {
		if err := settle(d); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Partition is, on a partitioned stream (Options.Partitions), the partition the entry was read
// from (its stream is `<Stream>:{partition}`), and true. Entry ids repeat across partitions, so
// the partition with EntryID names an entry where EntryID alone does not. 0 and false on an
// unpartitioned stream, a list or pub/sub.
func (d *Delivery) Partition() (uint32, bool) { return d.read.partitionOf() }

// partitionOf is the read's partition and whether it has one (none without a read).
func (r *readState) partitionOf() (uint32, bool) {
	if r == nil {
		return 0, false
	}
	return r.partition, r.partitioned
}

// HasPayload says whether the entry is in the payload layout (what the clients publish): false
// for an entry another producer wrote with plain fields, which has Fields instead.
func (d *Delivery) HasPayload() bool { return len(d.RawFields) == 0 }

// Text is the payload as UTF-8 text. For an entry not in the payload layout it returns an
// error naming the fields to read instead (see JSON).
func (d *Delivery) Text() (string, error) {
	if !d.HasPayload() {
		return "", d.noPayload("Text")
	}
	return string(d.Payload), nil
}

// JSON decodes the payload as JSON into v (encoding/json). For an entry not in the payload
// layout it fails with an error that says so and names the entry's fields (read them from
// Fields or TextFields); a payload that is not JSON fails with encoding/json's error, wrapped
// with the entry id.
func (d *Delivery) JSON(v any) error {
	if !d.HasPayload() {
		return d.noPayload("JSON")
	}
	if err := json.Unmarshal(d.Payload, v); err != nil {
		return fmt.Errorf("window: the payload of entry %s is not JSON: %w", d.EntryID, err)
	}
	return nil
}

// TextFields is Fields as text (invalid UTF-8 replaced); nil for an entry in the payload layout.
func (d *Delivery) TextFields() map[string]string {
	if d.Fields == nil {
		return nil
	}
	m := make(map[string]string, len(d.Fields))
	for k, v := range d.Fields {
		m[k] = strings.ToValidUTF8(string(v), "\uFFFD")
	}
	return m
}

func (d *Delivery) noPayload(call string) error {
	names := make([]string, 0, len(d.RawFields))
	for _, f := range d.RawFields {
		names = append(names, string(f.GetName()))
	}
	return fmt.Errorf("window: %s: entry %s is not in the payload layout (no _payload field; another producer wrote it with plain fields %s): read d.Fields or d.TextFields() instead",
		call, d.EntryID, strings.Join(names, ", "))
}

func fieldMap(fs []*windowv1.Field) map[string][]byte {
	if len(fs) == 0 {
		return nil
	}
	m := make(map[string][]byte, len(fs))
	for _, f := range fs {
		m[string(f.GetName())] = f.GetValue()
	}
	return m
}

// Settled says whether the delivery has an outcome.
func (d *Delivery) Settled() bool {
	return d.Outcome() != windowv1.OutcomeKind_OUTCOME_KIND_UNSPECIFIED
}

func (d *Delivery) settledError() error {
	return &AlreadySettledError{Slot: d.Slot, EntryID: d.EntryID, Outcome: d.outcome.GetKind()}
}

// Queue adds a Redis command to the delivery's side effects. It runs only if the delivery is
// acked, in the read's flush; its reply is never seen. Arguments may be strings, []byte,
// integers, floats, bools or fmt.Stringers.
func (d *Delivery) Queue(name string, args ...any) error {
	if name == "" {
		return errors.New("window: Queue needs a command name")
	}
	cmd := &windowv1.QueuedCommand{Slot: d.Slot, Name: name, Args: make([][]byte, len(args))}
	for i, a := range args {
		cmd.Args[i] = argBytes(a)
	}
	s := d.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.outcome != nil {
		return d.settledError()
	}
	if s.dead || s.closing {
		return ErrStale
	}
	d.commands = append(d.commands, cmd)
	return nil
}

// Ack settles the delivery and keeps its queued commands: they run in the read's flush, with the
// entry's XACK.
func (d *Delivery) Ack() error { return d.settle(windowv1.OutcomeKind_OUTCOME_KIND_ACK, 0, "") }

// Drop settles the delivery and discards its commands: the entry is acked and never comes back.
func (d *Delivery) Drop(reason string) error {
	return d.settle(windowv1.OutcomeKind_OUTCOME_KIND_DROP, 0, reason)
}

// Retry discards the delivery's commands; a copy of the entry comes back at the end of the
// stream.
func (d *Delivery) Retry(reason string) error {
	return d.settle(windowv1.OutcomeKind_OUTCOME_KIND_RETRY, 0, reason)
}

// RetryAfter discards the delivery's commands; the entry is delivered again after delay (at
// least 1 ms), durably scheduled in Redis.
func (d *Delivery) RetryAfter(delay time.Duration) error { return d.RetryAfterReason(delay, "") }

// RetryAfterReason is RetryAfter with a reason, kept with the copy as header x-window-reason.
func (d *Delivery) RetryAfterReason(delay time.Duration, reason string) error {
	if delay < time.Millisecond {
		return fmt.Errorf("window: RetryAfter needs a delay of at least 1ms, got %v", delay)
	}
	return d.settle(windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER, delay, reason)
}

// DeadLetter settles the delivery and discards its commands, as Drop does; the entry is
// written to the subscription's dead-letter target at once, whatever its delivery count, with
// reason (the dead letter's x-window-reason): for an entry no retry can fix. It needs a
// dead-letter target (Options.MaxDeliveries and DeadLetter; pub/sub has none): without one it
// returns an error and settles nothing.
func (d *Delivery) DeadLetter(reason string) error {
	if !d.sess.sub.opts.hasDeadLetter() {
		return errors.New("window: DeadLetter needs a dead-letter target: subscribe with MaxDeliveries and DeadLetter, or settle it with Drop")
	}
	return d.settle(windowv1.OutcomeKind_OUTCOME_KIND_DEAD_LETTER, 0, reason)
}

// Outcome is the delivery's outcome so far (OUTCOME_KIND_UNSPECIFIED while unsettled).
func (d *Delivery) Outcome() windowv1.OutcomeKind {
	d.sess.mu.Lock()
	defer d.sess.mu.Unlock()
	return d.outcome.GetKind()
}

// Reason is the reason given with the outcome, if any.
func (d *Delivery) Reason() string {
	d.sess.mu.Lock()
	defer d.sess.mu.Unlock()
	return d.outcome.GetReason()
}

// Extend says the delivery is still being worked on (NATS JetStream's in_progress): another
// consumer does not take it meanwhile (a stream entry is made idle again, a reliable list's
// lease renewed; simple lists and pub/sub have nothing that could take it). It sends at once,
// not with the read's batch, and may be called any number of times before the outcome.
func (d *Delivery) Extend() error {
	s := d.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.outcome != nil {
		return d.settledError()
	}
	if s.dead || s.closing {
		return ErrStale
	}
	s.sendLocked(&windowv1.SubscribeRequest{Kind: &windowv1.SubscribeRequest_Batch{
		Batch: &windowv1.Batch{Extend: []uint64{d.Slot}},
	}})
	return nil
}

func (d *Delivery) settle(kind windowv1.OutcomeKind, delay time.Duration, reason string) error {
	s := d.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	return d.settleLocked(kind, delay, reason)
}

// settleLocked is settle with the session lock held: a refused outcome is settled anew under
// the same lock that reopened it, so no other goroutine sees the delivery open in between.
func (d *Delivery) settleLocked(kind windowv1.OutcomeKind, delay time.Duration, reason string) error {
	s := d.sess
	o := &windowv1.Outcome{Slot: d.Slot, Kind: kind, Reason: reason, Trace: d.trace}
	if kind == windowv1.OutcomeKind_OUTCOME_KIND_RETRY_AFTER {
		o.Delay = durationpb.New(delay)
	}
	if d.outcome != nil {
		return d.settledError()
	}
	if s.dead || s.closing {
		return ErrStale
	}
	d.outcome = o
	s.settledLocked(d)
	r := d.read
	r.settled = append(r.settled, d)
	if r.sent {
		// The read's batch went out already and this delivery was reopened after a rejection:
		// send its new outcome on its own.
		s.sendLocked(s.batchOf([]*Delivery{d}))
		return nil
	}
	r.unsettled--
	if r.unsettled == 0 {
		r.sent = true
		s.sendLocked(s.batchOf(r.settled))
	} else if s.sendEachLocked() {
		s.sendLocked(s.batchOf(r.settled))
	}
	return nil
}

// batchOf builds one batch: every command of the deliveries, then their outcomes, in order
// (with PackedAcks, plain acks as slot ids in `acks`, which the sidecar applies after the
// outcomes). Marks them sent. nil when there is nothing to send. Called with the session lock
// held.
func (s *session) batchOf(ds []*Delivery) *windowv1.SubscribeRequest {
	b := &windowv1.Batch{}
	packed := s.sub.opts.PackedAcks
	for _, d := range ds {
		if d.sent {
			continue
		}
		o := d.outcome
		if o.GetKind() == windowv1.OutcomeKind_OUTCOME_KIND_ACK {
			// Commands of other outcomes would be discarded anyway: don't send them.
			b.Commands = append(b.Commands, d.commands...)
			if packed && o.GetReason() == "" && o.GetTrace() == nil {
				b.Acks = append(b.Acks, d.Slot)
				d.sent = true
				continue
			}
		}
		b.Outcomes = append(b.Outcomes, o)
		d.sent = true
	}
	if len(b.Outcomes) == 0 && len(b.Acks) == 0 {
		return nil
	}
	return &windowv1.SubscribeRequest{Kind: &windowv1.SubscribeRequest_Batch{Batch: b}}
}

func argBytes(a any) []byte {
	switch v := a.(type) {
	case []byte:
		return v
	case string:
		return []byte(v)
	case int:
		return strconv.AppendInt(nil, int64(v), 10)
	case int8:
		return strconv.AppendInt(nil, int64(v), 10)
	case int16:
		return strconv.AppendInt(nil, int64(v), 10)
	case int32:
		return strconv.AppendInt(nil, int64(v), 10)
	case int64:
		return strconv.AppendInt(nil, v, 10)
	case uint:
		return strconv.AppendUint(nil, uint64(v), 10)
	case uint8:
		return strconv.AppendUint(nil, uint64(v), 10)
	case uint16:
		return strconv.AppendUint(nil, uint64(v), 10)
	case uint32:
		return strconv.AppendUint(nil, uint64(v), 10)
	case uint64:
		return strconv.AppendUint(nil, v, 10)
	case float32:
		return strconv.AppendFloat(nil, float64(v), 'f', -1, 32)
	case float64:
		return strconv.AppendFloat(nil, v, 'f', -1, 64)
	case bool:
		if v {
			return []byte("1")
		}
		return []byte("0")
	case fmt.Stringer:
		return []byte(v.String())
	default:
		return []byte(fmt.Sprint(v))
	}
}
