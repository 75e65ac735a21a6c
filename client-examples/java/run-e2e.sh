#!/usr/bin/env bash
# End-to-end test of the Java example: installs what is missing (Debian packages), generates and
# builds, starts a redis-server on a free port and the sidecar, runs the producer then the
# worker until done, and checks the Redis end state of ../orders.json with redis-cli. Then
# it does it again through a second sidecar on a Unix socket (--listen unix:PATH), with the
# examples' --addr unix:PATH: grpc-java's epoll transport over Netty's native library, which
# native-epoll.sh builds from Debian's source (Debian ships none), and no other channel option.
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
need_cmd javac default-jdk-headless
need_cmd jar default-jdk-headless
need_cmd protoc protobuf-compiler
command -v protoc-gen-grpc-java >/dev/null 2>&1 || need_cmd grpc_java_plugin protobuf-compiler-grpc-java-plugin
# The proto imports google/protobuf/duration.proto, which protoc only recommends.
[[ -f /usr/include/google/protobuf/duration.proto ]] || missing+=(libprotobuf-dev)
need_file() { [[ -f /usr/share/java/$1.jar ]] || missing+=("$2"); }
for jar in grpc-api grpc-context grpc-core grpc-netty grpc-protobuf grpc-protobuf-lite grpc-stub; do
  need_file "$jar" libgrpc-java
done
for jar in netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks netty-common \
  netty-handler netty-handler-proxy netty-resolver netty-transport netty-transport-native-unix-common \
  netty-transport-native-epoll; do
  need_file "$jar" libnetty-java
done
need_file protobuf libprotobuf-java
need_file guava libguava-java
need_file perfmark-api libperfmark-java
need_file gson libgoogle-gson-java
need_file geronimo-annotation-1.3-spec libgeronimo-annotation-1.3-spec-java
need_file error_prone_annotations liberror-prone-java
need_file junit4 junit4
need_file hamcrest-core libhamcrest-java
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
need_cmd jq jq
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
fi

SKIP_TESTS=1 ./build.sh
# Netty's native epoll library, for the Unix socket (cached in build/native).
native_dir=$(./native-epoll.sh)

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

jars=/usr/share/java
if java -cp "build/test-classes:build/window-examples.jar:$jars/junit4.jar:$jars/hamcrest-core.jar" \
  org.junit.runner.JUnitCore dev.windowsidecar.client.SubscriptionTest \
  dev.windowsidecar.client.WindowClientTest >"$work/junit.log" 2>&1; then
  check "helper unit tests (JUnit: $(grep -Eo 'OK \([0-9]+ tests\)' "$work/junit.log"))" ok ok
else
  cat "$work/junit.log"
  check "helper unit tests (JUnit)" failed ok
fi

set +e
timeout 60 java -cp build/window-examples.jar dev.windowsidecar.examples.Producer \
  --orders "$orders_json" >"$work/producer.log" 2>&1
producer_rc=$?
timeout 120 java -cp build/window-examples.jar dev.windowsidecar.examples.Worker \
  --orders "$orders_json" --consumer worker-1 --idle-timeout 20s >"$work/worker.log" 2>&1
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
# The recommended sidecar setup: a second sidecar on --listen unix:PATH, reached with the
# target unix:PATH of newer grpc-java (WindowClient.connect: NettyChannelBuilder.forAddress of a
# DomainSocketAddress over epoll) and no other channel option (no overrideAuthority): grpc-java
# sends the socket path as :authority and the sidecar takes it.
sock="$work/sidecar.sock"
uds="unix:$sock"
echo "== a second sidecar on $uds"
# h2's debug lines show what became of the :authority.
RUST_LOG=info,h2::server=debug "$bin" --listen "$uds" --redis-url "redis://127.0.0.1:$redis_port" \
  --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar-uds.log" 2>&1 &
pids+=($!)
wait_for "window-sidecar on $uds" test -S "$sock"
rcli FLUSHDB >/dev/null
uds_stream=uds-orders
java_uds=(java "-Djava.library.path=$native_dir" -cp build/window-examples.jar)
set +e
timeout 60 "${java_uds[@]}" dev.windowsidecar.examples.Producer --addr "$uds" \
  --orders "$orders_json" --stream "$uds_stream" >"$work/uds-producer.log" 2>&1
producer_rc=$?
timeout 120 "${java_uds[@]}" dev.windowsidecar.examples.Worker --addr "$uds" \
  --orders "$orders_json" --stream "$uds_stream" --consumer uds-1 --idle-timeout 20s \
  >"$work/uds-worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/uds-producer.log"
grep -E '^summary:' "$work/uds-worker.log" || true
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
# The socket path as :authority is no authority: the sidecar's h2 ignores it (a debug line)
# and refuses no request as malformed.
check "unix socket: grpc-java sent the socket path as :authority, ignored" \
  "$(grep -cF "ignoring a malformed :authority (b\"$sock\")" "$work/sidecar-uds.log" | awk '{print ($1 > 0)}')" 1
check "unix socket: no other malformed line in the sidecar's log" \
  "$(grep -i malformed "$work/sidecar-uds.log" | grep -vcF 'ignoring a malformed :authority')" 0

echo "$passed passed, $failed failed"
((failed == 0))
