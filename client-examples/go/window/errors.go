package window

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// The errors of the package, the same in every window-sidecar client (client-examples/README.md):
//
//	*WindowError             any failed call (an RPC's status other than the ones below)
//	*ConnectionError         the sidecar cannot be reached: names the address and the cause
//	                         (nothing listens, the name does not resolve, TLS fails, or what
//	                         answers there is not the sidecar: Redis, an HTTP/1 server, a URL)
//	*RedisUnavailableError   the sidecar answered, and said that Redis is unavailable
//	*RefusedError            the sidecar refused the call (token, policy, request, limit)
//	*CallTimeoutError        the sidecar was reached but did not answer before the deadline
//	*RejectedError           the sidecar refused a command or an outcome of a delivery
//	*SideEffectError         Redis answered a side effect of an acked delivery with an error
//	*RequeueRefusedError     Redis refused to write a Retry, RetryAfter or dead letter
//	*SubscriptionEndedError  the subscription stopped for good
//	*AlreadySettledError     a command or an outcome after the delivery's outcome
//
// Match them with errors.As, or with errors.Is against the sentinels ErrWindow (any of them),
// ErrConnection, ErrRedisUnavailable, ErrRefused, ErrCallTimeout, ErrRejected, ErrSideEffect, ErrRequeueRefused, ErrSubscriptionEnded and
// ErrAlreadySettled. Each that comes from
// an RPC carries its gRPC status (Status(), and errors.Unwrap gives the status error), so that
// nobody needs to import gRPC to tell them apart.
var (
	// ErrWindow matches every error of the package with errors.Is.
	ErrWindow = errors.New("window")
	// ErrConnection matches a *ConnectionError.
	ErrConnection = errors.New("window: cannot reach the sidecar")
	// ErrRedisUnavailable matches a *RedisUnavailableError.
	ErrRedisUnavailable = errors.New("window: the sidecar says Redis is unavailable")
	// ErrRefused matches a *RefusedError.
	ErrRefused = errors.New("window: the sidecar refused the call")
	// ErrCallTimeout matches a *CallTimeoutError.
	ErrCallTimeout = errors.New("window: the sidecar did not answer in time")
	// ErrRejected matches a *RejectedError.
	ErrRejected = errors.New("window: the sidecar refused a command or an outcome")
	// ErrSideEffect matches a *SideEffectError.
	ErrSideEffect = errors.New("window: a side effect failed in Redis")
	// ErrRequeueRefused matches a *RequeueRefusedError.
	ErrRequeueRefused = errors.New("window: Redis refused a requeue")
	// ErrSubscriptionEnded matches a *SubscriptionEndedError.
	ErrSubscriptionEnded = errors.New("window: the subscription ended")
	// ErrAlreadySettled matches an *AlreadySettledError: the delivery already has an outcome.
	ErrAlreadySettled = errors.New("window: delivery already settled")
)

// WindowError is a call of the client that failed with a gRPC status (for example
// UNAUTHENTICATED without the sidecar's token, INVALID_ARGUMENT for a bad request).
type WindowError struct {
	// Op is the call: "publish", "subscribe".
	Op string
	// Err is the gRPC status error.
	Err error
}

func (e *WindowError) Error() string { return fmt.Sprintf("window: %s: %v", e.Op, e.Err) }

