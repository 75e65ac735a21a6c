#!/usr/bin/env bash
# Generates the gRPC code, compiles it with the helper and the examples against Debian's jars in
# /usr/share/java (no Maven Central needed), compiles and runs the helper's unit tests (JUnit 4;
# SKIP_TESTS=1 does not run them), and packs build/window-examples.jar, whose manifest Class-Path
# names those jars:
#
#   java -cp build/window-examples.jar dev.windowsidecar.examples.Producer --addr 127.0.0.1:50051
#   java -cp build/window-examples.jar dev.windowsidecar.examples.Worker   --addr 127.0.0.1:50051
set -euo pipefail
cd "$(dirname "$0")"
jars=/usr/share/java

# jar -> Debian package. Runtime: grpc-java over Netty (its epoll transport for Unix sockets),
# protobuf, guava, perfmark, gson.
declare -A runtime=(
  [grpc-api]=libgrpc-java [grpc-context]=libgrpc-java [grpc-core]=libgrpc-java
  [grpc-netty]=libgrpc-java [grpc-protobuf]=libgrpc-java [grpc-protobuf-lite]=libgrpc-java
  [grpc-stub]=libgrpc-java [protobuf]=libprotobuf-java [guava]=libguava-java
  [perfmark-api]=libperfmark-java [gson]=libgoogle-gson-java
  [netty-buffer]=libnetty-java [netty-codec]=libnetty-java [netty-codec-http]=libnetty-java
  [netty-codec-http2]=libnetty-java [netty-codec-socks]=libnetty-java
  [netty-common]=libnetty-java [netty-handler]=libnetty-java
  [netty-handler-proxy]=libnetty-java [netty-resolver]=libnetty-java
  [netty-transport]=libnetty-java [netty-transport-native-unix-common]=libnetty-java
  [netty-transport-native-epoll]=libnetty-java
)
# Compile only: @javax.annotation.Generated on the generated stubs, errorprone on guava.
declare -A compile_only=([geronimo-annotation-1.3-spec]=libgeronimo-annotation-1.3-spec-java
  [error_prone_annotations]=liberror-prone-java)
declare -A test_only=([junit4]=junit4 [hamcrest-core]=libhamcrest-java)

missing=()
classpath() { # classpath SET VAR: VAR = the jars of the associative array SET, separated by ':'
  local -n set=$1 var=$2
  local cp=() name
  for name in $(printf '%s\n' "${!set[@]}" | sort); do
    if [[ -f $jars/$name.jar ]]; then cp+=("$jars/$name.jar"); else missing+=("${set[$name]}"); fi
  done
  var=$(IFS=:; echo "${cp[*]}")
}
classpath runtime run_cp
classpath compile_only compile_cp
compile_cp=$run_cp:$compile_cp
main_missing=("${missing[@]}")
classpath test_only test_cp
test_missing=("${missing[@]:${#main_missing[@]}}")
if ((${#main_missing[@]})) || { ((${#test_missing[@]})) && [[ ${SKIP_TESTS:-0} != 1 ]]; }; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "build.sh: missing jars; apt-get install ${missing[*]} (or SKIP_TESTS=1 without the test jars)" >&2
  exit 1
fi
command -v javac >/dev/null || { echo "build.sh: javac is missing (apt-get install default-jdk-headless)" >&2; exit 1; }

./generate.sh
rm -rf build/classes build/test-classes
mkdir -p build/classes build/test-classes
javac -d build/classes -cp "$compile_cp" -Xlint:all,-processing,-serial \
  $(find build/generated src/main/java -name '*.java')

# The tests compile whenever JUnit is there; SKIP_TESTS=1 skips running them.
if ((${#test_missing[@]} == 0)); then
  javac -d build/test-classes -cp "build/classes:$run_cp:$test_cp" $(find src/test/java -name '*.java')
  if [[ ${SKIP_TESTS:-0} != 1 ]]; then
    java -cp "build/test-classes:build/classes:$run_cp:$test_cp" org.junit.runner.JUnitCore \
      dev.windowsidecar.client.SubscriptionTest dev.windowsidecar.client.WindowClientTest
  fi
fi

{
  echo "Manifest-Version: 1.0"
  echo "Created-By: window-sidecar client-examples/java/build.sh"
  # Class-Path: space separated, continuation lines start with one space, at most 72 bytes.
  echo "Class-Path: ${run_cp//:/ }" | fold -w 70 | sed '2,$s/^/ /'
} >build/MANIFEST.MF
jar --create --file build/window-examples.jar --manifest build/MANIFEST.MF -C build/classes .
echo "built build/window-examples.jar"
