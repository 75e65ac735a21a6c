#!/usr/bin/env bash
# End-to-end test of the Node/TypeScript client example against a real redis-server and
# window-sidecar.
#
#   bash client-examples/node/run-e2e.sh        (or: npm run e2e)
#
# 1. installs what is missing (npm ci: @grpc/grpc-js, ts-proto, buf, typescript), generates the
#    code and compiles (npm run build), builds the sidecar when WINDOW_SIDECAR_BIN is missing;
# 2. starts a redis-server on a free port and the sidecar;
# 3. scenario "plain": producer, then worker until done; asserts the Redis end state of
#    ../orders.json;
# 4. scenario "restart": a slow worker (WORKER_DELAY_MS) whose sidecar is SIGTERMed and
#    restarted on the same port mid-run; the worker must reconnect and nothing may be lost;
# 5. scenario "unix socket": a second sidecar on --listen unix:PATH, reached with grpc-js's usual
#    target "unix:PATH" and no channel option: a health Check (grpc-health-check), then the
#    producer and the worker on a fresh stream; asserts the same end state.
# Prints "N passed, 0 failed" last and exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
orders="$here/../orders.json"
sidecar_bin="${WINDOW_SIDECAR_BIN:-$root/target/debug/window-sidecar}"
work="$(mktemp -d "${TMPDIR:-/tmp}/window-node-e2e.XXXXXX")"
pids=()
passed=0
failed=0

log() { printf '== %s\n' "$*"; }

cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [[ $failed -eq 0 && -z "${KEEP_E2E_DIR:-}" ]]; then
    rm -rf "$work"
  else
    echo "logs kept in $work"
  fi
}
trap cleanup EXIT

pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; }
# check NAME ACTUAL EXPECTED
check() {
  if [[ "$2" == "$3" ]]; then pass "$1"; else fail "$1: got '$2', want '$3'"; fi
}

# ---- 1. tools ----------------------------------------------------------------------------
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "node and npm are needed (apt-get install nodejs npm)" >&2
  exit 1
fi
need_install=no
for f in node_modules/.bin/buf node_modules/.bin/tsc node_modules/.bin/protoc-gen-ts_proto \
  node_modules/@grpc/grpc-js/package.json node_modules/@bufbuild/protobuf/package.json \
  node_modules/grpc-health-check/package.json; do
  [[ -e "$here/$f" ]] || need_install=yes
done
if [[ $need_install == yes ]]; then
  log "installing the npm packages"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
log "generating the gRPC code and compiling"
(cd "$here" && npm run --silent build)
if [[ ! -x "$sidecar_bin" ]]; then
  log "building the sidecar ($sidecar_bin is missing)"
  (cd "$root" && cargo build -p window-sidecar)
fi
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "redis-server and redis-cli are needed (apt-get install redis-server)" >&2
  exit 1
fi

free_port() {
  node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}

# ---- 2. redis-server and the sidecar ------------------------------------------------------
redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
rcli() { redis-cli -p "$redis_port" "$@"; }
for _ in $(seq 100); do
  [[ "$(rcli ping 2>/dev/null)" == PONG ]] && break
  sleep 0.05
done

