#!/usr/bin/env bash
# End-to-end test of the Python client example against a real redis-server and window-sidecar.
#
#   bash client-examples/python/run-e2e.sh
#
# 1. installs what is missing into .venv (pip only: grpcio, grpcio-tools, OpenTelemetry),
#    generates the code (./generate.sh), builds the sidecar when WINDOW_SIDECAR_BIN is missing;
# 2. starts a redis-server on a free port and the sidecar;
# 3. scenario "plain": producer, then worker until done, with OpenTelemetry hidden (the helper
#    must work unchanged without it); asserts the Redis end state of ../orders.json;
# 4. scenario "restart": a slow worker (WORKER_DELAY_MS) whose sidecar is SIGTERMed and
#    restarted on the same port mid-run; the worker must reconnect and nothing may be lost
#    (same end state); its spans must continue the producer's traces;
# 5. scenario "duplicate consumer": a second worker with the same consumer name gets
#    ALREADY_EXISTS, backs off and subscribes once the first one has closed;
# 6. scenario "backlog": 3000 entries consumed with COUNT 16: every entry settled once, and
#    the flush reports come in the reads that rode on their flushes (Open.reports_in_reads).
# 7. scenario "unix socket": a second sidecar on --listen unix:PATH, reached with grpcio's usual
#    target "unix:PATH" and no channel option: a health Check (grpcio-health-checking), then
#    the producer and the worker on a fresh stream; asserts the same end state.
# Prints "N passed, 0 failed" last and exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
orders="$here/../orders.json"
sidecar_bin="${WINDOW_SIDECAR_BIN:-$root/target/debug/window-sidecar}"
work="$(mktemp -d "${TMPDIR:-/tmp}/window-py-e2e.XXXXXX")"
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
py="$here/.venv/bin/python"
if [[ ! -x "$py" ]]; then
  log "creating $here/.venv"
  python3 -m venv "$here/.venv"
fi
if ! "$py" -c 'import grpc, grpc_health.v1, grpc_tools, google.protobuf, opentelemetry.sdk.trace' 2>/dev/null; then
  log "installing the Python packages"
  "$py" -m pip install --quiet --disable-pip-version-check \
    -r "$here/requirements.txt" -r "$here/requirements-otel.txt"
fi
log "generating the gRPC code"
PYTHON="$py" "$here/generate.sh"
if [[ ! -x "$sidecar_bin" ]]; then
  log "building the sidecar ($sidecar_bin is missing)"
  (cd "$root" && cargo build -p window-sidecar)
fi
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "redis-server and redis-cli are needed (apt-get install redis-server)" >&2
  exit 1
fi

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
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
"$py" - "$orders" >"$work/expected.txt" <<'EOF'
import json, sys
spec = json.load(open(sys.argv[1]))
exp = spec["expected"]
for sku, total in exp["sku_totals"].items():
    print("total", sku, total)
print("skus", len(exp["sku_totals"]))
print("picks", exp["picks"])
print("summary", exp["acked"], exp["dropped"], exp["retried"])
print("stream", spec["stream"])
print("group", spec["group"])
def invalid(o):
    return not o["lines"] or any(l["qty"] <= 0 for l in o["lines"])
for o in spec["orders"]:
    if invalid(o):
        print("invalid", o["id"])
    else:
        for l in o["lines"]:
            print("pick", f'{o["id"]}:{l["sku"]}:{l["qty"]}')
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
log "scenario plain: producer, then worker (OpenTelemetry hidden)"
(cd "$here" && PYTHONPATH="$here/tests/no_otel" "$py" producer.py --sidecar "$addr") \
  >"$work/plain-producer.log" 2>&1 || { cat "$work/plain-producer.log"; fail "plain: producer"; }
cat "$work/plain-producer.log"
rc=0
(cd "$here" && PYTHONPATH="$here/tests/no_otel" WORKER_SPANS_FILE="$work/plain-spans.jsonl" \
  timeout 90 "$py" worker.py --sidecar "$addr" --idle-exit 20) >"$work/plain-worker.log" 2>&1 || rc=$?
