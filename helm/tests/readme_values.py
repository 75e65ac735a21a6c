#!/usr/bin/env python3
"""The values table of helm/window-sidecar/README.md, generated from values.yaml.

A value is documented by a `# -- description` comment right above its key (continued on the
following `#` lines), as helm-docs does. A map whose key carries such a comment is one row (its
default shown as JSON); a map without one is descended into. Every documented path must also be
described in values.schema.json.

  readme_values.py CHART --check   exit 1 unless README.md holds the current table and every
                                   value is documented
  readme_values.py CHART --write   rewrite the table in README.md

The table sits between the lines <!-- values-table:start --> and <!-- values-table:end -->.
"""

import json
import os
import re
import sys

import yaml

START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"


def comments_by_path(text):
    """{dotted path: description} from the `# --` comments of values.yaml."""
    docs = {}
    stack = []  # (indent, key)
    pending = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_]+):", line)
        if not match:
            if not stripped.startswith("- "):
                pending = None
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if pending is not None:
            docs[".".join(k for _, k in stack)] = " ".join(pending)
        pending = None
    return docs


def rows(values, docs, prefix=""):
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in docs:
            yield from rows(value, docs, path + ".")
        else:
            yield path, value, docs.get(path)


def schema_has(schema, path):
    node = schema
    for key in path.split("."):
        node = (node.get("properties") or {}).get(key)
        if node is None:
            return False
    return True


def type_of(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def table(chart):
    with open(os.path.join(chart, "values.yaml"), encoding="utf-8") as f:
        text = f.read()
    with open(os.path.join(chart, "values.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    docs = comments_by_path(text)
    problems, lines = [], ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for path, value, doc in rows(yaml.safe_load(text), docs):
        if not doc:
            problems.append(f"{path}: no `# --` description in values.yaml")
        if not schema_has(schema, path):
            problems.append(f"{path}: not described in values.schema.json")
        default = json.dumps(value, separators=(", ", ": "))
        lines.append(f"| `{path}` | {type_of(value)} | `{cell(default)}` | {cell(doc or '')} |")
    return "\n".join(lines) + "\n", problems


def main():
    chart, mode = sys.argv[1], sys.argv[2]
    readme_path = os.path.join(chart, "README.md")
    generated, problems = table(chart)
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    if START not in readme or END not in readme:
        problems.append(f"README.md has no {START} ... {END} block")
        current = None
    else:
        head, rest = readme.split(START, 1)
        current, tail = rest.split(END, 1)
    if mode == "--write" and current is not None:
        with open(readme_path, "w", encoding="utf-8") as f:
            f.write(f"{head}{START}\n{generated}{END}{tail}")
        current = "\n" + generated
    if current is not None and current.strip() != generated.strip():
        problems.append("README.md's values table is out of date: run "
                        "`python3 helm/tests/readme_values.py helm/window-sidecar --write`")
    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok {generated.count(chr(10)) - 2} values documented in README.md and the schema")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
