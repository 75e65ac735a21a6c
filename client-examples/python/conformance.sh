#!/usr/bin/env bash
# The conformance runner of the Python client (see ../conformance/README.md).
#
#   conformance.sh build            builds the wheel and installs it into a virtualenv in the
#                                   build directory (../build-dir.sh: outside the checkout)
#   conformance.sh run SCENARIO     runs conformance/runner.py on the installed package
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../build-dir.sh
source "$here/../build-dir.sh"
venv="$(build_dir python-conformance-venv)"
case ${1:-} in
  build)
    # The way a user builds and installs it: pip builds the wheel in an isolated environment
    # with the build's own requirements (hatchling, the pinned grpcio-tools), then installs
    # it with its dependencies into the runner's virtualenv.
    [[ -x $venv/bin/python ]] || python3 -m venv --clear "$venv"
    dist="$(mktemp -d)"
    trap 'rm -rf "$dist"' EXIT
    "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$dist" "$here"
    # The same version as the last build: uninstalled first so that this wheel is the one.
    "$venv/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y \
      window-sidecar-client 2>/dev/null || true
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "$dist"/window_sidecar_client-*.whl
    ;;
  run)
    # From outside the source tree, so that only the installed package is importable.
    cd /
    exec "$venv/bin/python" "$here/conformance/runner.py" "$2"
    ;;
  *) echo "usage: $0 build | run SCENARIO.json" >&2; exit 2 ;;
esac
