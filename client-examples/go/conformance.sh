#!/usr/bin/env bash
# The conformance runner of the Go client (see ../conformance/README.md): cmd/conformance, a
# main package of this module built on its window package like any user's worker.
#
#   conformance.sh build            builds bin/conformance offline (offline-modfile.sh, Debian's
#                                   Go sources, no module proxy)
#   conformance.sh run SCENARIO     execs bin/conformance SCENARIO (the environment names the
#                                   sidecar: WINDOW_SIDECAR_ADDR, _TOKEN, _TLS_CA/_CERT/_KEY)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case ${1:-} in
  build)
    # shellcheck source=../e2e-lib.sh
    source "$here/../e2e-lib.sh"
    # shellcheck source=toolchain.sh
    source "$here/toolchain.sh"
    need_go_toolchain
    install_missing
    cd "$here"
    ./offline-modfile.sh go.mod .offline
    GOFLAGS="-mod=mod -modfile=$here/.offline/go.mod" GOPROXY=off GOSUMDB=off \
      go build -o bin/conformance ./cmd/conformance
    ;;
  run)
    (($# == 2)) || { echo "usage: $0 run SCENARIO.json" >&2; exit 2; }
    exec "$here/bin/conformance" "$2"
    ;;
  *) echo "usage: $0 build | run SCENARIO.json" >&2; exit 2 ;;
esac
