#!/usr/bin/env bash
# Builds the npm tarball of @window-sidecar/client without writing into the checkout: the
# package's sources and the proto are copied into a temporary directory (the repository's
# layout, so that `buf generate ../../proto` finds it), built there (`npm pack` runs the
# `prepack` build: buf generate, tsc, the ESM wrapper) and packed into DEST. A read-only checkout
# builds the same way.
#
#   ./pack.sh DEST                  the tarball into DEST; prints its path last
#   ./pack.sh DEST --publish-dry-run  also `npm publish --dry-run` of the same build
#
# The checkout's node_modules (npm ci) is used read-only when it is there; else the temporary
# copy installs its own from package-lock.json.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$(mkdir -p "${1:?usage: pack.sh DEST [--publish-dry-run]}" && cd "$1" && pwd)"
proto="${WINDOW_PROTO_DIR:-$here/../../proto}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/window-node-pack.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
pkg="$tmp/client-examples/node"
mkdir -p "$pkg"
cp -R "$proto" "$tmp/proto"
cp -R "$here/src" "$pkg/src"
rm -rf "$pkg/src/gen"
cp "$here"/{package.json,package-lock.json,tsconfig.json,buf.gen.yaml,esm-wrapper.cjs,README.md,LICENSE} "$pkg/"
cd "$pkg"
if [[ -d $here/node_modules/.bin ]]; then
  ln -s "$here/node_modules" node_modules
else
  npm ci --no-audit --no-fund --loglevel=error
fi
tarball="$(npm pack --silent --pack-destination "$dest" | tail -1)"
if [[ ${2:-} == --publish-dry-run ]]; then
  npm publish --dry-run --access public --loglevel=warn 2>&1 | sed 's/^/publish --dry-run: /' >&2
fi
echo "$dest/$tarball"
