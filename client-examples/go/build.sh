#!/usr/bin/env bash
# Builds the module offline against Debian's Go packages (/usr/share/gocode, no module proxy):
# writes the CI-only modfile .offline/go.mod (offline-modfile.sh: go.mod plus a replace of every
# dependency by its Debian directory), checks gofmt, runs go vet ./... and go build ./..., and
# builds bin/producer, bin/worker and bin/healthcheck. The user-facing go.mod is not touched.
#
# Source it, or run it and then `export GOFLAGS="-mod=mod -modfile=$PWD/.offline/go.mod"
# GOPROXY=off` to run go test ./... and the like the same way.
set -euo pipefail
cd "$(dirname "$0")"

./offline-modfile.sh go.mod .offline
export GOFLAGS="-mod=mod -modfile=$PWD/.offline/go.mod" GOPROXY=off

unformatted=$(gofmt -l window orders cmd windowv1 example-app internal)
if [[ -n "$unformatted" ]]; then
  echo "build.sh: not gofmt-ed: $unformatted" >&2
  exit 1
fi
go vet ./...
go build ./...
mkdir -p bin
for cmd in producer worker healthcheck; do go build -o "bin/$cmd" "./cmd/$cmd"; done
echo "built bin/producer bin/worker bin/healthcheck"
