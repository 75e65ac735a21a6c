#!/usr/bin/env bash
# Generates the gRPC code, then vets and builds bin/producer, bin/worker and bin/healthcheck in
# GOPATH mode against Debian's golang-* packages (/usr/share/gocode). No module proxy needed.
#
#   .gopath/src/window_sidecar/v1      generated (generate.sh)
#   .gopath/src/windowsidecar.example  -> this directory (the helper, orders, cmd/*)
set -euo pipefail
cd "$(dirname "$0")"

./generate.sh
ln -sfn ../.. .gopath/src/windowsidecar.example

export GO111MODULE=off
export GOPATH="$PWD/.gopath:/usr/share/gocode"
unset GOFLAGS
pkgs=(windowsidecar.example/window windowsidecar.example/orders
      windowsidecar.example/cmd/producer windowsidecar.example/cmd/worker
      windowsidecar.example/cmd/healthcheck)

unformatted=$(gofmt -l window orders cmd)
if [[ -n "$unformatted" ]]; then
  echo "build.sh: not gofmt-ed: $unformatted" >&2
  exit 1
fi
go vet "${pkgs[@]}"
mkdir -p bin
go build -o bin/producer windowsidecar.example/cmd/producer
go build -o bin/worker windowsidecar.example/cmd/worker
go build -o bin/healthcheck windowsidecar.example/cmd/healthcheck
echo "built bin/producer bin/worker bin/healthcheck"
