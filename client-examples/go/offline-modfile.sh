#!/usr/bin/env bash
# Writes a CI-only copy of a go.mod that builds offline against Debian's Go sources
# (/usr/share/gocode/src, from golang-google-grpc-dev, golang-google-protobuf-dev, …):
# the same requirements plus a `replace` of every module of the build graph by its Debian
# directory, or by an empty stub module when Debian has none (the graph names modules such as
# github.com/envoyproxy/go-control-plane whose packages the build never imports, and without a
# module proxy the go command must still read their go.mod).
#
#   offline-modfile.sh GO_MOD OUT_DIR   writes OUT_DIR/go.mod (and OUT_DIR/stubs/…)
#
# Use it with GOFLAGS="-mod=mod -modfile=OUT_DIR/go.mod" GOPROXY=off: the user-facing go.mod
# is never touched (the go command writes OUT_DIR/go.mod and OUT_DIR/go.sum instead).
set -euo pipefail
src_mod=$1
out=$(mkdir -p "$2" && cd "$2" && pwd)
gocode=${GOCODE:-/usr/share/gocode/src}

rm -rf "$out/stubs"
# Written, not copied: a copy of a read-only checkout's go.mod would be read-only too, and the
# go command writes the modfile it is given.
cat "$src_mod" >"$out/go.mod"
rm -f "$out/go.sum"

# requires GO_MOD: the module paths GO_MOD requires, one a line.
requires() { go mod edit -json "$1" | jq -r '.Require // [] | .[].Path'; }
# module_of GO_MOD: the module path GO_MOD declares.
module_of() { go mod edit -json "$1" | jq -r '.Module.Path'; }

self=$(module_of "$src_mod")
declare -A seen=(["$self"]=1)
queue=()
while read -r m; do queue+=("$m"); done < <(requires "$src_mod")
# Modules replaced already by GO_MOD keep their replacement (for example the helper module in
# a user's go.mod); the requirements of one replaced by a directory are followed.
src_dir=$(cd "$(dirname "$src_mod")" && pwd)
while IFS=$'\t' read -r m dir; do
  seen["$m"]=1
  [[ -z $dir ]] && continue
  [[ $dir == /* ]] || dir="$src_dir/$dir"
  while read -r r; do queue+=("$r"); done < <(requires "$dir/go.mod")
done < <(go mod edit -json "$src_mod" |
  jq -r '.Replace // [] | .[] | [.Old.Path, (if .New.Version then "" else .New.Path end)] | @tsv')

replaces=()
declare -A debian_dir=()
while ((${#queue[@]})); do
  m=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n ${seen[$m]:-} ]] && continue
  seen["$m"]=1
  dir="$gocode/$m"
  if [[ -f $dir/go.mod && $(module_of "$dir/go.mod") == "$m" ]]; then
    replaces+=("-replace=$m=$dir")
    debian_dir["$m"]=$dir
    while read -r r; do queue+=("$r"); done < <(requires "$dir/go.mod")
  elif [[ -d $dir ]]; then
    # Debian's sources without a go.mod: the same files, under a go.mod of that path.
    stub="$out/stubs/$m"
    mkdir -p "$stub"
    for f in "$dir"/*; do ln -s "$f" "$stub/"; done
    printf 'module %s\n' "$m" >"$stub/go.mod"
    replaces+=("-replace=$m=$stub")
  else
    stub="$out/stubs/$m"
    mkdir -p "$stub"
    printf 'module %s\n' "$m" >"$stub/go.mod"
    replaces+=("-replace=$m=$stub")
  fi
done
# A module whose Debian directory also holds another module of the graph without a go.mod of
# its own (Debian's go.opentelemetry.io/otel holds otel/trace, a module of its own upstream):
# the package would be in both. Such a module gets a stub of links to its directory's files
# without that subdirectory (the inner module's stub, with its go.mod, sits there instead).
for m in "${!debian_dir[@]}"; do
  dir=${debian_dir[$m]}
  inner=()
  for m2 in "${!seen[@]}"; do
    [[ $m2 == "$m"/* && ! -f $dir/${m2#"$m"/}/go.mod ]] && inner+=("${m2#"$m"/}")
  done
  ((${#inner[@]})) || continue
  stub="$out/stubs/$m"
  mkdir -p "$stub"
  for f in "$dir"/*; do
    name=${f##*/}
    [[ -e $stub/$name ]] && continue
    skip=no
    for i in "${inner[@]}"; do [[ ${i%%/*} == "$name" ]] && skip=yes; done
    [[ $skip == yes ]] || ln -s "$f" "$stub/"
  done
  for i in "${inner[@]}"; do
    # An inner module deeper down: link the levels between.
    [[ $i == */* ]] || continue
    echo "offline-modfile.sh: $m holds $i below a subdirectory: not handled" >&2
    exit 1
  done
  replaces+=("-replace=$m=$stub")
done
((${#replaces[@]} == 0)) || go mod edit "${replaces[@]}" "$out/go.mod"
# A relative replacement of GO_MOD is relative to its directory, not to OUT_DIR.
while read -r m dir; do
  go mod edit -replace="$m=$src_dir/$dir" "$out/go.mod"
done < <(go mod edit -json "$src_mod" |
  jq -r '.Replace // [] | .[] | select(.New.Version == null and (.New.Path | startswith("/") | not)) | "\(.Old.Path) \(.New.Path)"')