// GRPCStatus makes status.FromError and status.Code see the call's status.
func (e *WindowError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// Unwrap is the gRPC status error.
func (e *WindowError) Unwrap() error { return e.Err }

// Is matches ErrWindow.
func (e *WindowError) Is(target error) bool { return target == ErrWindow }

// Status is the gRPC status of the failed call.
func (e *WindowError) Status() *status.Status { return status.Convert(e.Err) }

// Code is the status code.
func (e *WindowError) Code() codes.Code { return status.Code(e.Err) }

// ConnectionError is the sidecar not reachable: nothing listens at the address, the connection
// was refused or timed out, TLS failed. Its message names the address and the cause:
// "window: cannot reach the sidecar at 127.0.0.1:50079: connection refused".
type ConnectionError struct {
	// Addr is the address dialled.
	Addr string
	// Cause is the transport's reason, as short as it can be said ("connection refused").
	Cause string
	// Err is the gRPC status error (UNAVAILABLE, or DEADLINE_EXCEEDED when the connection did
	// not come within ConnectTimeout).
	Err error
}

func (e *ConnectionError) Error() string {
	if step := nextStep(e.Cause); step != "" {
		return fmt.Sprintf("window: cannot reach the sidecar at %s: %s; %s", e.Addr, e.Cause, step)
	}
	return fmt.Sprintf("window: cannot reach the sidecar at %s: %s", e.Addr, e.Cause)
}

// notTheSidecar: whether err is a *ConnectionError whose probe found something else than the
// sidecar at the address (Redis, an HTTP/1 server, a TLS server reached in plaintext), which no
// retry fixes.
func notTheSidecar(err error) bool {
	var ce *ConnectionError
	if !errors.As(err, &ce) {
		return false
	}
	for _, p := range []string{"a Redis server answers", "an HTTP/1 server answers", "a TLS server answers", "an HTTP server answers"} {
		if strings.HasPrefix(ce.Cause, p) {
			return true
		}
	}
	return false
}

// listenHint is where a message tells the user to point the client.
const listenHint = "set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its --listen (127.0.0.1:50051 by default)"

// nextStep is what to do about an unreachable sidecar, by its cause.
func nextStep(cause string) string {
	text := strings.ToLower(cause)
	for _, p := range []string{"a redis server", "an http/1 server", "a tls server", "an http server", "the address is a"} {
		if strings.HasPrefix(text, p) {
			return ""
		}
	}
	switch {
	case strings.Contains(text, "connection refused") || strings.Contains(text, "no such file or directory"):
		return "nothing listens there: start the sidecar, or " + listenHint
	case strings.Contains(text, "does not resolve") || strings.Contains(text, "no such host"):
		return "check the host name in the address"
	case strings.Contains(text, "tls") || strings.Contains(text, "certificate") || strings.Contains(text, "handshake"):
		return "check WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY) against the sidecar's --tls-cert, or unset them for a plaintext sidecar"
	case strings.Contains(text, "timeout") || strings.Contains(text, "timed out"):
		return "check the address, and that no firewall drops the connection"
	}
	return "is the sidecar running there? " + listenHint
}

// RedisUnavailableError is the sidecar's answer that Redis is unavailable: UNAVAILABLE from
// the sidecar itself (Redis is unreachable, did not answer within the sidecar's
// --redis-timeout, or refused the sidecar's credentials), as opposed to a transport that
// failed (a *ConnectionError). The sidecar is reachable: the fault is between it and Redis.
type RedisUnavailableError struct {
	// Addr is the sidecar's address.
	Addr string
	// Op is the call: "publish", "subscribe".
	Op string
	// Message is the sidecar's message.
	Message string
	// Err is the gRPC status error.
	Err error
}

func (e *RedisUnavailableError) Error() string {
	return fmt.Sprintf("window: the sidecar at %s answered %s that Redis is unavailable: %s; check that Redis is up and that the sidecar's --redis-url reaches it (the sidecar's log says more)", e.Addr, e.Op, e.Message)
}

// Unwrap is the gRPC status error.
func (e *RedisUnavailableError) Unwrap() error { return e.Err }

// Is matches ErrRedisUnavailable and ErrWindow.
func (e *RedisUnavailableError) Is(target error) bool {
	return target == ErrRedisUnavailable || target == ErrWindow
}

// Status is the call's gRPC status (UNAVAILABLE).
func (e *RedisUnavailableError) Status() *status.Status { return status.Convert(e.Err) }

// GRPCStatus makes status.FromError and status.Code see the call's status.
func (e *RedisUnavailableError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// refusalSteps is what a refused call's reason (its status) asks the caller to do.
var refusalSteps = map[codes.Code]string{
	codes.Unauthenticated:    "set WINDOW_SIDECAR_TOKEN to the token of the sidecar's --auth-token-file",
	codes.PermissionDenied:   "the sidecar's policy or Redis's ACL does not allow it",
	codes.InvalidArgument:    "the request is not one the sidecar accepts; fix it, retrying will not help",
	codes.FailedPrecondition: "Redis holds something else at that key, or refuses the command; retrying will not help",
	codes.ResourceExhausted:  "a limit of the sidecar: send less, or raise the limit",
	codes.OutOfRange:         "a limit of the sidecar: send less, or raise the limit",
	codes.AlreadyExists:      "the name is taken",
}

// RefusedError is the sidecar's refusal of a call: Reason is the status's name
// (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, FAILED_PRECONDITION,
// RESOURCE_EXHAUSTED, …) and Message the sidecar's reason. The same call gets the same answer.
// (A command or an outcome of a delivery the sidecar refuses is a *RejectedError.)
type RefusedError struct {
	Addr    string
	Op      string
	Reason  string
	Message string
	Err     error
}

func (e *RefusedError) Error() string {
	s := fmt.Sprintf("window: the sidecar at %s refused %s: %s: %s", e.Addr, e.Op, e.Reason, e.Message)
	if step := refusalSteps[status.Code(e.Err)]; step != "" {
		s += " (" + step + ")"
	}
	return s
}

// Unwrap is the gRPC status error.
func (e *RefusedError) Unwrap() error { return e.Err }

// Is matches ErrRefused and ErrWindow.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused || target == ErrWindow }

// Status is the call's gRPC status.
func (e *RefusedError) Status() *status.Status { return status.Convert(e.Err) }

// GRPCStatus makes status.FromError and status.Code see the call's status.
func (e *RefusedError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// CallTimeoutError is a call that reached the sidecar but got no answer before its deadline
// (Timeout, 0 when unknown). The sidecar answers within its --redis-timeout (5 s by default)
// even when Redis does not, and DefaultCallTimeout is longer, so this means a sidecar too busy
// to answer or a deadline shorter than its --redis-timeout. A publish may have been written.
type CallTimeoutError struct {
	Addr    string
	Op      string
	Timeout time.Duration
	Err     error
}

func (e *CallTimeoutError) Error() string {
	within := " in time"
	if e.Timeout > 0 {
		within = " within " + e.Timeout.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("window: the sidecar at %s did not answer %s%s; the sidecar itself waits up to its --redis-timeout (5s by default) for Redis, so a longer silence means it is overloaded or stuck (see its log and metrics), or the deadline is shorter than its --redis-timeout; a publish may have been written", e.Addr, e.Op, within)
}

// Unwrap is the gRPC status error.
func (e *CallTimeoutError) Unwrap() error { return e.Err }

// Is matches ErrCallTimeout and ErrWindow.
func (e *CallTimeoutError) Is(target error) bool {
	return target == ErrCallTimeout || target == ErrWindow
}

// Status is the call's gRPC status (DEADLINE_EXCEEDED).
func (e *CallTimeoutError) Status() *status.Status { return status.Convert(e.Err) }

// GRPCStatus makes status.FromError and status.Code see the call's status.
func (e *CallTimeoutError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// Unwrap is the gRPC status error.
func (e *ConnectionError) Unwrap() error { return e.Err }

// Is matches ErrConnection and ErrWindow.
func (e *ConnectionError) Is(target error) bool {
	return target == ErrConnection || target == ErrWindow
}

// Status is the gRPC status of the failed call.
func (e *ConnectionError) Status() *status.Status { return status.Convert(e.Err) }

// GRPCStatus makes status.FromError and status.Code see the call's status.
func (e *ConnectionError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// RejectedError is the sidecar's refusal of a command or an outcome of a delivery, handed to
// Options.OnError after the client settled the delivery as Options.RejectedOutcome says.
type RejectedError struct {
	// Reason is the RejectionReason's name without its prefix: "FORBIDDEN_COMMAND",
	// "INVALID_COMMAND", "PERMISSION_DENIED", "INCOMPLETE_SEGMENT", …
	Reason string
	// Slot is the delivery's slot; Command the refused command's name ("" for an outcome).
	Slot    uint64
	Command string
	// Message is the sidecar's explanation.
	Message string
	// Delivery is the delivery it belongs to (nil if it was no longer known).
	Delivery *Delivery
	// Outcome is what the client settled the delivery with ("dead_letter", "drop",
	// "retry_after"; "" when the delivery needed no new outcome).
	Outcome string
	// Rejection is the sidecar's message as received.
	Rejection *windowv1.Rejection
}

func (e *RejectedError) Error() string {
	what := "the outcome"
	if e.Command != "" {
		what = "command " + e.Command
	}
	s := fmt.Sprintf("window: the sidecar refused %s of slot %d: %s: %s", what, e.Slot, e.Reason, e.Message)
	if e.Delivery != nil {
		s = fmt.Sprintf("window: the sidecar refused %s of entry %s (slot %d): %s: %s", what, e.Delivery.EntryID, e.Slot, e.Reason, e.Message)
	}
	if e.Outcome != "" {
		s += "; the client settled it with " + e.Outcome
	}
	return s
}

// Is matches ErrRejected and ErrWindow.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected || target == ErrWindow }

// entryName is how a message names an entry: its stream id, else (a list value) its slot.
func entryName(entryID string, slot uint64) string {
	if entryID != "" {
		return "entry " + entryID
	}
	return fmt.Sprintf("the entry of slot %d", slot)
}

// SideEffectError is a side-effect command of an acked delivery that Redis answered with an
// error when it ran (WRONGTYPE, "ERR value is not an integer or out of range", …), from a flush
// report's side_effect_failures, handed to Options.OnError (the report still goes to OnFlush).
//
// Settled says what became of the entry: true in pipeline mode, where it was acked all the same
// (Redis has no rollback: the other commands ran); false in atomic mode, where its segment
// stopped at the failed command (the commands before it stay applied), the entry was not acked
// and is delivered again with its count raised, and at MaxDeliveries goes to the dead letter
// with Redis's error as its reason.
type SideEffectError struct {
	// Slot is the delivery's slot; EntryID the stream entry id ("" for a list value or a
	// message).
	Slot    uint64
	EntryID string
	// Command is the failed command's name, as queued.
	Command string
	// RedisError is Redis's error as Redis worded it.
	RedisError string
	// Settled: the entry was acked all the same (pipeline mode), rather than left pending and
	// delivered again (atomic mode).
	Settled bool
	// Delivery is the delivery it belongs to (nil if it was no longer known).
	Delivery *Delivery
	// Failure is the sidecar's report of it as received.
	Failure *windowv1.SideEffectFailure
}

func (e *SideEffectError) Error() string {
	after := "not settled: delivered again, and dead-lettered with this error at MaxDeliveries"
	if e.Settled {
		after = "settled all the same: Redis has no rollback"
	}
	return fmt.Sprintf("window: side effect %s of %s failed: %s (%s)", e.Command, entryName(e.EntryID, e.Slot), e.RedisError, after)
}

// Is matches ErrSideEffect and ErrWindow.
func (e *SideEffectError) Is(target error) bool {
	return target == ErrSideEffect || target == ErrWindow
}

// RequeueRefusedError is a Retry, RetryAfter or dead letter of an entry that Redis refused to
// write (out of memory, an ACL without the write, a key of the wrong type, a read-only
// replica), from a flush report's requeue_refused, handed to Options.OnError (the report still
// goes to OnFlush). The entry was not settled: it stays pending and is delivered again.
type RequeueRefusedError struct {
	// Slot is the delivery's slot (0 for an entry moved to the dead letter past MaxDeliveries
	// without being delivered); EntryID the stream entry id ("" for a list value).
	Slot    uint64
	EntryID string
	// RedisError is Redis's error as Redis worded it.
	RedisError string
	// Outcome is the outcome whose write was refused ("retry", "retry_after", "dead_letter";
	// "" when the client does not know it).
	Outcome string
	// Delivery is the delivery it belongs to (nil if it was no longer known).
	Delivery *Delivery
	// Refusal is the sidecar's report of it as received.
	Refusal *windowv1.RequeueRefusal
}

func (e *RequeueRefusedError) Error() string {
	what := "requeue"
	switch {
	case e.Outcome == "retry":
		what = "Retry"
	case e.Outcome == "retry_after":
		what = "RetryAfter"
	case e.Outcome == "dead_letter" || e.Slot == 0:
		what = "dead letter"
	}
	return fmt.Sprintf("window: %s of %s not written: %s; it stays pending and is delivered again", what, entryName(e.EntryID, e.Slot), e.RedisError)
}

// Is matches ErrRequeueRefused and ErrWindow.
func (e *RequeueRefusedError) Is(target error) bool {
	return target == ErrRequeueRefused || target == ErrWindow
}

// SubscriptionEndedError is a subscription that stopped for good: MaxAttempts consecutive opens
// failed, or the sidecar answered with a status no retry fixes (UNAUTHENTICATED,
// PERMISSION_DENIED, INVALID_ARGUMENT, …). Subscription.Err and Run return it, and OnError gets
// it.
type SubscriptionEndedError struct {
	// Attempts counts the consecutive failed opens before it ended (0 when a stream that was
	// open failed with a status no retry fixes).
	Attempts int
	// Err is the last error: a *ConnectionError, or the gRPC status error.
	Err error
}

func (e *SubscriptionEndedError) Error() string {
	last := e.Err
	var we *WindowError
	if errors.As(last, &we) {
		last = we.Err
	}
	msg := strings.TrimPrefix(errString(last), "window: ")
	if e.Attempts > 1 {
		return fmt.Sprintf("window: the subscription ended after %d attempts: %s", e.Attempts, msg)
	}
	return "window: the subscription ended: " + msg
}

// GRPCStatus makes status.FromError and status.Code see the last status.
func (e *SubscriptionEndedError) GRPCStatus() *status.Status { return e.Status() }

// Unwrap is the last error.
func (e *SubscriptionEndedError) Unwrap() error { return e.Err }

// Is matches ErrSubscriptionEnded and ErrWindow.
func (e *SubscriptionEndedError) Is(target error) bool {
	return target == ErrSubscriptionEnded || target == ErrWindow
}

// Status is the gRPC status of the last error.
func (e *SubscriptionEndedError) Status() *status.Status { return status.Convert(unwrapStatus(e.Err)) }

// AlreadySettledError is a command queued on, or an outcome given to, a delivery that already
// has an outcome.
type AlreadySettledError struct {
	Slot    uint64
	EntryID string
	// Outcome is the outcome it has.
	Outcome windowv1.OutcomeKind
}

func (e *AlreadySettledError) Error() string {
	return fmt.Sprintf("window: delivery %s (slot %d) already settled (%s)", e.EntryID, e.Slot, outcomeName(e.Outcome))
}

// Is matches ErrAlreadySettled and ErrWindow.
func (e *AlreadySettledError) Is(target error) bool {
	return target == ErrAlreadySettled || target == ErrWindow
}

func outcomeName(k windowv1.OutcomeKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "OUTCOME_KIND_"))
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// unwrapStatus is the innermost error carrying a gRPC status.
func unwrapStatus(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if _, ok := e.(interface{ GRPCStatus() *status.Status }); ok {
			return e
		}
	}
	return err
}

// callError turns a failed RPC's error into the package's: a *ConnectionError when the
// transport could not reach addr, else a *WindowError.
func callError(op, addr string, err error) error {
	return classify(op, addr, false, 0, err)
}

// redisUnavailable are the sidecar's own messages for an unavailable Redis (its UNAVAILABLE
// answers), as opposed to an UNAVAILABLE grpc-go makes up for a broken transport.
var redisUnavailable = []string{"Redis is unreachable", "Redis did not answer in time", "authentication to Redis failed"}

// classify turns a failed RPC's error into the package's, by its cause: a transport that failed
// (probed once to say what answers at addr instead: Redis, an HTTP/1 server, TLS), the
// sidecar's answer that Redis is unavailable, a refusal, a deadline, or a *WindowError.
func classify(op, addr string, tls bool, timeout time.Duration, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrWindow) {
		return err
	}
	st, isStatus := status.FromError(err)
	if isStatus && st.Code() == codes.Unavailable {
		for _, m := range redisUnavailable {
			if strings.Contains(st.Message(), m) {
				return &RedisUnavailableError{Addr: addr, Op: op, Message: st.Message(), Err: err}
			}
		}
	}
	if cause, ok := connectionCause(err); ok {
		if !plainCause(cause) {
			if seen := probe(addr, tls); seen != "" {
				cause = seen
			}
		}
		return &ConnectionError{Addr: addr, Cause: cause, Err: err}
	}
	if !isStatus {
		return &WindowError{Op: op, Err: err}
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable, codes.Unimplemented, codes.Internal, codes.Unknown:
		if transportFailure.MatchString(msg) {
			cause := probe(addr, tls)
			if cause == "" {
				if m := httpStatus.FindStringSubmatch(msg); m != nil {
					cause = "an HTTP server answers there with " + m[1] + ", not the sidecar's gRPC service"
				} else {
					cause = "the connection failed (" + msg + ")"
				}
			}
			return &ConnectionError{Addr: addr, Cause: cause, Err: err}
		}
	}
	if st.Code() == codes.DeadlineExceeded {
		return &CallTimeoutError{Addr: addr, Op: op, Timeout: timeout, Err: err}
	}
	if _, ok := refusalSteps[st.Code()]; ok {
		return &RefusedError{Addr: addr, Op: op, Reason: codeName(st.Code()), Message: msg, Err: err}
	}
	return &WindowError{Op: op, Err: err}
}

// codeName is a status code as the proto names it: PERMISSION_DENIED.
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// plainCause: a cause that needs no probe of the address (nothing listens there, no such
// host, a TLS handshake that failed).
func plainCause(cause string) bool {
	c := strings.ToLower(cause)
	for _, p := range []string{"connection refused", "no such file or directory", "no such host", "certificate", "handshake", "tls"} {
		if strings.Contains(c, p) {
			return true
		}
	}
	return false
}

// What grpc-go says when what answered does not speak the sidecar's HTTP/2 gRPC (a Redis
// server, an HTTP/1 server, an HTTP server's 404) or the connection broke.
var (
	transportFailure = regexp.MustCompile(`(?i)http2|http/2|http status code|server preface|protocol error|connection closed|closed network connection|broken pipe|connection reset|stream removed|goaway|bad http|unexpected eof|malformed header|content-type|frame too large`)
	httpStatus       = regexp.MustCompile(`(?i)(?:http status code|http status|status:?) (\d{3})`)
)

// probeLine is sent by probe: Redis reads an inline PING (with arguments it refuses: -ERR),
// an HTTP/1 server a request line (HTTP/1.x 4xx).
const probeLine = "PING / HTTP/1.0\r\n\r\n"

// whatAnswers is what kind of server sent reply to probeLine, as a *ConnectionError's cause;
// "" when it is none the client knows (the sidecar itself, or silence).
func whatAnswers(reply []byte, tls bool) string {
	for _, p := range []string{"+PONG", "-ERR", "-NOAUTH", "-WRONGPASS", "-NOPERM", "-DENIED", "-LOADING", "-MISCONF", "-READONLY", "-MASTERDOWN"} {
		if bytes.HasPrefix(reply, []byte(p)) {
			return "a Redis server answers there, not the sidecar; " + listenHint + " (the sidecar reaches Redis through its own --redis-url)"
		}
	}
	if bytes.HasPrefix(reply, []byte("HTTP/1.")) {
		return "an HTTP/1 server answers there (the sidecar's metrics and probes port, --metrics-listen?), not the sidecar's gRPC port; " + listenHint
	}
	if !tls && len(reply) >= 2 && reply[0] == 0x15 && reply[1] == 0x03 {
		return "a TLS server answers there and the client speaks plaintext; set WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY for mutual TLS) to connect with TLS"
	}
	return ""
}

// probe connects to addr once with a raw socket, sends probeLine and reads the reply: the cause
// to report when a Redis server, an HTTP/1 server (the sidecar's metrics port) or a TLS server
// answers there; "" when it cannot tell.
func probe(addr string, tls bool) string {
	network, where := "tcp", addr
	switch {
	case strings.HasPrefix(addr, "unix://"):
		network, where = "unix", strings.TrimPrefix(addr, "unix://")
	case strings.HasPrefix(addr, "unix:"):
		network, where = "unix", strings.TrimPrefix(addr, "unix:")
	default:
		for _, p := range []string{"dns:///", "passthrough:///", "dns:"} {
			where = strings.TrimPrefix(where, p)
		}
		if _, _, err := net.SplitHostPort(where); err != nil {
			return ""
		}
	}
	conn, err := net.DialTimeout(network, where, time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte(probeLine)); err != nil {
		return ""
	}
	buf := make([]byte, 64)
	n, _ := io.ReadAtLeast(conn, buf, 8)
	return whatAnswers(buf[:n], tls)
}

// addressProblem is why addr is not an address the client can use (a URL where host:port or
// unix:/path is expected); "" otherwise.
func addressProblem(addr string) string {
	i := strings.Index(addr, "://")
	if i <= 0 {
		return ""
	}
	scheme := strings.ToLower(addr[:i])
	switch scheme {
	case "dns", "unix", "unix-abstract", "passthrough", "ipv4", "ipv6":
		return ""
	}
	rest := strings.SplitN(addr[i+3:], "/", 2)[0]
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	if scheme == "redis" || scheme == "rediss" {
		return "the address is a Redis URL; " + listenHint + ", not Redis's (that one goes to the sidecar's --redis-url)"
	}
	hint := "give host:port"
	if rest != "" {
		hint = "give " + rest
	}
	if scheme == "https" {
		hint += " and WINDOW_SIDECAR_TLS_CA for TLS"
	}
	return "the address is a URL, and the sidecar takes host:port or unix:/path: " + hint + " (WINDOW_SIDECAR_ADDR or the client's address)"
}

// connectionCause: whether err is the transport failing to reach the sidecar, and the cause in
// a few words.
func connectionCause(err error) (string, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return "", false
	}
	msg := st.Message()
	transport := strings.Contains(msg, "connection error") || strings.Contains(msg, "transport:") ||
		strings.Contains(msg, "Error while dialing")
	switch {
	case st.Code() == codes.Unavailable && transport:
	case st.Code() == codes.DeadlineExceeded && strings.Contains(msg, "connect"):
	default:
		return "", false
	}
	tlsFailed := false
	for _, known := range []string{"connection refused", "no such file or directory", "connection reset by peer",
		"i/o timeout", "no route to host", "network is unreachable", "permission denied", "no such host",
		"certificate", "handshake", "authentication handshake failed"} {
		if strings.Contains(msg, known) {
			if known == "certificate" || known == "handshake" || known == "authentication handshake failed" {
				tlsFailed = true
				break
			}
			if known == "no such host" {
				return "the host name does not resolve", true
			}
			return known, true
		}
	}
	cause := strings.TrimSuffix(strings.TrimSpace(msg), `"`)
	if i := strings.LastIndex(cause, "desc = "); i >= 0 {
		cause = strings.Trim(cause[i+len("desc = "):], `"`)
	}
	cause = strings.TrimPrefix(cause, "transport: ")
	if tlsFailed {
		// The other clients' words: "the TLS handshake failed (tls: first record does not look
		// like a TLS handshake)".
		return "the TLS handshake failed (" + strings.TrimPrefix(cause, "authentication handshake failed: ") + ")", true
	}
	return cause, true
}
