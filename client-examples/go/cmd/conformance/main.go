// Command conformance is the Go client's conformance runner: it plays the worker side of one
// scenario of client-examples/conformance/scenarios with the window package and prints what it
// sees as JSON lines (see client-examples/conformance/README.md). The address, the token and
// the TLS files come from the environment, read by the window package (window.Dial("")).
//
//	conformance SCENARIO.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"example.invalid/window-sidecar/client-examples/go/window"
)

type scenario struct {
	Open struct {
		Form            string `json:"form"`
		Key             string `json:"key"`
		Group           string `json:"group"`
		Consumer        string `json:"consumer"`
		Count           uint32 `json:"count"`
		Mode            string `json:"mode"`
		MaxDeliveries   uint32 `json:"max_deliveries"`
		DeadLetter      string `json:"dead_letter"`
		ReportsInReads  bool   `json:"reports_in_reads"`
		PackedAcks      bool   `json:"packed_acks"`
		RejectedOutcome string `json:"rejected_outcome"`
		MaxAttempts     int    `json:"max_attempts"`
		MaxInFlight     uint32 `json:"max_in_flight"`
		OrderingHeader  string `json:"ordering_header"`
		OrderingField   string `json:"ordering_field"`
		Partitions      uint32 `json:"partitions"`
		// Consumers, instead of Consumer: replicas of one group, one subscription each on a
		// client (a connection) of its own, handled side by side.
		Consumers []string `json:"consumers"`
	} `json:"open"`
	Sidecar struct {
		Listen string `json:"listen"`
	} `json:"sidecar"`
	SideEffect string `json:"side_effect"`
	Publish    []struct {
		Payload string            `json:"payload"`
		Headers map[string]string `json:"headers"`
	} `json:"publish"`
	// PublishPartitions has the publish write a partitioned stream: each entry to the partition
	// of its key, the header or the field named.
	PublishPartitions *struct {
		Partitions uint32 `json:"partitions"`
		Header     string `json:"header"`
		Field      string `json:"field"`
	} `json:"publish_partitions"`
	// PublishTimeoutMs is the publish call's deadline (a context deadline); 0: the client's
	// default (window.DefaultCallTimeout).
	PublishTimeoutMs int                 `json:"publish_timeout_ms"`
	Handle           map[string][]string `json:"handle"`
	Effects          string              `json:"effects"`
	// Expect is read here only for the calls that must fail (which calls to make).
	Expect struct {
		Errors []struct {
			Call string `json:"call"`
		} `json:"errors"`
	} `json:"expect"`
}

// expects is whether the scenario expects call to fail.
func (sc *scenario) expects(call string) bool {
	for _, e := range sc.Expect.Errors {
		if e.Call == call {
			return true
		}
	}
	return false
}

var outMu sync.Mutex

