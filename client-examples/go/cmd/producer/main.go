// Command producer publishes the order set of orders.json to the `orders` stream through the
// sidecar's Publish RPC: one entry per order, payload = the order JSON, all in one call.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"example.invalid/window-sidecar/client-examples/go/orders"
	"example.invalid/window-sidecar/client-examples/go/window"
)

func main() {
	addr := flag.String("addr", envOr("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"), "sidecar gRPC address (env WINDOW_SIDECAR_ADDR)")
	path := flag.String("orders", "../orders.json", "the order set")
	stream := flag.String("stream", "", "stream key (default: the one in the orders file)")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("producer: ")

	file, err := orders.Load(*path)
	if err != nil {
		log.Fatal(err)
	}
	if *stream == "" {
		*stream = file.Stream
	}
	payloads, err := file.Payloads()
	if err != nil {
		log.Fatal(err)
	}
	msgs := make([]window.Message, len(payloads))
	for i, p := range payloads {
		o, err := orders.Parse(p)
		if err != nil {
			log.Fatalf("order %d: %v", i+1, err)
		}
		msgs[i] = window.Message{Payload: p, Headers: map[string]string{
			"content-type": "application/json",
			"order-id":     o.ID,
		}}
	}

	client, err := window.Dial(*addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ids, err := client.Publish(ctx, *stream, msgs...)
	if err != nil {
		log.Fatalf("publish to %s: %v", *addr, err)
	}
	if len(ids) == 0 {
		fmt.Printf("published no orders to %q\n", *stream)
		return
	}
	fmt.Printf("published %d orders to %q: %s .. %s\n", len(ids), *stream, ids[0], ids[len(ids)-1])
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
