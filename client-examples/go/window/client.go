// Package window is a small Go client for window-sidecar.
//
// It wraps the generated WindowService stub (package windowv1 of this module, generated from
// proto/window_sidecar/v1/window.proto) with:
//
//   - Dial: the sidecar's address, bearer token and TLS files from the environment
//     (WINDOW_SIDECAR_ADDR, WINDOW_SIDECAR_TOKEN, WINDOW_SIDECAR_TLS_*) unless given in code;
//   - Publish, PublishList, PublishChannel, PublishShardedChannel: many payload-and-headers
//     entries to a stream, a list or a channel in one call;
//   - Subscribe: a subscription to a stream, a reliable or simple list or pub/sub whose
//     deliveries arrive on a channel or a handler (Run). Each Delivery collects the Redis
//     commands queued for it (Queue) and one outcome (Ack, Drop, Retry, RetryAfter). When every
//     delivery of a read is settled, the read's commands and outcomes go to the sidecar in one
//     batch message, so the sidecar can flush the read in one Redis round trip.
//
// The subscription reconnects and resubscribes with backoff when its stream fails (the sidecar
// restarts, drains or shuts down, the connection breaks, or the consumer name is still held by
// an old stream). Deliveries of a lost stream are never settled on a new one: their entries stay
// pending in Redis and the sidecar delivers them again, first thing, on the new stream.
package window

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// Client is a connection to one sidecar.
type Client struct {
	conn  *grpc.ClientConn
	stub  windowv1.WindowServiceClient
	owned bool
	addr  string // the address dialled, for the errors that name it
	tls   bool   // whether the connection may use TLS (what the probe of a failure expects)
}

// DefaultCallTimeout bounds a Publish whose context has no deadline. It is longer than the
// sidecar's --redis-timeout (5 s by default), within which the sidecar answers even when Redis
// does not, so that the sidecar's own answer (a *RedisUnavailableError) arrives rather than a
// deadline of the client's; a deadline of the caller's own should be longer than that too.
const DefaultCallTimeout = 30 * time.Second

// DefaultConnectTimeout is how long a call waits to reach the sidecar without
// WithConnectTimeout.
const DefaultConnectTimeout = 5 * time.Second

// WithConnectTimeout is a Dial option: how long one attempt to reach the sidecar may take
// before a call fails with a *ConnectionError (5 s by default). A sidecar that refuses the
// connection fails the call at once.
func WithConnectTimeout(d time.Duration) grpc.DialOption { return connectTimeout{d: d} }

type connectTimeout struct {
	grpc.EmptyDialOption
	d time.Duration
}

// The environment a deployed worker is configured by (the same in every window-sidecar client).
const (
	// AddrEnv is the sidecar's address when Dial is given none: host:port or unix:/path.
	AddrEnv = "WINDOW_SIDECAR_ADDR"
	// DefaultAddr is the address without AddrEnv.
	DefaultAddr = "127.0.0.1:50051"
	// TokenEnv is the bearer token sent with every call, for a sidecar with --auth-token-file.
	TokenEnv = "WINDOW_SIDECAR_TOKEN"
	// TLSCAEnv is a PEM file of the CA the sidecar's certificate is verified against; when set,
	// Dial uses TLS.
	TLSCAEnv = "WINDOW_SIDECAR_TLS_CA"
	// TLSCertEnv and TLSKeyEnv are the PEM client certificate and key, for mutual TLS.
	TLSCertEnv = "WINDOW_SIDECAR_TLS_CERT"
	TLSKeyEnv  = "WINDOW_SIDECAR_TLS_KEY"
	// TLSServerNameEnv is the name to verify in the sidecar's certificate instead of the
	// target's host (optional).
	TLSServerNameEnv = "WINDOW_SIDECAR_TLS_SERVER_NAME"
)

