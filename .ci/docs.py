#!/usr/bin/env python3
"""The manual agrees with the tree: links resolve, and the references list what the code has.

1. Every relative link of every tracked Markdown file (server/vendor aside) resolves: the file
   or folder exists, and a `#anchor` names a heading of the target (GitHub's anchors: the
   heading's text lowercased, punctuation dropped, spaces to `-`, a repeated heading `-1`,
   `-2`...), or an explicit `<a id=…>`/`<a name=…>`.
2. docs/reference/flags.md lists every flag of `window-sidecar --help` and of
   `window-sidecar dead-letters --help`, each with its environment variable, and no flag they
   do not have. The flags are read from the clap definitions (`#[arg(long…)]` in
   server/src/config/mod.rs and server/src/cli/dead_letters.rs), not from a built binary's
   `--help`: the check then runs in a second, before (and without) any build, and on a machine
   with no Rust toolchain; clap builds `--help` from exactly these attributes, so the two cannot
   disagree. The parser refuses a definition it does not understand (an `#[arg]` with no field
   after it, a `flatten` of an unknown struct, far fewer flags than expected) rather than
   passing quietly.
3. docs/reference/metrics.md lists every metric the server registers (`register` and
   `register_with_unit` calls in server/src, named as Prometheus exposes them: the registry's
   prefix, the unit, `_total` for counters) with its type, and no metric it does not register.
   A family's 0.1.0 name (`window_…`, gone since 0.2.0) appears only in the reference's
   "Former names" table, beside the name that replaced it.
4. Every rpc, message, enum, enum value, oneof and field of the wire contract (proto/**/*.proto)
   has a comment on the line directly above it: the contract is what clients in every language
   are generated from, and its comments are their only documentation.
5. docs/performance.md's generated parts (its tables) and README.md's (its headline figures)
   are what .ci/perf_doc.py renders from docs/performance.json, the benchmark's report: neither
   page is edited without the JSON, so the README's figures are those of the run the
   performance page shows.

Prints one line per problem (`path:line: what`) and exits 1 when there is one.
usage: docs.py [ROOT]   (the repository root; by default the parent of this script's folder)
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent).resolve()
FLAGS_DOC = "docs/reference/flags.md"
METRICS_DOC = "docs/reference/metrics.md"
SIDECAR_FLAGS = "server/src/config/mod.rs"
DEAD_LETTER_FLAGS = "server/src/cli/dead_letters.rs"

problems = []


def problem(path, line, what):
    problems.append(f"{path}:{line}: {what}")


def read(rel):
    path = ROOT / rel
    if not path.exists():
        problem(rel, 1, "no such file")
        return ""
    return path.read_text(encoding="utf-8")


def tracked(*suffixes):
    """The files ending in one of `suffixes` that git tracks or would (new files not yet added
    included), the vendored crates aside."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                              "--exclude-standard", *("*" + s for s in suffixes)], check=True,
                             capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [str(p.relative_to(ROOT)) for s in suffixes for p in ROOT.rglob("*" + s)
               if ".git" not in p.parts and "node_modules" not in p.parts]
    return sorted(set(f for f in out if not f.startswith("server/vendor/") and (ROOT / f).exists()))


def tracked_markdown():
    """The Markdown files git tracks or would."""
    return tracked(".md")


# ---------------------------------------------------------------------------------------------
# 1. Links

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # punctuation (backticks, dots, colons...) dropped
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, out = {}, set()
        text = path.read_text(encoding="utf-8", errors="replace")
        for _, line in prose_lines(text):
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                out.add(base if n == 0 else f"{base}-{n}")
            out.update(HTML_ANCHOR.findall(line))
        _anchors[path] = out
    return _anchors[path]


