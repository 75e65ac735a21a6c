"""Imports the generated code (``./generate.sh`` writes it to ``generated/``)."""

import os
import sys

_GENERATED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "generated")
if _GENERATED not in sys.path:
    sys.path.insert(0, _GENERATED)

try:
    from window_sidecar.v1 import window_pb2 as pb  # noqa: E402
    from window_sidecar.v1 import window_pb2_grpc as pb_grpc  # noqa: E402
except ImportError as err:  # pragma: no cover - a setup error, explained
    raise ImportError(
        f"the generated gRPC code is missing or broken ({err}); run ./generate.sh "
        "(python -m grpc_tools.protoc) in client-examples/python first"
    ) from err

__all__ = ["pb", "pb_grpc"]
