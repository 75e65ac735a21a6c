// Command example-app is a program outside the helper's module, as a team would write one: its
// go.mod requires example.invalid/window-sidecar/client-examples/go and imports the window
// package. run-e2e.sh builds it in a scratch copy outside the repository, against the helper
// module installed there, and uses it to check the rule for a refused command end to end.
//
// It publishes one order to -stream, then consumes it with a cap of -max-deliveries and the
// dead-letter stream -dead-letter. Its handler queues a command the sidecar refuses (-command,
// FLUSHALL by default) and acks, so every ack is refused. With -rejected-outcome retry_after the
// helper retries the delivery after the growing delay until the cap sends the entry to the dead
// letter; it prints the deliveries it saw and the entries the flushes dead-lettered, and exits 0
// once one was. With -rejected-outcome auto (the helper's default) FLUSHALL, which no retry
// fixes (FORBIDDEN_COMMAND), is dead-lettered at once (the same line, after one delivery); with
// auto and no dead letter (-max-deliveries 0 -dead-letter "") it is dropped at once: it prints
// the deliveries, the drop and the reason the error callback got, and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"example.invalid/window-sidecar/client-examples/go/window"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "sidecar gRPC target")
	stream := flag.String("stream", "poison", "stream key")
	deadLetter := flag.String("dead-letter", "poison:dead", "dead-letter stream")
	maxDeliveries := flag.Uint("max-deliveries", 2, "deliveries before the dead letter")
	command := flag.String("command", "FLUSHALL", "the refused command the handler queues (name and arguments)")
	outcome := flag.String("rejected-outcome", "retry_after", "how the helper settles a refused delivery: auto, drop or retry_after")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("example-app: ")

	rejectedOutcome := map[string]window.RejectedOutcome{
		"auto": window.RejectedAuto, "drop": window.RejectedDrop, "retry_after": window.RejectedRetryAfter,
	}
	ro, ok := rejectedOutcome[*outcome]
	if !ok {
		log.Fatalf("-rejected-outcome %q: auto, drop or retry_after", *outcome)
	}
	client, err := window.Dial(*addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// Ctrl-C and SIGTERM: close the subscription (what is settled is flushed), then exit.
	interrupted, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if _, err := client.Publish(ctx, *stream, window.Message{Payload: []byte(`{"id":"poison-1"}`)}); err != nil {
		log.Fatalf("publish: %v", err)
	}
	deadLettered := make(chan uint32, 1)
	dropped := make(chan *window.RejectedError, 1)
	sub, err := client.Subscribe(ctx, window.Options{
		Stream: *stream, Group: "example-app", Consumer: "example-1", Count: 1,
		MaxDeliveries: uint32(*maxDeliveries), DeadLetter: *deadLetter,
		RejectedOutcome: ro,
		OnFlush: func(f window.Flush) {
			if n := f.Report.GetDeadLettered(); n > 0 {
				deadLettered <- n
			}
		},
		OnError: func(err error) {
			var re *window.RejectedError
			if errors.As(err, &re) {
				log.Printf("error callback: %v", err)
				if re.Outcome == "drop" {
					dropped <- re
				}
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	args := strings.Fields(*command)
	deliveries := 0
	for {
		select {
		case d, ok := <-sub.Deliveries():
			if !ok {
				log.Fatalf("subscription ended: %v", sub.Err())
			}
			deliveries++
			log.Printf("%s (delivery %d): queue %s, ack", d.EntryID, d.DeliveryCount, *command)
			rest := make([]any, len(args)-1)
			for i, a := range args[1:] {
				rest[i] = a
			}
			if err := d.Queue(args[0], rest...); err != nil {
				log.Fatal(err)
			}
			if err := d.Ack(); err != nil {
				log.Fatal(err)
			}
		case n := <-deadLettered:
			if err := sub.Close(ctx); err != nil {
				log.Printf("close: %v", err)
			}
			fmt.Printf("deliveries=%d dead_lettered=%d\n", deliveries, n)
			return
		case re := <-dropped:
			// The drop went out with the rejection's answer; Close flushes it.
			if err := sub.Close(ctx); err != nil {
				log.Printf("close: %v", err)
			}
			fmt.Printf("deliveries=%d dropped=1 reason=%s\n", deliveries, re.Reason)
			return
		case <-interrupted.Done():
			if err := sub.Close(ctx); err != nil {
				log.Printf("close: %v", err)
			}
			fmt.Printf("interrupted: deliveries=%d\n", deliveries)
			os.Exit(130)
		case <-ctx.Done():
			fmt.Printf("deliveries=%d dead_lettered=0\n", deliveries)
			os.Exit(1)
		}
	}
}
