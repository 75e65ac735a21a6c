#!/usr/bin/env bash
# The conformance runner of the Go client (see ../conformance/README.md): cmd/conformance, a
# main package of this module built on its window package like any user's worker.
#
#   conformance.sh build            builds the runner offline (offline-modfile.sh, Debian's Go
#                                   sources, no module proxy) into the build directory, outside
#                                   the checkout (../build-dir.sh: $WINDOW_BUILD_DIR/go, else one
#                                   under ${TMPDIR:-/tmp})
#   conformance.sh run SCENARIO     execs that runner on SCENARIO (the environment names the
#                                   sidecar: WINDOW_SIDECAR_ADDR, _TOKEN, _TLS_CA/_CERT/_KEY)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../build-dir.sh
source "$here/../build-dir.sh"
out="$(build_dir go)"
case ${1:-} in
  build)
    # shellcheck source=../e2e-lib.sh
    source "$here/../e2e-lib.sh"
    # shellcheck source=toolchain.sh
    source "$here/toolchain.sh"
    need_go_toolchain
    install_missing
    cd "$here"
    ./offline-modfile.sh go.mod "$out/offline"
    GOFLAGS="-mod=mod -modfile=$out/offline/go.mod" GOPROXY=off GOSUMDB=off \
      go build -o "$out/bin/conformance" ./cmd/conformance
    ;;
  run)
    (($# == 2)) || { echo "usage: $0 run SCENARIO.json" >&2; exit 2; }
    exec "$out/bin/conformance" "$2"
    ;;
  *) echo "usage: $0 build | run SCENARIO.json" >&2; exit 2 ;;
esac
