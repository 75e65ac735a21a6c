#!/usr/bin/env bash
# Builds the module offline against Debian's Go packages (/usr/share/gocode, no module proxy):
# writes the CI-only modfile <build dir>/offline/go.mod (offline-modfile.sh: go.mod plus a
# replace of every dependency by its Debian directory), checks gofmt, runs go vet ./... and go
# build ./..., and builds <build dir>/bin/producer, worker and healthcheck. The build directory is
# outside the checkout (../build-dir.sh: $WINDOW_BUILD_DIR/go, else one under ${TMPDIR:-/tmp}):
# the checkout is only read, and go.mod is never touched.
#
# Source it, or run it and then export the GOFLAGS it prints last (with GOPROXY=off) to run go
# test ./... and the like the same way.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=../build-dir.sh
source ../build-dir.sh
out="$(build_dir go)"

./offline-modfile.sh go.mod "$out/offline"
export GOFLAGS="-mod=mod -modfile=$out/offline/go.mod" GOPROXY=off

unformatted=$(gofmt -l window orders cmd windowv1 example-app internal)
if [[ -n "$unformatted" ]]; then
  echo "build.sh: not gofmt-ed: $unformatted" >&2
  exit 1
fi
go vet ./...
go build ./...
mkdir -p "$out/bin"
for cmd in producer worker healthcheck; do go build -o "$out/bin/$cmd" "./cmd/$cmd"; done
echo "built $out/bin/producer $out/bin/worker $out/bin/healthcheck"
echo "GOFLAGS=\"$GOFLAGS\""
