package window

//go:generate go run ../internal/gencommands -spec ../rediscommands/redis-7.0.15.json -lang go -out commands_gen.go

// Commands queues typed Redis commands as a delivery's side effects: d.Redis().HINCRBY(key,
// field, 1) is d.Queue("HINCRBY", key, field, 1), with the command's name, its arguments and
// their types checked by the compiler. The methods are generated (commands_gen.go, by
// internal/gencommands) from Redis's own command specification, the COMMAND DOCS and COMMAND
// INFO replies of Redis RedisSpecVersion (rediscommands/redis-<version>.json): every command of
// the data groups that writes (strings, hashes, lists, sets, sorted sets, streams, keys,
// HyperLogLog, geo, bitmaps) and PUBLISH / SPUBLISH, not the blocking ones and not those the
// sidecar refuses. Names are Redis's own, in capitals (HINCRBY, XADD, EXPIRE); a command's
// optional arguments go in its <NAME>Options, taken by <NAME>With. Anything else: Queue.
//
// Argument types follow the specification: a key or pattern is a string; a string argument
// takes what Queue takes (string, []byte, numbers, fmt.Stringer); an integer is an int64, a
// double a float64; an optional integer or double is a pointer (Int64, Float64); an optional
// token is a bool; a choice of tokens is a string type with its constants (EXPIRECondition…);
// any other choice is a value made by its constructors (SETExpirationEX(60)).
//
// Like Queue, each method returns ErrAlreadySettled after the outcome and ErrStale once the
// stream that delivered the entry is gone; the command runs only if the delivery is acked.
type Commands struct{ d *Delivery }

// Redis is the delivery's typed command API (see Commands).
func (d *Delivery) Redis() *Commands { return &Commands{d: d} }

func (r *Commands) queue(name string, a []any) error { return r.d.Queue(name, a...) }

// Int64 is a pointer to v, for an optional integer argument.
func Int64(v int64) *int64 { return &v }

// Float64 is a pointer to v, for an optional double argument.
func Float64(v float64) *float64 { return &v }