sidecar_port="$(free_port)"
addr="127.0.0.1:$sidecar_port"
sidecar_pid=""
sidecar_n=0
start_sidecar() {
  sidecar_n=$((sidecar_n + 1))
  "$sidecar_bin" --listen "$addr" --redis-url "redis://127.0.0.1:$redis_port" \
    --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar-$sidecar_n.log" 2>&1 &
  sidecar_pid=$!
  pids+=("$sidecar_pid")
  for _ in $(seq 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$sidecar_port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "the sidecar did not listen on $addr:" >&2
  cat "$work/sidecar-$sidecar_n.log" >&2
  return 1
}
start_sidecar
log "redis-server on $redis_port, sidecar on $addr"

# ---- expectations from orders.json ------------------------------------------------------
node - "$orders" >"$work/expected.txt" <<'EOF'
const spec = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const exp = spec.expected;
for (const [sku, total] of Object.entries(exp.sku_totals)) console.log("total", sku, total);
console.log("skus", Object.keys(exp.sku_totals).length);
console.log("picks", exp.picks);
console.log("summary", exp.acked, exp.dropped, exp.retried);
console.log("stream", spec.stream);
console.log("group", spec.group);
const invalid = (o) => !o.lines.length || o.lines.some((l) => l.qty <= 0);
for (const o of spec.orders) {
  if (invalid(o)) console.log("invalid", o.id);
  else for (const l of o.lines) console.log("pick", `${o.id}:${l.sku}:${l.qty}`);
}
EOF
stream="$(awk '$1=="stream"{print $2}' "$work/expected.txt")"
group="$(awk '$1=="group"{print $2}' "$work/expected.txt")"
totals_key="sku-totals"
picks_key=picks

check_end_state() { # LABEL [STREAM]
  local label="$1" stream="${2:-$stream}" sku want
  while read -r _ sku want; do
    check "$label: HGET $totals_key $sku" "$(rcli hget "$totals_key" "$sku")" "$want"
  done < <(grep '^total ' "$work/expected.txt")
  check "$label: HLEN $totals_key (no other SKU)" "$(rcli hlen "$totals_key")" \
    "$(awk '$1=="skus"{print $2}' "$work/expected.txt")"
  check "$label: LLEN $picks_key" "$(rcli llen "$picks_key")" \
    "$(awk '$1=="picks"{print $2}' "$work/expected.txt")"
  check "$label: the picks are exactly the valid orders' lines" \
    "$(rcli lrange "$picks_key" 0 -1 | sort | tr '\n' ' ')" \
    "$(awk '$1=="pick"{print $2}' "$work/expected.txt" | sort | tr '\n' ' ')"
  local bad=0 id
  while read -r _ id; do
    bad=$((bad + $(rcli lrange "$picks_key" 0 -1 | grep -c "^$id:" || true)))
  done < <(grep '^invalid ' "$work/expected.txt")
  check "$label: no picks from invalid orders" "$bad" 0
  check "$label: XPENDING $stream $group" "$(rcli xpending "$stream" "$group" | head -1)" 0
  check "$label: ZCARD {$stream}:window:delayed" "$(rcli zcard "{$stream}:window:delayed")" 0
}

# ---- 3. scenario "plain" -----------------------------------------------------------------
log "scenario plain: producer, then worker"
(cd "$here" && node dist/producer.js --sidecar "$addr") \
  >"$work/plain-producer.log" 2>&1 || { cat "$work/plain-producer.log"; fail "plain: producer"; }
cat "$work/plain-producer.log"
rc=0
(cd "$here" && timeout 90 node dist/worker.js --sidecar "$addr" --idle-exit 20) >"$work/plain-worker.log" 2>&1 || rc=$?
grep -E '^worker-1:|^not settled' "$work/plain-worker.log" || true
check "plain: worker exit code" "$rc" 0
read -r acked dropped retried < <(awk '$1=="summary"{print $2, $3, $4}' "$work/expected.txt")
check "plain: worker summary" \
  "$(grep -Eo '^worker-1: acked [0-9]+, dropped [0-9]+, retried [0-9]+' "$work/plain-worker.log")" \
  "worker-1: acked $acked, dropped $dropped, retried $retried"
check_end_state plain
[[ $rc -eq 0 ]] || tail -30 "$work/plain-worker.log"

# ---- 4. scenario "restart" ---------------------------------------------------------------
log "scenario restart: SIGTERM the sidecar in the middle of a slow worker run"
rcli flushdb >/dev/null
(cd "$here" && node dist/producer.js --sidecar "$addr") \
  >"$work/restart-producer.log" 2>&1 || { cat "$work/restart-producer.log"; fail "restart: producer"; }
cat "$work/restart-producer.log"
(cd "$here" && WORKER_DELAY_MS=300 exec timeout 120 node dist/worker.js --sidecar "$addr" \
  --count 4 --idle-exit 30) \
  >"$work/restart-worker.log" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
# Wait until the first read has been flushed, so the restart lands mid-run.
for _ in $(seq 300); do
  grep -q 'flush of read 1:' "$work/restart-worker.log" && break
  sleep 0.05
done
check "restart: worker was mid-run at the restart" \
  "$(grep -c 'every order is settled for good' "$work/restart-worker.log" || true):$(kill -0 "$worker_pid" 2>/dev/null && echo running)" \
  "0:running"
old_pid="$sidecar_pid"
kill -TERM "$old_pid"
stopped=no
for _ in $(seq 200); do
  if ! kill -0 "$old_pid" 2>/dev/null; then stopped=yes; break; fi
  sleep 0.05
done
wait "$old_pid" 2>/dev/null || true
check "restart: the sidecar drained and exited on SIGTERM" "$stopped" yes
grep -o 'subscription closed.*' "$work/sidecar-1.log" | tail -1 | sed 's/^/   old sidecar: /' || true
start_sidecar
rc=0
wait "$worker_pid" || rc=$?
grep -E '^worker-1:|^not settled' "$work/restart-worker.log" || true
check "restart: worker exit code" "$rc" 0
check "restart: the worker saw the stream end with UNAVAILABLE" \
  "$(grep -c 'subscription stream ended with UNAVAILABLE' "$work/restart-worker.log" | awk '{print ($1 > 0)}')" 1
check "restart: the worker resubscribed to the new sidecar" \
  "$(grep -c "resubscribed as consumer 'worker-1'" "$work/restart-worker.log" | awk '{print ($1 > 0)}')" 1
check_end_state restart
[[ $rc -eq 0 ]] || tail -40 "$work/restart-worker.log"

# ---- 5. scenario "unix socket" --------------------------------------------------------------
# The recommended sidecar setup. Each client names the socket in grpc-js's own syntax,
# "unix:PATH", and sets no channel option (no grpc.default_authority).
sock="$work/sidecar.sock"
uds="unix:$sock"
log "scenario unix socket: a second sidecar on unix:$sock"
"$sidecar_bin" --listen "unix:$sock" --redis-url "redis://127.0.0.1:$redis_port" \
  --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar-uds.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
  [[ -S $sock ]] && break
  sleep 0.05
done
(cd "$here" && timeout 30 node dist/health-check.js --sidecar "$uds") >"$work/uds-health.log" 2>&1 || true
cat "$work/uds-health.log"
check "unix socket: health Check" "$(grep -o 'health window_sidecar.v1.WindowService: .*' "$work/uds-health.log")" \
  "health window_sidecar.v1.WindowService: SERVING"
rcli flushdb >/dev/null
uds_stream=uds-orders
(cd "$here" && node dist/producer.js --sidecar "$uds" --stream "$uds_stream") \
  >"$work/uds-producer.log" 2>&1 || { cat "$work/uds-producer.log"; fail "unix socket: producer"; }
cat "$work/uds-producer.log"
check "unix socket: Publish" "$(grep -Eo "^published [0-9]+ orders to '$uds_stream'" "$work/uds-producer.log")" \
  "published $((acked + dropped)) orders to '$uds_stream'"
rc=0
(cd "$here" && timeout 90 node dist/worker.js --sidecar "$uds" --stream "$uds_stream" --consumer uds-1 \
  --idle-exit 20) >"$work/uds-worker.log" 2>&1 || rc=$?
grep -E '^uds-1:|^not settled' "$work/uds-worker.log" || true
check "unix socket: worker exit code" "$rc" 0
check "unix socket: worker summary" \
  "$(grep -Eo '^uds-1: acked [0-9]+, dropped [0-9]+, retried [0-9]+' "$work/uds-worker.log")" \
  "uds-1: acked $acked, dropped $dropped, retried $retried"
# Every entry was delivered: the orders and a copy per retry, the last of them the group's last.
check "unix socket: the group read all the stream's entries" \
  "$(rcli xlen "$uds_stream") $(rcli xinfo groups "$uds_stream" | awk 'prev == "last-delivered-id" {print} {prev = $0}')" \
  "$((acked + dropped + retried)) $(rcli xrevrange "$uds_stream" + - count 1 | head -1)"
check_end_state "unix socket" "$uds_stream"
[[ $rc -eq 0 ]] || tail -30 "$work/uds-worker.log"

echo
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
