#!/usr/bin/env bash
# The wire contract's checks, as for any gRPC API others generate clients from: buf's standard
# lint, and no breaking change against the last released contract (proto/RELEASES names its
# commit) unless it comes as a new package version. buf comes from npm (@bufbuild/buf), which the
# Node client already uses; it is installed into a cache directory when not on the PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
BUF_VERSION=1.75.0
buf=$(command -v buf || true)
if [[ -z $buf ]]; then
  prefix="${WINDOW_BUF_DIR:-${TMPDIR:-/tmp}/window-sidecar-buf-$BUF_VERSION}"
  if [[ ! -x $prefix/node_modules/.bin/buf ]]; then
    mkdir -p "$prefix"
    npm install --silent --no-audit --no-fund --prefix "$prefix" "@bufbuild/buf@$BUF_VERSION"
  fi
  buf=$prefix/node_modules/.bin/buf
fi
"$buf" --version
"$buf" lint proto
echo "buf lint: clean"
# The last line of proto/RELEASES: `<version> <commit>`.
read -r version commit < <(grep -v '^#' proto/RELEASES | tail -n 1)
"$buf" breaking proto --against ".git#ref=$commit,subdir=proto"
echo "buf breaking: nothing breaks against $version ($commit)"
