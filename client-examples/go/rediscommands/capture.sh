#!/usr/bin/env bash
# Captures Redis's own command specification from a real redis-server into the JSON file the
# typed side-effect methods are generated from (see ../internal/gencommands): the replies of
# COMMAND DOCS (every command's arguments, their types, tokens and flags) and COMMAND INFO
# (whether a command writes, blocks, …), as redis-cli --json prints them with RESP3, beside the
# server's version:
#
#   {"redis_version": "7.0.15", "command_docs": {...}, "command_info": [...]}
#
#   capture.sh [REDIS_SERVER]   writes redis-<version>.json here; REDIS_SERVER defaults to
#                               the redis-server on PATH
#
# It is run by hand when moving to another Redis version (then `go generate ./window` and the
# Java client's generate-commands.sh); the captured file is committed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
server=${1:-redis-server}
port=$((20000 + RANDOM % 10000))
dir=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$server" --port "$port" --save '' --appendonly no --dir "$dir" --daemonize yes \
  --logfile "$dir/redis.log" --pidfile "$dir/redis.pid"
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
version=$(redis-cli -p "$port" info server | sed -nE 's/^redis_version:([^\r]*)\r?$/\1/p')
redis-cli -p "$port" -3 --json COMMAND DOCS >"$dir/docs.json"
redis-cli -p "$port" -3 --json COMMAND INFO >"$dir/info.json"
jq -S -n --arg v "$version" --slurpfile docs "$dir/docs.json" --slurpfile info "$dir/info.json" \
  '{redis_version: $v, command_docs: $docs[0], command_info: ($info[0] | sort_by(.[0]))}' \
  >"$here/redis-$version.json"
echo "wrote $here/redis-$version.json"
