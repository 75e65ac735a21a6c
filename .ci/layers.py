#!/usr/bin/env python3
"""The layering rules the compiler cannot see, checked from the source.

The crate boundary already makes "the core does no I/O" a compile error; this guards the rest:

1. the core crate depends only on what pure code needs (a new dependency there could bring a
   client library, and with it I/O, into reach);
2. grpc/ and session/ take the product's vocabulary from the core's domain, never through the
   Redis adapter (they may call the adapter's I/O: that is what they are for);
3. no file uses a file of a higher layer: the order is .ci/layers.toml's (docs/layers.md says
   what each layer owns), and what a layer owns must not depend on what is built on it;
4. no two files import from each other, directly or round a longer circle (a flush once went
   flush -> redirect -> flush), a module's root and its own parts included.

What counts as an import is every path in the code, not only `use` lines: `crate::a::b(...)` in
an expression, `super::X` in a type, a path inside a macro call (`matches!`, `tracing`'s
macros), and `a::b` whose `a` is a module or an item the file imported or declared. A path is
followed to the file that defines what it names: through `pub use` re-exports (a mod.rs's, lib.rs's,
any file's), and into the core crate from the server's `crate::domain` or `window_sidecar_core::`.
A `use` of a module counts as a use of its file. Comments and string literals are not code;
`#[cfg(test)]` items and test modules are left out (a test may reach anything). Not imports: a
`mod child;` line, and a `pub use` by which a module re-exports one of its own descendants without
using it itself (each user of the name is credited to the defining file instead).

usage: python3 .ci/layers.py [--graph] [--edges]
Exits non-zero with one line per violation; --graph also prints how many imports go from each
layer to each other one, --edges every import between two files (with the line of its first use).
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = pathlib.Path(__file__).resolve().parent / "layers.toml"
CORE_DEPENDENCIES = {"bytes", "thiserror", "wildmatch"}
# Each crate by its root file, with the name other crates use for it (a binary has none).
CRATES = {
    "server/core/src/lib.rs": "window_sidecar_core",
    "server/src/lib.rs": "window_sidecar",
    "server/src/main.rs": None,
}
SERVER_LIB = "server/src/lib.rs"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# --- Reading the source -------------------------------------------------------------------


def blank(text, start, end):
    """text with [start, end) made spaces, newlines kept (offsets and line numbers stay put)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


RAW_STRING = re.compile(r'(?:b|c)?r(#*)"')
CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]*\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def code_of(text):
    """The source with comments, and the contents of string and char literals, blanked."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    def word_before(k):
        return k > 0 and (text[k - 1].isalnum() or text[k - 1] == "_")

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif (m := RAW_STRING.match(text, i)) and not word_before(i):
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j
            wipe(m.end(), j)
            i = j + len(close)
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1) and not word_before(i)):
            j = start = i + (1 if c == '"' else 2)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(start, j)
            i = j + 1
        elif c == "'" and (m := CHAR.match(text, i)):
            wipe(i + 1, m.end() - 1)
            i = m.end()
        else:
            i += 1  # anything else, a lifetime's quote included
    return "".join(out)


def matching(code, open_at):
    """The offset just past the bracket that closes the one at open_at."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = []
    for j in range(open_at, len(code)):
        ch = code[j]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
    return len(code)


TEST_ATTR = re.compile(r"#\[cfg\((?:test|(?:all|any)\(\s*test\b[^\]]*\))\)\]")
ATTR = re.compile(r"\s*#\[")
MOD_DECL = re.compile(rf"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*;", re.M)
MOD_INLINE = re.compile(rf"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*\{{", re.M)
ITEM = re.compile(
    rf"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:(?:async|const|unsafe|extern\s+\S+)\s+)*"
    rf"(?:fn|struct|enum|trait|const|static|type|union)\s+({IDENT})",
    re.M,
)
USE = re.compile(r"(?<![\w:])(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);")
VISIBILITY = re.compile(r"\bpub\s*\(\s*in\s+[\w:\s]+\)")
PATH = re.compile(rf"(?<![\w:$#'])({IDENT}(?:\s*::\s*{IDENT})+)")


