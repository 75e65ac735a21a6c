#!/usr/bin/env bash
# End-to-end test of the Node/TypeScript client, @window-sidecar/client, as a package: built
# and packed here, installed into a scratch project outside the repository, and run from there
# against a real redis-server and window-sidecar.
#
#   bash client-examples/node/run-e2e.sh        (or: npm run e2e)
#
# 1. installs what is missing (Debian's nodejs, npm, redis-server, redis-tools; npm ci:
#    @grpc/grpc-js, ts-proto, buf, typescript), runs the strict type checks (tsc --strict
#    --noEmit of the library, the examples, the tests and the conformance runner) and the unit
#    tests (npm test), packs the package outside the checkout (pack.sh: a temporary copy runs
#    npm pack, whose build is buf generate + tsc into dist/ + the ESM wrapper), checks that the
#    checkout is untouched, what the tarball holds (the LICENSE among it), `npm publish
#    --dry-run`, and that the package loads with both require and import,
#    creates a scratch project in the work directory, installs the tarball there (npm install)
#    and compiles the examples (producer, worker, health check, importing
#    "@window-sidecar/client") against the installed package's types; builds the sidecar when
#    WINDOW_SIDECAR_BIN is missing, and runs the tests against it (npm run test:sidecar:
#    test/sidecar.test.ts, which starts a redis-server and a sidecar of its own);
# 2. starts a redis-server on a free port and the sidecar;
# 3. scenario "plain": producer, then worker until done; asserts the Redis end state of
#    ../orders.json;
# 4. scenario "restart": a slow worker (WORKER_DELAY_MS) whose sidecar is SIGTERMed and
#    restarted on the same port mid-run; the worker must reconnect and nothing may be lost;
# 5. scenario "unix socket": a second sidecar on --listen unix:PATH, reached with grpc-js's usual
#    target "unix:PATH" and no channel option: a health Check, then the producer and the worker
#    on a fresh stream; asserts the same end state;
# 6. scenario "rejected command": an order whose handler also queues FLUSHALL, which the sidecar
#    refuses, with --rejected-outcome retry_after, --max-deliveries 2 and a dead-letter stream:
#    retried after 1 s, then dead-lettered;
# 7. scenario "token": a third sidecar with --auth-token-file; without WINDOW_SIDECAR_TOKEN the
#    producer and the worker fail with UNAUTHENTICATED, with it they work (the worker in atomic
#    mode) and give the same end state;
# 8. scenario "reliable list": the orders LPUSHed onto a list, which the worker reads with the
#    reliable-list source; the same SKU totals and picks, the list, the processing list and the
#    delay set empty;
# 9. scenario "batches": the worker with --batches takes a read at a time (sub.batches()),
#    drops and retries per order and acks the rest with one batch.ack(); the same end state.
# Every program runs from the scratch project. Prints "N passed, 0 failed" last and exits
# non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# root, orders, sidecar_bin; e2e_init, check, start_redis, start_sidecar, check_end_state, …
source "$here/../e2e-lib.sh"
e2e_init node

# ---- 1. tools ----------------------------------------------------------------------------
need_cmd node nodejs
need_cmd npm npm
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
install_missing
need_install=no
for f in node_modules/.bin/buf node_modules/.bin/tsc node_modules/.bin/protoc-gen-ts_proto \
  node_modules/@grpc/grpc-js/package.json node_modules/@bufbuild/protobuf/package.json \
  node_modules/grpc-health-check/package.json node_modules/@redis/client/package.json; do
  [[ -e "$here/$f" ]] || need_install=yes
done
if [[ $need_install == yes ]]; then
  log "installing the npm packages"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi

# ---- 1b. strict checks and unit tests --------------------------------------------------------
log "tsc --strict --noEmit, unit tests"
(cd "$here" && npm run --silent generate)
for project in tsconfig.json examples/tsconfig.json tsconfig.test.json conformance/tsconfig.json; do
  if out="$(cd "$here" && node_modules/.bin/tsc --strict --noEmit -p "$project" 2>&1)"; then
    pass "tsc --strict --noEmit -p $project"
  else
    echo "$out"
    fail "tsc --strict --noEmit -p $project"
  fi
done
if (cd "$here" && npm test --silent) >"$work/unit.log" 2>&1; then
  pass "unit tests ($(grep -c '^ok ' "$work/unit.log") passed)"
else
  cat "$work/unit.log"
  fail "unit tests"
fi

