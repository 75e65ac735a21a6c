#!/usr/bin/env bash
# End-to-end test of the Java client as a package. Installs what is missing (Debian packages:
# Maven, its plugins and the Java libraries, which put their artefacts in /usr/share/maven-repo),
# then, offline (mvn -o, no Maven Central):
#   1. builds the package with Maven (pom.xml: protoc + the grpc-java plugin, javac -Xlint:all
#      -Werror, the JUnit tests) into a temp dir outside the repository (-Dwindow.build.directory:
#      the build writes nothing into the checkout, checked) and installs
#      dev.windowsidecar:window-sidecar-client:0.1.0 into a scratch local repository there;
#   2. copies the example application (examples/, which depends on the package by those
#      coordinates) into that temp dir and builds it there against the scratch repository;
#   3. starts a redis-server on a free port and the sidecar, runs the application's producer then
#      its worker until done, and checks the Redis end state of ../orders.json with redis-cli;
#   4. does it again through a second sidecar on a Unix socket (--listen unix:PATH), with the
#      examples' --addr unix:PATH: grpc-java's epoll transport over Netty's native library, which
#      native-epoll.sh builds from Debian's source (Debian ships none), and no other option;
#   5. a third sidecar with --auth-token-file: with WINDOW_SIDECAR_TOKEN the producer and the
#      worker work, without it their calls fail with UNAUTHENTICATED;
#   6. a poison order whose handler queues FLUSHALL, which the sidecar refuses: with
#      --rejected-outcome retry_after the helper settles it with retry_after 1 s, and with a cap
#      of 2 deliveries it ends in the dead-letter stream; with the default (auto) it is
#      dead-lettered at once (dropped at once without a dead letter), and no line repeats the
#      sidecar's advice to settle it otherwise;
#   7. the orders once more with the worker taking a read at a time (--batches: subscribeBatches,
#      drops and retries per order, the rest acked with one batch.ack()): the same end state.
#   Besides: RedisCommands.java is what generate-commands.sh makes of the checked-in command
#   specification, and the jar carries the repository's LICENSE.
#
#   WINDOW_SIDECAR_BIN   the sidecar binary (default ../../target/debug/window-sidecar; built
#                        with cargo when missing)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# root, orders, sidecar_bin; e2e_init, check, start_redis, start_sidecar, check_end_state, …
source "$here/../e2e-lib.sh"
cd "$here"
e2e_init java

# --- toolchain: install only what is missing ---------------------------------------------
# need_java_toolchain, write_maven_settings: maven-debian.sh, shared with conformance.sh.
source "$here/maven-debian.sh"
need_java_toolchain
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
need_cmd jq jq
install_missing

# --- the package: build, install into a scratch repository, build the application on it ----
# Maven offline on Debian's repository: a settings file that makes it the only repository, a
# scratch local repository, and the poms' profile "debian" (maven-debian.sh).
m2="$work/m2"
write_maven_settings "$work/settings.xml" "$m2"
# Offline, a file: repository is the one kind Maven may still read.
mvn_o=(mvn -o -B -Dstyle.color=never -s "$work/settings.xml" -Daether.offline.protocols=file)

log "mvn -o install: the package, into $m2"
# The checkout's files before and after the builds: they write into the work directory only.
tree_state() { (cd "$here" && find . | sort); }
tree_state >"$work/tree-before.txt"
set +e
"${mvn_o[@]}" -Dwindow.build.directory="$work/target" install >"$work/mvn-install.log" 2>&1
install_rc=$?
set -e
check "mvn -o install of the package (protoc, javac -Xlint:all -Werror, JUnit)" "$install_rc" 0
check "javac: no warning in the package's build" \
  "$(grep -c 'COMPILATION WARNING' "$work/mvn-install.log" || true)" 0
