// Package window is a small Go client for window-sidecar.
//
// It wraps the generated WindowService stub (package windowv1 of this module, generated from
// proto/window_sidecar/v1/window.proto) with:
//
//   - Publish: XADD many payload-and-headers entries in one call;
//   - Subscribe: a subscription whose deliveries arrive on a channel. Each Delivery collects the
//     Redis commands queued for it (Queue) and one outcome (Ack, Drop, Retry, RetryAfter). When
//     every delivery of a read is settled, the read's commands and outcomes go to the sidecar in
//     one batch message, so the sidecar can flush the read in one Redis round trip.
//
// The subscription reconnects and resubscribes with backoff when its stream fails (the sidecar
// restarts or shuts down, the connection breaks, or the consumer name is still held by an old
// stream). Deliveries of a lost stream are never settled on a new one: their entries stay
// pending in Redis and the sidecar delivers them again, first thing, on the new stream.
package window

import (
	"context"
	"errors"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// Client is a connection to one sidecar.
type Client struct {
	conn  *grpc.ClientConn
	stub  windowv1.WindowServiceClient
	owned bool
}

// TokenEnv is the environment variable Dial reads the sidecar's bearer token from.
const TokenEnv = "WINDOW_SIDECAR_TOKEN"

// Dial connects to the sidecar at addr, a grpc-go target: host:port, or unix:///path/to.sock for
// a sidecar on a Unix socket. Without options it dials in plaintext (Plaintext), as a sidecar
// listens on the pod's loopback interface or a socket in a volume it shares with the
// application; opts replace that (pass grpc.WithTransportCredentials for a sidecar with --tls-cert).
//
// When WINDOW_SIDECAR_TOKEN is set, every call carries it as `authorization: Bearer <token>`
// (BearerToken), for a sidecar started with --auth-token-file: the token then lives in the
// deployment's secrets, not in the code.
func Dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(Plaintext())}
	}
	if token := os.Getenv(TokenEnv); token != "" {
		opts = append(opts, BearerToken(token))
	}
	conn, err := grpc.Dial(addr, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, stub: windowv1.NewWindowServiceClient(conn), owned: true}, nil
}

// BearerToken sends token as `authorization: Bearer <token>` with every call, what a sidecar
// started with --auth-token-file or --auth-token requires. It is allowed over plaintext: the
// sidecar's connection does not leave the pod (loopback or a Unix socket).
func BearerToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearer("Bearer " + token))
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// Plaintext is transport credentials without security, for a sidecar on loopback or a Unix
// socket. It is what grpc-go's credentials/insecure provides from v1.34 on; the grpc-go this
// module is built and tested with (v1.33, Debian 12's) has no such package, and its
// grpc.WithInsecure is deprecated in later versions.
func Plaintext() credentials.TransportCredentials { return plaintext{} }

type plaintext struct{}

func (plaintext) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, plaintextInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (plaintext) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, plaintextInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (plaintext) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (plaintext) Clone() credentials.TransportCredentials { return plaintext{} }

func (plaintext) OverrideServerName(string) error { return nil }

type plaintextInfo struct{ credentials.CommonAuthInfo }

func (plaintextInfo) AuthType() string { return "insecure" }

// NewClient uses a connection the caller owns (Close leaves it open).
func NewClient(conn *grpc.ClientConn) *Client {
	return &Client{conn: conn, stub: windowv1.NewWindowServiceClient(conn)}
}

// Conn is the connection, for other services of the sidecar (grpc.health.v1).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Stub is the generated client, for anything the helper does not cover.
func (c *Client) Stub() windowv1.WindowServiceClient { return c.stub }

// Close closes the connection when Dial opened it.
func (c *Client) Close() error {
	if c.owned {
		return c.conn.Close()
	}
	return nil
}

// Message is one entry to publish: a payload and optional headers (written as the `_payload`
// and `h:<name>` fields that a Delivery splits back into Payload and Headers).
type Message struct {
	Payload []byte
	Headers map[string]string
}

// Publish appends the messages to a stream in one call and returns the ids Redis gave them.
func (c *Client) Publish(ctx context.Context, stream string, msgs ...Message) ([]string, error) {
	if stream == "" {
		return nil, errors.New("window: Publish needs a stream key")
	}
	req := &windowv1.PublishRequest{Stream: stream}
	for _, m := range msgs {
		req.Entries = append(req.Entries, &windowv1.PublishEntry{Payload: m.Payload, Headers: m.Headers})
	}
	resp, err := c.stub.Publish(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetIds(), nil
}
