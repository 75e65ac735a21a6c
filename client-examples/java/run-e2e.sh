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
# root, orders, sidecar_bin; e2e_init, check, start_redis, start_sidecar, check_end_state, …
source "$here/../e2e-lib.sh"
cd "$here"
e2e_init java

# --- toolchain: install only what is missing ---------------------------------------------
need_cmd javac default-jdk-headless
need_cmd jar default-jdk-headless
need_cmd protoc protobuf-compiler
command -v protoc-gen-grpc-java >/dev/null 2>&1 || need_cmd grpc_java_plugin protobuf-compiler-grpc-java-plugin
# The proto imports google/protobuf/duration.proto, which protoc only recommends.
need_path /usr/include/google/protobuf/duration.proto libprotobuf-dev
need_file() { need_path "/usr/share/java/$1.jar" "$2"; }
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
install_missing

SKIP_TESTS=1 ./build.sh
# Netty's native epoll library, for the Unix socket (cached in build/native).
native_dir=$(./native-epoll.sh)
ensure_sidecar

# --- processes ------------------------------------------------------------------------------
start_redis
start_sidecar
export WINDOW_SIDECAR_ADDR="$addr"
load_expected expected_by_jq

# --- checks ---------------------------------------------------------------------------------
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
  --orders "$orders" >"$work/producer.log" 2>&1
producer_rc=$?
timeout 120 java -cp build/window-examples.jar dev.windowsidecar.examples.Worker \
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
java_uds=(java "-Djava.library.path=$native_dir" -cp build/window-examples.jar)
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

e2e_summary