# ---- 1c. the package: npm pack, installed into a scratch project outside the repository ------
log "pack.sh: the tarball built in a temporary copy, and npm publish --dry-run"
tree_state() {
  (cd "$here" && find . \( -path ./node_modules -o -path ./build-test -o -path ./.conformance \) -prune -o -print | sort)
}
tree_state >"$work/tree-before.txt"
tarball="$(bash "$here/pack.sh" "$work" --publish-dry-run 2>"$work/pack.log" | tail -1)" ||
  { cat "$work/pack.log"; fail "pack.sh"; }
tree_state >"$work/tree-after.txt"
check "pack.sh wrote nothing into the checkout (no dist/, no src/gen/)" \
  "$(diff "$work/tree-before.txt" "$work/tree-after.txt" | grep -c '^[<>]' || true)" 0
check "npm publish --dry-run: the package, no warning but the missing login" \
  "$(grep -c '^publish --dry-run: + @window-sidecar/client@' "$work/pack.log"):$(grep -i 'publish --dry-run: npm warn' "$work/pack.log" | grep -vc 'requires you to be logged in' || true)" "1:0"
check "npm pack made the tarball" "$(basename "$tarball")" "window-sidecar-client-$(node -p "require('$here/package.json').version").tgz"
tar tzf "$tarball" | sort >"$work/tarball.txt"
# Exactly the compiled client, its types, the generated code (the window and dead-letter
# services) and the ES module entry, with
# package.json, README.md and the LICENSE.
check "the tarball's files" "$(sed 's#^package/##' "$work/tarball.txt" | paste -sd' ')" \
  "$(printf '%s\n' LICENSE README.md package.json dist/esm/index.{mjs,d.mts} \
    dist/{index,tracing,window-client,commands,errors,gen/google/protobuf/duration,gen/window_sidecar/v1/window,gen/window_sidecar/v1/dead_letters}.{d.ts,js} \
    | sort | paste -sd' ')"
check "the tarball's LICENSE is the repository's" \
  "$(tar xzf "$tarball" -O package/LICENSE | cmp -s - "$root/LICENSE" && echo same)" same

