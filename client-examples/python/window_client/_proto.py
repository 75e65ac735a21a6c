"""The generated code: the messages (``pb``) and the stub (``pb_grpc``).

It is built into the package as ``window_client/_generated`` (by the wheel's build, or by
``./generate.sh`` in a source checkout), so importing it needs no entry on ``sys.path``."""

try:
    from ._generated import window_pb2 as pb
    from ._generated import window_pb2_grpc as pb_grpc
except ImportError as err:  # pragma: no cover - a setup error, explained
    raise ImportError(
        f"the generated gRPC code is missing or broken ({err}); install the built wheel, or "
        "run ./generate.sh in client-examples/python when working in the source tree"
    ) from err

__all__ = ["pb", "pb_grpc"]
