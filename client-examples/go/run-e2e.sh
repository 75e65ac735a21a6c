#!/usr/bin/env bash
# End-to-end test of the Go example: installs what is missing (Debian packages), generates and
# builds, starts a redis-server on a free port and the sidecar, runs the producer then the
# worker until done, and checks the Redis end state of ../orders.json with redis-cli; then does
# it again through a second sidecar on a Unix socket (--listen unix:PATH), after a health Check,
# with grpc-go's usual target unix:///PATH and no other dial option.
#
#   WINDOW_SIDECAR_BIN   the sidecar binary (default ../../target/debug/window-sidecar; built
#                        with cargo when missing)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# root, orders, sidecar_bin; e2e_init, check, start_redis, start_sidecar, check_end_state, …
source "$here/../e2e-lib.sh"
cd "$here"
e2e_init go

# --- toolchain: install only what is missing ---------------------------------------------
need_cmd go golang-go
need_cmd protoc protobuf-compiler
need_cmd protoc-gen-go protoc-gen-go
need_cmd protoc-gen-go-grpc protoc-gen-go-grpc
need_path /usr/share/gocode/src/google.golang.org/grpc golang-google-grpc-dev
need_path /usr/share/gocode/src/google.golang.org/protobuf golang-google-protobuf-dev
need_path /usr/share/gocode/src/github.com/golang/protobuf golang-github-golang-protobuf-1-5-dev
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
need_cmd jq jq
install_missing

./build.sh
ensure_sidecar

# --- processes ------------------------------------------------------------------------------
start_redis
start_sidecar
export WINDOW_SIDECAR_ADDR="$addr"
load_expected expected_by_jq

# --- checks ---------------------------------------------------------------------------------
if (GO111MODULE=off GOPATH="$here/.gopath:/usr/share/gocode" GOFLAGS='' \
  go test -count=1 windowsidecar.example/window >"$work/go-test.log" 2>&1); then
  check "helper unit tests (go test)" ok ok
else
  cat "$work/go-test.log"
  check "helper unit tests (go test)" failed ok
fi

set +e
timeout 60 ./bin/producer -orders "$orders" >"$work/producer.log" 2>&1
producer_rc=$?
timeout 120 ./bin/worker -orders "$orders" -consumer worker-1 -idle-timeout 20s \
  >"$work/worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/producer.log"
grep -E '^summary:' "$work/worker.log" || true
check "producer exit status" "$producer_rc" 0
check "worker exit status" "$worker_rc" 0
check_summary_counts "" "$work/worker.log"
check_end_state

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
timeout 30 ./bin/healthcheck -addr "$uds" >"$work/uds-health.log" 2>&1
timeout 60 ./bin/producer -addr "$uds" -orders "$orders" -stream "$uds_stream" >"$work/uds-producer.log" 2>&1
producer_rc=$?
timeout 120 ./bin/worker -addr "$uds" -orders "$orders" -stream "$uds_stream" -consumer uds-1 \
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

e2e_summary