// Dial connects to the sidecar at addr, a grpc-go target: host:port, or unix:/path/to.sock
// (unix:///path/to.sock) for a sidecar on a Unix socket. An empty addr is WINDOW_SIDECAR_ADDR,
// or 127.0.0.1:50051 without it.
//
// Without options the transport comes from the environment (Environment): TLS when
// WINDOW_SIDECAR_TLS_CA is set (mutual TLS with WINDOW_SIDECAR_TLS_CERT and
// WINDOW_SIDECAR_TLS_KEY), else plaintext, as a sidecar listens on the pod's loopback
// interface or a socket in a volume it shares with the application. opts replace that: pass
// grpc.WithTransportCredentials (Plaintext, or TLS with TLSFiles) to set it in code.
//
// When WINDOW_SIDECAR_TOKEN is set, every call carries it as `authorization: Bearer <token>`
// (BearerToken), for a sidecar started with --auth-token-file: the token then lives in the
// deployment's secrets, not in the code.
//
// The connection retries a lost sidecar after 100 ms doubling to 5 s (jittered), the backoff
// of a subscription's own reconnections; a grpc.WithConnectParams in opts replaces it.
func Dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	if addr == "" {
		addr = os.Getenv(AddrEnv)
	}
	if addr == "" {
		addr = DefaultAddr
	}
	if problem := addressProblem(addr); problem != "" {
		return nil, &ConnectionError{Addr: addr, Cause: problem}
	}
	timeout := DefaultConnectTimeout
	transport := false
	for _, o := range opts {
		if ct, ok := o.(connectTimeout); ok && ct.d > 0 {
			timeout = ct.d
		} else if !ok {
			transport = true
		}
	}
	_, tlsEnv := TLSFilesFromEnv()
	if !transport {
		creds, err := Environment()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	}
	opts = append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 5 * time.Second,
		},
		MinConnectTimeout: timeout,
	})}, opts...)
	if token := os.Getenv(TokenEnv); token != "" {
		opts = append(opts, BearerToken(token))
	}
	conn, err := grpc.Dial(addr, opts...)
	if err != nil {
		return nil, &WindowError{Op: "dial " + addr, Err: err}
	}
	return &Client{conn: conn, stub: windowv1.NewWindowServiceClient(conn), owned: true, addr: addr, tls: transport || tlsEnv}, nil
}

// TLSFiles names the PEM files of a TLS connection to the sidecar.
type TLSFiles struct {
	// CA is the CA file the sidecar's certificate is verified against. Required.
	CA string
	// Cert and Key are the client's certificate and key, for a sidecar with --tls-client-ca
	// (mutual TLS). Both or neither.
	Cert, Key string
	// ServerName is the name verified in the sidecar's certificate. Empty: the target's host.
	ServerName string
}