grep -E '^worker-1:|^not settled' "$work/plain-worker.log" || true
check "plain: worker exit code" "$rc" 0
read -r acked dropped retried < <(awk '$1=="summary"{print $2, $3, $4}' "$work/expected.txt")
check "plain: worker summary" \
  "$(grep -Eo '^worker-1: acked [0-9]+, dropped [0-9]+, retried [0-9]+' "$work/plain-worker.log")" \
  "worker-1: acked $acked, dropped $dropped, retried $retried"
check "plain: ran without OpenTelemetry" \
  "$(grep -c 'tracing: off' "$work/plain-worker.log"):$([[ -e "$work/plain-spans.jsonl" ]] && echo spans || echo none)" \
  "1:none"
check_end_state plain
[[ $rc -eq 0 ]] || tail -30 "$work/plain-worker.log"

# ---- 4. scenario "restart" ---------------------------------------------------------------
log "scenario restart: SIGTERM the sidecar in the middle of a slow worker run"
rcli flushdb >/dev/null
(cd "$here" && "$py" producer.py --sidecar "$addr" --traceparents-out "$work/traceparents.json") \
  >"$work/restart-producer.log" 2>&1 || { cat "$work/restart-producer.log"; fail "restart: producer"; }
cat "$work/restart-producer.log"
(cd "$here" && WORKER_DELAY_MS=300 WORKER_SPANS_FILE="$work/restart-spans.jsonl" \
  exec timeout 120 "$py" worker.py --sidecar "$addr" --count 4 --idle-exit 30) \
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
# The delivery spans continue the producer's traces (also across retry_after and the restart),
# and the worker's own span is a child of the delivery span (it is current in the loop body).
span_report="$("$py" - "$work/traceparents.json" "$work/restart-spans.jsonl" "$work/restart-worker.log" <<'EOF'
import json, os, re, sys
tps = json.load(open(sys.argv[1]))
spans = [json.loads(l) for l in open(sys.argv[2])] if os.path.exists(sys.argv[2]) else []
log = open(sys.argv[3]).read()
handed = len(re.findall(r" worker INFO (ack|drop|retry) ", log))
process = [s for s in spans if s["name"] == "process orders"]
# A span's order.id is unknown when its stream was lost before the handler ran: match on
# the trace context itself.
produced = {tuple(tp.split("-")[1:3]) for tp in tps.values()}
ok = sum(1 for s in process if (s["trace_id"], s["parent_span_id"]) in produced)
ids = {s["span_id"] for s in process}
handle = [s for s in spans if s["name"] == "handle order"]
nested = sum(1 for s in handle if s["parent_span_id"] in ids)
print(f"{len(process)}={handed} {ok}={len(process)} {nested}={len(handle)} {len(tps)}")
EOF
)" || span_report="error"
read -r counted continued nested tps <<<"$span_report"
check "restart: one delivery span per handled delivery" "${counted%=*}" "${counted#*=}"
check "restart: delivery spans continue the producer's traceparent" "${continued%=*}" "${continued#*=}"
check "restart: the handler's span is a child of the delivery span" "${nested%=*}" "${nested#*=}"
check "restart: traced deliveries" "$([[ "${counted%=*}" -ge 12 && "$tps" == 12 ]] && echo yes)" yes
[[ $rc -eq 0 ]] || tail -40 "$work/restart-worker.log"

# ---- 5. scenario "duplicate consumer" ------------------------------------------------------
log "scenario duplicate consumer: ALREADY_EXISTS, backoff, then subscribed"
echo '{"stream": "'"$stream"'", "group": "'"$group"'", "orders": []}' >"$work/none.json"
(cd "$here" && exec timeout 60 "$py" worker.py --sidecar "$addr" --orders "$work/none.json" \
  --consumer twin --idle-exit 3) >"$work/twin-1.log" 2>&1 &
twin1=$!
pids+=("$twin1")
for _ in $(seq 200); do
  grep -q "subscribed as consumer 'twin'" "$work/twin-1.log" && break
  sleep 0.05
done
rc2=0
(cd "$here" && timeout 60 "$py" worker.py --sidecar "$addr" --orders "$work/none.json" \
  --consumer twin --idle-exit 8) >"$work/twin-2.log" 2>&1 || rc2=$?
