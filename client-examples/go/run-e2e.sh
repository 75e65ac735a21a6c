#!/usr/bin/env bash
# End-to-end test of the Go helper module: installs what is missing (Debian packages); checks
# the module in module mode, offline, against Debian's Go sources (the generated code matches
# the proto, gofmt, go vet, go build, go test, build.sh; go.mod untouched, and nothing written
# into the checkout: the offline modfile and the binaries go to a temp dir); installs the
# module into a fresh directory outside the repository and builds, in a scratch copy of
# example-app (a user's module whose go.mod requires the helper and replaces it by that copy),
# the example app and the helper's producer, worker and healthcheck. With those binaries it
# starts a redis-server on a free port and the sidecar, runs the producer then the worker and
# checks the Redis end state of ../orders.json with redis-cli; checks the rejection rule (a
# handler that queues a refused command: with retry_after and a cap of 2 deliveries it ends in
# the dead letter, by default it is dead-lettered at once, or dropped without one); does the
# order run again through a second sidecar on a Unix socket (--listen unix:PATH, grpc-go's
# target unix:///PATH, no other dial option), and through a third one started with
# --auth-token-file (the token from WINDOW_SIDECAR_TOKEN; without it, UNAUTHENTICATED), the
# worker in atomic mode; and once more with the worker taking a read at a time (-batches).
#
#   WINDOW_SIDECAR_BIN   the sidecar binary (default ../../target/debug/window-sidecar; built
#                        with cargo when missing)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# root, orders, sidecar_bin; e2e_init, check, start_redis, start_sidecar, check_end_state, …
source "$here/../e2e-lib.sh"
# shellcheck source=toolchain.sh
source "$here/toolchain.sh"
cd "$here"
e2e_init go
module=example.invalid/window-sidecar/client-examples/go
gocode=/usr/share/gocode/src

# --- toolchain: install only what is missing ---------------------------------------------
need_go_toolchain
need_cmd protoc protobuf-compiler
need_cmd protoc-gen-go protoc-gen-go
need_cmd protoc-gen-go-grpc protoc-gen-go-grpc
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
need_cmd jq jq
install_missing
ensure_sidecar

# gocheck NAME LOG COMMAND...: runs COMMAND into LOG; one check, its log printed on a failure.
gocheck() {
  local name=$1 out=$2
  shift 2
  if "$@" >"$out" 2>&1; then
    check "$name" ok ok
  else
    cat "$out"
    check "$name" failed ok
  fi
}

# --- the module, offline, in module mode ----------------------------------------------------
# The go command reads the CI-only modfile (go.mod plus Debian replaces) and never the network.
export GOPROXY=off GOSUMDB=off
gomod_sum=$(sha256sum go.mod)
# In the work directory, as every file this script writes: the checkout is only read.
tree_state() { (cd "$here" && find . | sort); }
tree_state >"$work/tree-before.txt"
./offline-modfile.sh go.mod "$work/offline"
export GOFLAGS="-mod=mod -modfile=$work/offline/go.mod"

./generate.sh "$work/gen" >/dev/null
# The committed generated code is the proto's (the version comments aside).
strip_versions() { grep -vE '^// (versions:|	protoc|- protoc)' "$1"; }
gen_diff=same
for f in window.pb.go window_grpc.pb.go; do
  diff <(strip_versions "windowv1/$f") <(strip_versions "$work/gen/windowv1/$f") >"$work/gen.diff" ||
    gen_diff="windowv1/$f differs: run ./generate.sh"
done
check "windowv1/ is generated from the proto (generate.sh)" "$gen_diff" same
check "go.mod requires google.golang.org/grpc at Debian's version" \
  "$(go mod edit -json go.mod | jq -r '.Require[] | select(.Path == "google.golang.org/grpc") | .Version')" \
  "v$(sed -nE 's/^const Version = "(.*)"/\1/p' $gocode/google.golang.org/grpc/version.go)"
check "go.mod requires google.golang.org/protobuf at Debian's version" \
  "$(go mod edit -json go.mod | jq -r '.Require[] | select(.Path == "google.golang.org/protobuf") | .Version')" \
  "v$(awk '/^\t(Major|Minor|Patch) *=/ {printf "%s%s", sep, $3; sep="."}' $gocode/google.golang.org/protobuf/internal/version/version.go)"
