"""The wheel's build hook (hatchling): generates the gRPC code from the proto into a temporary
directory and adds it to the wheel as ``window_client/_generated``; nothing is written into the
source tree, so a read-only checkout builds.

The proto is looked for at ``$WINDOW_PROTO_DIR``, then ``proto/`` beside this file (an unpacked
sdist, which carries it), then the repository's ``../../proto``. The generator is the build
environment's pinned grpcio-tools (``build-system.requires``). An sdist gets the proto and no
generated code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = Path("window_sidecar") / "v1" / "window.proto"


def find_proto(root: Path) -> Optional[Path]:
    """The directory that holds window_sidecar/v1/window.proto, or None."""
    candidates = [os.environ.get("WINDOW_PROTO_DIR"), root / "proto", root / ".." / ".." / "proto"]
    for c in candidates:
        if c and (Path(c) / PROTO).is_file():
            return Path(c).resolve()
    return None


class GenerateHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: Dict[str, Any]) -> None:
        root = Path(self.root)
        proto = find_proto(root)
        if proto is None:
            raise SystemExit(
                f"window.proto not found: set WINDOW_PROTO_DIR (looked in {root / 'proto'} "
                f"and {root.parent.parent / 'proto'})"
            )
        force = build_data.setdefault("force_include", {})
        if self.target_name == "sdist":
            force[str(proto / PROTO)] = str(Path("proto") / PROTO)
            return
        self._tmp = tempfile.mkdtemp(prefix="window-client-build-")
        out = Path(self._tmp)
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", "-I", str(proto),
             f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
             str(proto / PROTO)],
            check=True,
        )
        gen = out / "window_sidecar" / "v1"
        stub = (gen / "window_pb2_grpc.py").read_text()
        stub, n = re.subn(r"^from window_sidecar\.v1 import window_pb2 as ",
                          "from . import window_pb2 as ", stub, flags=re.M)
        if n != 1:
            raise SystemExit("hatch_build.py: the stub's import of window_pb2 was not found")
        (gen / "window_pb2_grpc.py").write_text(stub)
        (gen / "__init__.py").write_text(
            '"""Generated from proto/window_sidecar/v1/window.proto at build time; do not '
            'edit."""\n'
        )
        for name in ("__init__.py", "window_pb2.py", "window_pb2.pyi", "window_pb2_grpc.py"):
            force[str(gen / name)] = f"window_client/_generated/{name}"

    def finalize(self, version: str, build_data: Dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