def check_links(files):
    count = 0
    for rel in files:
        path = ROOT / rel
        text = path.read_text(encoding="utf-8", errors="replace")
        # Code is no link: fenced blocks blanked (keeping the line numbers), code spans dropped;
        # a link's text may run over a line break.
        lines = [""] * (text.count("\n") + 1)
        for number, line in prose_lines(text):
            lines[number - 1] = CODE_SPAN.sub("", line)
        prose = "\n".join(lines)
        for m in LINK.finditer(prose):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # a URL (https:, mailto:...): not ours to check
            count += 1
            number = prose.count("\n", 0, m.end()) + 1
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problem(rel, number, f"link {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problem(rel, number, f"link {target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    return count


# ---------------------------------------------------------------------------------------------
# 2. Flags

ARG = re.compile(r"#\[(arg|command)\((.*?)\)\]\s*(?:///[^\n]*\n\s*|#\[[^\n]*\n\s*)*(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:\s*([^,\n]+)", re.S)
STRUCT = re.compile(r"\n(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum)\s+(\w+)[^{;]*\{")


def block(text, start):
    """The text of the braces whose `{` ends at `start`."""
    depth, i = 1, start
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start:i - 1]


def items(rel):
    """{struct or enum name: its body} of a Rust file."""
    text = read(rel)
    return {m.group(1): block(text, m.end()) for m in STRUCT.finditer(text)}


def clap_flags(rel, top):
    """{--flag: env or None} of the clap definition `top` in `rel`, following `flatten`."""
    defs = items(rel)
    flags = {}

    def walk(name):
        body = defs.get(name)
        if body is None:
            problem(rel, 1, f"docs.py cannot find the clap definition {name}")
            return
        for kind, attrs, field, ty in ARG.findall(body):
            if kind == "command":
                if "flatten" in attrs:
                    walk(ty.strip().split("<")[-1].strip("> ").split("::")[-1])
                continue
            if not re.search(r"\blong\b", attrs):
                continue  # a positional argument
            m = re.search(r"\blong\s*=\s*\"([^\"]+)\"", attrs)
            flag = "--" + (m.group(1) if m else field.replace("_", "-"))
            env = re.search(r"\benv\s*=\s*\"([^\"]+)\"", attrs)
            flags[flag] = env.group(1) if env else None

    walk(top)
    # The attributes written on enum variants' fields (subcommands) are in the enum's body too.
    return flags


def doc_flags(rel, heading):
    """{--flag: (line, env or None)} of the first column of the tables under `heading` (a `## `
    section), and the line of the heading."""
    out, inside, at = {}, False, None
    for number, line in prose_lines(read(rel)):
        if line.startswith("## "):
            inside = line[3:].strip() == heading
            at = number if inside else at
            continue
        if inside and line.startswith("|") and not re.match(r"^\|\s*-", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            envs = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[1]) if len(cells) > 1 else []
            for flag in re.findall(r"`(?:-\w, )?(--[a-z0-9-]+)", cells[0]):
                out[flag] = (number, envs)
    return out, at


def check_flags():
    total = 0
    wanted = [
        ("The sidecar's flags", SIDECAR_FLAGS, "Config", {"--help": None, "--version": None}),
        ("The dead-letters command's flags", DEAD_LETTER_FLAGS, "DeadLettersCli", {"--help": None, "--version": None}),
    ]
    for heading, source, top, implicit in wanted:
        code = clap_flags(source, top)
        if top == "DeadLettersCli":
            # The actions' flags: every variant of the subcommand enum.
            for kind, attrs, field, ty in ARG.findall(items(source).get("Action", "")):
                if kind == "arg" and re.search(r"\blong\b", attrs):
                    m = re.search(r"\blong\s*=\s*\"([^\"]+)\"", attrs)
                    code["--" + (m.group(1) if m else field.replace("_", "-"))] = None
            code.update(clap_flags(source, "Select"))
        if len(code) < 10:
            problem(source, 1, f"docs.py found only {len(code)} flags of {top}: its parser no longer understands the definition")
        code.update(implicit)
        documented, at = doc_flags(FLAGS_DOC, heading)
        if at is None:
            problem(FLAGS_DOC, 1, f"no section '## {heading}'")
            continue
        for flag in sorted(set(code) - set(documented)):
            problem(FLAGS_DOC, at, f"{flag} ({source}) is not in '{heading}'")
        for flag in sorted(set(documented) - set(code)):
            problem(FLAGS_DOC, documented[flag][0], f"{flag} is no flag of {source}")
        for flag in sorted(set(code) & set(documented)):
            env = code[flag]
            line, envs = documented[flag]
            if env and env not in envs:
                problem(FLAGS_DOC, line, f"{flag}: its variable is {env} ({source}), not {', '.join(envs) or 'none'}")
        total += len(code)
    return total


# ---------------------------------------------------------------------------------------------
# 3. Metrics

REGISTER = re.compile(
    r"\.register(?:_with_unit)?\(\s*\"(\w+)\"\s*,\s*\"(?:[^\"\\]|\\.)*\"\s*,\s*(?:Unit::(\w+)\s*,\s*)?(?:\w+)\.(\w+)\.clone\(\)")
UNITS = {"Seconds": "seconds", "Bytes": "bytes", "Ratios": "ratios", "Volts": "volts",
         "Amperes": "amperes", "Joules": "joules", "Grams": "grams", "Meters": "meters", "Celsius": "celsius"}


def registered_metrics():
    """The registry's prefix, and {exposed name: (type, file, line, name without the counter's
    `_total`)} of every metric registered under server/src."""
    out = {}
    prefix = None
    for path in sorted((ROOT / "server/src").rglob("*.rs")):
        text = path.read_text(encoding="utf-8")
        m = re.search(r"Registry::with_prefix\(\s*\"(\w+)\"", text)
        if m:
            prefix = m.group(1)
    if prefix is None:
        problem("server/src", 1, "docs.py cannot find the registry's prefix (Registry::with_prefix)")
        return "", out
    for path in sorted((ROOT / "server/src").rglob("*.rs")):
        text = path.read_text(encoding="utf-8")
        for m in REGISTER.finditer(text):
            name, unit, field = m.groups()
            decl = re.search(rf"\bpub(?:\([^)]*\))?\s+{field}\s*:\s*([^\n]+?),?\s*\n", text)
            line = text.count("\n", 0, m.start()) + 1
            rel = str(path.relative_to(ROOT))
            if decl is None:
                problem(rel, line, f"docs.py cannot find the type of the metric field {field}")
                continue
            ty = decl.group(1)
            kind = ("histogram" if "Histogram" in ty or "Latency" in ty
                    else "counter" if "Counter" in ty else "gauge" if "Gauge" in ty else "?")
            if kind == "?":
                problem(rel, line, f"docs.py does not know the metric type {ty}")
            full = f"{prefix}_{name}" + (f"_{UNITS.get(unit, unit.lower())}" if unit else "")
            out[full + ("_total" if kind == "counter" else "")] = (kind, rel, line, full)
    return prefix + "_", out


def check_metrics():
    prefix, metrics = registered_metrics()
    if len(metrics) < 20:
        problem("server/src/metrics/mod.rs", 1, f"docs.py found only {len(metrics)} registered metrics: its parser no longer understands the registrations")
    new = re.compile(r"\b(" + re.escape(prefix) + r"[a-z0-9_]*[a-z0-9])")
    documented, types = {}, {}
    for number, line in prose_lines(read(METRICS_DOC)):
        for name in new.findall(line):
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[: -len(suffix)]
                if name.endswith(suffix) and metrics.get(base, ("",))[0] == "histogram":
                    name = base
            documented.setdefault(name, number)
        row = re.match(r"^\|\s*`([a-z0-9_]+)`\s*\|\s*(\w+)\s*\|", line)
        if row:
            types[row.group(1)] = (row.group(2), number)
    for name, (kind, rel, line, _) in sorted(metrics.items()):
        if name not in documented:
            problem(METRICS_DOC, 1, f"{name} ({kind}, registered at {rel}:{line}) is not in the reference")
        elif name not in types:
            problem(METRICS_DOC, documented[name], f"{name} has no row (| `name` | type | ...) in the reference")
        elif types[name][0] != kind:
            problem(METRICS_DOC, types[name][1], f"{name} is a {kind}, not a {types[name][0]}")
    for name, number in sorted(documented.items()):
        if name not in metrics:
            problem(METRICS_DOC, number, f"{name} is not a metric the server registers")
    # The 0.1.0 names: only in the "Former names" table, each beside the name that replaced it.
    old_prefix = "window_"
    exposed = sorted((name[len(prefix):] for name in metrics), key=len, reverse=True)
    old = re.compile(r"\b" + re.escape(old_prefix) + r"(" + "|".join(map(re.escape, exposed)) + r")((?:_bucket|_sum|_count)?)\b")
    section, table = None, False
    for number, line in enumerate(read(METRICS_DOC).splitlines(), 1):
        if line.startswith("## "):
            section = line[3:].strip()
        row = re.match(r"^\|\s*`(" + re.escape(old_prefix) + r"\w+)`\s*\|\s*`(\w+)`\s*\|", line)
        if section == "Former names" and row:
            former, now = row.groups()
            if now != prefix + former[len(old_prefix):] or now not in metrics:
                problem(METRICS_DOC, number, f"{former}: its name now is {prefix + former[len(old_prefix):]}, a metric the server must register")
    for path in tracked(".md", ".yaml", ".yml", ".json", ".tpl"):
        if path == "CHANGELOG.md":
            continue
        section = None
        for number, line in enumerate(read(path).splitlines(), 1):
            if path.endswith(".md") and line.startswith("## "):
                section = line[3:].strip()
            if path == METRICS_DOC and section == "Former names":
                continue
            for m in old.finditer(line):
                problem(path, number, f"{m.group(0)} is a 0.1.0 metric name the server no longer exports: use {prefix}{m.group(1)}{m.group(2) or ''}")
    return len(metrics)
    by_family = {v[3][len(prefix):]: (k, v[0]) for k, v in metrics.items()}
    expected = set()
    for family in re.findall(r"\"(\w+)\"", m.group(1)):
        if family not in by_family:
            problem(METRIC_NAMES, 1, f"OLD_FAMILIES names {family}, which is not registered")
            continue
        kind = by_family[family][1]
        expected.add(old_prefix.group(1) + family + ("_total" if kind == "counter" else ""))
    old = re.compile(r"`(" + re.escape(old_prefix.group(1)) + r"(?!" + re.escape(prefix[len(old_prefix.group(1)):]) + r")[a-z0-9_]*[a-z0-9])`")
    listed = {}
    for number, line in prose_lines(read(METRICS_DOC)):
        for name in old.findall(line):
            listed.setdefault(name, number)
    for name in sorted(expected - set(listed)):
        problem(METRICS_DOC, 1, f"the former name {name} (server/src/metrics/names.rs) is not listed")
    for name in sorted(set(listed) - expected):
        problem(METRICS_DOC, listed[name], f"{name} is not a former name the server exports")
    return len(metrics)


# ---------------------------------------------------------------------------------------------
# 4. The wire contract's comments

PROTO_ITEM = [
    ("service", re.compile(r"^\s*service\s+(\w+)\s*\{")),
    ("rpc", re.compile(r"^\s*rpc\s+(\w+)\s*\(")),
    ("message", re.compile(r"^\s*message\s+(\w+)\s*\{")),
    ("enum", re.compile(r"^\s*enum\s+(\w+)\s*\{")),
    ("oneof", re.compile(r"^\s*oneof\s+(\w+)\s*\{")),
    ("enum value", re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*=\s*-?\d+\s*[;\[]")),
    ("field", re.compile(r"^\s*(?:(?:repeated|optional)\s+)?(?:map\s*<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+\s*[;\[]")),
]


def check_proto():
    count = 0
    for path in sorted((ROOT / "proto").rglob("*.proto")):
        rel = str(path.relative_to(ROOT))
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("//"):
                continue
            for kind, pattern in PROTO_ITEM:
                m = pattern.match(line)
                if m:
                    count += 1
                    above = lines[i - 1].strip() if i else ""
                    if not above.startswith("//"):
                        problem(rel, i + 1, f"{kind} {m.group(1)} has no comment directly above it")
                    break
    return count


# ---------------------------------------------------------------------------------------------
# 5. The performance page's tables and the README's headline

def check_performance():
    """perf_doc.py's own check, its problems as this script's; the parts it checked, and the
    pages."""
    spec = importlib.util.spec_from_file_location("perf_doc", pathlib.Path(__file__).resolve().parent / "perf_doc.py")
    perf_doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf_doc)
    for path, line, what in perf_doc.check(ROOT):
        problem(path, line, what)
    return sum(len(parts) for parts in perf_doc.PAGES.values()), " and ".join(perf_doc.PAGES)


def main():
    files = tracked_markdown()
    links = check_links(files)
    flags = check_flags()
    metrics = check_metrics()
    items_ = check_proto()
    generated, pages = check_performance()
    for p in problems:
        print(p)
    if problems:
        print(f"docs: {len(problems)} problems")
        return 1
    print(f"docs: {len(files)} Markdown files, {links} relative links, {flags} flags, "
          f"{metrics} metrics, {items_} items of the wire contract, {generated} generated parts of "
          f"{pages}: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