tests_line=$(grep -Eo 'Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$work/mvn-install.log" | tail -1 || true)
check "helper unit tests (JUnit: ${tests_line:-none run})" \
  "$(grep -Ec '^\[INFO\] Tests run: [1-9][0-9]*, Failures: 0, Errors: 0, Skipped: 0$' "$work/mvn-install.log" || true)" 1
installed="$m2/dev/windowsidecar/window-sidecar-client/0.1.0/window-sidecar-client-0.1.0.jar"
check "the installed jar holds the generated stub and the helper" \
  "$(unzip -l "$installed" 2>/dev/null | grep -cE 'dev/windowsidecar/(v1/WindowServiceGrpc|client/WindowClient)\.class$' || true)" 2
check "the installed jar carries the repository's LICENSE (META-INF/LICENSE)" \
  "$(unzip -p "$installed" META-INF/LICENSE 2>/dev/null | cmp -s - "$root/LICENSE" && echo same)" same
# The typed command API is what the generator makes of the checked-in specification.
need_cmd go golang-go
install_missing
./generate-commands.sh "$work/RedisCommands.java"
check "RedisCommands.java is generated from ../go/rediscommands (generate-commands.sh)" \
  "$(cmp -s src/main/java/dev/windowsidecar/client/RedisCommands.java "$work/RedisCommands.java" && echo same || echo "differs: run generate-commands.sh")" same

# The application, outside the repository, on the package by its coordinates.
app="$work/app"
cp -r examples "$app"
rm -rf "$app/target"
log "mvn -o package: the application, in $app"
set +e
(cd "$app" && "${mvn_o[@]}" package \
  org.apache.maven.plugins:maven-dependency-plugin:3.5.0:build-classpath -Dmdep.outputFile=cp.txt) \
  >"$work/mvn-app.log" 2>&1
app_rc=$?
set -e
check "mvn -o package of the application (javac -Xlint:all -Werror)" "$app_rc" 0
check "the application's classpath takes the package from the scratch repository" \
  "$(tr ':' '\n' <"$app/cp.txt" 2>/dev/null | grep -cxF "$installed" || true)" 1
app_cp="$app/target/window-sidecar-examples-0.1.0.jar:$(cat "$app/cp.txt" 2>/dev/null || true)"

# Netty's native epoll library, for the Unix socket (cached outside the checkout, see
# ../build-dir.sh).
native_dir=$(./native-epoll.sh)
tree_state >"$work/tree-after.txt"
check "the builds wrote nothing into the checkout (no target/, no build/)" \
  "$(diff "$work/tree-before.txt" "$work/tree-after.txt" | grep -c '^[<>]' || true)" 0
ensure_sidecar

# --- processes ------------------------------------------------------------------------------
start_redis
start_sidecar
export WINDOW_SIDECAR_ADDR="$addr"
load_expected expected_by_jq

# --- checks ---------------------------------------------------------------------------------
set +e
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Producer \
  --orders "$orders" >"$work/producer.log" 2>&1
producer_rc=$?
timeout 120 java -cp "$app_cp" dev.windowsidecar.examples.Worker \
  --orders "$orders" --consumer worker-1 --idle-timeout 20s >"$work/worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/producer.log"
grep -E '^summary:' "$work/worker.log" || true
check "producer exit status" "$producer_rc" 0
check "worker exit status" "$worker_rc" 0
check_summary_counts "" "$work/worker.log"
check_end_state

# --- the Unix socket ----------------------------------------------------------------------
# The recommended sidecar setup: a second sidecar on --listen unix:PATH, reached with the
# target unix:PATH of newer grpc-java (WindowClient.connect: NettyChannelBuilder.forAddress of a
# DomainSocketAddress over epoll) and no other channel option (no overrideAuthority): grpc-java
# sends the socket path as :authority and the sidecar takes it.
sock="$work/sidecar.sock"
uds="unix:$sock"
log "a second sidecar on $uds"
# h2's debug lines show what became of the :authority.
RUST_LOG=info,h2::server=debug start_uds_sidecar "$sock"
rcli FLUSHDB >/dev/null
uds_stream=uds-orders
java_uds=(java "-Djava.library.path=$native_dir" -cp "$app_cp")
set +e
timeout 60 "${java_uds[@]}" dev.windowsidecar.examples.Producer --addr "$uds" \
  --orders "$orders" --stream "$uds_stream" >"$work/uds-producer.log" 2>&1
producer_rc=$?
timeout 120 "${java_uds[@]}" dev.windowsidecar.examples.Worker --addr "$uds" \
  --orders "$orders" --stream "$uds_stream" --consumer uds-1 --idle-timeout 20s \
  >"$work/uds-worker.log" 2>&1
worker_rc=$?
set -e
cat "$work/uds-producer.log"
grep -E '^summary:' "$work/uds-worker.log" || true
check "unix socket: producer exit status" "$producer_rc" 0
check_published "unix socket" "$work/uds-producer.log" "$uds_stream" '"'
check "unix socket: worker exit status" "$worker_rc" 0
check_summary_counts "unix socket" "$work/uds-worker.log"
# Every entry was delivered: the orders and a copy per retry, the last of them the group's last.
check_group_read_all "unix socket" "$uds_stream"
check_end_state "unix socket" "$uds_stream"
# The socket path as :authority is no authority: the sidecar's h2 ignores it (a debug line)
# and refuses no request as malformed.
check "unix socket: grpc-java sent the socket path as :authority, ignored" \
  "$(grep -cF "ignoring a malformed :authority (b\"$sock\")" "$work/sidecar-uds.log" | awk '{print ($1 > 0)}')" 1
check "unix socket: no other malformed line in the sidecar's log" \
  "$(grep -i malformed "$work/sidecar-uds.log" | grep -vcF 'ignoring a malformed :authority')" 0

# --- the bearer token -----------------------------------------------------------------------
# A third sidecar that wants a token: WindowClient.connect sends WINDOW_SIDECAR_TOKEN's.
start_token_sidecar
rcli FLUSHDB >/dev/null
auth_stream=auth-orders
set +e
env -u WINDOW_SIDECAR_TOKEN timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Producer \
  --addr "$token_addr" --orders "$orders" --stream "$auth_stream" >"$work/auth-producer-none.log" 2>&1
none_producer_rc=$?
env -u WINDOW_SIDECAR_TOKEN timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Worker \
  --addr "$token_addr" --orders "$orders" --stream "$auth_stream" --consumer auth-0 \
  --idle-timeout 20s >"$work/auth-worker-none.log" 2>&1
none_worker_rc=$?
WINDOW_SIDECAR_TOKEN=$(cat "$work/token") timeout 60 java -cp "$app_cp" \
  dev.windowsidecar.examples.Producer --addr "$token_addr" --orders "$orders" \
  --stream "$auth_stream" >"$work/auth-producer.log" 2>&1
producer_rc=$?
WINDOW_SIDECAR_TOKEN=$(cat "$work/token") timeout 120 java -cp "$app_cp" \
  dev.windowsidecar.examples.Worker --addr "$token_addr" --orders "$orders" \
  --stream "$auth_stream" --consumer auth-1 --idle-timeout 20s >"$work/auth-worker.log" 2>&1
worker_rc=$?
set -e
check "token: without it the producer fails with UNAUTHENTICATED" \
  "$none_producer_rc:$(grep -c UNAUTHENTICATED "$work/auth-producer-none.log" | awk '{print ($1 > 0)}')" 1:1
check "token: without it the worker's subscription fails with UNAUTHENTICATED" \
  "$none_worker_rc:$(grep -c 'subscription ended: .*UNAUTHENTICATED' "$work/auth-worker-none.log" | awk '{print ($1 > 0)}')" 1:1
check "token: producer exit status" "$producer_rc" 0
check_published "token" "$work/auth-producer.log" "$auth_stream" '"'
check "token: worker exit status" "$worker_rc" 0
check_summary_counts "token" "$work/auth-worker.log"
check_end_state "token" "$auth_stream"

# --- a refused command --------------------------------------------------------------------
# A poison order: its handler queues FLUSHALL, which the sidecar refuses (and with it the ack).
# With --rejected-outcome retry_after the helper settles it with retry_after 1 s; the worker's
# cap of 2 deliveries and dead-letter stream end it there on the second refusal.
poison_stream=poison-orders
dead=poison-orders-dead
jq -n --arg s "$poison_stream" \
  '{stream: $s, group: "order-service", orders: [{id: "p-1", poison: true, lines: [{sku: "poison", qty: 1}]}]}' \
  >"$work/poison.json"
set +e
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Producer \
  --orders "$work/poison.json" >"$work/poison-producer.log" 2>&1
producer_rc=$?
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Worker \
  --orders "$work/poison.json" --stream "$poison_stream" --consumer poison-1 --expect -1 \
  --idle-timeout 4s --max-deliveries 2 --dead-letter "$dead" --rejected-outcome retry_after \
  >"$work/poison-worker.log" 2>&1
worker_rc=$?
set -e
check "refused command: producer exit status" "$producer_rc" 0
check "refused command: worker exit status" "$worker_rc" 0
check "refused command: the helper logged the sidecar's refusal of FLUSHALL" \
  "$(grep -c 'refused command FLUSHALL' "$work/poison-worker.log" | awk '{print ($1 >= 2)}')" 1
check "refused command: XLEN $dead (dead-lettered after 2 deliveries)" "$(rcli xlen "$dead")" 1
dead_fields=$(rcli xrange "$dead" - + | paste -sd' ')
check "refused command: the dead letter says 2 deliveries and the rejection as reason" \
  "$(rcli --no-raw xrange "$dead" - + | awk '/x-window-deliveries/ {getline; d=$0} /x-window-reason/ {getline; r=$0} END {print (d ~ /"2"/) ":" (r ~ /rejected: FORBIDDEN_COMMAND: /)}')" 1:1
check "refused command: XPENDING $poison_stream order-service" \
  "$(rcli xpending "$poison_stream" order-service | head -1)" 0
check "refused command: ZCARD {$poison_stream}:window:delayed" "$(rcli zcard "{$poison_stream}:window:delayed")" 0
check "refused command: its other commands never ran (no HGET sku-totals poison)" \
  "$(rcli hget sku-totals poison)" ""
echo "   dead letter: $dead_fields"

# The default (auto): FORBIDDEN_COMMAND, which no retry fixes, dead-letters the poison order at
# once: one delivery, in the dead letter with the rejection as its reason, nothing pending or
# delayed, and no line repeats the sidecar's advice to settle it otherwise.
auto_stream=poison-auto
auto_dead=poison-auto-dead
jq -n --arg s "$auto_stream" \
  '{stream: $s, group: "order-service", orders: [{id: "p-2", poison: true, lines: [{sku: "poison", qty: 1}]}]}' \
  >"$work/poison-auto.json"
set +e
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Producer \
  --orders "$work/poison-auto.json" >"$work/poison-auto-producer.log" 2>&1
producer_rc=$?
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Worker \
  --orders "$work/poison-auto.json" --stream "$auto_stream" --consumer poison-2 --expect -1 \
  --idle-timeout 4s --max-deliveries 2 --dead-letter "$auto_dead" >"$work/poison-auto-worker.log" 2>&1
worker_rc=$?
set -e
check "refused command, auto: producer exit status" "$producer_rc" 0
check "refused command, auto: worker exit status" "$worker_rc" 0
check "refused command, auto: delivered once, dead-lettered with the reason" \
  "$(grep -c '(delivery 1)' "$work/poison-auto-worker.log"):$(grep -c '(delivery 2)' "$work/poison-auto-worker.log"):$(grep -c 'settled it with dead_letter' "$work/poison-auto-worker.log")" 1:0:1
check "refused command, auto: XLEN $auto_dead" "$(rcli xlen "$auto_dead")" 1
check "refused command, auto: the dead letter says 1 delivery and the rejection as reason" \
  "$(rcli --no-raw xrange "$auto_dead" - + | awk '/x-window-deliveries/ {getline; d=$0} /x-window-reason/ {getline; r=$0} END {print (d ~ /"1"/) ":" (r ~ /rejected: FORBIDDEN_COMMAND: /)}')" 1:1
check "refused command, auto: XPENDING $auto_stream order-service" \
  "$(rcli xpending "$auto_stream" order-service | head -1)" 0
check "refused command, auto: ZCARD {$auto_stream}:window:delayed" "$(rcli zcard "{$auto_stream}:window:delayed")" 0
check "refused command, auto: no line says \"settle it with\"" \
  "$(grep -ci 'settle it with' "$work/poison-auto-worker.log" || true)" 0

# auto without a dead letter: the poison order is dropped at once, nothing pending or delayed.
drop_stream=poison-drop
jq -n --arg s "$drop_stream" \
  '{stream: $s, group: "order-service", orders: [{id: "p-3", poison: true, lines: [{sku: "poison", qty: 1}]}]}' \
  >"$work/poison-drop.json"
set +e
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Producer \
  --orders "$work/poison-drop.json" >"$work/poison-drop-producer.log" 2>&1
producer_rc=$?
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Worker \
  --orders "$work/poison-drop.json" --stream "$drop_stream" --consumer poison-3 --expect -1 \
  --idle-timeout 4s >"$work/poison-drop-worker.log" 2>&1
worker_rc=$?
set -e
check "refused command, auto, no dead letter: producer exit status" "$producer_rc" 0
check "refused command, auto, no dead letter: worker exit status" "$worker_rc" 0
check "refused command, auto, no dead letter: delivered once, dropped with the reason" \
  "$(grep -c '(delivery 1)' "$work/poison-drop-worker.log"):$(grep -c '(delivery 2)' "$work/poison-drop-worker.log"):$(grep -c 'settled it with drop' "$work/poison-drop-worker.log")" 1:0:1
check "refused command, auto, no dead letter: XPENDING $drop_stream order-service" \
  "$(rcli xpending "$drop_stream" order-service | head -1)" 0
check "refused command, auto, no dead letter: ZCARD {$drop_stream}:window:delayed" \
  "$(rcli zcard "{$drop_stream}:window:delayed")" 0

# --- a read at a time ---------------------------------------------------------------------
rcli flushdb >/dev/null
set +e
timeout 60 java -cp "$app_cp" dev.windowsidecar.examples.Producer --addr "$addr" \
  --orders "$orders" >"$work/batches-producer.log" 2>&1
producer_rc=$?
timeout 120 java -cp "$app_cp" dev.windowsidecar.examples.Worker --addr "$addr" \
  --orders "$orders" --consumer batches-1 --idle-timeout 20s --batches true >"$work/batches-worker.log" 2>&1
worker_rc=$?
set -e
grep -E '^summary:' "$work/batches-worker.log" || true
check "batches: producer exit status" "$producer_rc" 0
check "batches: worker exit status" "$worker_rc" 0
check_summary_counts "batches" "$work/batches-worker.log"
check_end_state "batches"

e2e_summary
