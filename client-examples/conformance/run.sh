#!/usr/bin/env bash
# The conformance suite's driver: every scenario of scenarios/*.json against a real
# redis-server and a real sidecar, its worker side played by one language's runner
# (client-examples/<lang>/conformance.sh). See README.md beside this script.
#
#   run.sh LANG... [SCENARIO...]     LANG: python, node, go, java or all (one or more)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../e2e-lib.sh
source "$here/../e2e-lib.sh"

(($# >= 1)) || { echo "usage: $0 python|node|go|java|all... [SCENARIO...]" >&2; exit 2; }
langs=()
while (($#)); do
  case $1 in
    all) langs+=(python node go java) ;;
    python | node | go | java) langs+=("$1") ;;
    *) break ;;
  esac
  shift
done
((${#langs[@]})) || { echo "usage: $0 python|node|go|java|all... [SCENARIO...]" >&2; exit 2; }
if (($#)); then
  scenarios=()
  for name in "$@"; do scenarios+=("$here/scenarios/$name.json"); done
else
  scenarios=("$here"/scenarios/*.json)
fi

need_cmd jq jq
need_cmd redis-server redis-server
need_cmd openssl openssl
install_missing
ensure_sidecar
e2e_init conformance
start_redis

# One CA for the run: the sidecar's certificate (for 127.0.0.1 and localhost) and a client's.
make_tls() {
  local d="$work/tls"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=conformance-ca \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
    -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=conformance-client \
    -keyout "$d/client.key" -out "$d/client.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
  openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/client.ext" -out "$d/client.pem" 2>/dev/null
}
make_tls
printf 'conformance-%s%s\n' "$RANDOM" "$RANDOM" >"$work/token"

# runner_tls FILE: whether the runner is given the run's CA and client certificate
# (WINDOW_SIDECAR_TLS_*): `sidecar.runner_tls` when the scenario says, else `sidecar.tls`, so that
# a scenario can have the runner speak plaintext to a TLS sidecar or TLS to a plaintext one.
runner_tls() {
  jq -r 'if (.sidecar // {}) | has("runner_tls") then .sidecar.runner_tls
         else .sidecar.tls // false end' "$1"
}
# tls_env: the runner's TLS environment, as NAME=VALUE words.
tls_env() {
  printf '%s\n' WINDOW_SIDECAR_TLS_CA="$work/tls/ca.pem" \
    WINDOW_SIDECAR_TLS_CERT="$work/tls/client.pem" WINDOW_SIDECAR_TLS_KEY="$work/tls/client.key"
}

# scenario_sidecar SCENARIO N: starts the scenario's sidecar (on $conf_listen, chosen by the
# caller) as the scenario's `sidecar` says, logging to $work/<scenario>-sidecar-N.log; sets
# $conf_pid and waits until it listens.
scenario_sidecar() {
  local file=$1 n=$2 name i extra=()
  name="$(jq -r .name "$file")"
  mapfile -t extra < <(jq -r '.sidecar.args // [] | .[]' "$file")
  if [[ $(jq -r '.sidecar.token // false' "$file") == true ]]; then
    extra+=(--auth-token-file "$work/token")
  fi
  if [[ $(jq -r '.sidecar.tls // false' "$file") == true ]]; then
    extra+=(--tls-cert "$work/tls/server.pem" --tls-key "$work/tls/server.key"
      --tls-client-ca "$work/tls/ca.pem")
  fi
  # The suite's defaults, unless the scenario gives the flag itself.
  local flag value defaults=(--promote-interval 100ms --reclaim-interval 500ms --shutdown-grace 2s)
  for ((i = 0; i < ${#defaults[@]}; i += 2)); do
    flag=${defaults[i]} value=${defaults[i + 1]}
    printf '%s\n' "${extra[@]}" | grep -qx -- "$flag" || extra+=("$flag" "$value")
  done
  # `listen: metrics`: the metrics port the runner is pointed at; `redis: down`: a Redis URL
  # nothing answers at, as when Redis is down.
  [[ -n ${conf_metrics:-} ]] && extra+=(--metrics-listen "$conf_metrics")
  local redis_url="redis://127.0.0.1:$redis_port"
  [[ $(jq -r '.sidecar.redis // "up"' "$file") == down ]] && redis_url="redis://127.0.0.1:$(free_port)"
  "$sidecar_bin" --listen "$conf_listen" --redis-url "$redis_url" \
    "${extra[@]}" >"$work/$name-sidecar-$n.log" 2>&1 &
  conf_pid=$!
  pids+=("$conf_pid")
  if [[ $conf_listen == unix:* ]]; then
    wait_for "the sidecar on $conf_listen" test -S "${conf_listen#unix:}"
  else
    wait_for "the sidecar on $conf_listen" tcp_open "${conf_listen##*:}"
  fi
}

# events OUT: the runner's JSON lines as one array (lines that are not JSON objects skipped).
events() { jq -cs '[.[] | objects]' <(jq -cR 'fromjson? // empty' "$1"); }

# expects KIND: whether the scenario has an `expect.KIND` ($expect_kinds, set by expectations).
# The checks of a kind it does not have start no jq: expectations runs every 0.2 s while a
# scenario waits, and each jq process costs about as much CPU as a runner's delivery.
expects() { [[ $expect_kinds == *" $1 "* ]]; }

# expectations FILE OUT: prints one line per expectation, "NAME<TAB>GOT<TAB>WANT".
expectations() {
  local file=$1 out=$2 seen key form p e want got cmd expect_kinds
  # The side effects first: while a scenario runs they are what holds last, and all_hold stops
  # at the first line that does not hold.
  want="$(jq -cS '.expect.effects // {}' "$file")"
  got="$(rcli hgetall "$(jq -r .effects "$file")" | paste - - |
    jq -cSRn '[inputs | split("\t") | select(.[0] != "") | {(.[0]): (.[1] | tonumber)}] | add // {}')"
  printf 'side effects (HGETALL)\t%s\t%s\n' "$got" "$want"
  expect_kinds=" $(jq -r '.expect // {} | keys | join(" ")' "$file") "
  seen="$(events "$out")"
  key="$(jq -r .open.key "$file")"
  form="$(jq -r .open.form "$file")"
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -c --arg p "$p" '.expect.deliveries[$p]' "$file")"
    got="$(jq -c --arg p "$p" '[.[] | select(.event == "delivery" and .payload == $p) | .count]' <<<"$seen")"
    printf 'delivery counts of %s\t%s\t%s\n' "$p" "$got" "$want"
  done < <(expects deliveries && jq -r '.expect.deliveries // {} | keys[]' "$file")
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -c --arg p "$p" '.expect.partitions[$p]' "$file")"
    got="$(jq -c --arg p "$p" '[.[] | select(.event == "delivery" and .payload == $p) | .partition] | unique' <<<"$seen")"
    printf 'partitions %s came from\t%s\t%s\n' "$p" "$got" "[$want]"
  done < <(expects partitions && jq -r '.expect.partitions // {} | keys[]' "$file")
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -c --arg p "$p" '.expect.headers[$p]' "$file")"
    got="$(jq -c --arg p "$p" --argjson w "$want" \
      'first(.[] | select(.event == "delivery" and .payload == $p) | .headers // {}) // {}
       | with_entries(select(.key as $k | $w | has($k)))' <<<"$seen")"
    printf 'headers of %s\t%s\t%s\n' "$p" "$(jq -cS . <<<"$got")" "$(jq -cS . <<<"$want")"
  done < <(expects headers && jq -r '.expect.headers // {} | keys[]' "$file")
  while read -r e; do
    [[ -n $e ]] || continue
    got="$(jq -r --arg e "$e" 'any(.[]; .event == $e)' <<<"$seen")"
    printf 'event %s\t%s\ttrue\n' "$e" "$got"
  done < <(expects events && jq -r '.expect.events // [] | .[]' "$file")
  # The fields of an entry without the payload layout, by its `id` field (among the first
  # delivery's fields, as for headers).
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -c --arg p "$p" '.expect.fields[$p]' "$file")"
    got="$(jq -c --arg p "$p" --argjson w "$want" \
      'first(.[] | select(.event == "delivery" and .payload == $p) | .fields // {}) // {}
       | with_entries(select(.key as $k | $w | has($k)))' <<<"$seen")"
    printf 'fields of %s\t%s\t%s\n' "$p" "$(jq -cS . <<<"$got")" "$(jq -cS . <<<"$want")"
  done < <(expects fields && jq -r '.expect.fields // {} | keys[]' "$file")
  # json() of such an entry failed, its message naming what to use instead.
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -r --arg p "$p" '.expect.json_errors[$p]' "$file")"
    got="$(jq -r --arg p "$p" --arg w "$want" \
      'first(.[] | select(.event == "delivery" and .payload == $p) | .json_error // "")
       // "" | ascii_downcase | contains($w | ascii_downcase)' <<<"$seen")"
    printf 'json() of %s fails naming %s\t%s\ttrue\n' "$p" "$want" "$got"
  done < <(expects json_errors && jq -r '.expect.json_errors // {} | keys[]' "$file")
  # A call of the typed command API failed in the handler, naming the misspelled command.
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -r --arg p "$p" '.expect.call_errors[$p]' "$file")"
    got="$(jq -r --arg p "$p" --arg w "$want" \
      'any(.[]; .event == "call_error" and .payload == $p
        and ((.message // "") | ascii_downcase | contains($w | ascii_downcase)))' <<<"$seen")"
    printf 'the call failed at once for %s, naming %s\t%s\ttrue\n' "$p" "$want" "$got"
  done < <(expects call_errors && jq -r '.expect.call_errors // {} | keys[]' "$file")
  # The error callback got a RejectedError with this reason for this delivery.
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -r --arg p "$p" '.expect.rejected[$p]' "$file")"
    got="$(jq -r --arg p "$p" \
      '[.[] | select(.event == "rejected" and .payload == $p and .error == "RejectedError")
        | .reason] | unique | join(",")' <<<"$seen")"
    printf 'RejectedError reasons of %s\t%s\t%s\n' "$p" "$got" "$want"
  done < <(expects rejected && jq -r '.expect.rejected // {} | keys[]' "$file")
  # The error callback got a SideEffectError for this delivery: the command Redis failed,
  # whether the entry was settled all the same, and a text its message contains.
  while read -r p; do
    [[ -n $p ]] || continue
    e="$(jq -c --arg p "$p" '.expect.side_effect_errors[$p]' "$file")"
    want="$(jq -r '"\(.command | ascii_upcase) settled=\(.settled)"' <<<"$e")"
    got="$(jq -r --arg p "$p" \
      '[.[] | select(.event == "side_effect_error" and .payload == $p and .error == "SideEffectError")
        | "\(.command | ascii_upcase) settled=\(.settled)"] | unique | join(",")' <<<"$seen")"
    printf 'SideEffectError of %s\t%s\t%s\n' "$p" "$got" "$want"
    want="$(jq -r '.contains // ""' <<<"$e")"
    got="$(jq -r --arg p "$p" --arg w "$want" \
      'any(.[]; .event == "side_effect_error" and .payload == $p
        and ((.message // "") | ascii_downcase | contains($w | ascii_downcase)))' <<<"$seen")"
    printf 'SideEffectError of %s says "%s"\t%s\ttrue\n' "$p" "$want" "$got"
  done < <(expects side_effect_errors && jq -r '.expect.side_effect_errors // {} | keys[]' "$file")
  # The error callback got a RequeueRefusedError for this delivery, its message containing
  # this text (Redis's error).
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -r --arg p "$p" '.expect.requeue_refused[$p]' "$file")"
    got="$(jq -r --arg p "$p" --arg w "$want" \
      'any(.[]; .event == "requeue_refused" and .payload == $p and .error == "RequeueRefusedError"
        and ((.message // "") | ascii_downcase | contains($w | ascii_downcase)))' <<<"$seen")"
    printf 'RequeueRefusedError of %s says "%s"\t%s\ttrue\n' "$p" "$want" "$got"
  done < <(expects requeue_refused && jq -r '.expect.requeue_refused // {} | keys[]' "$file")
  # Text that must appear nowhere in what the runner printed (stdout and stderr).
  while read -r e; do
    [[ -n $e ]] || continue
    got="$(cat "$out" "${out%.jsonl}.log" 2>/dev/null | grep -ciF -- "$e" || true)"
    printf 'lines saying "%s"\t%s\t0\n' "$e" "$got"
  done < <(expects not_logged && jq -r '.expect.not_logged // [] | .[]' "$file")
  # The errors of calls that failed: the library's class, the message's parts ($ADDR: the
  # address the runner was given), how long the call took.
  while read -r e; do
    [[ -n $e ]] || continue
    local call cls within ok
    call="$(jq -r .call <<<"$e")"
    cls="$(jq -r .error <<<"$e")"
    within="$(jq -r '.within_ms // 30000' <<<"$e")"
    got="$(jq -c --arg c "$call" 'first(.[] | select(.event == "error" and .call == $c)) // null' <<<"$seen")"
    printf '%s fails with %s\t%s\t%s\n' "$call" "$cls" "$(jq -r '.error // "no error"' <<<"$got")" "$cls"
    ok="$(jq -r --arg a "$conf_addr" --argjson e "$e" \
      '(.message // "") | ascii_downcase as $m
       | [$e.contains[] | sub("\\$ADDR"; $a) | ascii_downcase | select(($m | contains(.)) | not)]
       | join(", ")' <<<"$got")"
    printf '%s error names %s\t%s\t\n' "$call" "$(jq -r '.contains | join(" and ")' <<<"$e")" \
      "${ok:+missing: $ok in: $(jq -r '.message // ""' <<<"$got")}"
    printf '%s fails within %s ms\t%s\ttrue\n' "$call" "$within" \
      "$(jq -r --argjson w "$within" '(.elapsed_ms // 1e9) <= $w' <<<"$got")"
  done < <(expects errors && jq -c '.expect.errors // [] | .[]' "$file")
  # Replicas (`open.consumers`): each named consumer got some of the deliveries.
  while read -r c; do
    [[ -n $c ]] || continue
    got="$(jq -r --arg c "$c" '[.[] | select(.event == "delivery" and .consumer == $c)] | length > 0' <<<"$seen")"
    printf 'consumer %s got deliveries\t%s\ttrue\n' "$c" "$got"
  done < <(expects consumers_served && jq -r '.expect.consumers_served // [] | .[]' "$file")
  # Ordering keys: each key's deliveries in order (by the header that carries the key), at
  # most one delivery of a key out at a time (between its delivery line and its settle line no
  # other delivery of that key), and the deliveries that came before a held one was settled.
  local oh
  oh="$(if expects order; then jq -r '.expect.order.header // empty' "$file"; fi)"
  if [[ -n $oh ]]; then
    while read -r p; do
      [[ -n $p ]] || continue
      want="$(jq -c --arg p "$p" '.expect.order.keys[$p]' "$file")"
      got="$(jq -c --arg h "$oh" --arg p "$p" \
        '[.[] | select(.event == "delivery" and (.headers // {})[$h] == $p) | .payload]' <<<"$seen")"
      printf 'deliveries of key %s, in order\t%s\t%s\n' "$p" "$got" "$want"
    done < <(expects order && jq -r '.expect.order.keys // {} | keys[]' "$file")
    got="$(jq -r --arg h "$oh" '
      reduce (.[] | select(.event == "delivery" or .event == "settle")) as $e
        ({out: {}, key: {}, bad: []};
         if $e.event == "delivery" then
           (($e.headers // {})[$h] // "") as $k
           | .key[$e.payload] = $k
           | if $k == "" then .
             elif (.out[$k] // null) != null then
               .bad += ["\($e.payload) while \(.out[$k]) was out"]
             else .out[$k] = $e.payload end
         else
           (.key[$e.payload] // "") as $k
           | if $k != "" and .out[$k] == $e.payload then .out[$k] = null else . end
         end)
      | if .bad == [] then "true" else .bad | join("; ") end' <<<"$seen")"
    printf 'at most one delivery of each key out at a time\t%s\ttrue\n' "$got"
  fi
  while read -r p; do
    [[ -n $p ]] || continue
    want="$(jq -c --arg p "$p" '.expect.while_held[$p] | sort' "$file")"
    # Before the held delivery's settle line: not held up behind it. (Deliveries of one read
    # are printed by concurrent handlers, so one may come out before the held one's line.)
    got="$(jq -c --arg p "$p" --argjson w "$want" '
      (to_entries | map(select(.value.event == "settle" and .value.payload == $p)) | first | .key) as $to
      | if $to == null then "\($p) never settled"
        else [.[:$to][] | select(.event == "delivery") | .payload
              | select(. as $x | $w | index($x))] | unique end' <<<"$seen")"
    printf 'delivered before the held %s was settled\t%s\t%s\n' "$p" "$got" "$want"
  done < <(expects while_held && jq -r '.expect.while_held // {} | keys[]' "$file")
  while read -r e; do
    [[ -n $e ]] || continue
    mapfile -t cmd < <(jq -r '.command[]' <<<"$e")
    got="$(rcli "${cmd[@]}" | paste -sd' ')"
    printf '%s\t%s\t%s\n' "${cmd[*]}" "$got" "$(jq -r .reply <<<"$e")"
  done < <(expects redis && jq -c '.expect.redis // [] | .[]' "$file")
  # The drained sidecar exited within this long of its SIGTERM (fault `drain_sidecar`).
  want="$(if expects drained_within_ms; then jq -r '.expect.drained_within_ms // empty' "$file"; fi)"
  if [[ -n $want ]]; then
    got="never drained"
    [[ -n ${conf_drained_ms:-} ]] && got="$conf_drained_ms ms"
    [[ -n ${conf_drained_ms:-} ]] && ((conf_drained_ms <= want)) && got=true
    printf 'the drained sidecar exited within %s ms\t%s\ttrue\n' "$want" "$got"
  fi
  # Nothing left unsettled, whatever the scenario expects besides (when the runner consumed).
  expects errors && [[ $(jq -r '.expect.errors | length' "$file") != 0 ]] && return 0
  partitions="$(jq -r '.open.partitions // 0' "$file")"
  if ((partitions > 0)); then
    # A partitioned stream: each partition `key:{n}` is a stream of its own, whose companion
    # keys share its hash tag.
    for ((n = 0; n < partitions; n++)); do
      printf 'ZCARD %s:{%s}:window:delayed\t%s\t0\n' "$key" "$n" "$(rcli zcard "$key:{$n}:window:delayed")"
      printf 'XPENDING %s:{%s}\t%s\t0\n' "$key" "$n" \
        "$(rcli xpending "$key:{$n}" "$(jq -r .open.group "$file")" | head -1)"
    done
    return 0
  fi
  printf 'ZCARD {%s}:window:delayed\t%s\t0\n' "$key" "$(rcli zcard "{$key}:window:delayed")"
  case $form in
    stream)
      printf 'XPENDING %s\t%s\t0\n' "$key" \
        "$(rcli xpending "$key" "$(jq -r .open.group "$file")" | head -1)"
      ;;
    reliable_list)
      got=0
      while read -r p; do
        [[ -n $p ]] && got=$((got + $(rcli llen "$p")))
      done < <(rcli --scan --pattern "{$key}:window:processing:*")
      printf 'entries in the processing lists of %s\t%s\t0\n' "$key" "$got"
      ;;
  esac
}

# all_hold FILE OUT: whether every expectation holds now. It stops at the first that does not,
# which cuts the checks left off (their next line ends the subshell with SIGPIPE).
all_hold() {
  expectations "$1" "$2" | awk -F'\t' '$2 != $3 { exit 1 }'
}

# wait_published OUT RUNNER_PID: waits (20 s at the most) for the runner's "published" line;
# fails when it never comes or the runner exits first.
wait_published() {
  wait_event "$1" "$2" published
}

# wait_event OUT RUNNER EVENT: waits (up to 20 s) until the runner's output has a line of
# EVENT; fails when the runner is gone first.
wait_event() {
  for _ in $(seq 200); do
    grep -q "\"event\" *: *\"$3\"" "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# fault FILE N: the scenario's fault on the running sidecar ($conf_pid), and a new one on the
# same address.
fault() {
  local file=$1 kind old=$conf_pid
  kind="$(jq -r .fault.kind "$file")"
  case $kind in
    kill_sidecar)
      kill -KILL "$old"
      wait "$old" 2>/dev/null || true
      sleep 0.3
      ;;
    drain_sidecar)
      # How long the drain took, SIGTERM to exit (`expect.drained_within_ms`).
      local began
      began=$(date +%s%3N)
      kill -TERM "$old"
      wait "$old" 2>/dev/null || true
      conf_drained_ms=$(($(date +%s%3N) - began))
      ;;
    *) echo "unknown fault $kind" >&2; return 1 ;;
  esac
  [[ $conf_listen == unix:* ]] && rm -f "${conf_listen#unix:}"
  scenario_sidecar "$file" 2 || fail "$(jq -r .name "$file"): the sidecar starts again after the fault"
}

# run_scenario LANG FILE: one scenario, its checks counted as "LANG/NAME: …".
run_scenario() {
  local lang=$1 file=$2 name out err runner status stopped at_ms
  name="$(jq -r .name "$file")"
  out="$work/$lang-$name.jsonl"
  err="$work/$lang-$name.log"
  rcli flushall >/dev/null
  conf_drained_ms=""
  # What Redis holds before the scenario starts (a key of the wrong type, a non-integer).
  local line words
  while read -r line; do
    [[ -n $line ]] || continue
    mapfile -t words < <(jq -r '.[]' <<<"$line")
    rcli "${words[@]}" >/dev/null
  done < <(jq -c '.setup // [] | .[]' "$file")
  local listen
  listen="$(jq -r '.sidecar.listen // "tcp"' "$file")"
  if [[ $listen == unix ]]; then
    conf_listen="unix:$work/$name.sock"
    rm -f "$work/$name.sock"
  else
    conf_listen="127.0.0.1:$(free_port)"
  fi
  conf_addr=$conf_listen conf_metrics=""
  case $listen in
    closed) ;;
    redis) conf_addr="127.0.0.1:$redis_port" ;;
    url) conf_addr="http://$conf_listen" ;;
    metrics) conf_metrics="127.0.0.1:$(free_port)" conf_addr=$conf_metrics ;;
  esac
  if [[ $(jq -r '.expect.errors // [] | length' "$file") != 0 ]]; then
    run_error_scenario "$lang" "$file"
    return
  fi
  if ! scenario_sidecar "$file" 1; then
    fail "$lang/$name: the sidecar starts ($(tail -n 3 "$work/$name-sidecar-1.log" | paste -sd' '))"
    return
  fi
  local env=(WINDOW_SIDECAR_ADDR="$conf_listen")
  [[ $(jq -r '.sidecar.token // false' "$file") == true ]] &&
    env+=(WINDOW_SIDECAR_TOKEN="$(cat "$work/token")")
  [[ $(runner_tls "$file") == true ]] && mapfile -t -O "${#env[@]}" env < <(tls_env)
  env "${env[@]}" bash "$root/client-examples/$lang/conformance.sh" run "$file" >"$out" 2>"$err" &
  runner=$!
  pids+=("$runner")
  if ! wait_published "$out" "$runner"; then
    fail "$lang/$name: the runner opened its subscription and published"
  else
    # Entries another producer wrote with plain fields (not the payload layout).
    local xkey fv
    xkey="$(jq -r .open.key "$file")"
    while read -r e; do
      [[ -n $e ]] || continue
      mapfile -t fv < <(jq -r 'to_entries[] | .key, .value' <<<"$e")
      rcli xadd "$xkey" '*' "${fv[@]}" >/dev/null
    done < <(jq -c '.xadd // [] | .[]' "$file")
    if [[ $(jq -r '.fault // empty' "$file") != "" ]]; then
      # A fault meant to land while the runner handles a delivery waits for its first one,
      # however long a loaded machine takes to hand it over.
      if [[ $(jq -r '.fault.after // empty' "$file") == delivery ]] &&
        ! wait_event "$out" "$runner" delivery; then
        fail "$lang/$name: the runner got a delivery before the fault"
      fi
      at_ms="$(jq -r .fault.at_ms "$file")"
      sleep "$(awk -v ms="$at_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
      fault "$file"
    fi
    local deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
      all_hold "$file" "$out" && break
      kill -0 "$runner" 2>/dev/null || break
      sleep 0.2
    done
  fi
  # Stopped the way an orchestrator stops a worker; it must go within 10 s and exit 0.
  kill -TERM "$runner" 2>/dev/null || true
  stopped=no
  for _ in $(seq 100); do
    if ! kill -0 "$runner" 2>/dev/null; then stopped=yes; break; fi
    sleep 0.1
  done
  [[ $stopped == yes ]] || kill -KILL "$runner" 2>/dev/null || true
  status=0
  wait "$runner" 2>/dev/null || status=$?
  check "$lang/$name: the runner exited 0 within 10 s of SIGTERM" "$stopped:$status" "yes:0"
  while IFS=$'\t' read -r what got want; do
    check "$lang/$name: $what" "$got" "$want"
  done < <(expectations "$file" "$out")
  kill -TERM "$conf_pid" 2>/dev/null || true
  wait "$conf_pid" 2>/dev/null || true
}

# run_error_scenario LANG FILE: a scenario whose calls fail (`expect.errors`): the runner is
# given an address where no sidecar answers ($conf_addr: nothing at all with `listen: closed`,
# Redis's own port with `redis`, the sidecar's metrics port with `metrics`, a URL with `url`),
# a sidecar whose Redis is down (`redis: down`) or holds its writes (`redis: paused`), or one
# that speaks TLS when the runner does not or the reverse (`tls`, `runner_tls`); never the
# sidecar's token. It must exit 0 by itself within 60 s; then the expectations are checked.
run_error_scenario() {
  local lang=$1 file=$2 name out err runner status stopped listen paused=no env
  name="$(jq -r .name "$file")"
  out="$work/$lang-$name.jsonl"
  err="$work/$lang-$name.log"
  listen="$(jq -r '.sidecar.listen // "tcp"' "$file")"
  conf_pid=""
  if [[ $listen == tcp || $listen == metrics ]]; then
    if ! scenario_sidecar "$file" 1; then
      fail "$lang/$name: the sidecar starts ($(tail -n 3 "$work/$name-sidecar-1.log" | paste -sd' '))"
      return
    fi
    [[ $listen == metrics ]] && wait_for "the metrics port $conf_metrics" tcp_open "${conf_metrics##*:}"
  fi
  # `redis: paused`: Redis holds every write (the sidecar's publish among them) until the
  # runner has exited; reads and new connections still go through. 30 s bounds it should
  # run.sh itself be stopped before it unpauses.
  if [[ $(jq -r '.sidecar.redis // "up"' "$file") == paused ]]; then
    rcli client pause 30000 WRITE >/dev/null
    paused=yes
  fi
  env=(WINDOW_SIDECAR_ADDR="$conf_addr")
  [[ $(runner_tls "$file") == true ]] && mapfile -t -O "${#env[@]}" env < <(tls_env)
  env "${env[@]}" bash "$root/client-examples/$lang/conformance.sh" run "$file" >"$out" 2>"$err" &
  runner=$!
  pids+=("$runner")
  stopped=no
  for _ in $(seq 600); do
    if ! kill -0 "$runner" 2>/dev/null; then stopped=yes; break; fi
    sleep 0.1
  done
  [[ $stopped == yes ]] || kill -KILL "$runner" 2>/dev/null || true
  status=0
  wait "$runner" 2>/dev/null || status=$?
  [[ $paused == yes ]] && rcli client unpause >/dev/null
  check "$lang/$name: the runner exited 0 by itself within 60 s" "$stopped:$status" "yes:0"
  while IFS=$'\t' read -r what got want; do
    check "$lang/$name: $what" "$got" "$want"
  done < <(expectations "$file" "$out")
  if [[ -n $conf_pid ]]; then
    kill -TERM "$conf_pid" 2>/dev/null || true
    wait "$conf_pid" 2>/dev/null || true
  fi
}

for lang in "${langs[@]}"; do
  log "$lang: building its runner"
  if ! bash "$root/client-examples/$lang/conformance.sh" build >"$work/$lang-build.log" 2>&1; then
    fail "$lang: the runner builds (see $lang-build.log)"
    tail -n 30 "$work/$lang-build.log"
    continue
  fi
  for file in "${scenarios[@]}"; do
    log "$lang: $(jq -r .name "$file")"
    run_scenario "$lang" "$file"
  done
done
e2e_summary
