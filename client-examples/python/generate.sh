#!/usr/bin/env bash
# Generates the Python gRPC code for window-sidecar from ../../proto into generated/ (not
# committed). Uses grpcio-tools: `python -m grpc_tools.protoc`, which ships protoc and the
# well-known types (google/protobuf/duration.proto).
#
#   ./generate.sh            # with .venv/bin/python when it exists, else python3
#   PYTHON=python ./generate.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto="$(cd "$here/../../proto" && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then py="$here/.venv/bin/python"; else py=python3; fi
fi
out="$here/generated"
rm -rf "$out"
mkdir -p "$out"
"$py" -m grpc_tools.protoc \
  -I "$proto" \
  --python_out="$out" \
  --pyi_out="$out" \
  --grpc_python_out="$out" \
  "$proto/window_sidecar/v1/window.proto"
# Regular packages, so that `window_sidecar.v1` resolves to generated/ only.
touch "$out/window_sidecar/__init__.py" "$out/window_sidecar/v1/__init__.py"
echo "generated $(cd "$out" && find . -name '*.py' -o -name '*.pyi' | sort | tr '\n' ' ')"
