#!/usr/bin/env bash
# Generates the Go code of ../../proto/window_sidecar/v1/window.proto with protoc,
# protoc-gen-go and protoc-gen-go-grpc into .gopath/src/window_sidecar/v1 (import path
# "window_sidecar/v1", package windowv1, from the proto's go_package). Not committed.
set -euo pipefail
cd "$(dirname "$0")"

for tool in protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null || {
    echo "generate.sh: $tool is missing (Debian: apt-get install protobuf-compiler protoc-gen-go protoc-gen-go-grpc)" >&2
    exit 1
  }
done

out=.gopath/src
rm -rf "$out/window_sidecar"
mkdir -p "$out"
protoc -I ../../proto \
  --go_out="$out" \
  --go-grpc_out="$out" \
  ../../proto/window_sidecar/v1/window.proto
echo "generated $(ls "$out"/window_sidecar/v1/*.go | tr '\n' ' ')"
