#!/usr/bin/env python3
"""Checks on manifests rendered by `helm template`, for run.sh.

Subcommands (each exits 0 when its check passes, 1 when it fails, 2 on bad usage):

  split RENDERED BUILTIN_OUT CUSTOM_OUT
      Splits a rendered stream into built-in Kubernetes kinds (for kubernetes-validate) and
      custom resources (CRD kinds, which kubernetes-validate has no schema for).
  validate-custom CUSTOM SCHEMA_DIR
      Validates each custom resource against SCHEMA_DIR/<group>_<version>_<Kind>.json. A kind
      without a schema there fails: nothing is skipped silently.
  assert-pod RENDERED --native yes|no
      Checks the shape of every pod that carries the sidecar: where the sidecar sits, its
      hardened securityContext, its probes, its /tmp, the downward-API consumer name, the
      termination grace period, that every file a flag names (--auth-token-file, --tls-*) is a
      read-only mounted Secret key, and that the application's WINDOW_SIDECAR_ADDR reaches the
      listener (a Unix socket: on an emptyDir both mount, with a group they share).
  assert-scaling RENDERED [--expect KIND]...
      Checks that each ScaledObject targets a rendered workload with the sidecar (not the
      keeper, no replicas of its own) and scales on the work waiting from zero; that the
      PodMonitors select every pod with the sidecar and find its metrics port; and that no
      other selector picks up the keeper's pods.
  assert-sidecar RENDERED [--has FLAG=VALUE] [--lacks FLAG] [--file PATH=SECRET/KEY]
                 [--socket PATH] [--no-port NAME]
      Checks the sidecar container of every workload: a flag rendered with exactly that value
      (a flag named by several --has: rendered exactly those times, in order),
      a flag not rendered, a path in the sidecar that is Secret SECRET's key KEY (mounted
      read-only), a Unix socket shared with the application container (an emptyDir mounted in
      both, WINDOW_SIDECAR_ADDR=unix:PATH), a containerPort not declared.
  assert-app RENDERED [--env-secret VAR=SECRET/KEY] [--env-file VAR=SECRET/KEY] [--lacks-env VAR]
      Checks the application containers (those with WINDOW_SIDECAR_ADDR) of every pod that
      carries the sidecar: VAR taken from Secret SECRET's key KEY (secretKeyRef), VAR naming a
      file in the container that is Secret SECRET's key KEY (mounted read-only), VAR not set.
  assert-consumer RENDERED --worker NAME --worker-env VAR --worker-source FILE [--consumer NAME]
      Checks the consumer names of every pod that carries the sidecar: the sidecar and the
      worker container NAME both take POD_NAME from the downward API (metadata.name), the
      sidecar's WINDOW_CONSUMER_NAME and the worker's VAR expand to the pod name (or to
      --consumer, with $(POD_NAME) in it expanded), and FILE (the worker's source) reads VAR
      for its consumer name.
  same-sidecar RENDERED_A RENDERED_B
      Checks that both streams hold one workload each whose sidecar container is the same (in
      the same list, initContainers or containers) and whose volumes that the sidecar mounts
      are the same.
  check-config RENDERED BIN --expect CODE [--pod-name NAME] [--external FILE]
               [--set-arg FLAG=VALUE] [--set-env NAME=VALUE]
      Runs the real binary with the sidecar container's rendered args and env plus
      --check-config, in an otherwise empty environment, and expects exit code CODE.
      --set-arg replaces a rendered flag (or adds it); --set-env replaces an env var.
"""

import argparse
import base64
import difflib
import json
import os
import re
import subprocess
import sys

import yaml

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod"}
SAMPLE_NAMESPACE = "default"


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def api_group(doc):
    api_version = doc.get("apiVersion", "")
    return api_version.split("/")[0] if "/" in api_version else ""


def is_custom(doc):
    """Built-in groups are the core group, undotted ones (apps, batch, policy, ...) and
    *.k8s.io; any other dotted group belongs to a CustomResourceDefinition."""
    group = api_group(doc)
    return "." in group and not group.endswith(".k8s.io")


