#!/usr/bin/env bash
# The conformance runner of the Node client (see ../conformance/README.md).
#
#   conformance.sh build            the package's tarball (pack.sh), installed into a scratch project
#                                   in the build directory (../build-dir.sh: outside the
#                                   checkout), where conformance/runner.ts is compiled (tsc,
#                                   strict) against the installed package
#   conformance.sh run SCENARIO     runs the compiled runner on the installed package
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../build-dir.sh
source "$here/../build-dir.sh"
app="$(build_dir node-conformance)"
case ${1:-} in
  build)
    cd "$here"
    [[ -e node_modules/.bin/tsc && -e node_modules/.bin/buf && -e node_modules/@grpc/grpc-js/package.json ]] ||
      npm ci --no-audit --no-fund --loglevel=error
    rm -rf "$app"
    mkdir -p "$app/src"
    # pack.sh builds in a temporary copy (buf generate + tsc + the ESM wrapper): the tarball a
    # user installs.
    tarball="$(bash "$here/pack.sh" "$app" | tail -1)"
    cp conformance/runner.ts "$app/src/"
    ts_version="$(node -p "require('./node_modules/typescript/package.json').version")"
    types_version="$(node -p "require('./node_modules/@types/node/package.json').version")"
    cat >"$app/package.json" <<JSON
{
  "name": "window-sidecar-conformance-node",
  "version": "1.0.0",
  "private": true,
  "dependencies": { "@window-sidecar/client": "file:$tarball" },
  "devDependencies": { "typescript": "$ts_version", "@types/node": "$types_version" }
}
JSON
    cat >"$app/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "target": "ES2022", "module": "commonjs", "moduleResolution": "node", "types": ["node"],
    "strict": true, "esModuleInterop": true, "rootDir": "src", "outDir": "dist"
  },
  "include": ["src/*.ts"]
}
JSON
    cd "$app"
    npm install --no-audit --no-fund --prefer-offline --loglevel=error
    node_modules/.bin/tsc -p tsconfig.json
    ;;
  run)
    # From the scratch project: only the installed package resolves.
    scenario="$(realpath "$2")"
    cd "$app"
    exec node dist/runner.js "$scenario"
    ;;
  *) echo "usage: $0 build | run SCENARIO.json" >&2; exit 2 ;;
esac
