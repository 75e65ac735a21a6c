#!/usr/bin/env bash
# Generates the Java code of ../../proto/window_sidecar/v1/window.proto with protoc and the
# grpc-java plugin (Debian: protobuf-compiler, protobuf-compiler-grpc-java-plugin) into
# build/generated (package dev.windowsidecar.v1, from the proto's java_package). Not committed.
set -euo pipefail
cd "$(dirname "$0")"

plugin=${GRPC_JAVA_PLUGIN:-$(command -v protoc-gen-grpc-java || command -v grpc_java_plugin || true)}
command -v protoc >/dev/null || { echo "generate.sh: protoc is missing (apt-get install protobuf-compiler)" >&2; exit 1; }
[[ -n $plugin && -x $plugin ]] || {
  echo "generate.sh: the grpc-java protoc plugin is missing (apt-get install protobuf-compiler-grpc-java-plugin, or set GRPC_JAVA_PLUGIN)" >&2
  exit 1
}

out=build/generated
rm -rf "$out"
mkdir -p "$out"
protoc -I ../../proto \
  --plugin=protoc-gen-grpc-java="$plugin" \
  --java_out="$out" \
  --grpc-java_out="$out" \
  ../../proto/window_sidecar/v1/window.proto
echo "generated $(find "$out" -name '*.java' | wc -l) files in $out"
