#!/usr/bin/env python3
"""Static checks of the container image definition against the chart, for run.sh.

There is no container engine on the build machines, so the Dockerfile is not built here. What
can drift without one is checked instead:

  - every base image is pinned by digest (`FROM image:tag@sha256:...`; `scratch` and earlier
    stages need none), in the sidecar's Dockerfile and in the Python example worker's;
  - the builder compiles the pinned toolchain (rust-toolchain.toml: the image tag and
    RUSTUP_TOOLCHAIN) with `cargo build --release -p window-sidecar --locked`, the runtime is
    distroless and non-root;
  - the binary the runtime gets is stripped: its debug sections go to a separate file
    (`objcopy --only-keep-debug`), the copied binary is the one `objcopy --strip-debug
    --add-gnu-debuglink` wrote, and a stage exports the debug file;
  - the runtime user, exposed ports and entrypoint match what the chart assumes (values.yaml);
  - .dockerignore keeps every file the workspace build reads (each workspace member and each
    path dependency), so a new crate cannot silently break `docker build`;
  - the example worker's image (client-examples/python/Dockerfile) runs as the chart's worker
    user, its working directory holds the script the chart's worker command runs, and its
    Dockerfile.dockerignore keeps every file it copies.

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


PINNED = re.compile(r"^[^\s@]+:[^\s@]+@sha256:[0-9a-f]{64}$")


def unpinned_bases(steps):
    """The FROM images not pinned by digest; scratch and earlier stages need no pin."""
    stages, out = set(), []
    for word, args in steps:
        if word != "FROM":
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        image = parts[0]
        if image != "scratch" and image.lower() not in stages and not PINNED.match(image):
            out.append(image)
        if len(parts) >= 3 and parts[1].upper() == "AS":
            stages.add(parts[2].lower())
    return out


def main():
    root = sys.argv[1]
    problems = []

    def check(ok, what):
        if not ok:
            problems.append(what)

    steps = instructions(os.path.join(root, "Dockerfile"))
    froms = [args.split()[0] for word, args in steps if word == "FROM"]
    for image in unpinned_bases(steps):
        check(False, f"Dockerfile: base image {image} is not pinned by digest (image:tag@sha256:...)")
    args = dict(
        a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a
    )
    check(len(froms) >= 2, "the Dockerfile is not a multi-stage build")
    builder = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), froms[0]).split()[0]
    with open(os.path.join(root, "rust-toolchain.toml"), "rb") as f:
        channel = tomllib.load(f)["toolchain"]["channel"]
    check(builder.startswith(f"rust:{channel}-bookworm@") or builder.startswith(
        f"rust:{channel.rsplit('.', 1)[0]}-bookworm@"),
        f"builder {builder!r} does not use the pinned toolchain {channel} on bookworm")
    envs = " ".join(a for word, a in steps if word == "ENV")
    check(f"RUSTUP_TOOLCHAIN={channel}" in envs.split(),
          f"the builder's RUSTUP_TOOLCHAIN is not the pinned toolchain {channel}")
    runs = " ".join(a for word, a in steps if word == "RUN")
    check("cargo build --release -p window-sidecar --locked" in runs,
          "the builder does not run cargo build --release -p window-sidecar --locked")
    check(froms[-1].startswith("gcr.io/distroless/cc-debian12:nonroot@sha256:"),
          f"runtime image is {froms[-1]!r}, expected gcr.io/distroless/cc-debian12:nonroot@sha256:...")
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]

    # The stripped binary: debug sections kept apart, the stripped one copied into the runtime.
    keep = re.search(r"objcopy\s+--only-keep-debug\s+(\S+)\s+(\S+)", runs)
    strip = re.search(r"objcopy\s+--strip-debug\s+--add-gnu-debuglink=(\S+)\s+(\S+)\s+(\S+)", runs)
    check(keep is not None, "the builder does not keep the debug sections apart (objcopy --only-keep-debug)")
    check(strip is not None, "the builder does not strip the binary "
          "(objcopy --strip-debug --add-gnu-debuglink=DEBUG IN OUT)")
    copies = [a.split() for w, a in final if w == "COPY"]
    binary = [c for c in copies if c[-1] == "/usr/local/bin/window-sidecar"]
    if keep and strip:
        check(keep.group(1) == strip.group(2) and keep.group(2) == strip.group(1),
              f"objcopy strips {strip.group(2)} linked to {strip.group(1)}, but keeps the debug "
              f"sections of {keep.group(1)} in {keep.group(2)}")
        check(binary and binary[0][-2] == strip.group(3),
              f"the runtime copies {binary[0][-2] if binary else 'nothing'} to "
              f"/usr/local/bin/window-sidecar, not the stripped {strip.group(3)}")
        debug_stage = [a for w, a in steps if w == "COPY" and keep.group(2) in a.split()]
        check(bool(debug_stage), f"no stage exports the debug file {keep.group(2)}")
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

    worker = worker_image_problems(root, values)
    problems += worker

    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok builder {builder}, runtime {froms[-1]}, user {users[-1]}, ports {' '.join(sorted(exposed))}; "
              f"the binary stripped ({' '.join(strip.group(0).split())}); "
              f".dockerignore keeps the {len(members)} workspace members and their sources")
        print("  ok example worker: client-examples/python/Dockerfile pinned, runs as the chart's "
              "worker user from the directory of its command; Dockerfile.dockerignore keeps what it copies")
    return 1 if problems else 0


def worker_image_problems(root, values):
    """The Python example worker's image against the chart's example.worker values."""
    problems = []
    here = os.path.join(root, "client-examples/python")
    steps = instructions(os.path.join(here, "Dockerfile"))
    for image in unpinned_bases(steps):
        problems.append(f"client-examples/python/Dockerfile: base image {image} is not pinned by digest")
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    worker = values["example"]["worker"]
    uid = worker["securityContext"]["runAsUser"]
    users = [a for w, a in final if w == "USER"]
    if not users or users[-1].split(":")[0] != str(uid):
        problems.append(f"worker image USER {users} is not the chart's example.worker runAsUser {uid}")
    workdirs = [a for w, a in final if w == "WORKDIR"]
    script = next((a for a in worker["command"][1:] if a.endswith(".py")), None)
    # The image keeps the repository's layout under /app: WORKDIR /app/X is the repository's X.
    if not workdirs or not workdirs[-1].startswith("/app/"):
        problems.append(f"worker image WORKDIR {workdirs} is not under /app (the repository's layout)")
    elif script is None or not os.path.isfile(os.path.join(root, workdirs[-1][len("/app/"):], script)):
        problems.append(f"the chart's worker command {worker['command']} runs {script}, which is not "
                        f"in the image's WORKDIR {workdirs[-1]}")
    with open(os.path.join(here, "Dockerfile.dockerignore"), encoding="utf-8") as f:
        patterns = [l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")]
    needed = ["client-examples/orders.json", "client-examples/python/pyproject.toml",
              "client-examples/python/hatch_build.py", "client-examples/python/LICENSE",
              "client-examples/python/generate.sh",
              "client-examples/python/window_client/py.typed"]
    needed += [os.path.relpath(p, root) for p in glob.glob(os.path.join(here, "*.py"))]
    needed += [os.path.relpath(p, root) for p in glob.glob(os.path.join(here, "window_client/*.py"))]
    needed += [os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "proto/**/*.proto"), recursive=True)]
    for path in sorted(set(needed)):
        if not dockerignore_keeps(patterns, path):
            problems.append(f"client-examples/python/Dockerfile.dockerignore leaves out {path}, which the image needs")
    for path in ("client-examples/python/.venv/bin/python", "client-examples/python/window_client/_generated/x.py",
                 "target/debug/window-sidecar", "server/Cargo.toml"):
        if dockerignore_keeps(patterns, path):
            problems.append(f"client-examples/python/Dockerfile.dockerignore sends {path} to the build context")
    return problems


if __name__ == "__main__":
    sys.exit(main())