def without_tests(code):
    """The code with every #[cfg(test)] item blanked: a `mod tests;` so declared is then never
    loaded."""
    while m := TEST_ATTR.search(code):
        j = m.end()
        while a := ATTR.match(code, j):  # the item's other attributes
            j = matching(code, a.end() - 1)
        # The item ends at its first `;` or at its body's closing brace, outside brackets.
        k, depth = j, 0
        while k < len(code):
            ch = code[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == ";" and depth == 0:
                k += 1
                break
            elif ch == "{" and depth == 0:
                k = matching(code, k)
                break
            k += 1
        code = blank(code, m.start(), k)
    return code


def expand(tree):
    """A use tree as (path, bound name) pairs: `a::{b, c::{self, d as e}, f::*}` as
    (['a','b'],'b'), (['a','c'],'c'), (['a','c','d'],'e'), (['a','f','*'],'*')."""
    tree = re.sub(r"\s+", " ", tree).strip().lstrip(":").strip()
    out = []

    def split(body):
        parts, depth, cur = [], 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        return [p.strip() for p in parts if p.strip()]

    def walk(prefix, rest):
        brace = rest.find("{")
        if brace >= 0:
            head = [s.strip() for s in rest[:brace].split("::") if s.strip()]
            for part in split(rest[brace + 1 : rest.rfind("}")]):
                walk(prefix + head, part)
            return
        alias = None
        if m := re.match(rf"(.*?)\s+as\s+({IDENT})$", rest):
            rest, alias = m.group(1), m.group(2)
        path = prefix + [s.strip() for s in rest.split("::") if s.strip()]
        if path and path[-1] == "self":
            path = path[:-1]
        if path:
            out.append((path, alias or path[-1]))

    walk([], tree)
    return out


class Module:
    """A module: its file (an inline module's is its parent's, with the span it covers), the
    modules it declares, and the names its `use` lines bind."""

    def __init__(self, crate, path, file, span=None):
        self.crate, self.path, self.file, self.span = crate, path, file, span
        self.children = {}  # name -> Module
        self.imports = {}  # bound name -> path as written
        self.globs = []  # paths of `use path::*`
        self.items = set()  # names the module defines


class Crates:
    """Every module of the crates, from their roots down their `mod` declarations."""

    def __init__(self):
        self.code = {}  # file -> code (comments, literals and tests blanked)
        self.raw = {}  # file -> text as written
        self.modules = []
        self.roots = {}  # crate root -> Module
        self.extern = {name: root for root, name in CRATES.items() if name}
        for root in CRATES:
            self.roots[root] = self.load(root, [], ROOT / root)

    def load(self, crate, path, file):
        raw = file.read_text()
        code = without_tests(code_of(raw))
        self.raw[file], self.code[file] = raw, code
        module = Module(crate, path, file)
        self.modules.append(module)
        here = file.parent if file.name in ("mod.rs", "lib.rs", "main.rs") else file.with_suffix("")
        for m in MOD_DECL.finditer(code):
            name = m.group(1)
            for candidate in (here / f"{name}.rs", here / name / "mod.rs"):
                if candidate.is_file():
                    module.children[name] = self.load(crate, path + [name], candidate)
                    break
        for m in MOD_INLINE.finditer(code):
            span = (m.end(), matching(code, m.end() - 1))
            inline = Module(crate, path + [m.group(1)], file, span)
            module.children[m.group(1)] = inline
            self.modules.append(inline)
        for m in ITEM.finditer(code):
            self.owner(module, m.start()).items.add(m.group(1))
        for m in USE.finditer(code):
            owner = self.owner(module, m.start())
            for p, name in expand(m.group(2)):
                if name == "*":
                    owner.globs.append(p[:-1])
                elif name != "_":
                    owner.imports.setdefault(name, p)
        return module

    def owner(self, module, offset):
        """The innermost module of module's file that holds offset."""
        for child in module.children.values():
            if child.span and child.file == module.file and child.span[0] <= offset < child.span[1]:
                return self.owner(child, offset)
        return module

    def module_at(self, crate, path):
        m = self.roots[crate]
        for seg in path:
            m = m.children.get(seg) if m else None
        return m

    def resolve(self, module, path, depth=0):
        """The file that defines what `path`, as written in `module`, names; None when it is
        outside these crates (std, a dependency) or not a path to anything."""
        if depth > 8 or not path:
            return None
        head = path[0]
        if head == "crate":
            start, rest = self.roots[module.crate], path[1:]
        elif head in ("super", "self"):
            start, rest = module, path
            while rest and rest[0] in ("super", "self") and start is not None:
                if rest[0] == "super":
                    start = self.module_at(start.crate, start.path[:-1])
                rest = rest[1:]
        elif head in module.children or head in module.imports or head in module.items:
            # A name in scope: a module it declares, a name it imported or an item of its own
            # (an inline module sees only its own names, as in Rust).
            start, rest = module, path
        elif head in self.extern and self.extern[head] != module.crate:
            start, rest = self.roots[self.extern[head]], path[1:]
        else:
            return None
        return self.walk(start, rest, depth)

    def walk(self, module, rest, depth):
        while module is not None and rest:
            seg = rest[0]
            if seg in module.children:
                module, rest = module.children[seg], rest[1:]
            elif seg in module.imports and seg not in module.items:
                found = self.resolve(module, module.imports[seg] + rest[1:], depth + 1)
                return found if found is not None else module.file
            else:
                if seg not in module.items:
                    for glob in module.globs:
                        found = self.resolve(module, glob + rest, depth + 1)
                        if found is not None and found != module.file:
                            return found
                return module.file
        return module.file if module is not None else None


def rel(file):
    return str(file.relative_to(ROOT))


def scan(crates):
    """(edges: file -> {target file: (line, path)}, problems of rule 2)."""
    edges, problems = {}, []
    for module in crates.modules:
        f = module.file
        code = crates.code[f]
        if module.span:
            code = blank(code, 0, module.span[0])
            code = blank(code, module.span[1], len(code))
        for child in module.children.values():
            if child.span and child.file == f:
                code = blank(code, *child.span)  # scanned as a module of its own
        uses = [
            (p, name, m.start(), bool(m.group(1)))
            for m in USE.finditer(code)
            for p, name in expand(m.group(2))
        ]
        rest = code
        for m in list(USE.finditer(code)) + list(MOD_DECL.finditer(code)):
            rest = blank(rest, m.start(), m.end())
        for m in VISIBILITY.finditer(rest):
            rest = blank(rest, m.start(), m.end())  # `pub(in path)` names who may see, not a use
        inline = [
            (re.sub(r"\s+", "", m.group(1)).split("::"), None, m.start(), False)
            for m in PATH.finditer(rest)
        ]
        for p, name, offset, public in uses + inline:
            target = crates.resolve(module, p)
            if target is None or target == f:
                continue
            if (
                public
                and name != "*"
                and reexports_own(crates, module, target)
                and not re.search(rf"(?<![\w:]){re.escape(name)}\b", rest)
            ):
                continue  # a module re-exporting its own part, for others to name
            line = crates.raw[f].count("\n", 0, offset) + 1
            if (
                module.crate == SERVER_LIB
                and module.path[:1] in (["grpc"], ["session"])
                and rel(target).startswith("server/core/")
                and through_redis(module, p)
            ):
                problems.append(
                    f"{rel(f)}:{line} takes {'::'.join(p)} through redis/: "
                    "the domain's types come from crate::domain"
                )
            edges.setdefault(f, {}).setdefault(target, (line, "::".join(p)))
    return edges, problems


def reexports_own(crates, module, target):
    """Whether target is the file of one of module's own descendants."""
    return any(
        m.file == target
        and m.crate == module.crate
        and len(m.path) > len(module.path)
        and m.path[: len(module.path)] == module.path
        for m in crates.modules
    )


def through_redis(module, path):
    """Whether `path`, written in a module outside redis/, names its item through redis/."""
    if path[0] in module.imports:
        path = module.imports[path[0]] + path[1:]
    return path[:2] == ["crate", "redis"]


def circles(edges):
    """The strongly connected sets of two files or more (Tarjan), each as a sorted list."""
    index, low, stack, on, found = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp, key=rel))

    for v in sorted(edges, key=rel):
        if v not in index:
            strong(v)
    return found


