// Command healthcheck asks the sidecar's grpc.health.v1.Health service for the status of a
// service (default window_sidecar.v1.WindowService), again until it is SERVING or -timeout has
// passed, and prints it. It exits 0 when SERVING, 1 otherwise (also when a call fails).
//
// -addr takes any grpc-go target: host:port, or unix:///path/to.sock for the Unix socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"example.invalid/window-sidecar/client-examples/go/window"
)

func main() {
	addr := flag.String("addr", envOr("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"), "sidecar gRPC target (env WINDOW_SIDECAR_ADDR)")
	service := flag.String("service", "window_sidecar.v1.WindowService", "the service whose status to ask for")
	timeout := flag.Duration("timeout", 10*time.Second, "give up waiting for SERVING after this long")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("healthcheck: ")

	status, err := check(*addr, *service, *timeout)
	if err != nil {
		log.Fatalf("check %s at %s: %v", *service, *addr, err)
	}
	fmt.Printf("health %s: %s\n", *service, status)
	if status != healthpb.HealthCheckResponse_SERVING {
		os.Exit(1)
	}
}

func check(addr, service string, timeout time.Duration) (healthpb.HealthCheckResponse_ServingStatus, error) {
	// window.Dial: the same plaintext (and token, when set) as the helper's own calls.
	client, err := window.Dial(addr)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	health := healthpb.NewHealthClient(client.Conn())
	// The service is NOT_SERVING until the sidecar's first Redis ping: ask again for a while.
	until := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err != nil {
			return 0, err
		}
		if res.Status == healthpb.HealthCheckResponse_SERVING || time.Now().After(until) {
			return res.Status, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