app="$work/app"
log "scratch project $app: npm install the tarball, compile the examples"
mkdir -p "$app/src"
cp "$here"/examples/*.ts "$app/src/"
# The toolchain a user's TypeScript project would have: the versions this package is built with.
ts_version="$(node -p "require('$here/node_modules/typescript/package.json').version")"
types_version="$(node -p "require('$here/node_modules/@types/node/package.json').version")"
cat >"$app/package.json" <<EOF
{
  "name": "window-orders-app",
  "version": "1.0.0",
  "private": true,
  "dependencies": { "@window-sidecar/client": "file:$tarball" },
  "devDependencies": { "typescript": "$ts_version", "@types/node": "$types_version" }
}
EOF
cat >"$app/tsconfig.json" <<'EOF'
{
  "compilerOptions": {
    "target": "ES2022", "module": "commonjs", "moduleResolution": "node", "types": ["node"],
    "strict": true, "esModuleInterop": true, "rootDir": "src", "outDir": "dist"
  },
  "include": ["src/*.ts"]
}
EOF
(cd "$app" && npm install --no-audit --no-fund --prefer-offline --loglevel=error) >"$work/app-install.log" 2>&1 \
  || { cat "$work/app-install.log"; fail "npm install of the tarball"; }
check "the package resolves by name from the scratch project's node_modules" \
  "$(cd "$app" && node -p 'require.resolve("@window-sidecar/client")')" "$app/node_modules/@window-sidecar/client/dist/index.js"
check "require and import give the same classes (one CommonJS build, an ES module wrapper)" \
  "$(cd "$app" && node --input-type=module -e 'import { WindowClient, ConnectionError, WindowError } from "@window-sidecar/client"; import { createRequire } from "node:module"; const c = createRequire(import.meta.url)("@window-sidecar/client"); console.log(c.WindowClient === WindowClient && new ConnectionError("a", "b") instanceof c.WindowError && typeof WindowError)')" function
# Without skipLibCheck: the package's .d.ts files must type-check too.
if out="$(cd "$app" && node_modules/.bin/tsc -p tsconfig.json 2>&1)"; then
  pass "the examples compile (strict) against the installed package"
else
  echo "$out"
  fail "the examples compile (strict) against the installed package"
fi
# run PROGRAM ARG…: runs the scratch project's compiled PROGRAM (producer, worker, health-check).
run() { (cd "$app" && exec node "dist/$1.js" "${@:2}"); }
# run_for SECONDS PROGRAM ARG…: the same, killed after SECONDS.
run_for() { (cd "$app" && exec timeout "$1" node "dist/$2.js" "${@:3}"); }

ensure_sidecar

# ---- 1d. the tests against the real sidecar -------------------------------------------------
log "npm run test:sidecar: the tests against $sidecar_bin"
if (cd "$here" && WINDOW_SIDECAR_BIN="$sidecar_bin" npm run --silent test:sidecar) >"$work/sidecar-tests.log" 2>&1; then
  pass "tests against the sidecar ($(grep -c '^ok ' "$work/sidecar-tests.log") passed)"
else
  cat "$work/sidecar-tests.log"
  fail "tests against the sidecar"
fi

# ---- 2. redis-server and the sidecar ------------------------------------------------------
start_redis
start_sidecar
log "redis-server on $redis_port, sidecar on $addr"

# ---- expectations from orders.json (the lines e2e-lib.sh reads) --------------------------
load_expected node - "$orders" <<'EOF'
const spec = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const exp = spec.expected;
console.log("stream", spec.stream);
console.log("group", spec.group);
console.log("orders", spec.orders.length);
console.log("summary", exp.acked, exp.dropped, exp.retried);
console.log("hash", exp.sku_totals_hash);
console.log("list", exp.picks_list);
console.log("skus", Object.keys(exp.sku_totals).length);
console.log("picks", exp.picks);
for (const [sku, total] of Object.entries(exp.sku_totals)) console.log("total", sku, total);
const invalid = (o) => !o.lines.length || o.lines.some((l) => l.qty <= 0);
for (const o of spec.orders) {
  if (invalid(o)) console.log("invalid", o.id);
  else for (const l of o.lines) console.log("pick", `${o.id}:${l.sku}:${l.qty}`);
}
EOF

# worker_scenario NAME ARGS...: a fresh database, the producer, then the order worker as
# consumer NAME-1 with ARGS until done; its exit code, summary and the Redis end state.
worker_scenario() {
  local name="$1"; shift
  rcli flushdb >/dev/null
  run producer --sidecar "$addr" --orders "$orders" \
    >"$work/$name-producer.log" 2>&1 || { cat "$work/$name-producer.log"; fail "$name: producer"; }
  cat "$work/$name-producer.log"
  rc=0
  run_for 90 worker --sidecar "$addr" --orders "$orders" --consumer "$name-1" --idle-exit 20 "$@" \
    >"$work/$name-worker.log" 2>&1 || rc=$?
  grep -E "^$name-1:|^not settled" "$work/$name-worker.log" || true
  check "$name: worker exit code" "$rc" 0
  check_worker_summary "$name" "$name-1" "$work/$name-worker.log"
  check_end_state "$name"
  check_no_invalid_picks "$name"
  [[ $rc -eq 0 ]] || tail -30 "$work/$name-worker.log"
}

# ---- 3. scenario "plain" -----------------------------------------------------------------
log "scenario plain: producer, then worker"
worker_scenario plain

# ---- 4. scenario "restart" ---------------------------------------------------------------
log "scenario restart: SIGTERM the sidecar in the middle of a slow worker run"
rcli flushdb >/dev/null
run producer --sidecar "$addr" --orders "$orders" \
  >"$work/restart-producer.log" 2>&1 || { cat "$work/restart-producer.log"; fail "restart: producer"; }
cat "$work/restart-producer.log"
(cd "$app" && WORKER_DELAY_MS=300 exec timeout 120 node dist/worker.js --sidecar "$addr" \
  --orders "$orders" --count 4 --idle-exit 30) \
  >"$work/restart-worker.log" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
# The restart lands mid-run: once the first read has been flushed.
restart_sidecar_mid_run restart "$worker_pid" "$work/restart-worker.log"
rc=0
wait "$worker_pid" || rc=$?
grep -E '^worker-1:|^not settled' "$work/restart-worker.log" || true
check "restart: worker exit code" "$rc" 0
check_resubscribed restart worker-1 "$work/restart-worker.log"
check_end_state restart
check_no_invalid_picks restart
[[ $rc -eq 0 ]] || tail -40 "$work/restart-worker.log"

# ---- 5. scenario "unix socket" --------------------------------------------------------------
# The recommended sidecar setup. Each client names the socket in grpc-js's own syntax,
# "unix:PATH", and sets no channel option (no grpc.default_authority).
sock="$work/sidecar.sock"
uds="unix:$sock"
log "scenario unix socket: a second sidecar on unix:$sock"
start_uds_sidecar "$sock"
run_for 30 health-check --sidecar "$uds" >"$work/uds-health.log" 2>&1 || true
cat "$work/uds-health.log"
check_health "unix socket" "$work/uds-health.log"
rcli flushdb >/dev/null
uds_stream=uds-orders
run producer --sidecar "$uds" --orders "$orders" --stream "$uds_stream" \
  >"$work/uds-producer.log" 2>&1 || { cat "$work/uds-producer.log"; fail "unix socket: producer"; }
cat "$work/uds-producer.log"
check_published "unix socket" "$work/uds-producer.log" "$uds_stream" "'"
rc=0
run_for 90 worker --sidecar "$uds" --orders "$orders" --stream "$uds_stream" --consumer uds-1 \
  --idle-exit 20 >"$work/uds-worker.log" 2>&1 || rc=$?
grep -E '^uds-1:|^not settled' "$work/uds-worker.log" || true
check "unix socket: worker exit code" "$rc" 0
check_worker_summary "unix socket" uds-1 "$work/uds-worker.log"
# Every entry was delivered: the orders and a copy per retry, the last of them the group's last.
check_group_read_all "unix socket" "$uds_stream"
check_end_state "unix socket" "$uds_stream"
check_no_invalid_picks "unix socket"
[[ $rc -eq 0 ]] || tail -30 "$work/uds-worker.log"

# ---- 6. scenario "rejected command" -------------------------------------------------------------
# The rejection rule with rejectedOutcome "retry_after" (the default drops a FORBIDDEN_COMMAND at
# once; the conformance suite checks that): a delivery with a command the sidecar refuses is
# settled with retry_after 1 s and the reason "rejected: <reason>: <message>", never acked; with
# a cap of 2 deliveries the poison order reaches the dead letter on its second delivery.
log "scenario rejected command: every order also queues FLUSHALL, max 2 deliveries, a dead letter"
rcli flushdb >/dev/null
rcli set sentinel still-here >/dev/null
poison_stream=poison-orders
dead_letter="$poison_stream:dead"
node -e '
  const [src, dst, stream] = process.argv.slice(1);
  const spec = JSON.parse(require("fs").readFileSync(src, "utf8"));
  const order = spec.orders.find((o) => o.lines.length && o.lines.every((l) => l.qty > 0) && !o.flaky);
  require("fs").writeFileSync(dst, JSON.stringify({ stream, group: spec.group, orders: [order] }));
' "$orders" "$work/poison.json" "$poison_stream"
run producer --sidecar "$addr" --orders "$work/poison.json" >"$work/poison-producer.log" 2>&1 \
  || { cat "$work/poison-producer.log"; fail "rejected command: producer"; }
cat "$work/poison-producer.log"
rc=0
run_for 60 worker --sidecar "$addr" --orders "$work/poison.json" --consumer poison-1 \
  --max-deliveries 2 --dead-letter "$dead_letter" --poison-command FLUSHALL --rejected-outcome retry_after --idle-exit 15 \
  >"$work/poison-worker.log" 2>&1 || rc=$?
grep -E '^poison-1:|^not settled' "$work/poison-worker.log" || true
check "rejected command: worker exit code" "$rc" 0
check "rejected command: worker summary" \
  "$(grep -Eo '^poison-1: acked [0-9]+, dropped [0-9]+, retried [0-9]+, dead-lettered [0-9]+' "$work/poison-worker.log")" \
  "poison-1: acked 0, dropped 0, retried 1, dead-lettered 1"
check "rejected command: the sidecar refused FLUSHALL twice" \
  "$(grep -c 'the sidecar refused FLUSHALL of entry' "$work/poison-worker.log")" 2
check "rejected command: FLUSHALL never ran" "$(rcli get sentinel)" still-here
check "rejected command: XLEN $dead_letter" "$(rcli xlen "$dead_letter")" 1
dead_fields="$(rcli xrange "$dead_letter" - + | tail -n +2)"
check "rejected command: the dead letter's reason is the rejection" \
  "$(awk 'prev == "h:x-window-reason" {print} {prev = $0}' <<<"$dead_fields" | grep -c '^rejected: ')" 1
check "rejected command: the dead letter's delivery count" \
  "$(awk 'prev == "h:x-window-deliveries" {print} {prev = $0}' <<<"$dead_fields")" 2
check "rejected command: XPENDING $poison_stream $group" "$(rcli xpending "$poison_stream" "$group" | head -1)" 0
check "rejected command: ZCARD {$poison_stream}:window:delayed" "$(rcli zcard "{$poison_stream}:window:delayed")" 0
check "rejected command: no side effect was applied" "$(rcli exists "$totals_key" "$picks_key")" 0
[[ $rc -eq 0 ]] || tail -30 "$work/poison-worker.log"

# ---- 7. scenario "token" ---------------------------------------------------------------------
# A sidecar that requires a bearer token: the client reads it from WINDOW_SIDECAR_TOKEN. The
# worker runs in atomic mode here (the acked segments of a read in one script), with the same end state.
log "scenario token: a third sidecar with --auth-token-file, the worker in atomic mode"
rcli flushdb >/dev/null
start_token_sidecar
token_stream=token-orders
rc=0
(unset WINDOW_SIDECAR_TOKEN; run producer --sidecar "$token_addr" --orders "$orders" --stream "$token_stream") \
  >"$work/token-none-producer.log" 2>&1 || rc=$?
check "token: without the token the producer fails with UNAUTHENTICATED" \
  "$rc:$(grep -c 'UNAUTHENTICATED' "$work/token-none-producer.log" | awk '{print ($1 > 0)}')" 1:1
rc=0
(unset WINDOW_SIDECAR_TOKEN; run_for 30 worker --sidecar "$token_addr" --orders "$orders" --stream "$token_stream") \
  >"$work/token-none-worker.log" 2>&1 || rc=$?
check "token: without the token the worker fails with UNAUTHENTICATED" \
  "$rc:$(grep -c '^subscription failed: UNAUTHENTICATED' "$work/token-none-worker.log")" 1:1
check "token: the health service stays open" \
  "$(unset WINDOW_SIDECAR_TOKEN; run_for 30 health-check --sidecar "$token_addr" 2>&1)" \
  "health window_sidecar.v1.WindowService: SERVING"
export WINDOW_SIDECAR_TOKEN
WINDOW_SIDECAR_TOKEN="$(cat "$work/token")"
run producer --sidecar "$token_addr" --orders "$orders" --stream "$token_stream" \
  >"$work/token-producer.log" 2>&1 || { cat "$work/token-producer.log"; fail "token: producer"; }
cat "$work/token-producer.log"
check_published token "$work/token-producer.log" "$token_stream" "'"
rc=0
run_for 90 worker --sidecar "$token_addr" --orders "$orders" --stream "$token_stream" --consumer token-1 \
  --atomic --idle-exit 20 >"$work/token-worker.log" 2>&1 || rc=$?
unset WINDOW_SIDECAR_TOKEN
grep -E '^token-1:|^not settled' "$work/token-worker.log" || true
check "token: worker exit code" "$rc" 0
check "token: the subscription is in atomic mode" \
  "$(grep -c "subscribed as consumer 'token-1' .* mode MODE_ATOMIC" "$work/token-worker.log")" 1
check_worker_summary token token-1 "$work/token-worker.log"
check_end_state token "$token_stream"
check_no_invalid_picks token
[[ $rc -eq 0 ]] || tail -30 "$work/token-worker.log"

# ---- 8. scenario "reliable list" ---------------------------------------------------------------
log "scenario reliable list: the orders LPUSHed onto a list, the worker with --reliable-list"
rcli flushdb >/dev/null
list_key=orders-list
node -e '
  const spec = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  for (const o of spec.orders) console.log(JSON.stringify(o));
' "$orders" | while IFS= read -r order; do rcli lpush "$list_key" "$order" >/dev/null; done
check "reliable list: LLEN $list_key before" "$(rcli llen "$list_key")" "$n_orders"
rc=0
run_for 90 worker --sidecar "$addr" --orders "$orders" --reliable-list "$list_key" --consumer list-1 \
  --idle-exit 20 >"$work/list-worker.log" 2>&1 || rc=$?
grep -E '^list-1:|^not settled' "$work/list-worker.log" || true
check "reliable list: worker exit code" "$rc" 0
check_worker_summary "reliable list" list-1 "$work/list-worker.log"
while read -r sku want; do
  check "reliable list: HGET $totals_key $sku" "$(rcli hget "$totals_key" "$sku")" "$want"
done < <(expected total)
check "reliable list: HLEN $totals_key (no other SKUs)" "$(rcli hlen "$totals_key")" "$(expected skus)"
check "reliable list: the picks are exactly the valid orders' lines" \
  "$(rcli lrange "$picks_key" 0 -1 | sort | paste -sd' ')" "$(expected pick | sort | paste -sd' ')"
check "reliable list: the list, the processing list and the delay set are empty" \
  "$(rcli llen "$list_key") $(rcli llen "{$list_key}:window:processing:list-1") $(rcli zcard "{$list_key}:window:delayed")" "0 0 0"
check_no_invalid_picks "reliable list"
[[ $rc -eq 0 ]] || tail -30 "$work/list-worker.log"

# ---- 9. scenario "batches" -----------------------------------------------------------------
log "scenario batches: producer, then the worker a read at a time"
worker_scenario batches --batches

e2e_summary