def shortest_circle(edges, members):
    """The shortest circle through the first of `members`, staying among them."""
    first = members[0]
    prev, queue = {first: None}, [first]
    while queue:
        following = []
        for v in queue:
            for w in sorted(edges.get(v, {}), key=rel):
                if w == first:
                    cycle = [v]
                    while prev[cycle[-1]] is not None:
                        cycle.append(prev[cycle[-1]])
                    return cycle[::-1]
                if w in members and w not in prev:
                    prev[w] = v
                    following.append(w)
        queue = following
    return [first]


def main():
    problems, notes = [], []
    config = tomllib.loads(CONFIG.read_text())
    layers = config["layer"]

    cargo = (ROOT / "server/core/Cargo.toml").read_text()
    deps = re.search(r"^\[dependencies\]\n(.*?)(?:^\[|\Z)", cargo, re.M | re.S).group(1)
    names = {
        line.split("=")[0].split(".")[0].strip()
        for line in deps.splitlines()
        if line.strip() and not line.startswith("#")
    }
    allowed = ", ".join(sorted(CORE_DEPENDENCIES))
    for extra in sorted(names - CORE_DEPENDENCIES):
        problems.append(f"server/core depends on {extra}: the core holds only pure code ({allowed})")

    crates = Crates()
    files = sorted(crates.code, key=rel)
    edges, domain = scan(crates)
    problems += domain

    def layer_of(f):
        best, r = None, rel(f)
        for i, layer in enumerate(layers):
            for prefix in layer["paths"]:
                holds = r == prefix or r.startswith(prefix.rstrip("/") + "/")
                if holds and (best is None or len(prefix) > best[1]):
                    best = (i, len(prefix))
        return None if best is None else best[0]

    for f in files:
        if layer_of(f) is None:
            problems.append(f"{rel(f)} is in no layer of .ci/layers.toml: give it the one it belongs to")

    for f, targets in edges.items():
        for t, (line, path) in sorted(targets.items(), key=lambda x: rel(x[0])):
            a, b = layer_of(f), layer_of(t)
            if a is not None and b is not None and b > a:
                problems.append(
                    f"upward: {rel(f)}:{line} ({layers[a]['name']}) uses {path}, "
                    f"of {rel(t)} ({layers[b]['name']})"
                )

    known = [{ROOT / f for f in k["files"]} for k in config.get("known_circle", [])]
    used = set()
    for members in circles(edges):
        cycle = shortest_circle(edges, members)
        hops = " -> ".join(f"{rel(a)}:{edges[a][b][0]}" for a, b in zip(cycle, cycle[1:] + cycle[:1]))
        listed = ", ".join(rel(m) for m in members)
        line = f"circle of {len(members)} files ({listed}): {hops} -> {rel(cycle[0])}"
        waiver = next((i for i, k in enumerate(known) if set(members) <= k), None)
        if waiver is None:
            problems.append(line)
        else:
            used.add(waiver)
            notes.append(f"known {line}")
    for i, k in enumerate(config.get("known_circle", [])):
        if i not in used:
            listed = ", ".join(k["files"])
            problems.append(f"known circle of .ci/layers.toml no longer found ({listed}): remove it")

    if "--edges" in sys.argv:
        for f in sorted(edges, key=rel):
            for t, (line, path) in sorted(edges[f].items(), key=lambda x: rel(x[0])):
                print(f"{rel(f)}:{line} -> {rel(t)} ({path})")
    if "--graph" in sys.argv:
        between = {}
        for f, targets in edges.items():
            for t in targets:
                a, b = layer_of(f), layer_of(t)
                if a is not None and b is not None and a != b:
                    between[(a, b)] = between.get((a, b), 0) + 1
        for (a, b), n in sorted(between.items(), key=lambda x: (-x[0][0], -x[0][1])):
            print(f"{layers[a]['name']} -> {layers[b]['name']}: {n}")

    for note in notes:
        print(note)
    for p in sorted(set(problems)):
        print(p)
    if problems:
        sys.exit(1)
    print(
        f"layers: core dependencies {sorted(names)}; {len(files)} files in {len(layers)} layers, "
        f"{sum(len(t) for t in edges.values())} imports between them, none upward, "
        f"no circle{' but the known' if notes else ''}, "
        "no domain type through redis/ in grpc/ or session/"
    )


if __name__ == "__main__":
    main()
