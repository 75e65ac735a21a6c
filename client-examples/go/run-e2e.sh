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
root=$(cd "$here/../.." && pwd)
bin=${WINDOW_SIDECAR_BIN:-$root/target/debug/window-sidecar}
[[ $bin == /* ]] || bin="$PWD/$bin"
orders_json="$here/../orders.json"
cd "$here"

# --- toolchain: install only what is missing ---------------------------------------------
missing=()
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need_dir() { [[ -d $1 ]] || missing+=("$2"); }
need_cmd go golang-go
need_cmd protoc protobuf-compiler
need_cmd protoc-gen-go protoc-gen-go
need_cmd protoc-gen-go-grpc protoc-gen-go-grpc
need_dir /usr/share/gocode/src/google.golang.org/grpc golang-google-grpc-dev
need_dir /usr/share/gocode/src/google.golang.org/protobuf golang-google-protobuf-dev
need_dir /usr/share/gocode/src/github.com/golang/protobuf golang-github-golang-protobuf-1-5-dev
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
need_cmd jq jq
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
fi

./build.sh

if [[ ! -x $bin ]]; then
  echo "building the sidecar ($bin is missing)"
  (cd "$root" && cargo build -p window-sidecar)
  bin="$root/target/debug/window-sidecar"
fi

# --- processes ------------------------------------------------------------------------------
work=$(mktemp -d)
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((status != 0)); then
    for log in "$work"/*.log; do
      [[ -f $log ]] && { echo "--- $(basename "$log") (last lines)"; tail -n 20 "$log"; }
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "no free port found" >&2
  return 1
}
wait_for() { # what, command...
  local what=$1
  shift
  for _ in $(seq 1 150); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$what did not come up" >&2
  return 1
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
pids+=($!)
rcli() { redis-cli -p "$redis_port" "$@"; }
wait_for "redis-server" bash -c "redis-cli -p $redis_port PING | grep -q PONG"

grpc_port=$(free_port)
"$bin" --listen "127.0.0.1:$grpc_port" --redis-url "redis://127.0.0.1:$redis_port" \
  --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar.log" 2>&1 &
pids+=($!)
wait_for "window-sidecar" bash -c "exec 3<>/dev/tcp/127.0.0.1/$grpc_port"
export WINDOW_SIDECAR_ADDR="127.0.0.1:$grpc_port"

# --- checks ---------------------------------------------------------------------------------
passed=0
failed=0
check() { # name, got, want
  if [[ $2 == "$3" ]]; then
    passed=$((passed + 1))
    echo "ok   - $1"
  else
    failed=$((failed + 1))
    echo "FAIL - $1: got '$2', want '$3'"
  fi
}

if (GO111MODULE=off GOPATH="$here/.gopath:/usr/share/gocode" GOFLAGS='' \
  go test -count=1 windowsidecar.example/window >"$work/go-test.log" 2>&1); then
  check "helper unit tests (go test)" ok ok
else
  cat "$work/go-test.log"
  check "helper unit tests (go test)" failed ok
fi

set +e
timeout 60 ./bin/producer -orders "$orders_json" >"$work/producer.log" 2>&1
producer_rc=$?
timeout 120 ./bin/worker -orders "$orders_json" -consumer worker-1 -idle-timeout 20s \
  >"$work/worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/producer.log"
grep -E '^summary:' "$work/worker.log" || true
check "producer exit status" "$producer_rc" 0
check "worker exit status" "$worker_rc" 0

# check_summary PREFIX LOG: the worker's summary line against ../orders.json.
check_summary() {
  local summary got what
  summary=$(grep -E '^summary:' "$2" || true)
  for what in acked dropped retried; do
    got=$(sed -nE "s/.* $what=([0-9]+).*/\1/p; s/^summary: $what=([0-9]+).*/\1/p" <<<"$summary" | head -n1)
    check "${1}worker summary $what" "$got" "$(jq -r ".expected.$what" "$orders_json")"
  done
}
# check_end_state PREFIX STREAM: the Redis end state of ../orders.json consumed from STREAM.
check_end_state() {
  local prefix=$1 stream=$2 hash picks expected_picks group sku want
  hash=$(jq -r '.expected.sku_totals_hash' "$orders_json")
  while read -r sku want; do
    check "${prefix}HGET $hash $sku" "$(rcli HGET "$hash" "$sku")" "$want"
  done < <(jq -r '.expected.sku_totals | to_entries[] | "\(.key) \(.value)"' "$orders_json")
  check "${prefix}HLEN $hash (no other SKUs)" "$(rcli HLEN "$hash")" "$(jq '.expected.sku_totals | length' "$orders_json")"

  picks=$(jq -r '.expected.picks_list' "$orders_json")
  check "${prefix}LLEN $picks" "$(rcli LLEN "$picks")" "$(jq '.expected.picks' "$orders_json")"
  expected_picks=$(jq -r '.orders[] | select((.lines | length) > 0 and all(.lines[]; .qty > 0))
    | .id as $id | .lines[] | "\($id):\(.sku):\(.qty)"' "$orders_json" | sort | paste -sd' ')
  check "${prefix}picks are exactly those of the valid orders" \
    "$(rcli LRANGE "$picks" 0 -1 | sort | paste -sd' ')" "$expected_picks"

  group=$(jq -r '.group' "$orders_json")
  check "${prefix}XPENDING $stream $group" "$(rcli XPENDING "$stream" "$group" | head -n1)" 0
  check "${prefix}ZCARD {$stream}:window:delayed" "$(rcli ZCARD "{$stream}:window:delayed")" 0
}
check_summary "" "$work/worker.log"
check_end_state "" "$(jq -r '.stream' "$orders_json")"

# --- the Unix socket ----------------------------------------------------------------------
# The recommended sidecar setup: a second sidecar on --listen unix:PATH, reached with grpc-go's
# usual target unix:///PATH and no other dial option (no grpc.WithAuthority).
sock="$work/sidecar.sock"
uds="unix://$sock"
echo "== a second sidecar on unix:$sock"
"$bin" --listen "unix:$sock" --redis-url "redis://127.0.0.1:$redis_port" \
  --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar-uds.log" 2>&1 &
pids+=($!)
wait_for "window-sidecar on unix:$sock" test -S "$sock"
rcli FLUSHDB >/dev/null
uds_stream=uds-orders
set +e
timeout 30 ./bin/healthcheck -addr "$uds" >"$work/uds-health.log" 2>&1
timeout 60 ./bin/producer -addr "$uds" -orders "$orders_json" -stream "$uds_stream" >"$work/uds-producer.log" 2>&1
producer_rc=$?
timeout 120 ./bin/worker -addr "$uds" -orders "$orders_json" -stream "$uds_stream" -consumer uds-1 \
  -idle-timeout 20s >"$work/uds-worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/uds-health.log" "$work/uds-producer.log"
grep -E '^summary:' "$work/uds-worker.log" || true
check "unix socket: health Check" "$(grep -o 'health window_sidecar.v1.WindowService: .*' "$work/uds-health.log")" \
  "health window_sidecar.v1.WindowService: SERVING"
check "unix socket: producer exit status" "$producer_rc" 0
check "unix socket: Publish" "$(grep -Eo "^published [0-9]+ orders to \"$uds_stream\"" "$work/uds-producer.log")" \
  "published $(jq '.orders | length' "$orders_json") orders to \"$uds_stream\""
check "unix socket: worker exit status" "$worker_rc" 0
check_summary "unix socket: " "$work/uds-worker.log"
# Every entry was delivered: the orders and a copy per retry, the last of them the group's last.
check "unix socket: the group read all the stream's entries" \
  "$(rcli XLEN "$uds_stream") $(rcli XINFO GROUPS "$uds_stream" | awk 'prev == "last-delivered-id" {print} {prev = $0}')" \
  "$(jq '(.orders | length) + .expected.retried' "$orders_json") $(rcli XREVRANGE "$uds_stream" + - COUNT 1 | head -n1)"
check_end_state "unix socket: " "$uds_stream"

echo "$passed passed, $failed failed"
((failed == 0))
