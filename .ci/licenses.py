#!/usr/bin/env python3
"""The dependency tree's licenses and sources, checked offline from `cargo metadata`.

Every package the workspace can build (all targets, all platforms) must carry a license
expression that one of ALLOWED satisfies, and come from crates.io or from a path inside this
repository (the vendored crates). `cargo deny` does this and more, but its advisory database
is a git repository this project's machines cannot reach; licenses and sources need none.

  python3 .ci/licenses.py          exit 1 and say which package, when one fails
"""

import json
import os
import re
import subprocess
import sys

# Permissive licenses, and MPL-2.0 (file-level copyleft: using the crate unchanged is fine).
ALLOWED = {
    "0BSD", "Apache-2.0", "Apache-2.0 WITH LLVM-exception", "BSD-2-Clause", "BSD-3-Clause",
    "BSL-1.0", "CC0-1.0", "CDLA-Permissive-2.0", "ISC", "MIT", "MIT-0", "MPL-2.0",
    "Unicode-3.0", "Unicode-DFS-2016", "Unlicense", "Zlib",
}


def tokens(expression):
    # Old crates write "MIT/Apache-2.0" for "MIT OR Apache-2.0".
    expression = expression.replace("/", " OR ")
    return re.findall(r"\(|\)|[A-Za-z0-9.+-]+(?: WITH [A-Za-z0-9.+-]+)?", expression)


def satisfied(expression):
    """Whether ALLOWED satisfies an SPDX expression (OR, AND, parentheses, WITH)."""
    toks = tokens(expression)
    pos = 0

    def parse_or():
        nonlocal pos
        value = parse_and()
        while pos < len(toks) and toks[pos] == "OR":
            pos += 1
            value = parse_and() or value
        return value

    def parse_and():
        nonlocal pos
        value = parse_atom()
        while pos < len(toks) and toks[pos] == "AND":
            pos += 1
            value = parse_atom() and value
        return value

    def parse_atom():
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok == "(":
            value = parse_or()
            pos += 1  # ")"
            return value
        return tok in ALLOWED

    value = parse_or()
    if pos != len(toks):
        raise ValueError(f"cannot parse the license expression {expression!r}")
    return value


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        cwd=root, check=True, capture_output=True, text=True).stdout)
    members = set(metadata["workspace_members"])
    problems = []
    checked = 0
    for package in metadata["packages"]:
        if package["id"] in members:
            continue
        checked += 1
        name = f"{package['name']} {package['version']}"
        license_ = package.get("license")
        if not license_:
            problems.append(f"{name}: no license expression (license_file: {package.get('license_file')})")
        elif not satisfied(license_):
            problems.append(f"{name}: {license_!r} is not satisfied by the allowed licenses")
        source = package.get("source")
        if source is None:
            if not os.path.realpath(package["manifest_path"]).startswith(root + os.sep):
                problems.append(f"{name}: a path dependency outside the repository")
        elif not (source.startswith("registry+") and source.endswith("/crates.io-index")):
            problems.append(f"{name}: from {source}, not crates.io")
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"licenses and sources: {checked} packages, {len(problems)} refused")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
