package window

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// The errors of the package, the same in every window-sidecar client (client-examples/README.md):
//
//	*WindowError             any failed call (an RPC's status other than the ones below)
//	*ConnectionError         the sidecar cannot be reached: names the address and the cause
//	*RejectedError           the sidecar refused a command or an outcome of a delivery
//	*SideEffectError         Redis answered a side effect of an acked delivery with an error
//	*RequeueRefusedError     Redis refused to write a Retry, RetryAfter or dead letter
//	*SubscriptionEndedError  the subscription stopped for good
//	*AlreadySettledError     a command or an outcome after the delivery's outcome
//
// Match them with errors.As, or with errors.Is against the sentinels ErrWindow (any of them),
// ErrConnection, ErrRejected, ErrSideEffect, ErrRequeueRefused, ErrSubscriptionEnded and
// ErrAlreadySettled. Each that comes from
// an RPC carries its gRPC status (Status(), and errors.Unwrap gives the status error), so that
// nobody needs to import gRPC to tell them apart.
var (
	// ErrWindow matches every error of the package with errors.Is.
	ErrWindow = errors.New("window")
	// ErrConnection matches a *ConnectionError.
	ErrConnection = errors.New("window: cannot reach the sidecar")
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
	return fmt.Sprintf("window: cannot reach the sidecar at %s: %s", e.Addr, e.Cause)
}

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
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrWindow) {
		return err
	}
	if cause, ok := connectionCause(err); ok {
		return &ConnectionError{Addr: addr, Cause: cause, Err: err}
	}
	return &WindowError{Op: op, Err: err}
}

// connectionCause: whether err is the transport failing to reach the sidecar, and the cause in
// a few words. grpc-go says so with UNAVAILABLE and a message such as `connection error: desc =
// "transport: Error while dialing dial tcp 127.0.0.1:50079: connect: connection refused"`;
// the sidecar's own UNAVAILABLE (Redis unreachable, draining) says something else.
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
	for _, known := range []string{"connection refused", "no such file or directory", "connection reset by peer",
		"i/o timeout", "no route to host", "network is unreachable", "permission denied",
		"certificate", "handshake", "authentication handshake failed"} {
		if strings.Contains(msg, known) {
			if known == "certificate" || known == "handshake" || known == "authentication handshake failed" {
				break
			}
			return known, true
		}
	}
	cause := strings.TrimSuffix(strings.TrimSpace(msg), `"`)
	if i := strings.LastIndex(cause, "desc = "); i >= 0 {
		cause = strings.Trim(cause[i+len("desc = "):], `"`)
	}
	cause = strings.TrimPrefix(cause, "transport: ")
	return cause, true
}
