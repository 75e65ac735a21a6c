# shellcheck shell=bash
# Where the Go and Java builds write (the offline modfile, binaries, Maven's target directories,
# Netty's native library) and the Node and Python conformance runners are installed, so that a build leaves the checkout untouched and a read-only
# checkout builds, as the Python (hatchling) and Node (pack.sh) builds do. Sourced by
# go/build.sh, go/conformance.sh, java/conformance.sh, java/native-epoll.sh,
# node/conformance.sh and python/conformance.sh.
#
#   WINDOW_BUILD_DIR   the directory to build in (created when missing); default
#                      ${TMPDIR:-/tmp}/window-sidecar-build-<uid>/<a hash of the checkout's path>:
#                      outside the checkout, one per checkout, and the same from one call to
#                      the next (a runner built by `conformance.sh build` is found by `run`)

# build_dir NAME: prints the directory NAME in the build directory, creating it.
build_dir() {
  local base=${WINDOW_BUILD_DIR:-}
  if [[ -z $base ]]; then
    local checkout
    checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    base="${TMPDIR:-/tmp}/window-sidecar-build-$(id -u)/$(printf '%s' "$checkout" | sha256sum | cut -c1-16)"
  fi
  mkdir -p "$base/$1"
  (cd "$base/$1" && pwd)
}