def describe(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')} ({doc.get('apiVersion')})"


def cmd_split(args):
    docs = load_docs(args.rendered)
    builtin = [d for d in docs if not is_custom(d)]
    custom = [d for d in docs if is_custom(d)]
    with open(args.builtin_out, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(builtin, f, sort_keys=False)
    with open(args.custom_out, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(custom, f, sort_keys=False)
    for doc in custom:
        print(f"  custom resource {describe(doc)}: validated against a local schema, "
              "not by kubernetes-validate (it has no schema for CRD kinds)")
    return 0


def cmd_validate_custom(args):
    import jsonschema  # installed with kubernetes-validate

    failed = 0
    for doc in load_docs(args.custom):
        version = doc["apiVersion"].split("/")[1]
        name = f"{api_group(doc)}_{version}_{doc['kind']}.json"
        path = os.path.join(args.schema_dir, name)
        if not os.path.exists(path):
            print(f"  FAIL {describe(doc)}: no schema {name} in {args.schema_dir}")
            failed += 1
            continue
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
        for error in errors:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            print(f"  FAIL {describe(doc)} at {where}: {error.message}")
        failed += bool(errors)
        if not errors:
            print(f"  ok {describe(doc)} against {name}")
    return 1 if failed else 0


def pod_specs(docs):
    """(workload description, pod spec) for every workload in the stream."""
    for doc in docs:
        kind = doc.get("kind")
        if kind not in WORKLOAD_KINDS:
            continue
        spec = doc["spec"] if kind == "Pod" else doc["spec"]["template"]["spec"]
        yield describe(doc), spec


def is_sidecar(container):
    return any(str(a).startswith("--health-listen=") for a in container.get("args") or [])


def is_keeper(spec):
    """A keeper pod: the sidecar alone, with --keep flags, and no application."""
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    return (len(containers) == 1 and is_sidecar(containers[0])
            and any(str(a).startswith("--keep=") for a in containers[0].get("args") or []))


def sidecars(spec):
    """(list name, container) for each window-sidecar container of a pod spec."""
    for where in ("initContainers", "containers"):
        for container in spec.get(where) or []:
            if is_sidecar(container):
                yield where, container


def flag(container, name):
    for arg in container.get("args") or []:
        if str(arg).startswith(name + "="):
            return str(arg).split("=", 1)[1]
    return None


FILE_FLAGS = ("--auth-token-file", "--tls-cert", "--tls-key", "--tls-client-ca")


def mount_for(container, path):
    """The volume mount of a container whose directory holds path (the deepest one)."""
    best = None
    for m in container.get("volumeMounts") or []:
        mount = m["mountPath"].rstrip("/")
        if path.startswith(mount + "/") and (best is None or len(mount) > len(best["mountPath"].rstrip("/"))):
            best = m
    return best


def secret_file(container, spec, path):
    """(Secret name, key) that path in the container is, or a string saying why it is none."""
    m = mount_for(container, path)
    if m is None:
        return f"{path} is on no volume mount"
    if not m.get("readOnly"):
        return f"{path} is on a writable mount ({m['name']})"
    volume = {v["name"]: v for v in spec.get("volumes") or []}.get(m["name"])
    if volume is None or "secret" not in volume:
        return f"{path} is on volume {m['name']}, which is not a Secret"
    rel = path[len(m["mountPath"].rstrip("/")) + 1:]
    items = volume["secret"].get("items")
    if items is None:
        return volume["secret"]["secretName"], rel
    for item in items:
        if item["path"] == rel:
            return volume["secret"]["secretName"], item["key"]
    return f"{path}: Secret volume {m['name']} projects no {rel}"


def app_containers(spec):
    """Containers other than the sidecar that set WINDOW_SIDECAR_ADDR, with its value."""
    for where in ("initContainers", "containers"):
        for container in spec.get(where) or []:
            if is_sidecar(container):
                continue
            for e in container.get("env") or []:
                if e["name"] == "WINDOW_SIDECAR_ADDR" and "value" in e:
                    yield container, e["value"]


def effective(container, spec, field):
    return ((container.get("securityContext") or {}).get(field)
            or (spec.get("securityContext") or {}).get(field))


def listener_problems(c, spec):
    """Whether the application containers reach the sidecar's --listen."""
    problems = []
    listen = flag(c, "--listen") or "127.0.0.1:50051"
    apps = list(app_containers(spec))
    if not apps:
        problems.append("no application container sets WINDOW_SIDECAR_ADDR")
    ports = {p.get("name") for p in c.get("ports") or []}
    if listen.startswith("unix:"):
        path = listen[len("unix:"):]
        if "grpc" in ports:
            problems.append("listens on a Unix socket but declares the TCP containerPort grpc")
        m = mount_for(c, path)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        if m is None or "emptyDir" not in volumes.get(m["name"], {}):
            problems.append(f"the socket {path} is not on an emptyDir mount")
            return problems
        if m.get("readOnly"):
            problems.append(f"the socket's directory {m['mountPath']} is mounted read-only")
        name = os.path.basename(path)
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        for app, addr in apps:
            theirs = [a for a in app.get("volumeMounts") or [] if a["name"] == m["name"]]
            if not theirs:
                problems.append(f"{app['name']} does not mount the socket's volume {m['name']}")
                continue
            want = f"unix:{theirs[0]['mountPath'].rstrip('/')}/{name}"
            if addr != want:
                problems.append(f"{app['name']}: WINDOW_SIDECAR_ADDR={addr}, expected {want}")
            # The socket is mode 0660: the application needs the sidecar's user or group.
            same_user = effective(c, spec, "runAsUser") == effective(app, spec, "runAsUser")
            same_group = effective(c, spec, "runAsGroup") == effective(app, spec, "runAsGroup")
            if not (fs_group or same_user or same_group):
                problems.append(f"{app['name']} shares neither fsGroup, user nor group with "
                                "the sidecar: it cannot open the socket (mode 0660)")
    else:
        host, port = listen.rsplit(":", 1)
        host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
        for app, addr in apps:
            if addr != f"{host}:{port}":
                problems.append(f"{app['name']}: WINDOW_SIDECAR_ADDR={addr}, expected {host}:{port}")
        if "grpc" not in ports:
            problems.append("no grpc containerPort for the TCP listener")
    return problems


def seconds(humantime):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    for number, unit in re.findall(r"(\d+)\s*(ms|s|m|h|d)", humantime):
        total += int(number) * units[unit]
    return total


def cmd_assert_pod(args):
    problems = []
    found = 0
    for workload, spec in pod_specs(load_docs(args.rendered)):
        for where, c in sidecars(spec):
            found += 1
            keeper = is_keeper(spec)
            # A keeper has no application to start before: a plain container.
            want = "initContainers" if args.native == "yes" and not keeper else "containers"

            def check(ok, what):
                if not ok:
                    problems.append(f"{workload} {c['name']}: {what}")

            check(where == want, f"is in {where}, expected {want}")
            check((c.get("restartPolicy") == "Always") == (want == "initContainers"),
                  f"restartPolicy is {c.get('restartPolicy')!r}")
            sc = c.get("securityContext") or {}
            check(sc.get("runAsNonRoot") is True, "runAsNonRoot is not true")
            check(sc.get("runAsUser") == 65532, "runAsUser is not 65532")
            check(sc.get("readOnlyRootFilesystem") is True, "root filesystem is writable")
            check(sc.get("allowPrivilegeEscalation") is False, "privilege escalation allowed")
            check("ALL" in ((sc.get("capabilities") or {}).get("drop") or []),
                  "capabilities are not all dropped")
            check((sc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
                  "seccompProfile is not RuntimeDefault")
            health = flag(c, "--health-listen")
            health_port = int(health.rsplit(":", 1)[1]) if health else None
            for probe in ("livenessProbe", "readinessProbe"):
                grpc = (c.get(probe) or {}).get("grpc") or {}
                check(grpc.get("port") == health_port,
                      f"{probe} is not a gRPC probe on the health port {health_port}")
            ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
            check(ports.get("grpc-health") == health_port, "no grpc-health containerPort")
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
            volumes = {v["name"]: v for v in spec.get("volumes") or []}
            check("/tmp" in mounts and "emptyDir" in volumes.get(mounts["/tmp"], {}),
                  "/tmp is not an emptyDir")
            if (c.get("env") and any(e["name"].startswith("WINDOW_REDIS_TLS_") for e in c["env"])):
                tls = mounts.get("/etc/window-sidecar/redis-tls")
                check(tls is not None and "secret" in volumes.get(tls, {}),
                      "TLS variables set but no Secret at /etc/window-sidecar/redis-tls")
                check(any(m.get("readOnly") for m in c["volumeMounts"]
                          if m["mountPath"] == "/etc/window-sidecar/redis-tls"),
                      "TLS material is not mounted read-only")
            for name in FILE_FLAGS:
                path = flag(c, name)
                if path is not None:
                    where = secret_file(c, spec, path)
                    check(not isinstance(where, str), f"{name}: {where}")
            check(bool(flag(c, "--tls-cert")) == bool(flag(c, "--tls-key")),
                  "--tls-cert and --tls-key are not rendered together")
            if keeper:
                ports = {p.get("name") for p in c.get("ports") or []}
                check("metrics" in ports, "the keeper exports no metrics port")
            else:
                for problem in listener_problems(c, spec):
                    check(False, problem)
            env = {e["name"]: e for e in c.get("env") or []}
            pod_name = env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
            check(pod_name.get("fieldPath") == "metadata.name", "POD_NAME is not the pod name")
            check("WINDOW_CONSUMER_NAME" in env, "no WINDOW_CONSUMER_NAME")
            check("WINDOW_REDIS_URL" in env and "secretKeyRef" in env["WINDOW_REDIS_URL"].get("valueFrom", {}),
                  "WINDOW_REDIS_URL does not come from a Secret")
            grace = seconds(flag(c, "--shutdown-grace") or "10s")
            period = spec.get("terminationGracePeriodSeconds", 30)
            check(period > grace,
                  f"terminationGracePeriodSeconds {period} is not above --shutdown-grace {grace}s")
    if not found:
        problems.append("no window-sidecar container (one with --health-listen) in any workload")
    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok {found} sidecar container(s) shaped as expected")
    return 1 if problems else 0


def cmd_assert_sidecar(args):
    problems = []
    found = 0
    for workload, spec in pod_specs(load_docs(args.rendered)):
        for _, c in sidecars(spec):
            found += 1
            where = f"{workload} {c['name']}"
            rendered = [str(a) for a in c.get("args") or []]
            # A repeatable flag (--watch) named by several --has must be rendered as exactly
            # those, in that order.
            wanted = {}
            for want in args.has:
                wanted.setdefault(want.split("=", 1)[0], []).append(want)
            for name, wants in wanted.items():
                got = [a for a in rendered if a.split("=", 1)[0] == name]
                if got != wants:
                    problems.append(f"{where}: expected {' '.join(wants)}, rendered {got or 'nothing'}")
            for name in args.lacks:
                got = [a for a in rendered if a.split("=", 1)[0] == name]
                if got:
                    problems.append(f"{where}: {name} should be left to the sidecar's default, "
                                    f"rendered {got}")
            for want in args.file:
                path, ref = want.split("=", 1)
                secret, key = ref.split("/", 1)
                got = secret_file(c, spec, path)
                if got != (secret, key):
                    problems.append(f"{where}: {path} should be Secret {secret} key {key}: {got}")
            for path in args.socket:
                if flag(c, "--listen") != f"unix:{path}":
                    problems.append(f"{where}: --listen is {flag(c, '--listen')}, expected unix:{path}")
                m = mount_for(c, path)
                apps = list(app_containers(spec))
                if m is None or not apps:
                    problems.append(f"{where}: the socket is on no mount, or no application container")
                    continue
                for app, addr in apps:
                    mounts = {a["name"]: a["mountPath"] for a in app.get("volumeMounts") or []}
                    if mounts.get(m["name"]) != m["mountPath"] or addr != f"unix:{path}":
                        problems.append(f"{where}: {app['name']} mounts {mounts.get(m['name'])} "
                                        f"and has WINDOW_SIDECAR_ADDR={addr}")
            ports = {p.get("name") for p in c.get("ports") or []}
            for name in args.no_port:
                if name in ports:
                    problems.append(f"{where}: declares containerPort {name}")
    if not found:
        problems.append("no window-sidecar container (one with --health-listen) in any workload")
    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        checked = len(args.has) + len(args.lacks) + len(args.file) + len(args.socket) + len(args.no_port)
        print(f"  ok {checked} expectation(s) on {found} sidecar container(s)")
    return 1 if problems else 0


def cmd_assert_app(args):
    problems = []
    found = 0
    for workload, spec in pod_specs(load_docs(args.rendered)):
        if not any(True for _ in sidecars(spec)):
            continue
        for app, _ in app_containers(spec):
            found += 1
            where = f"{workload} {app['name']}"
            env = {e["name"]: e for e in app.get("env") or []}
            for want in args.env_secret:
                name, ref = want.split("=", 1)
                secret, key = ref.split("/", 1)
                got = ((env.get(name) or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
                if (got.get("name"), got.get("key")) != (secret, key) or got.get("optional"):
                    problems.append(f"{where}: {name} should come from Secret {secret} key {key}, "
                                    f"got {env.get(name)}")
            for want in args.env_file:
                name, ref = want.split("=", 1)
                secret, key = ref.split("/", 1)
                path = (env.get(name) or {}).get("value")
                if not path:
                    problems.append(f"{where}: {name} is not set to a path")
                    continue
                got = secret_file(app, spec, path)
                if got != (secret, key):
                    problems.append(f"{where}: {name}={path} should be Secret {secret} key {key}: {got}")
            for name in args.lacks_env:
                if name in env:
                    problems.append(f"{where}: {name} should not be set, got {env[name]}")
    if not found:
        problems.append("no application container (one with WINDOW_SIDECAR_ADDR) beside a sidecar")
    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        checked = len(args.env_secret) + len(args.env_file) + len(args.lacks_env)
        print(f"  ok {checked} expectation(s) on {found} application container(s)")
    return 1 if problems else 0


def expand(value, defined):
    """Kubernetes' $(VAR) expansion: only variables defined earlier; $$ escapes a $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return defined.get(name, m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)


def downward_pod_name(container):
    """Whether the container takes POD_NAME from the pod's metadata.name."""
    for item in container.get("env") or []:
        if item["name"] == "POD_NAME":
            ref = ((item.get("valueFrom") or {}).get("fieldRef") or {})
            return ref.get("fieldPath") == "metadata.name"
    return False


def expanded_env(container, pod_name):
    """The container's literal and downward-API env, expanded as the kubelet does."""
    env = {}
    for item in container.get("env") or []:
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {})
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        elif ref.get("fieldPath") == "metadata.name":
            env[item["name"]] = pod_name
    return env


def cmd_assert_consumer(args):
    problems = []
    found = 0
    pod_name = "orders-window-sidecar-7d9c6b5f4-x2k8q"
    want = expand(args.consumer, {"POD_NAME": pod_name})
    with open(args.worker_source, encoding="utf-8") as f:
        source = f.read()
    if not re.search(r"os\.environ\.get\(\s*[\"']" + re.escape(args.worker_env) + r"[\"']", source):
        problems.append(f"{args.worker_source} does not read {args.worker_env}")
    for workload, spec in pod_specs(load_docs(args.rendered)):
        if is_keeper(spec):
            continue  # no worker, no consumer: it holds none
        found += 1
        side = [c for _, c in sidecars(spec)]
        workers = [c for c in spec.get("containers") or [] if c["name"] == args.worker]
        if len(side) != 1 or len(workers) != 1:
            problems.append(f"{workload}: expected one sidecar and one container {args.worker}, "
                            f"found {len(side)} and {len(workers)}")
            continue
        for c, var in ((side[0], "WINDOW_CONSUMER_NAME"), (workers[0], args.worker_env)):
            if not downward_pod_name(c):
                problems.append(f"{workload} {c['name']}: POD_NAME is not from metadata.name")
            got = expanded_env(c, pod_name).get(var)
            if got != want:
                problems.append(f"{workload} {c['name']}: {var} expands to {got!r}, "
                                f"not {want!r}")
    if not found:
        problems.append("no workload")
    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok {found} pod(s): sidecar and {args.worker} take POD_NAME from metadata.name; "
              f"WINDOW_CONSUMER_NAME and {args.worker_env} are {args.consumer} ({want} in pod "
              f"{pod_name}), which {os.path.basename(args.worker_source)} reads")
    return 1 if problems else 0


def sidecar_of(path):
    """(list name, sidecar container, the pod volumes it mounts) of the one workload in path."""
    specs = list(pod_specs(load_docs(path)))
    if len(specs) != 1:
        raise SystemExit(f"  FAIL {path}: expected one workload, found {len(specs)}")
    workload, spec = specs[0]
    found = list(sidecars(spec))
    if len(found) != 1:
        raise SystemExit(f"  FAIL {workload}: expected one sidecar container, found {len(found)}")
    where, container = found[0]
    mounted = {m["name"] for m in container.get("volumeMounts") or []}
    volumes = [v for v in spec.get("volumes") or [] if v["name"] in mounted]
    return where, container, volumes


def cmd_same_sidecar(args):
    a, b = sidecar_of(args.rendered_a), sidecar_of(args.rendered_b)
    problems = []
    if a[0] != b[0]:
        problems.append(f"the sidecar is in {a[0]} in one and in {b[0]} in the other")
    if a[1] != b[1]:
        left = yaml.safe_dump(a[1], sort_keys=True).splitlines()
        right = yaml.safe_dump(b[1], sort_keys=True).splitlines()
        diff = "\n".join(difflib.unified_diff(left, right, "a", "b", lineterm=""))
        problems.append(f"the sidecar containers differ:\n{diff}")
    if a[2] != b[2]:
        problems.append(f"the sidecar's volumes differ: {a[2]} and {b[2]}")
    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok the same sidecar container ({a[0]}, {len(a[1].get('args') or [])} args, "
              f"{len(a[1].get('env') or [])} env) and the same {len(a[2])} volume(s)")
    return 1 if problems else 0


def secret_value(docs, external, name, key):
    for doc in docs:
        if doc.get("kind") == "Secret" and doc["metadata"]["name"] == name:
            if key in (doc.get("stringData") or {}):
                return doc["stringData"][key]
            if key in (doc.get("data") or {}):
                return base64.b64decode(doc["data"][key]).decode("utf-8")
            return None
    return (external.get(name) or {}).get(key)


def resolve_env(container, docs, external, pod_name):
    field_values = {"metadata.name": pod_name, "metadata.namespace": SAMPLE_NAMESPACE,
                    "spec.nodeName": "node-1", "status.podIP": "10.0.0.10"}
    env = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = field_values[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secret_value(docs, external, ref["name"], ref["key"])
            if value is None:
                if ref.get("optional"):
                    continue
                raise SystemExit(f"  FAIL env {name}: Secret {ref['name']} key {ref['key']} "
                                 "is neither rendered nor in the external secrets file")
            env[name] = value
        elif name not in env:
            env[name] = ""
    return env


def redact(text):
    return re.sub(r"(://)[^@/\s]*@", r"\1***@", text)


def cmd_check_config(args):
    docs = load_docs(args.rendered)
    external = {}
    if args.external:
        with open(args.external, encoding="utf-8") as f:
            external = yaml.safe_load(f) or {}
    runs = 0
    failed = 0
    for workload, spec in pod_specs(docs):
        for _, container in sidecars(spec):
            runs += 1
            argv = [str(a) for a in container.get("args") or []]
            for override in args.set_arg:
                name = override.split("=", 1)[0]
                argv = [a for a in argv if a.split("=", 1)[0] != name] + [override]
            env = resolve_env(container, docs, external, args.pod_name)
            for override in args.set_env:
                name, value = override.split("=", 1)
                env[name] = value
            env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
            cmd = [args.bin] + argv + ["--check-config"]
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
            shown = " ".join(redact(a) for a in cmd[1:])
            env_shown = " ".join(f"{k}={redact(v)}" for k, v in sorted(env.items())
                                 if k != "PATH" and "PASSWORD" not in k)
            ok = result.returncode == args.expect
            failed += not ok
            print(f"  {'ok' if ok else 'FAIL'} {workload} {container['name']}: exit "
                  f"{result.returncode} (expected {args.expect})")
            if not ok or args.verbose:
                print(f"    args: {shown}")
                print(f"    env:  {env_shown}")
            message = (result.stderr.strip() or result.stdout.strip()).splitlines()
            if message:
                print(f"    says: {redact(message[0])}")
    if not runs:
        print("  FAIL no window-sidecar container (one with --health-listen) in any workload")
        return 1
    return 1 if failed else 0


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def cmd_assert_scaling(args):
    """The scaling and monitoring objects fit the workloads rendered beside them: each
    ScaledObject targets a rendered Deployment that carries the sidecar and scales on the work
    waiting, waking from zero on the first entry; the PodMonitors select every pod that carries
    the sidecar (each at least one) and find its metrics port; no other selector in the stream picks up a keeper's
    pods."""
    docs = load_docs(args.rendered)
    problems, notes = [], []
    workloads = {}
    for doc in docs:
        if doc.get("kind") in WORKLOAD_KINDS - {"Pod"}:
            workloads[(doc["kind"], doc["metadata"]["name"])] = doc
    with_sidecar = {key: doc for key, doc in workloads.items()
                    if list(sidecars(doc["spec"]["template"]["spec"]))}
    keepers = {key: doc for key, doc in with_sidecar.items()
               if is_keeper(doc["spec"]["template"]["spec"])}
    kinds = {doc.get("kind") for doc in docs}
    scraped = set()
    for want in args.expect:
        if want not in kinds and not (want == "keeper" and keepers):
            problems.append(f"expected a {want} in the stream")
    for doc in docs:
        kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
        if kind == "ScaledObject":
            ref = doc["spec"]["scaleTargetRef"]
            target = with_sidecar.get((ref.get("kind", "Deployment"), ref["name"]))
            if target is None:
                problems.append(f"ScaledObject/{name} targets {ref}, not a rendered workload "
                                "that carries the sidecar")
            elif (ref.get("kind", "Deployment"), ref["name"]) in keepers:
                problems.append(f"ScaledObject/{name} scales the keeper")
            elif "replicas" in target["spec"]:
                problems.append(f"ScaledObject/{name}: its target sets replicas, which KEDA's "
                                "HPA owns")
            prom = [tr for tr in doc["spec"]["triggers"] if tr["type"] == "prometheus"]
            if not prom:
                problems.append(f"ScaledObject/{name} has no prometheus trigger")
            for tr in prom:
                md = tr["metadata"]
                if "window_sidecar_work_waiting_entries" not in md.get("query", ""):
                    problems.append(f"ScaledObject/{name}: the query does not read the work "
                                    f"waiting: {md.get('query')}")
                if md.get("activationThreshold") != "0":
                    problems.append(f"ScaledObject/{name}: activationThreshold "
                                    f"{md.get('activationThreshold')!r}, not \"0\"")
            if doc["spec"].get("minReplicaCount", 0) == 0 and not keepers:
                notes.append(f"ScaledObject/{name} scales to zero without a keeper here")
            notes.append(f"ScaledObject/{name} -> {ref['kind']}/{ref['name']}, triggers "
                         + ", ".join(tr["type"] for tr in doc["spec"]["triggers"]))
        if kind == "PodMonitor":
            selector = doc["spec"]["selector"].get("matchLabels") or {}
            selected = 0
            for (wkind, wname), w in with_sidecar.items():
                labels = w["spec"]["template"]["metadata"].get("labels") or {}
                if not selects(selector, labels):
                    continue
                selected += 1
                scraped.add((wkind, wname))
                ports = {p.get("name") for _, c in sidecars(w["spec"]["template"]["spec"])
                         for p in c.get("ports") or []}
                for endpoint in doc["spec"]["podMetricsEndpoints"]:
                    if endpoint.get("port") not in ports:
                        problems.append(f"PodMonitor/{name}: {wkind}/{wname}'s sidecar has no "
                                        f"port {endpoint.get('port')!r}")
                notes.append(f"PodMonitor/{name} scrapes {wkind}/{wname}")
            if not selected:
                problems.append(f"PodMonitor/{name} selects no pod with the sidecar ({selector})")
    if "PodMonitor" in kinds:
        for wkind, wname in sorted(set(with_sidecar) - scraped):
            problems.append(f"no PodMonitor selects {wkind}/{wname}'s pods")
    for (kkind, kname), keeper in keepers.items():
        labels = keeper["spec"]["template"]["metadata"].get("labels") or {}
        for doc in docs:
            if (doc.get("kind"), doc.get("metadata", {}).get("name")) == (kkind, kname):
                continue
            spec = doc.get("spec") or {}
            selector = spec.get("selector")
            if doc.get("kind") in WORKLOAD_KINDS | {"PodDisruptionBudget"}:
                selector = (selector or {}).get("matchLabels")
            elif doc.get("kind") != "Service":
                continue
            if selects(selector or {}, labels):
                problems.append(f"{describe(doc)} selects the keeper's pods {labels}")
        notes.append(f"keeper {kkind}/{kname}: "
                     + " ".join(a for _, c in sidecars(keeper["spec"]["template"]["spec"])
                                for a in c["args"] if a.startswith("--keep")))
    for n in notes:
        print(f"  ok {n}")
    for p in problems:
        print(f"  FAIL {p}")
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("split")
    p.add_argument("rendered")
    p.add_argument("builtin_out")
    p.add_argument("custom_out")
    p.set_defaults(func=cmd_split)
    p = sub.add_parser("validate-custom")
    p.add_argument("custom")
    p.add_argument("schema_dir")
    p.set_defaults(func=cmd_validate_custom)
    p = sub.add_parser("assert-pod")
    p.add_argument("rendered")
    p.add_argument("--native", choices=["yes", "no"], required=True)
    p.set_defaults(func=cmd_assert_pod)
    p = sub.add_parser("assert-sidecar")
    p.add_argument("rendered")
    p.add_argument("--has", action="append", default=[])
    p.add_argument("--lacks", action="append", default=[])
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--socket", action="append", default=[])
    p.add_argument("--no-port", action="append", default=[])
    p.set_defaults(func=cmd_assert_sidecar)
    p = sub.add_parser("assert-app")
    p.add_argument("rendered")
    p.add_argument("--env-secret", action="append", default=[])
    p.add_argument("--env-file", action="append", default=[])
    p.add_argument("--lacks-env", action="append", default=[])
    p.set_defaults(func=cmd_assert_app)
    p = sub.add_parser("assert-consumer")
    p.add_argument("rendered")
    p.add_argument("--worker", required=True)
    p.add_argument("--worker-env", required=True)
    p.add_argument("--worker-source", required=True)
    p.add_argument("--consumer", default="$(POD_NAME)")
    p.set_defaults(func=cmd_assert_consumer)
    p = sub.add_parser("assert-scaling")
    p.add_argument("rendered")
    p.add_argument("--expect", action="append", default=[],
                   help="a kind that must be in the stream (ScaledObject, PodMonitor, ...), "
                   "or keeper")
    p.set_defaults(func=cmd_assert_scaling)
    p = sub.add_parser("same-sidecar")
    p.add_argument("rendered_a")
    p.add_argument("rendered_b")
    p.set_defaults(func=cmd_same_sidecar)
    p = sub.add_parser("check-config")
    p.add_argument("rendered")
    p.add_argument("bin")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--pod-name", default="orders-worker-7d9c6b5f4-x2k8q")
    p.add_argument("--external")
    p.add_argument("--set-arg", action="append", default=[])
    p.add_argument("--set-env", action="append", default=[])
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=cmd_check_config)
    args = parser.parse_args()
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