// TLS reads the files into transport credentials, for grpc.WithTransportCredentials.
func TLS(f TLSFiles) (credentials.TransportCredentials, error) {
	if f.CA == "" {
		return nil, errors.New("window: TLS needs a CA file")
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("window: the TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("window: no PEM certificate in the TLS CA file %s", f.CA)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: f.ServerName, MinVersion: tls.VersionTLS12}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("window: a TLS client certificate needs its key, and a key its certificate")
	}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("window: the TLS client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}

// TLSFilesFromEnv is the TLS configuration of the environment (WINDOW_SIDECAR_TLS_CA,
// WINDOW_SIDECAR_TLS_CERT, WINDOW_SIDECAR_TLS_KEY, WINDOW_SIDECAR_TLS_SERVER_NAME); ok is
// false when WINDOW_SIDECAR_TLS_CA is not set.
func TLSFilesFromEnv() (f TLSFiles, ok bool) {
	f = TLSFiles{
		CA: os.Getenv(TLSCAEnv), Cert: os.Getenv(TLSCertEnv), Key: os.Getenv(TLSKeyEnv),
		ServerName: os.Getenv(TLSServerNameEnv),
	}
	return f, f.CA != ""
}

// Environment is the transport Dial uses without options: TLS from the environment
// (TLSFilesFromEnv) when WINDOW_SIDECAR_TLS_CA is set, else Plaintext. A certificate or key
// set without a CA is an error rather than silently ignored.
func Environment() (credentials.TransportCredentials, error) {
	f, ok := TLSFilesFromEnv()
	if !ok {
		if f.Cert != "" || f.Key != "" {
			return nil, fmt.Errorf("window: %s and %s need %s", TLSCertEnv, TLSKeyEnv, TLSCAEnv)
		}
		return Plaintext(), nil
	}
	return TLS(f)
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
// socket. It is what grpc-go's credentials/insecure provides from v1.34 on
// (insecure.NewCredentials()); the grpc-go this module is built and tested with, v1.33 (Debian
// 12's, the only one reachable offline), has no such package, and its grpc.WithInsecure is
// deprecated in later versions. A project on grpc-go 1.34 or newer may pass
// grpc.WithTransportCredentials(insecure.NewCredentials()) to Dial instead: the same thing.
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
	return &Client{conn: conn, stub: windowv1.NewWindowServiceClient(conn), addr: conn.Target(), tls: true}
}

// Addr is the address the client dialled.
func (c *Client) Addr() string { return c.addr }

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
// and `h:<name>` fields of a stream entry, or framed into a list value or a pub/sub message, that
// a Delivery splits back into Payload and Headers).
type Message struct {
	Payload []byte
	Headers map[string]string
	// Trace is the producer's W3C trace context to carry (headers traceparent and
	// tracestate). Empty: the one of Publish's context, if it has one (see TraceFromContext).
	Trace *windowv1.TraceContext
}

// Target is where Publish writes: exactly one of Stream (XADD), List (LPUSH), Channel
// (PUBLISH) and ShardedChannel (SPUBLISH, Redis 7).
type Target struct {
	Stream, List, Channel, ShardedChannel string
	// MaxLen: streams, trims the stream to about this many entries (XADD MAXLEN ~). 0: no trim.
	// With Partitions, each partition.
	MaxLen uint64
	// Partitions writes Stream as a partitioned stream of this many partitions, the streams
	// `<Stream>:{0}` … `<Stream>:{Partitions-1}` that a subscription with Options.Partitions
	// reads: each message goes to `<Stream>:{n}`, n being the 32-bit FNV-1a hash of its key
	// (the value of PartitionHeader, or of the stored field PartitionField) modulo Partitions.
	// A key's messages so stay in one partition, in the order published, which is what keeps
	// them in order across a group of replicas; messages without the key go to the partitions
	// in turn. Needs exactly one of PartitionHeader and PartitionField; streams only. At most
	// 1024. 0: Stream itself.
	Partitions uint32
	// PartitionHeader names the header whose value is a message's partition key: the one the
	// subscriptions order by (Options.OrderingHeader).
	PartitionHeader string
	// PartitionField names the entry's field, as stored, whose value is its partition key
	// (a header is stored as the field `h:<name>`).
	PartitionField string
}

// partitionBy is the routing of a partitioned publish (nil: not partitioned), or why the
// target's partition settings do not go together.
func (t *Target) partitionBy() (*windowv1.OrderingKey, error) {
	keyed := t.PartitionHeader != "" || t.PartitionField != ""
	switch {
	case t.Partitions == 0 && keyed:
		return nil, errors.New("window: PartitionHeader and PartitionField route a partitioned publish: set Partitions too (the number of the stream's partitions)")
	case t.Partitions == 0:
		return nil, nil
	case t.Stream == "":
		return nil, errors.New("window: Partitions is for a stream (Target.Stream); a list or channel has no partitions")
	case t.PartitionHeader != "" && t.PartitionField != "":
		return nil, errors.New("window: PartitionHeader and PartitionField: one partition key, not both")
	case t.PartitionHeader != "":
		return &windowv1.OrderingKey{Source: &windowv1.OrderingKey_Header{Header: t.PartitionHeader}}, nil
	case t.PartitionField != "":
		return &windowv1.OrderingKey{Source: &windowv1.OrderingKey_Field{Field: t.PartitionField}}, nil
	}
	return nil, errors.New("window: Partitions needs the key each message is routed by: PartitionHeader (the subscriptions' OrderingHeader) or PartitionField")
}

// PublishTo writes the messages to the target in one call, in order. The response has the
// stream ids (streams; with Partitions, each in its message's partition) or the receivers of
// each message (channels). A context without a deadline gets DefaultCallTimeout. A sidecar
// that cannot be reached fails the call with a *ConnectionError naming the address and the
// cause (and what answers there instead, when that is Redis or an HTTP/1 server), the
// sidecar's answer that Redis is unavailable with a *RedisUnavailableError, a refusal with a
// *RefusedError, a deadline with a *CallTimeoutError, anything else with a *WindowError
// carrying the status.
func (c *Client) PublishTo(ctx context.Context, t Target, msgs ...Message) (*windowv1.PublishResponse, error) {
	n := 0
	for _, k := range []string{t.Stream, t.List, t.Channel, t.ShardedChannel} {
		if k != "" {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("window: Publish needs exactly one of a stream, a list, a channel and a sharded channel")
	}
	partitionBy, err := t.partitionBy()
	if err != nil {
		return nil, err
	}
	req := &windowv1.PublishRequest{
		Stream: t.Stream, List: t.List, Channel: t.Channel, ShardedChannel: t.ShardedChannel, MaxLen: t.MaxLen,
		Partitions: t.Partitions, PartitionBy: partitionBy,
	}
	ctxTrace := TraceFromContext(ctx)
	for _, m := range msgs {
		tr := m.Trace
		if tr.GetTraceparent() == "" {
			tr = ctxTrace
		}
		req.Entries = append(req.Entries, &windowv1.PublishEntry{Payload: m.Payload, Headers: m.Headers, Trace: tr})
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		defer cancel()
	}
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	resp, err := c.stub.Publish(ctx, req)
	if err != nil {
		return nil, classify("publish", c.addr, c.tls, timeout, err)
	}
	return resp, nil
}

// Publish appends the messages to a stream in one call and returns the ids Redis gave them.
func (c *Client) Publish(ctx context.Context, stream string, msgs ...Message) ([]string, error) {
	if stream == "" {
		return nil, errors.New("window: Publish needs a stream key")
	}
	resp, err := c.PublishTo(ctx, Target{Stream: stream}, msgs...)
	if err != nil {
		return nil, err
	}
	return resp.GetIds(), nil
}

// PublishList pushes the messages onto a list (LPUSH, each value a frame of its payload and
// headers), where list subscriptions read them in order.
func (c *Client) PublishList(ctx context.Context, key string, msgs ...Message) error {
	if key == "" {
		return errors.New("window: PublishList needs a list key")
	}
	_, err := c.PublishTo(ctx, Target{List: key}, msgs...)
	return err
}

// PublishChannel publishes the messages on a pub/sub channel and returns how many subscribers
// received each.
func (c *Client) PublishChannel(ctx context.Context, channel string, msgs ...Message) ([]uint64, error) {
	if channel == "" {
		return nil, errors.New("window: PublishChannel needs a channel")
	}
	resp, err := c.PublishTo(ctx, Target{Channel: channel}, msgs...)
	return resp.GetReceivers(), err
}

// PublishShardedChannel publishes the messages on a sharded channel (SPUBLISH, Redis 7).
func (c *Client) PublishShardedChannel(ctx context.Context, channel string, msgs ...Message) ([]uint64, error) {
	if channel == "" {
		return nil, errors.New("window: PublishShardedChannel needs a channel")
	}
	resp, err := c.PublishTo(ctx, Target{ShardedChannel: channel}, msgs...)
	return resp.GetReceivers(), err
}
