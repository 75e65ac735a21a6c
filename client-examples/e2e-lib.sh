# shellcheck shell=bash
# The set-up the client examples' end-to-end scripts (client-examples/*/run-e2e.sh) share:
# installing what is missing, a throwaway redis-server, the sidecar on TCP and on a Unix
# socket, the check counting and the Redis end state of orders.json. Sourced, after
# `set -euo pipefail`, by a script that then calls e2e_init; each script keeps its own
# toolchain, build, programs and extra checks.
#
#   WINDOW_SIDECAR_BIN   the sidecar binary (default target/debug/window-sidecar of this
#                        repository; built with cargo when missing, see ensure_sidecar)
#   KEEP_E2E_DIR         when set, the work directory and its logs are kept after a pass too
#
# It sets: root (the repository), orders (client-examples/orders.json), sidecar_bin, missing;
# e2e_init: work, pids, passed, failed; start_redis: redis_port; start_sidecar: addr,
# sidecar_port, sidecar_pid; load_expected: stream, group, n_orders, acked, dropped, retried,
# totals_key, picks_key.

e2e_lib_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$e2e_lib_dir/.." && pwd)"
orders="$e2e_lib_dir/orders.json"
sidecar_bin="${WINDOW_SIDECAR_BIN:-$root/target/debug/window-sidecar}"
[[ $sidecar_bin == /* ]] || sidecar_bin="$PWD/$sidecar_bin"
missing=()
sidecar_n=0

# log MESSAGE...: prints a step line, "== MESSAGE".
log() { printf '== %s\n' "$*"; }

# ---- tools --------------------------------------------------------------------------------

# need_cmd COMMAND PACKAGE: adds the Debian PACKAGE to $missing when COMMAND is not on PATH.
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
# need_path PATH PACKAGE: adds the Debian PACKAGE to $missing when PATH does not exist.
need_path() { [[ -e $1 ]] || missing+=("$2"); }
# install_missing: apt-get installs the packages in $missing (each once; sudo unless root),
# and nothing when there are none.
install_missing() {
  ((${#missing[@]})) || return 0
  local sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
}
# require_cmds HINT COMMAND...: exits 1, saying "A and B are needed (HINT)", unless every
# COMMAND is on PATH (for the scripts that install no Debian package).
require_cmds() {
  local hint=$1 cmd names
  shift
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 && continue
    names="$(printf '%s and ' "$@")"
    echo "${names% and } are needed ($hint)" >&2
    exit 1
  done
}
# ensure_sidecar: builds the sidecar with cargo when $sidecar_bin is missing (and then runs
# the one it built).
ensure_sidecar() {
  [[ -x $sidecar_bin ]] && return 0
  log "building the sidecar ($sidecar_bin is missing)"
  (cd "$root" && cargo build -p window-sidecar)
  sidecar_bin="$root/target/debug/window-sidecar"
}

# ---- the run: work directory, processes, checks ---------------------------------------------

# e2e_init NAME: makes the work directory ($TMPDIR/window-NAME-e2e.XXXXXX) for the logs,
# zeroes the counts and sets the EXIT trap (e2e_cleanup).
e2e_init() {
  work="$(mktemp -d "${TMPDIR:-/tmp}/window-$1-e2e.XXXXXX")"
  pids=()
  passed=0
  failed=0
  trap e2e_cleanup EXIT
}
# e2e_cleanup: the EXIT trap. Kills and reaps every pid in $pids; after a pass removes the work
# directory (unless KEEP_E2E_DIR is set), after a failure prints the last lines of each log
# and keeps it.
e2e_cleanup() {
  local status=$? pid f
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((status == 0 && failed == 0)) && [[ -z ${KEEP_E2E_DIR:-} ]]; then
    rm -rf "$work"
    return
  fi
  if ((status != 0 || failed != 0)); then
    for f in "$work"/*.log; do
      [[ -f $f ]] && { echo "--- $(basename "$f") (last lines)"; tail -n 20 "$f"; }
    done
  fi
  echo "logs kept in $work"
}

# pass NAME, fail NAME: counts and prints one check's outcome ("ok   - NAME", "FAIL - NAME").
pass() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; }
# check NAME ACTUAL EXPECTED: passes when ACTUAL is EXPECTED, else fails saying both.
check() {
  if [[ "$2" == "$3" ]]; then pass "$1"; else fail "$1: got '$2', want '$3'"; fi
}
# e2e_summary: prints "N passed, N failed" last; its status is the script's (0: no failure).
e2e_summary() {
  echo
  echo "$passed passed, $failed failed"
  ((failed == 0))
}

# tcp_open PORT: succeeds when something listens on 127.0.0.1:PORT.
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# free_port: prints a port of 127.0.0.1 that nothing listens on, from 20000 up to the start of
# the kernel's ephemeral range (an outgoing connection may hold a port above it).
free_port() {
  local low port
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
  ((low > 21000)) || low=60000
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % (low - 20000)))
    if ! tcp_open "$port"; then
      echo "$port"
      return
    fi
  done
  echo "no free port found" >&2
  return 1
}
# wait_for WHAT COMMAND...: runs COMMAND every 0.1 s until it succeeds (15 s at the most);
# fails, saying so, when it never does.
wait_for() {
  local what=$1
  shift
  for _ in $(seq 1 150); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "timed out waiting for $what" >&2
  return 1
}

# ---- redis-server and the sidecar -----------------------------------------------------------

# rcli ARG...: redis-cli against the throwaway redis-server.
rcli() { redis-cli -p "$redis_port" "$@"; }
# start_redis: starts a throwaway redis-server (no persistence, its files in $work) on a free
# port, $redis_port, and waits for its PONG.
start_redis() {
  redis_port="$(free_port)"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" >"$work/redis.log" 2>&1 &
  pids+=("$!")
  wait_for "redis-server on $redis_port" redis_up
}
redis_up() { [[ "$(rcli ping 2>/dev/null)" == PONG ]]; }
# start_sidecar: starts a sidecar on TCP, $addr (a free port the first time, the same one
# again after a restart), against the redis-server; logs to $work/sidecar-N.log (N counts the
# starts), sets $sidecar_pid and waits until it listens.
start_sidecar() {
  if [[ -z ${addr:-} ]]; then
    sidecar_port="$(free_port)"
    addr="127.0.0.1:$sidecar_port"
  fi
  sidecar_n=$((sidecar_n + 1))
  "$sidecar_bin" --listen "$addr" --redis-url "redis://127.0.0.1:$redis_port" \
    --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar-$sidecar_n.log" 2>&1 &
  sidecar_pid=$!
  pids+=("$sidecar_pid")
  if ! wait_for "the sidecar on $addr" tcp_open "$sidecar_port"; then
    cat "$work/sidecar-$sidecar_n.log" >&2
    return 1
  fi
}
# restart_sidecar_mid_run LABEL WORKER_PID WORKER_LOG: once the worker has flushed its first
# read, checks (as "LABEL: …") that it is still mid-run, SIGTERMs the TCP sidecar, checks that
# it drained and exited within 10 s, prints its last "subscription closed" line and starts a
# new one on the same address.
restart_sidecar_mid_run() {
  local old="$sidecar_pid" stopped=no
  wait_for "the worker's first flushed read" grep -q 'flush of read 1:' "$3" || true
  check "$1: worker was mid-run at the restart" \
    "$(grep -c 'every order is settled for good' "$3" || true):$(kill -0 "$2" 2>/dev/null && echo running)" \
    "0:running"
  kill -TERM "$old"
  for _ in $(seq 200); do
    if ! kill -0 "$old" 2>/dev/null; then stopped=yes; break; fi
    sleep 0.05
  done
  wait "$old" 2>/dev/null || true
  check "$1: the sidecar drained and exited on SIGTERM" "$stopped" yes
  grep -o 'subscription closed.*' "$work/sidecar-$sidecar_n.log" | tail -1 | sed 's/^/   old sidecar: /' || true
  start_sidecar
}
# check_resubscribed LABEL CONSUMER WORKER_LOG: the worker saw its stream end with UNAVAILABLE
# and resubscribed as CONSUMER (two checks).
check_resubscribed() {
  check "$1: the worker saw the stream end with UNAVAILABLE" \
    "$(grep -c 'subscription stream ended with UNAVAILABLE' "$3" | awk '{print ($1 > 0)}')" 1
  check "$1: the worker resubscribed to the new sidecar" \
    "$(grep -c "resubscribed as consumer '$2'" "$3" | awk '{print ($1 > 0)}')" 1
}
# start_token_sidecar: starts a third sidecar on a free port that requires a bearer token
# (--auth-token-file $work/token, a new random token; logs to $work/sidecar-token.log) and
# waits for it; sets token_addr.
start_token_sidecar() {
  printf 'e2e-%s%s\n' "$RANDOM" "$RANDOM" >"$work/token"
  local port
  port="$(free_port)"
  token_addr="127.0.0.1:$port"
  log "a third sidecar on $token_addr with --auth-token-file"
  "$sidecar_bin" --listen "$token_addr" --redis-url "redis://127.0.0.1:$redis_port" \
    --auth-token-file "$work/token" --promote-interval 100ms --shutdown-grace 2s \
    >"$work/sidecar-token.log" 2>&1 &
  pids+=("$!")
  wait_for "the sidecar on $token_addr" tcp_open "$port"
}
# start_uds_sidecar SOCKET: starts a second sidecar on --listen unix:SOCKET (logs to
# $work/sidecar-uds.log; the caller's environment, e.g. RUST_LOG, goes with it) and waits
# for the socket.
start_uds_sidecar() {
  "$sidecar_bin" --listen "unix:$1" --redis-url "redis://127.0.0.1:$redis_port" \
    --promote-interval 100ms --shutdown-grace 2s >"$work/sidecar-uds.log" 2>&1 &
  pids+=("$!")
  wait_for "the sidecar on unix:$1" test -S "$1"
}

# ---- what orders.json expects -----------------------------------------------------------------
# $work/expected.txt, a line a fact: "stream S", "group G", "orders N", "summary ACKED DROPPED
# RETRIED", "hash KEY" and "list KEY" (the worker's SKU totals hash and picks list), "skus N",
# "picks N", "total SKU N" a SKU, "pick ID:SKU:QTY" a valid order's line, "invalid ID".

# load_expected COMMAND...: runs COMMAND, which prints those lines for $orders, into
# $work/expected.txt and sets the variables from them.
load_expected() {
  "$@" >"$work/expected.txt"
  stream="$(expected stream)"
  group="$(expected group)"
  n_orders="$(expected orders)"
  read -r acked dropped retried <<<"$(expected summary)"
  totals_key="$(expected hash)"
  picks_key="$(expected list)"
}
# expected KIND: prints the rest of each "KIND …" line of $work/expected.txt.
expected() { awk -v k="$1" '$1 == k { sub(/^[^ ]+ /, ""); print }' "$work/expected.txt"; }
# expected_by_jq: prints the expected.txt lines of $orders with jq.
expected_by_jq() {
  jq -r '
    "stream \(.stream)", "group \(.group)", "orders \(.orders | length)",
    (.expected | "summary \(.acked) \(.dropped) \(.retried)", "hash \(.sku_totals_hash)",
      "list \(.picks_list)", "skus \(.sku_totals | length)", "picks \(.picks)",
      (.sku_totals | to_entries[] | "total \(.key) \(.value)")),
    (.orders[] | if (.lines | length) > 0 and all(.lines[]; .qty > 0)
      then .id as $id | .lines[] | "pick \($id):\(.sku):\(.qty)" else "invalid \(.id)" end)
  ' "$orders"
}

# ---- checks of the Redis end state and of the programs' output ----------------------------------
# LABEL, when not empty, prefixes each check's name as "LABEL: ".

# check_end_state LABEL [STREAM]: the Redis end state of orders.json consumed from STREAM
# (default its own): HGET of every SKU total, HLEN, LLEN and the exact picks, XPENDING 0 and
# the delay set's ZCARD 0.
check_end_state() {
  local p="${1:+$1: }" s="${2:-$stream}" sku want
  while read -r sku want; do
    check "${p}HGET $totals_key $sku" "$(rcli hget "$totals_key" "$sku")" "$want"
  done < <(expected total)
  check "${p}HLEN $totals_key (no other SKUs)" "$(rcli hlen "$totals_key")" "$(expected skus)"
  check "${p}LLEN $picks_key" "$(rcli llen "$picks_key")" "$(expected picks)"
  check "${p}the picks are exactly the valid orders' lines" \
    "$(rcli lrange "$picks_key" 0 -1 | sort | paste -sd' ')" "$(expected pick | sort | paste -sd' ')"
  check "${p}XPENDING $s $group" "$(rcli xpending "$s" "$group" | head -1)" 0
  check "${p}ZCARD {$s}:window:delayed" "$(rcli zcard "{$s}:window:delayed")" 0
}
# check_no_invalid_picks LABEL: no pick names an invalid order.
check_no_invalid_picks() {
  local bad=0 id
  while read -r id; do
    bad=$((bad + $(rcli lrange "$picks_key" 0 -1 | grep -c "^$id:" || true)))
  done < <(expected invalid)
  check "${1:+$1: }no picks from invalid orders" "$bad" 0
}
# check_group_read_all LABEL STREAM: the group read all of STREAM's entries, the last of them
# the group's last-delivered-id; the stream holds the orders alone (a retry stays pending in
# its group and appends nothing, which every other group of the stream would read).
check_group_read_all() {
  check "${1:+$1: }the group read all the stream's entries" \
    "$(rcli xlen "$2") $(rcli xinfo groups "$2" | awk 'prev == "last-delivered-id" {print} {prev = $0}')" \
    "$n_orders $(rcli xrevrange "$2" + - count 1 | head -1)"
}
# check_worker_summary LABEL CONSUMER LOG: LOG's line "CONSUMER: acked N, dropped N,
# retried N" has the expected counts (one check).
check_worker_summary() {
  check "${1:+$1: }worker summary" \
    "$(grep -Eo "^$2: acked [0-9]+, dropped [0-9]+, retried [0-9]+" "$3")" \
    "$2: acked $acked, dropped $dropped, retried $retried"
}
# check_summary_counts LABEL LOG: LOG's line "summary: acked=N dropped=N retried=N" has the
# expected counts (a check each).
check_summary_counts() {
  local summary got what want
  summary="$(grep -E '^summary:' "$2" || true)"
  for what in acked dropped retried; do
    want="${!what}"
    got="$(sed -nE "s/.* $what=([0-9]+).*/\1/p; s/^summary: $what=([0-9]+).*/\1/p" <<<"$summary" | head -n1)"
    check "${1:+$1: }worker summary $what" "$got" "$want"
  done
}
# check_published LABEL LOG STREAM QUOTE: LOG says "published N orders to QSTREAMQ", N the
# orders of orders.json, Q the QUOTE character the producer uses.
check_published() {
  check "${1:+$1: }Publish" "$(grep -Eo "^published [0-9]+ orders to $4$3$4" "$2")" \
    "published $n_orders orders to $4$3$4"
}
# check_health LABEL LOG: LOG says the health Check found window_sidecar.v1.WindowService
# SERVING.
check_health() {
  check "${1:+$1: }health Check" "$(grep -o 'health window_sidecar.v1.WindowService: .*' "$2")" \
    "health window_sidecar.v1.WindowService: SERVING"
}