check "gofmt -l (nothing unformatted)" "$(gofmt -l window orders cmd windowv1 example-app internal)" ""
# The typed commands are what the generator makes of the checked-in specification.
go run ./internal/gencommands -spec rediscommands/redis-7.0.15.json -lang go -out "$work/commands_gen.go"
check "window/commands_gen.go is generated from rediscommands/ (go generate ./window)" \
  "$(cmp -s window/commands_gen.go "$work/commands_gen.go" && echo same || echo "differs: run go generate ./window")" same
# The module carries the licence: its own copy of the repository's (a module cannot reach above
# its root).
check "LICENSE is the repository's" \
  "$(cmp -s LICENSE "$root/LICENSE" && echo same || echo "differs: cp ../../LICENSE LICENSE")" same
gocheck "go vet ./..." "$work/go-vet.log" go vet ./...
gocheck "go build ./..." "$work/go-build.log" go build ./...
gocheck "helper unit tests (go test ./...)" "$work/go-test.log" go test -count=1 ./...
check "go.mod untouched by the build" "$(sha256sum go.mod)" "$gomod_sum"
# build.sh, as a developer runs it, builds into the build directory (../build-dir.sh).
gocheck "build.sh (gofmt, vet, build, the binaries)" "$work/build-sh.log" \
  env WINDOW_BUILD_DIR="$work/build-dir" ./build.sh
check "build.sh built its binaries outside the checkout" \
  "$(ls "$work/build-dir/go/bin" 2>/dev/null | paste -sd' ')" "healthcheck producer worker"
tree_state >"$work/tree-after.txt"
check "the builds wrote nothing into the checkout (no .offline/, no bin/)" \
  "$(diff "$work/tree-before.txt" "$work/tree-after.txt" | grep -c '^[<>]' || true)" 0

# --- the module installed outside the repository, used by a user's module --------------------
# What a module zip holds: go.mod, LICENSE, README.md and the packages' files (not the nested
# example-app module, not build output).
install="$work/install/$module"
mkdir -p "$install"
find . \( -path ./example-app -o -path './.*' -o -path ./bin \) -prune -o \
  \( -name '*.go' -o -name go.mod -o -name README.md -o -name LICENSE -o -name '*.json' \) -print0 |
  xargs -0 cp --parents -t "$install"
check "the installed module carries LICENSE" "$(cmp -s "$install/LICENSE" "$root/LICENSE" && echo yes)" yes
app="$work/example-app"
mkdir -p "$app"
cp example-app/go.mod example-app/main.go "$app/"
(cd "$app" && GOFLAGS='' go mod edit -replace="$module=$install" go.mod)
./offline-modfile.sh "$app/go.mod" "$work/example-app-offline"
bin="$work/bin"
(
  cd "$app"
  export GOFLAGS="-mod=mod -modfile=$work/example-app-offline/go.mod"
  go build -o "$bin/example-app" . &&
    for cmd in producer worker healthcheck; do go build -o "$bin/$cmd" "$module/cmd/$cmd"; done &&
    go list -m -f '{{.Replace.Dir}}' "$module"
) >"$work/app-build.log" 2>&1 || cat "$work/app-build.log"
check "a user's module builds against the installed helper module" \
  "$(ls "$bin" 2>/dev/null | paste -sd' ') $(tail -1 "$work/app-build.log")" \
  "example-app healthcheck producer worker $install"
