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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"example.invalid/window-sidecar/client-examples/go/window"
)

type scenario struct {
	Open struct {
		Form           string `json:"form"`
		Key            string `json:"key"`
		Group          string `json:"group"`
		Consumer       string `json:"consumer"`
		Count          uint32 `json:"count"`
		Mode           string `json:"mode"`
		MaxDeliveries  uint32 `json:"max_deliveries"`
		DeadLetter     string `json:"dead_letter"`
		ReportsInReads bool   `json:"reports_in_reads"`
		PackedAcks     bool   `json:"packed_acks"`
	} `json:"open"`
	Publish []struct {
		Payload string            `json:"payload"`
		Headers map[string]string `json:"headers"`
	} `json:"publish"`
	Handle  map[string][]string `json:"handle"`
	Effects string              `json:"effects"`
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
	client, err := window.Dial("")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	opened := make(chan struct{})
	var openOnce sync.Once
	o := sc.Open
	opts := window.Options{
		Count:          o.Count,
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
			openOnce.Do(func() { close(opened) })
		},
		OnDraining: func(window.Draining) { emit("draining", nil) },
	}
	if opts.Count == 0 {
		opts.Count = 16
	}
	switch o.Form {
	case "stream":
		opts.Stream, opts.Group, opts.Consumer = o.Key, o.Group, o.Consumer
	case "reliable_list":
		opts.ReliableList = &window.ReliableList{Key: o.Key, Consumer: o.Consumer}
	case "simple_list":
		opts.SimpleList = o.Key
	case "pubsub":
		opts.PubSub = &window.PubSub{Channels: []string{o.Key}}
	default:
		log.Fatalf("unknown form %q", o.Form)
	}

	ctx := context.Background()
	sub, err := client.Subscribe(ctx, opts)
	if err != nil {
		log.Fatal(err)
	}
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-terms
		sub.Close()
	}()

	var seenMu sync.Mutex
	seen := map[string]int{}
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(func(d *window.Delivery) error {
			payload := string(d.Payload)
			seenMu.Lock()
			seen[payload]++
			n := seen[payload]
			seenMu.Unlock()
			headers := d.Headers
			if headers == nil {
				headers = map[string]string{}
			}
			emit("delivery", map[string]any{"payload": payload, "count": d.DeliveryCount, "headers": headers})
			return handle(d, action(sc.Handle, payload, n), sc.Effects)
		})
	}()

	select {
	case <-opened:
	case err := <-done:
		log.Fatalf("the subscription ended before it opened: %v", err)
	}
	emit("opened", nil)
	msgs := make([]window.Message, len(sc.Publish))
	for i, p := range sc.Publish {
		msgs[i] = window.Message{Payload: []byte(p.Payload), Headers: p.Headers}
	}
	switch o.Form {
	case "stream":
		_, err = client.Publish(ctx, o.Key, msgs...)
	case "reliable_list", "simple_list":
		err = client.PublishList(ctx, o.Key, msgs...)
	case "pubsub":
		_, err = client.PublishChannel(ctx, o.Key, msgs...)
	}
	if err != nil {
		log.Fatalf("publish: %v", err)
	}
	emit("published", map[string]any{"count": len(msgs)})
	if err := <-done; err != nil {
		log.Fatalf("the subscription failed: %v", err)
	}
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

func handle(d *window.Delivery, action, effects string) error {
	if err := d.Queue("HINCRBY", effects, string(d.Payload), 1); err != nil {
		return err
	}
	name, arg, _ := strings.Cut(action, ":")
	ms := func() time.Duration {
		v, err := strconv.Atoi(arg)
		if err != nil {
			log.Fatalf("action %q: %v", action, err)
		}
		return time.Duration(v) * time.Millisecond
	}
	switch name {
	case "ack":
		return d.Ack()
	case "drop":
		return d.Drop("")
	case "retry":
		return d.Retry("")
	case "retry_after":
		return d.RetryAfter(ms())
	case "reject":
		if err := d.Queue("FLUSHALL"); err != nil {
			return err
		}
		return d.Ack()
	case "fail":
		return errors.New("the scenario's handler fails")
	case "slow_ack":
		time.Sleep(ms())
		return d.Ack()
	}
	log.Fatalf("unknown action %q", action)
	return fmt.Errorf("unknown action %q", action)
}
