"""Builds the generated gRPC code into the wheel.

Everything else is in pyproject.toml. Every build runs ./generate.sh first (with the build
environment's Python, which has the pinned grpcio-tools of ``build-system.requires``) so that a
wheel always carries code generated from the proto it is built with; the proto lives at the
repository root (``../../proto``, or ``$WINDOW_PROTO_DIR``). Without it (an unpacked sdist) the
code generated before is used."""

import os
import subprocess
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.environ.get("WINDOW_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
GENERATED = os.path.join(HERE, "window_client", "_generated", "window_pb2.py")


def generate() -> None:
    """Generates the code before setuptools looks for the package directories (egg_info, the
    first step of every build, needs ``window_client/_generated`` to exist)."""
    if os.path.exists(os.path.join(PROTO, "window_sidecar", "v1", "window.proto")):
        subprocess.run(
            ["bash", os.path.join(HERE, "generate.sh")],
            check=True,
            env={**os.environ, "PYTHON": sys.executable, "WINDOW_PROTO_DIR": PROTO},
        )
    elif not os.path.exists(GENERATED):
        raise SystemExit(f"window.proto not found under {PROTO} and no generated code")


generate()
setup()
