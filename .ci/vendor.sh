#!/usr/bin/env bash
# Checks that each vendored crate (server/vendor/) is the crate crates.io publishes at that
# version with the patches of server/vendor/patches/ applied by `patch -p1`, in their order, and
# nothing else: a reader can rebuild it, and drop it once a release has the fix. The published
# crate comes from the local cargo cache when there, else from crates.io. A crate's own
# .gitignore keeps its Cargo.lock out of this repository, so the lockfile is not compared.
set -euo pipefail
cd "$(dirname "$0")/.."
vendor=$PWD/server/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# check NAME VERSION PATCH...: unpacks NAME-VERSION, applies each PATCH, compares.
check() {
  local name=$1 version=$2
  shift 2
  local crate="$name-$version.crate" cached
  cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$crate" 2>/dev/null | head -n 1 || true)
  if [[ -n $cached ]]; then
    cp "$cached" "$work/$crate"
  else
    curl -sSfL --retry 3 -o "$work/$crate" "https://static.crates.io/crates/$name/$crate"
  fi
  tar -xzf "$work/$crate" -C "$work"
  for diff in "$@"; do
    if grep -qE '^(\+\+\+|---) /' "$vendor/patches/$diff"; then
      echo "$diff names an absolute path: a patch must apply with patch -p1 from the crate's root" >&2
      return 1
    fi
    patch -d "$work/$name-$version" -p1 --quiet --forward <"$vendor/patches/$diff"
  done
  if ! diff -r --exclude=Cargo.lock "$work/$name-$version" "$vendor/$name"; then
    echo "server/vendor/$name is not $name $version from crates.io plus ${*}" >&2
    return 1
  fi
  echo "server/vendor/$name: $name $version from crates.io plus $*"
}

check fred 10.1.0 fred-10.1.0-ask-redirections.diff fred-10.1.0-one-write-per-pipeline.diff \
  fred-10.1.0-consume-pipeline.diff fred-10.1.0-raw-commands.diff
check h2 0.4.20 h2-0.4.20-unix-socket-authority.diff
