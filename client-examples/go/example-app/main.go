// Command example-app is a program outside the helper's module, as a team would write one: its
// go.mod requires example.invalid/window-sidecar/client-examples/go and imports the window
// package. run-e2e.sh builds it in a scratch copy outside the repository, against the helper
// module installed there.
//
// It publishes one message to -stream, consumes it, acks it and prints "acked <entry id>".
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"example.invalid/window-sidecar/client-examples/go/window"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "sidecar gRPC target")
	stream := flag.String("stream", "example-app", "stream key")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long")
	flag.Parse()
	log.SetPrefix("example-app: ")

	client, err := window.Dial(*addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	if _, err := client.Publish(ctx, *stream, window.Message{Payload: []byte("hello")}); err != nil {
		log.Fatalf("publish: %v", err)
	}
	sub, err := client.Subscribe(ctx, window.Options{Stream: *stream, Group: "example-app", Count: 1})
	if err != nil {
		log.Fatal(err)
	}
	d, ok := <-sub.Deliveries()
	if !ok {
		log.Fatalf("subscription ended: %v", sub.Err())
	}
	if err := d.Ack(); err != nil {
		log.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("acked %s\n", d.EntryID)
}
