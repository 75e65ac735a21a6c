#!/usr/bin/env bash
# Generates the Go code of ../../proto/window_sidecar/v1/window.proto with protoc, protoc-gen-go
# and protoc-gen-go-grpc into windowv1/ (package windowv1, import path
# example.invalid/window-sidecar/client-examples/go/windowv1, from the proto's go_package).
#
# The generated files are committed, as Go modules are fetched as source and `go get` runs no
# generator; run-e2e.sh checks that they match the proto (check-generated.sh).
#
#   generate.sh [OUT]   writes into OUT/windowv1 instead of ./windowv1
set -euo pipefail
cd "$(dirname "$0")"
out="${1:-.}"
module=example.invalid/window-sidecar/client-examples/go

for tool in protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null || {
    echo "generate.sh: $tool is missing (Debian: apt-get install protobuf-compiler protoc-gen-go protoc-gen-go-grpc)" >&2
    exit 1
  }
done

mkdir -p "$out/windowv1"
rm -f "$out"/windowv1/*.pb.go
protoc -I ../../proto \
  --go_out="$out" --go_opt=module="$module" \
  --go-grpc_out="$out" --go-grpc_opt=module="$module" \
  ../../proto/window_sidecar/v1/window.proto
echo "generated $(cd "$out" && ls windowv1/*.go | tr '\n' ' ')"