rc1=0
wait "$twin1" || rc1=$?
check "duplicate consumer: both workers exit 0" "$rc1:$rc2" "0:0"
check "duplicate consumer: the second got ALREADY_EXISTS and retried" \
  "$(grep -c 'ended with ALREADY_EXISTS' "$work/twin-2.log" | awk '{print ($1 > 0)}')" 1
check "duplicate consumer: the second subscribed after the first closed" \
  "$(grep -c "subscribed as consumer 'twin'" "$work/twin-2.log")" 1

# ---- 6. scenario "backlog" ------------------------------------------------------------------
log "scenario backlog: 3000 entries waiting; reads ride on flushes with their reports"
rc=0
(cd "$here" && PYTHONPATH="$here/tests/no_otel" timeout 60 "$py" - "$addr" 3000) \
  >"$work/backlog.log" 2>&1 <<'PY' || rc=$?
import asyncio, sys
from window_client import WindowClient

async def main(addr, n):
    settled = failed = 0
    async with WindowClient(addr) as client:
        await client.publish("backlog", [b"%d" % i for i in range(n)])

        def on_flush(ev):
            nonlocal settled, failed
            settled += ev.report.settles
            failed += not ev.ok
            if settled >= n:
                sub.stop()

        sub = client.subscribe("backlog", "g", consumer="c1", count=16,
                               on_flush=on_flush)
        async with sub:
            async for d in sub:
                d.queue("INCR", "backlog:n")
                d.ack()
        s = sub.stats
        print(f"settled {settled} failed {failed} reads {s.reads} flushes {s.flushes} "
              f"reports_in_reads {s.reports_in_reads} batches {s.batches}")

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
PY
cat "$work/backlog.log"
check "backlog: exit code" "$rc" 0
read -r settled bfailed reads flushes in_reads < <(awk '$1=="settled"{print $2, $4, $6, $8, $10}' "$work/backlog.log")
check "backlog: every entry settled, no failed flush" "${settled:-}:${bfailed:-}" "3000:0"
check "backlog: a report per read" "${flushes:-x}" "${reads:-y}"
# How many reads ride on a flush depends on timing (a read the reader already asked for does
# not); that they come, and are handled as reports, does not.
check "backlog: reports came in the reads that rode on their flushes" \
  "$([[ -n "${in_reads:-}" && "$in_reads" -ge 1 ]] && echo yes)" yes
check "backlog: INCR ran once per entry" "$(rcli get backlog:n)" 3000
check "backlog: XPENDING backlog g" "$(rcli xpending backlog g | head -1)" 0

# ---- 7. scenario "unix socket" --------------------------------------------------------------
# The recommended sidecar setup. Each client names the socket in grpcio's own syntax,
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
(cd "$here" && timeout 30 "$py" - "$uds") >"$work/uds-health.log" 2>&1 <<'PY' || true
import sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "window_sidecar.v1.WindowService"
Status = health_pb2.HealthCheckResponse
with grpc.insecure_channel(sys.argv[1]) as channel:
    health = health_pb2_grpc.HealthStub(channel)
    # The service is NOT_SERVING until the sidecar's first Redis ping: ask again for a while.
    deadline = time.monotonic() + 10
    while True:
        status = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status
        if status == Status.SERVING or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print(f"health {SERVICE}: {Status.ServingStatus.Name(status)}")
PY
cat "$work/uds-health.log"
check "unix socket: health Check" "$(grep -o 'health window_sidecar.v1.WindowService: .*' "$work/uds-health.log")" \
  "health window_sidecar.v1.WindowService: SERVING"
rcli flushdb >/dev/null
uds_stream=uds-orders
(cd "$here" && "$py" producer.py --sidecar "$uds" --stream "$uds_stream") \
  >"$work/uds-producer.log" 2>&1 || { cat "$work/uds-producer.log"; fail "unix socket: producer"; }
cat "$work/uds-producer.log"
check "unix socket: Publish" "$(grep -Eo "^published [0-9]+ orders to '$uds_stream'" "$work/uds-producer.log")" \
  "published $((acked + dropped)) orders to '$uds_stream'"
rc=0
(cd "$here" && timeout 90 "$py" worker.py --sidecar "$uds" --stream "$uds_stream" --consumer uds-1 \
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