case "$install" in "$root"/*) outside=no ;; *) outside=yes ;; esac
check "the installed module is outside the repository" "$outside" yes

# --- processes ------------------------------------------------------------------------------
start_redis
start_sidecar
export WINDOW_SIDECAR_ADDR="$addr"
load_expected expected_by_jq

set +e
timeout 60 "$bin/producer" -orders "$orders" >"$work/producer.log" 2>&1
producer_rc=$?
timeout 120 "$bin/worker" -orders "$orders" -consumer worker-1 -idle-timeout 20s \
  >"$work/worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/producer.log"
grep -E '^summary:' "$work/worker.log" || true
check "producer exit status" "$producer_rc" 0
check "worker exit status" "$worker_rc" 0
check_summary_counts "" "$work/worker.log"
check_end_state

# --- a refused command ------------------------------------------------------------------------
# The example app's handler queues FLUSHALL (forbidden) and acks: the sidecar refuses the
# command and the ack. With RejectedOutcome retry_after the helper settles with retry_after 1 s
# "rejected: FORBIDDEN_COMMAND: …", and the second delivery, at the cap of 2, goes to the dead
# letter.
set +e
timeout 60 "$bin/example-app" -addr "$addr" -stream poison -dead-letter poison:dead \
  -max-deliveries 2 -command FLUSHALL -rejected-outcome retry_after >"$work/example-app.log" 2>&1
app_rc=$?
set -e
grep -E '^deliveries=' "$work/example-app.log" || true
check "rejected command: example app exit status" "$app_rc" 0
check "rejected command: delivered twice, then dead-lettered" \
  "$(grep -E '^deliveries=' "$work/example-app.log")" "deliveries=2 dead_lettered=1"
check "rejected command: XLEN poison:dead" "$(rcli xlen poison:dead)" 1
check "rejected command: XPENDING poison example-app" "$(rcli xpending poison example-app | head -1)" 0
check "rejected command: ZCARD {poison}:window:delayed" "$(rcli zcard '{poison}:window:delayed')" 0
check "rejected command: the dead letter's reason is the rejection" \
  "$(rcli xrange poison:dead - + | awk 'prev == "x-window-reason" || prev == "h:x-window-reason" {print} {prev = $0}' | grep -c '^rejected: FORBIDDEN_COMMAND: ')" 1
# With the default (auto), FORBIDDEN_COMMAND, which no retry fixes, dead-letters the delivery at
# once: one delivery, in the dead letter with the rejection as its reason, nothing delayed, and
# no line repeats the sidecar's advice to settle it otherwise.
set +e
timeout 60 "$bin/example-app" -addr "$addr" -stream poison2 -dead-letter poison2:dead \
  -max-deliveries 2 -command FLUSHALL -rejected-outcome auto >"$work/example-app-auto.log" 2>&1
app_rc=$?
set -e
grep -E '^deliveries=' "$work/example-app-auto.log" || true
check "refused command, auto: example app exit status" "$app_rc" 0
check "refused command, auto: delivered once, then dead-lettered" \
  "$(grep -E '^deliveries=' "$work/example-app-auto.log")" "deliveries=1 dead_lettered=1"
check "refused command, auto: XLEN poison2:dead" "$(rcli xlen poison2:dead)" 1
check "refused command, auto: the dead letter's reason is the rejection" \
  "$(rcli xrange poison2:dead - + | awk 'prev == "h:x-window-reason" {print} {prev = $0}' | grep -c '^rejected: FORBIDDEN_COMMAND: ')" 1
check "refused command, auto: XPENDING poison2 example-app" "$(rcli xpending poison2 example-app | head -1)" 0
check "refused command, auto: ZCARD {poison2}:window:delayed" "$(rcli zcard '{poison2}:window:delayed')" 0
check "refused command, auto: no line says \"settle it with\"" "$(grep -ci 'settle it with' "$work/example-app-auto.log" || true)" 0
# Without a dead letter, auto drops it at once: one delivery, nothing delayed, the error
# callback told.
set +e
timeout 60 "$bin/example-app" -addr "$addr" -stream poison3 -dead-letter "" \
  -max-deliveries 0 -command FLUSHALL -rejected-outcome auto >"$work/example-app-drop.log" 2>&1
app_rc=$?
set -e
grep -E '^deliveries=' "$work/example-app-drop.log" || true
check "refused command, auto, no dead letter: example app exit status" "$app_rc" 0
check "refused command, auto, no dead letter: delivered once, dropped, the callback told FORBIDDEN_COMMAND" \
  "$(grep -E '^deliveries=' "$work/example-app-drop.log")" "deliveries=1 dropped=1 reason=FORBIDDEN_COMMAND"
check "refused command, auto, no dead letter: XPENDING poison3 example-app" "$(rcli xpending poison3 example-app | head -1)" 0
check "refused command, auto, no dead letter: ZCARD {poison3}:window:delayed" "$(rcli zcard '{poison3}:window:delayed')" 0

# --- the Unix socket ----------------------------------------------------------------------
# The recommended sidecar setup: a second sidecar on --listen unix:PATH, reached with grpc-go's
# usual target unix:///PATH and no other dial option (no grpc.WithAuthority).
sock="$work/sidecar.sock"
uds="unix://$sock"
log "a second sidecar on unix:$sock"
start_uds_sidecar "$sock"
rcli FLUSHDB >/dev/null
uds_stream=uds-orders
set +e
timeout 30 "$bin/healthcheck" -addr "$uds" >"$work/uds-health.log" 2>&1
timeout 60 "$bin/producer" -addr "$uds" -orders "$orders" -stream "$uds_stream" >"$work/uds-producer.log" 2>&1
producer_rc=$?
timeout 120 "$bin/worker" -addr "$uds" -orders "$orders" -stream "$uds_stream" -consumer uds-1 \
  -idle-timeout 20s >"$work/uds-worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/uds-health.log" "$work/uds-producer.log"
grep -E '^summary:' "$work/uds-worker.log" || true
check_health "unix socket" "$work/uds-health.log"
check "unix socket: producer exit status" "$producer_rc" 0
check_published "unix socket" "$work/uds-producer.log" "$uds_stream" '"'
check "unix socket: worker exit status" "$worker_rc" 0
check_summary_counts "unix socket" "$work/uds-worker.log"
# Every entry was delivered: the orders and a copy per retry, the last of them the group's last.
check_group_read_all "unix socket" "$uds_stream"
check_end_state "unix socket" "$uds_stream"

# --- the bearer token ---------------------------------------------------------------------
# A third sidecar requires a token (--auth-token-file): the helper sends WINDOW_SIDECAR_TOKEN
# as `authorization: Bearer …`; without it every call fails with UNAUTHENTICATED. The worker
# runs in atomic mode there (the acked orders' segments in one script per read), to the same end state.
start_token_sidecar
rcli FLUSHDB >/dev/null
rcli CONFIG RESETSTAT >/dev/null
auth_stream=auth-orders
set +e
(unset WINDOW_SIDECAR_TOKEN; timeout 30 "$bin/producer" -addr "$token_addr" -orders "$orders" \
  -stream "$auth_stream") >"$work/auth-none-producer.log" 2>&1
none_producer_rc=$?
(unset WINDOW_SIDECAR_TOKEN; timeout 30 "$bin/worker" -addr "$token_addr" -orders "$orders" \
  -stream "$auth_stream" -consumer auth-1 -idle-timeout 10s) >"$work/auth-none-worker.log" 2>&1
none_worker_rc=$?
export WINDOW_SIDECAR_TOKEN
WINDOW_SIDECAR_TOKEN="$(head -1 "$work/token")"
timeout 60 "$bin/producer" -addr "$token_addr" -orders "$orders" -stream "$auth_stream" \
  >"$work/auth-producer.log" 2>&1
producer_rc=$?
timeout 120 "$bin/worker" -addr "$token_addr" -orders "$orders" -stream "$auth_stream" \
  -consumer auth-1 -idle-timeout 20s -atomic >"$work/auth-worker.log" 2>&1
worker_rc=$?
unset WINDOW_SIDECAR_TOKEN
set -e
cat "$work/auth-producer.log"
grep -E '^summary:' "$work/auth-worker.log" || true
check "no token: producer fails with UNAUTHENTICATED" \
  "$none_producer_rc $(grep -c 'refused publish: UNAUTHENTICATED: .*set WINDOW_SIDECAR_TOKEN' "$work/auth-none-producer.log")" "1 1"
check "no token: worker fails with UNAUTHENTICATED" \
  "$none_worker_rc $(grep -c 'subscription ended: .*refused subscribe: UNAUTHENTICATED: .*set WINDOW_SIDECAR_TOKEN' "$work/auth-none-worker.log")" "1 1"
check "token: producer exit status" "$producer_rc" 0
check_published "token" "$work/auth-producer.log" "$auth_stream" '"'
check "token: worker exit status" "$worker_rc" 0
stats="$(rcli info commandstats)"
eval_calls="$(sed -nE 's/^cmdstat_eval:calls=([0-9]+),.*/\1/p' <<<"$stats")"
exec_calls="$(sed -nE 's/^cmdstat_exec:calls=([0-9]+),.*/\1/p' <<<"$stats")"
check "token: atomic mode, the acked orders' segments in scripts, no MULTI/EXEC" \
  "$((${eval_calls:-0} >= 1 && ${exec_calls:-0} == 0))" 1
check_summary_counts "token" "$work/auth-worker.log"
check_end_state "token" "$auth_stream"

# --- a read at a time -------------------------------------------------------------------------
# The worker with -batches receives whole reads (Batches): drops and retries per order, the rest
# acked with one Batch.Ack; the same end state as delivery by delivery.
rcli flushdb >/dev/null
set +e
timeout 60 "$bin/producer" -addr "$addr" -orders "$orders" >"$work/batches-producer.log" 2>&1
producer_rc=$?
timeout 120 "$bin/worker" -addr "$addr" -orders "$orders" -consumer batches-1 -idle-timeout 20s \
  -batches >"$work/batches-worker.log" 2>&1
worker_rc=$?
set -e
grep -E '^summary:' "$work/batches-worker.log" || true
check "batches: producer exit status" "$producer_rc" 0
check "batches: worker exit status" "$worker_rc" 0
check_summary_counts "batches" "$work/batches-worker.log"
check_end_state "batches"

e2e_summary