func emit(event string, fields map[string]any) {
	m := map[string]any{"event": event}
	for k, v := range fields {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		log.Fatal(err)
	}
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func main() {
	log.SetOutput(os.Stderr)
	if len(os.Args) != 2 {
		log.Fatal("usage: conformance SCENARIO.json")
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	var sc scenario
	if err := json.Unmarshal(raw, &sc); err != nil {
		log.Fatal(err)
	}
	began := time.Now()
	client, err := window.Dial("")
	if err != nil {
		if len(sc.Expect.Errors) > 0 {
			failed("connect", err, began)
			return
		}
		log.Fatal(err)
	}
	defer client.Close()
	if len(sc.Expect.Errors) > 0 {
		closedSidecar(client, &sc)
		return
	}

	// `open.consumers`: replicas of one group, each a subscription on a client (a connection)
	// of its own, as separate processes would have, all handled here, their lines naming the
	// consumer; else the one `open.consumer` on the one client, its lines naming none.
	o := sc.Open
	replicas := o.Consumers
	several := len(replicas) > 0
	if !several {
		replicas = []string{o.Consumer}
	}
	clients := []*window.Client{client}
	for range replicas[1:] {
		c, err := window.Dial("")
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}

	var names sync.Map // *window.Delivery -> its name, for the error callback
	var seenMu sync.Mutex
	seen := map[string]int{}
	// With `hold_until`, a held delivery must not stop the others: Run on several goroutines
	// (each hands out one delivery at a time).
	runners := 1
	for _, actions := range sc.Handle {
		for _, a := range actions {
			if strings.HasPrefix(a, "hold_until:") {
				runners = 4
			}
		}
	}
	ctx := context.Background()
	var openedWG sync.WaitGroup
	subs := make([]*window.Subscription, len(replicas))
	dones := make([]chan error, len(replicas))
	for i, consumer := range replicas {
		named := ""
		if several {
			named = consumer
		}
		openedWG.Add(1)
		var openOnce sync.Once
		opts := options(&sc, consumer, &names, func() { openOnce.Do(openedWG.Done) })
		sub, err := clients[i].Subscribe(ctx, opts)
		if err != nil {
			log.Fatal(err)
		}
		subs[i] = sub
		done := make(chan error, runners)
		dones[i] = done
		for r := 0; r < runners; r++ {
			go func() {
				done <- sub.Run(func(_ context.Context, d *window.Delivery) error {
					// An entry another producer wrote with plain fields is named by its id field.
					payload := string(d.Payload)
					fields := map[string]any{}
					if !d.HasPayload() {
						payload = d.TextFields()["id"]
						var v any
						jsonErr := any(nil)
						if err := d.JSON(&v); err != nil {
							jsonErr = err.Error()
						}
						fields["fields"] = d.TextFields()
						fields["json_error"] = jsonErr
					}
					names.Store(d, payload)
					seenMu.Lock()
					seen[payload]++
					n := seen[payload]
					seenMu.Unlock()
					headers := d.Headers
					if headers == nil {
						headers = map[string]string{}
					}
					fields["payload"], fields["count"], fields["headers"] = payload, d.DeliveryCount, headers
					if named != "" {
						fields["consumer"] = named
					}
					if p, ok := d.Partition(); ok {
						fields["partition"] = p
					}
					emit("delivery", fields)
					return handle(d, payload, named, action(sc.Handle, payload, n), sc.Effects, sc.SideEffect == "typed")
				})
			}()
		}
	}
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-terms
		for _, sub := range subs {
			sub.Stop()
		}
	}()

	// Every subscription opened, or one ended before it did.
	allOpened := make(chan struct{})
	go func() {
		openedWG.Wait()
		close(allOpened)
	}()
	ended := make(chan error, len(dones))
	for _, done := range dones {
		go func(done chan error) {
			ended <- <-done // the first Run of the subscription to return
		}(done)
	}
	select {
	case <-allOpened:
	case err := <-ended:
		log.Fatalf("the subscription ended before it opened: %v", err)
	}
	emit("opened", nil)
	msgs := make([]window.Message, len(sc.Publish))
	for i, p := range sc.Publish {
		msgs[i] = window.Message{Payload: []byte(p.Payload), Headers: p.Headers}
	}
	if err := publish(ctx, client, &sc, msgs); err != nil {
		log.Fatalf("publish: %v", err)
	}
	emit("published", map[string]any{"count": len(msgs)})
	for range dones {
		if err := <-ended; err != nil {
			log.Fatalf("the subscription failed: %v", err)
		}
	}
}

// options is the subscription the scenario's `open` describes, as consumer; opened is called on
// each of its opens.
func options(sc *scenario, consumer string, names *sync.Map, opened func()) window.Options {
	o := sc.Open
	opts := window.Options{
		RejectedOutcome: rejectedOutcome(o.RejectedOutcome),
		MaxAttempts:     o.MaxAttempts,
		OnError: func(err error) {
			nameOf := func(d *window.Delivery) string {
				if n, ok := names.Load(d); ok {
					return n.(string)
				}
				return ""
			}
			var (
				re *window.RejectedError
				se *window.SideEffectError
				qe *window.RequeueRefusedError
			)
			switch {
			case errors.As(err, &re):
				emit("rejected", map[string]any{"payload": nameOf(re.Delivery), "reason": re.Reason, "error": errorClass(err), "message": err.Error()})
			case errors.As(err, &se):
				emit("side_effect_error", map[string]any{"payload": nameOf(se.Delivery), "command": se.Command,
					"settled": se.Settled, "error": errorClass(err), "message": err.Error()})
			case errors.As(err, &qe):
				emit("requeue_refused", map[string]any{"payload": nameOf(qe.Delivery), "error": errorClass(err), "message": err.Error()})
			}
		},
		Count:          o.Count,
		MaxInFlight:    o.MaxInFlight,
		OrderingHeader: o.OrderingHeader,
		OrderingField:  o.OrderingField,
		Partitions:     o.Partitions,
		Atomic:         o.Mode == "atomic",
		MaxDeliveries:  o.MaxDeliveries,
		DeadLetter:     o.DeadLetter,
		ReportsInReads: o.ReportsInReads,
		PackedAcks:     o.PackedAcks,
		CloseTimeout:   4 * time.Second,
		OnOpened: func(op window.Opened) {
			if op.Resubscribed {
				emit("resubscribed", nil)
			}
			opened()
		},
		OnDraining: func(window.Draining) { emit("draining", nil) },
	}
	if opts.Count == 0 {
		opts.Count = 16
	}
	switch o.Form {
	case "stream":
		opts.Stream, opts.Group, opts.Consumer = o.Key, o.Group, consumer
	case "reliable_list":
		opts.ReliableList = &window.ReliableList{Key: o.Key, Consumer: consumer}
	case "simple_list":
		opts.SimpleList = o.Key
	case "pubsub":
		opts.PubSub = &window.PubSub{Channels: []string{o.Key}}
	default:
		log.Fatalf("unknown form %q", o.Form)
	}
	return opts
}

// action is the n-th action (1-based) of a payload's list, past its end the last one.
func action(handle map[string][]string, payload string, n int) string {
	actions := handle[payload]
	if len(actions) == 0 {
		actions = handle["*"]
	}
	if len(actions) == 0 {
		return "ack"
	}
	if n > len(actions) {
		n = len(actions)
	}
	return actions[n-1]
}

// ackedMu guards ackedChans and ackedOnce: `hold_until:P` waits for the channel of P, closed
// once the delivery named P is acked.
var (
	ackedMu    sync.Mutex
	ackedChans = map[string]chan struct{}{}
	ackedOnce  = map[string]*sync.Once{}
)

func ackedChan(name string) chan struct{} {
	ackedMu.Lock()
	defer ackedMu.Unlock()
	c, ok := ackedChans[name]
	if !ok {
		c = make(chan struct{})
		ackedChans[name] = c
	}
	return c
}

func acked(name string) *sync.Once {
	ackedMu.Lock()
	defer ackedMu.Unlock()
	o, ok := ackedOnce[name]
	if !ok {
		o = &sync.Once{}
		ackedOnce[name] = o
	}
	return o
}

// settle prints the line before an outcome the runner gives (run.sh checks the order with it);
// consumer names the replica with `open.consumers`, else "" (no field).
func settle(d *window.Delivery, name, consumer string) {
	fields := map[string]any{"payload": name, "count": d.DeliveryCount}
	if consumer != "" {
		fields["consumer"] = consumer
	}
	emit("settle", fields)
}

// handle queues the delivery's side effect and takes its action; consumer names the replica
// with `open.consumers`, else "".
func handle(d *window.Delivery, name, consumer, action, effects string, typed bool) error {
	var err error
	if typed {
		err = d.Redis().HINCRBY(effects, name, 1)
	} else {
		err = d.Queue("HINCRBY", effects, name, 1)
	}
	if err != nil {
		return err
	}
	verb, arg, _ := strings.Cut(action, ":")
	ms := func() time.Duration {
		v, err := strconv.Atoi(arg)
		if err != nil {
			log.Fatalf("action %q: %v", action, err)
		}
		return time.Duration(v) * time.Millisecond
	}
	switch verb {
	case "ack":
		settle(d, name, consumer)
		if err := d.Ack(); err != nil {
			return err
		}
		acked(name).Do(func() { close(ackedChan(name)) })
		return nil
	case "drop":
		settle(d, name, consumer)
		return d.Drop("")
	case "retry":
		settle(d, name, consumer)
		return d.Retry("")
	case "dead_letter":
		settle(d, name, consumer)
		return d.DeadLetter("conformance: dead_letter")
	case "retry_after":
		settle(d, name, consumer)
		return d.RetryAfter(ms())
	case "hold_until":
		// Unsettled until that delivery is acked; the other Run goroutines go on meanwhile.
		<-ackedChan(arg)
		settle(d, name, consumer)
		if err := d.Ack(); err != nil {
			return err
		}
		acked(name).Do(func() { close(ackedChan(name)) })
		return nil
	case "reject":
		// A command the sidecar refuses (FLUSHALL, or the one named): the client's rule applies.
		words := []string{"FLUSHALL"}
		if arg != "" {
			words = strings.Split(arg, " ")
		}
		args := make([]any, 0, len(words)-1)
		for _, w := range words[1:] {
			args = append(args, w)
		}
		if err := d.Queue(words[0], args...); err != nil {
			return err
		}
		return d.Ack()
	case "queue":
		// A command the sidecar accepts and Redis may fail when it runs, then an ack.
		words := strings.Split(arg, " ")
		args := make([]any, 0, len(words)-1)
		for _, w := range words[1:] {
			args = append(args, w)
		}
		if err := d.Queue(words[0], args...); err != nil {
			return err
		}
		settle(d, name, consumer)
		if err := d.Ack(); err != nil {
			return err
		}
		acked(name).Do(func() { close(ackedChan(name)) })
		return nil
	case "fail":
		return errors.New("the scenario's handler fails")
	case "typo":
		// A literal d.Redis().HINCRBYY(...) does not compile; looked up by a name known only at
		// run time (reflection), the misspelled command is no method: the call fails here, in
		// the handler, and nothing reaches the sidecar.
		if err := callByName(d.Redis(), "HINCRBYY", effects, name, int64(1)); err != nil {
			emit("call_error", map[string]any{"payload": name, "message": err.Error()})
		}
		return d.Ack()
	case "slow_ack":
		time.Sleep(ms())
		// Its settle line too, so that a slow key's order can be checked like any other's.
		settle(d, name, consumer)
		return d.Ack()
	}
	log.Fatalf("unknown action %q", action)
	return fmt.Errorf("unknown action %q", action)
}

// callByName calls the typed command method of that name, as a caller that knows the name only
// at run time must: through reflection. An unknown name is an error naming it.
func callByName(r *window.Commands, method string, args ...any) error {
	m := reflect.ValueOf(r).MethodByName(method)
	if !m.IsValid() {
		return fmt.Errorf("window.Commands has no method %s: Redis %s has no command %s (a literal d.Redis().%s(...) does not compile)",
			method, window.RedisSpecVersion, method, method)
	}
	in := make([]reflect.Value, len(args))
	for i, a := range args {
		in[i] = reflect.ValueOf(a)
	}
	out := m.Call(in)
	if err, _ := out[0].Interface().(error); err != nil {
		return err
	}
	return nil
}

func rejectedOutcome(s string) window.RejectedOutcome {
	switch s {
	case "", "auto":
		return window.RejectedAuto
	case "drop":
		return window.RejectedDrop
	case "retry_after":
		return window.RejectedRetryAfter
	}
	log.Fatalf("unknown rejected_outcome %q", s)
	return 0
}

// publish writes msgs to the form's target in one call, within the scenario's
// publish_timeout_ms when it gives one (a deadline on the call's context).
func publish(ctx context.Context, client *window.Client, sc *scenario, msgs []window.Message) error {
	if sc.PublishTimeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(sc.PublishTimeoutMs)*time.Millisecond)
		defer cancel()
	}
	if p := sc.PublishPartitions; p != nil {
		// Through the client's own checks whatever the form: it refuses partitions for a list
		// or a channel.
		t := window.Target{Partitions: p.Partitions, PartitionHeader: p.Header, PartitionField: p.Field}
		switch o := sc.Open; o.Form {
		case "stream":
			t.Stream = o.Key
		case "reliable_list", "simple_list":
			t.List = o.Key
		case "pubsub":
			t.Channel = o.Key
		}
		_, err := client.PublishTo(ctx, t, msgs...)
		return err
	}
	var err error
	switch o := sc.Open; o.Form {
	case "stream":
		_, err = client.Publish(ctx, o.Key, msgs...)
	case "reliable_list", "simple_list":
		err = client.PublishList(ctx, o.Key, msgs...)
	case "pubsub":
		_, err = client.PublishChannel(ctx, o.Key, msgs...)
	default:
		err = fmt.Errorf("unknown form %q", o.Form)
	}
	return err
}

