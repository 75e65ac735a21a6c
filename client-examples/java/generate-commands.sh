#!/usr/bin/env bash
# Regenerates src/main/java/dev/windowsidecar/client/RedisCommands.java, the typed command API,
# from Redis's own command specification (../go/rediscommands/redis-<version>.json, the COMMAND
# DOCS and COMMAND INFO replies of a real redis-server) with the generator the Go client shares
# (../go/internal/gencommands, standard library only: any Go toolchain runs it, no module needed).
#
#   generate-commands.sh [OUT]   writes OUT instead of the checked-in file (run-e2e.sh compares)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gen="$here/../go/internal/gencommands"
spec="$here/../go/rediscommands/redis-7.0.15.json"
out="${1:-$here/src/main/java/dev/windowsidecar/client/RedisCommands.java}"
command -v go >/dev/null || { echo "generate-commands.sh: go is needed (Debian: golang-go)" >&2; exit 1; }
GO111MODULE=off GOFLAGS='' go run "$gen/main.go" "$gen/java.go" -spec "$spec" -lang java -out "$out"
