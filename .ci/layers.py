#!/usr/bin/env python3
"""The layering rules the compiler cannot see, checked from the source.

The crate boundary already makes "the core does no I/O" a compile error; this guards the rest:

1. the core crate depends only on what pure code needs (a new dependency there could bring
   a client library, and with it I/O, into reach);
2. grpc/ and session/ take the product's vocabulary from the core's domain, never from the
   Redis adapter (they may call the adapter's I/O: that is what they are for);
3. no two files of the server import from each other, directly or round a longer circle
   (a flush once went flush -> redirect -> flush): `use` paths are resolved to the file that
   defines the item, following the re-exports of mod.rs files.

Exits non-zero with one line per violation.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SERVER = ROOT / "server" / "src"
CORE = ROOT / "server" / "core"
CORE_DEPENDENCIES = {"bytes", "thiserror", "wildmatch"}
DOMAIN_TYPES = {
    "Source", "StreamSource", "ListSource", "PubSubSource", "Mode", "Framing", "Entry", "Body",
    "ReadBatch", "Target", "Letter", "Selection", "Store", "Redrive", "MAX_BLOCK", "frame",
}
# Modules of the server crate that are the core's, re-exported by lib.rs.
CORE_MODULES = {"window", "engine", "policy", "domain"}

USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M | re.S)
MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)


def expand(tree):
    """`a::{b, c::{d}}` as ['a::b', 'a::c::d']."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, rest):
        if rest.startswith("{"):
            depth, start = 0, 1
            for i, ch in enumerate(rest):
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                if (ch == "," and depth == 1) or depth == 0:
                    part = rest[start:i]
                    if part:
                        walk(prefix, part)
                    start = i + 1
                    if depth == 0:
                        break
            return
        head, sep, tail = rest.partition("::")
        if sep and tail:
            walk(prefix + [head], tail)
        else:
            out.append(prefix + [head])

    walk([], tree)
    return out


def module_of(path):
    """A file's module path within the server crate, e.g. ['redis', 'flush']."""
    rel = path.relative_to(SERVER).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def file_of(module):
    """The file of a module path, if it is one of the crate's."""
    base = SERVER.joinpath(*module) if module else SERVER
    for candidate in (base.with_suffix(".rs"), base / "mod.rs") if module else (SERVER / "lib.rs",):
        if candidate.is_file():
            return candidate
    return None


def reexports(path):
    """name -> the module path (relative to the file's module) a mod.rs re-exports it from."""
    text = path.read_text()
    found = {}
    for m in USE.finditer(text):
        if not m.group(0).lstrip().startswith("pub"):
            continue
        for p in expand(m.group(1)):
            if p[0] not in ("crate", "super", "self") and len(p) > 1:
                found[p[-1]] = p[:-1]
    return found


def resolve(module, path):
    """The file that defines what `path` (as written in a file of `module`) names."""
    if path[0] == "crate":
        mod, rest = [], path[1:]
    elif path[0] == "super":
        mod, rest = list(module), list(path)
        while rest and rest[0] == "super":
            mod, rest = mod[:-1], rest[1:]
    elif path[0] == "self":
        mod, rest = list(module), path[1:]
    else:
        return None  # another crate
    if rest and rest[0] in CORE_MODULES and not mod:
        return None
    # Walk down while the next segment is a module file.
    while rest and file_of(mod + [rest[0]]) is not None and len(rest) > 1:
        mod, rest = mod + [rest[0]], rest[1:]
    if rest and len(rest) == 1 and file_of(mod + [rest[0]]) is not None and rest[0] != "self":
        # `use super::delay;`: the module itself.
        return file_of(mod + [rest[0]])
    here = file_of(mod)
    if here is None:
        return None
    if rest:
        origin = reexports(here).get(rest[-1])
        if origin is not None and file_of(mod + origin) is not None:
            return file_of(mod + origin)
    return here


def imports(path):
    module = module_of(path)
    text = path.read_text()
    # Code under #[cfg(test)] may see anything; only the module's own code counts.
    text = text.split("#[cfg(test)]")[0]
    for m in USE.finditer(text):
        for p in expand(m.group(1)):
            yield p, resolve(module, p)


def main():
    problems = []

    deps = re.search(r"^\[dependencies\]\n(.*?)(?:^\[|\Z)", (CORE / "Cargo.toml").read_text(), re.M | re.S)
    names = {line.split("=")[0].split(".")[0].strip() for line in deps.group(1).splitlines() if line.strip() and not line.startswith("#")}
    for extra in sorted(names - CORE_DEPENDENCIES):
        problems.append(f"server/core depends on {extra}: the core holds only pure code ({', '.join(sorted(CORE_DEPENDENCIES))})")

    files = [p for p in SERVER.rglob("*.rs") if p.name != "tests.rs" and "tests" not in p.parts]
    graph = {}
    for path in files:
        module = module_of(path)
        for use, target in imports(path):
            if module and module[0] in ("grpc", "session") and len(use) > 2 and use[:2] == ["crate", "redis"] and use[-1] in DOMAIN_TYPES:
                problems.append(f"{path.relative_to(ROOT)} takes {use[-1]} from redis/: the domain's types come from crate::domain")
            if target is not None and target != path:
                graph.setdefault(path, set()).add(target)

    # A file may use its own parent's items (a mod.rs re-exporting its children is how a
    # module speaks), so circles are looked for between files that are not parent and child.
    def parent(p):
        m = module_of(p)
        return file_of(m[:-1]) if m else None

    for a, targets in graph.items():
        for b in targets:
            if parent(a) == b or parent(b) == a:
                continue
            seen, stack = set(), [b]
            while stack:
                x = stack.pop()
                if x == a:
                    problems.append(f"file circle: {a.relative_to(ROOT)} -> {b.relative_to(ROOT)} -> ... -> {a.relative_to(ROOT)}")
                    break
                if x in seen:
                    continue
                seen.add(x)
                stack.extend(t for t in graph.get(x, ()) if parent(x) != t and parent(t) != x)

    for p in sorted(set(problems)):
        print(p)
    if problems:
        sys.exit(1)
    print(f"layers: core dependencies {sorted(names)}; {len(files)} server files, no domain type from redis/ in grpc/ or session/, no file circle")


if __name__ == "__main__":
    main()
