#!/usr/bin/env python3
"""The library chart (helm/window-sidecar-lib) agrees with the window-sidecar chart, for run.sh.

  - its templates/_helpers.tpl is the chart's, byte for byte (one set of named templates);
  - its values are the chart's sidecar values with the same defaults: image, sidecar, redis and
    otel whole, commonLabels, fullnameOverride, metrics.enabled; nameOverride is
    "window-sidecar", so that names come out as the chart's;
  - every top-level value the templates read is among them;
  - its appVersion (the default image tag) is the chart's.

Usage: library_check.py REPO_ROOT
"""

import os
import re
import sys

import yaml

SAME = ("fullnameOverride", "commonLabels", "image", "sidecar", "redis", "otel")


MISSING = "(missing)"


def differences(mine, theirs, path):
    """(dotted path, library value, chart value) for every leaf where the two differ."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs)):
            yield from differences(mine.get(key, MISSING), theirs.get(key, MISSING), f"{path}.{key}")
    elif mine != theirs:
        yield path, mine, theirs


def main():
    root = sys.argv[1]
    chart = os.path.join(root, "helm/window-sidecar")
    lib = os.path.join(root, "helm/window-sidecar-lib")
    problems = []

    def load(path):
        with open(path, encoding="utf-8") as f:
            return f.read()

    helpers = load(os.path.join(chart, "templates/_helpers.tpl"))
    if load(os.path.join(lib, "templates/_helpers.tpl")) != helpers:
        problems.append("helm/window-sidecar-lib/templates/_helpers.tpl differs from the chart's: "
                        "cp helm/window-sidecar/templates/_helpers.tpl helm/window-sidecar-lib/templates/")
    others = sorted(set(os.listdir(os.path.join(lib, "templates"))) - {"_helpers.tpl"})
    if others:
        problems.append(f"helm/window-sidecar-lib/templates has more than _helpers.tpl: {others}")

    values = yaml.safe_load(load(os.path.join(chart, "values.yaml")))
    lib_values = yaml.safe_load(load(os.path.join(lib, "values.yaml")))
    expected = {k: values[k] for k in SAME}
    expected["nameOverride"] = "window-sidecar"
    expected["metrics"] = {"enabled": values["metrics"]["enabled"]}
    for key in sorted(set(expected) | set(lib_values)):
        if key not in lib_values:
            problems.append(f"the library's values.yaml lacks {key} (the chart's: {expected[key]!r})")
        elif key not in expected:
            problems.append(f"the library's values.yaml has {key}, which is not a sidecar value")
        else:
            for path, mine, theirs in differences(lib_values[key], expected[key], key):
                problems.append(f"the library's {path} is {mine!r}, the chart's {theirs!r}")

    # .Values.X, and $v.X where a template holds the whole of .Values in $v.
    whole = set(re.findall(r"\$(\w+) := \.Values\s", helpers))
    read = set(re.findall(r"\.Values\.(\w+)", helpers))
    for name in whole:
        read |= set(re.findall(r"\$" + name + r"\.(\w+)", helpers))
    missing = sorted(read - set(lib_values))
    if missing:
        problems.append(f"the templates read values the library does not have: {missing}")

    app = yaml.safe_load(load(os.path.join(chart, "Chart.yaml")))["appVersion"]
    lib_chart = yaml.safe_load(load(os.path.join(lib, "Chart.yaml")))
    if lib_chart.get("type") != "library":
        problems.append(f"helm/window-sidecar-lib is type {lib_chart.get('type')!r}, not library")
    if lib_chart.get("appVersion") != app:
        problems.append(f"the library's appVersion {lib_chart.get('appVersion')!r} is not the chart's {app!r}")

    for p in problems:
        print(f"  FAIL {p}")
    if not problems:
        print(f"  ok the library's _helpers.tpl is the chart's; its values ({', '.join(sorted(lib_values))}) "
              f"are the chart's; the templates read only {', '.join(sorted(read))}; appVersion {app}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