// errorClass is the vocabulary's name of one of the window package's errors.
func errorClass(err error) string {
	var (
		ce *window.ConnectionError
		ru *window.RedisUnavailableError
		rf *window.RefusedError
		ct *window.CallTimeoutError
		re *window.RejectedError
		fe *window.SideEffectError
		qe *window.RequeueRefusedError
		se *window.SubscriptionEndedError
		ae *window.AlreadySettledError
		we *window.WindowError
	)
	switch {
	case errors.As(err, &se):
		return "SubscriptionEndedError"
	case errors.As(err, &ce):
		return "ConnectionError"
	case errors.As(err, &ru):
		return "RedisUnavailableError"
	case errors.As(err, &rf):
		return "RefusedError"
	case errors.As(err, &ct):
		return "CallTimeoutError"
	case errors.As(err, &re):
		return "RejectedError"
	case errors.As(err, &fe):
		return "SideEffectError"
	case errors.As(err, &qe):
		return "RequeueRefusedError"
	case errors.As(err, &ae):
		return "AlreadySettledError"
	case errors.As(err, &we):
		return "WindowError"
	}
	return fmt.Sprintf("%T", err)
}

// closedSidecar plays a scenario of failing calls (expect.errors): one publish, then a
// subscription that must give up; each failure printed as an error line (only the calls the
// scenario expects an error of).
func closedSidecar(client *window.Client, sc *scenario) {
	ctx := context.Background()
	o := sc.Open
	msgs := make([]window.Message, len(sc.Publish))
	for i, p := range sc.Publish {
		msgs[i] = window.Message{Payload: []byte(p.Payload), Headers: p.Headers}
	}
	began := time.Now()
	var err error
	if sc.expects("publish") {
		err = publish(ctx, client, sc, msgs)
		failed("publish", err, began)
	}
	if !sc.expects("subscribe") {
		return
	}
	opts := window.Options{Count: o.Count, MaxAttempts: o.MaxAttempts, Stream: o.Key, Group: o.Group, Consumer: o.Consumer}
	if opts.Count == 0 {
		opts.Count = 16
	}
	reported := make(chan error, 2)
	opts.OnError = func(err error) { reported <- err }
	began = time.Now()
	sub, err := client.Subscribe(ctx, opts)
	if err != nil {
		failed("subscribe", err, began)
		return
	}
	runErr := sub.Run(func(context.Context, *window.Delivery) error { return nil })
	select {
	case err := <-reported:
		failed("subscribe", err, began)
	default:
		failed("subscribe", runErr, began)
	}
}

func failed(call string, err error, began time.Time) {
	if err == nil {
		emit("error", map[string]any{"call": call, "error": "none", "message": "", "elapsed_ms": time.Since(began).Milliseconds()})
		return
	}
	log.Printf("%s: %v", call, err)
	emit("error", map[string]any{"call": call, "error": errorClass(err), "message": err.Error(), "elapsed_ms": time.Since(began).Milliseconds()})
}
