#!/usr/bin/env bash
# The conformance runner of the Python client (see ../conformance/README.md).
#
#   conformance.sh build            builds the wheel and installs it into .conformance-venv
#   conformance.sh run SCENARIO     runs conformance/runner.py on the installed package
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.conformance-venv"
case ${1:-} in
  build)
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    rm -rf "$here/build" "$here/dist-conformance"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check wheel
    "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
      -w "$here/dist-conformance" "$here"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
      "$here"/dist-conformance/window_sidecar_client-*.whl
    rm -rf "$here/dist-conformance"
    ;;
  run)
    # From outside the source tree, so that only the installed package is importable.
    cd /
    exec "$venv/bin/python" "$here/conformance/runner.py" "$2"
    ;;
  *) echo "usage: $0 build | run SCENARIO.json" >&2; exit 2 ;;
esac
