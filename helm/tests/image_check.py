#!/usr/bin/env python3
"""Static checks of the container image definition against the chart, for run.sh.

There is no container engine on the build machines, so the Dockerfile is not built here. What
can drift without one is checked instead:

  - the builder compiles the pinned toolchain (rust-toolchain.toml) with
    `cargo build --release -p window-sidecar --locked`, the runtime is distroless and non-root;
  - the runtime user, exposed ports and entrypoint match what the chart assumes (values.yaml);
  - .dockerignore keeps every file the workspace build reads (each workspace member and each
    path dependency), so a new crate cannot silently break `docker build`.

Usage: image_check.py REPO_ROOT
"""

import fnmatch
import glob
import os
import re
import sys
import tomllib

import yaml


def instructions(path):
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out, pending = [], ""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            line = pending + line
            pending = ""
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_keeps(patterns, path):
    """Docker's rule: the last matching pattern wins; '!' re-includes. A path is also matched
    by a pattern that matches one of its parent directories."""
    kept = True
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern[1:] if negate else pattern
        p = p.rstrip("/")
        if p.startswith("**/"):
            hit = any(fnmatch.fnmatch(seg, p[3:]) for seg in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, p) for prefix in prefixes)
        if hit:
            kept = negate
    return kept


def main():
    root = sys.argv[1]
    problems = []

    def check(ok, what):
        if not ok:
            problems.append(what)

    steps = instructions(os.path.join(root, "Dockerfile"))
    froms = [args for word, args in steps if word == "FROM"]
    args = dict(
        a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a
    )
    check(len(froms) >= 2, "the Dockerfile is not a multi-stage build")
    builder = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), froms[0]).split()[0]
    with open(os.path.join(root, "rust-toolchain.toml"), "rb") as f:
        channel = tomllib.load(f)["toolchain"]["channel"]
    check(builder.startswith(f"rust:{channel}-bookworm") or builder.startswith(
        f"rust:{channel.rsplit('.', 1)[0]}-bookworm"),
        f"builder {builder!r} does not use the pinned toolchain {channel} on bookworm")
    runs = " ".join(a for word, a in steps if word == "RUN")
    check("cargo build --release -p window-sidecar --locked" in runs,
          "the builder does not run cargo build --release -p window-sidecar --locked")
    check(froms[-1] == "gcr.io/distroless/cc-debian12:nonroot",
          f"runtime image is {froms[-1]!r}, expected gcr.io/distroless/cc-debian12:nonroot")
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    users = [a for w, a in final if w == "USER"]
    exposed = {p.split("/")[0] for w, a in final if w == "EXPOSE" for p in a.split()}
    entry = [a for w, a in final if w == "ENTRYPOINT"]

    with open(os.path.join(root, "helm/window-sidecar/values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f)
    uid = values["sidecar"]["securityContext"]["runAsUser"]
    check(users and users[-1].split(":")[0] == str(uid),
          f"runtime USER {users} is not the chart's runAsUser {uid}")
    ports = {str(p) for p in values["sidecar"]["ports"].values()}
    check(ports <= exposed, f"EXPOSE {sorted(exposed)} misses the chart's ports {sorted(ports)}")
    check(entry == ['["/usr/local/bin/window-sidecar"]'],
          f"ENTRYPOINT {entry} is not the exec form of /usr/local/bin/window-sidecar")

    with open(os.path.join(root, ".dockerignore"), encoding="utf-8") as f:
        patterns = [l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")]
    needed = ["Cargo.toml", "Cargo.lock", "rust-toolchain.toml"]
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        workspace = tomllib.load(f)["workspace"]
    members = [m for pattern in workspace.get("members", [])
               for m in sorted(glob.glob(os.path.join(root, pattern)))]
    for member in members:
        rel = os.path.relpath(member, root)
        needed.append(f"{rel}/Cargo.toml")
        with open(os.path.join(member, "Cargo.toml"), "rb") as f:
            manifest = tomllib.load(f)
        sections = [manifest.get(k, {}) for k in ("dependencies", "dev-dependencies", "build-dependencies")]
        for deps in sections:
            for dep in deps.values():
                if isinstance(dep, dict) and "path" in dep:
                    target = os.path.relpath(os.path.normpath(os.path.join(member, dep["path"])), root)
                    needed.append(f"{target}/Cargo.toml")
        for source in glob.glob(os.path.join(member, "**/*.rs"), recursive=True):
            needed.append(os.path.relpath(source, root))
    needed += [os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "proto/**/*.proto"), recursive=True)]
    for path in sorted(set(needed)):
        check(dockerignore_keeps(patterns, path), f".dockerignore leaves out {path}, which the build reads")
    for path in ("target/debug/window-sidecar", ".git/HEAD", "helm/window-sidecar/Chart.yaml"):
        check(not dockerignore_keeps(patterns, path), f".dockerignore sends {path} to the build context")

    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok builder {builder}, runtime {froms[-1]}, user {users[-1]}, ports {' '.join(sorted(exposed))}; "
              f".dockerignore keeps the {len(members)} workspace members and their sources")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
