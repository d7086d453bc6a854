"""attnserve: a Python client for the attnserve gRPC service.

    import attnserve
    with attnserve.Client("localhost:50051") as client:
        result = client.attend(q, k, v, causal=True)      # numpy (or torch) arrays in
        result.output                                     # a numpy array out
        result.timing.compute_us

Also: attnserve.AsyncClient (asyncio, grpc.aio), attnserve.export_state_dict (a PyTorch module's
weights as safetensors under the reference names, ready for Client.load_module), and
``python3 -m attnserve.reflection`` (a generic client through server reflection).

The messages come from stubs generated from proto/attnserve/v1/attention.proto (the build
writes them to <build>/python/attnserve_pb). They are found on sys.path, or in the directory the
ATTNSERVE_STUBS environment variable names: this package extends its own path with every
``attnserve`` directory there, so ``attnserve.v1.attention_pb2`` resolves to the generated code.
Needs grpcio, protobuf and numpy (Debian's python3-grpcio, python3-protobuf, python3-numpy);
torch is optional.
"""
import os
import pkgutil
import sys

__path__ = pkgutil.extend_path(__path__, __name__)  # noqa: F821 (the generated attnserve/v1)
_stubs = os.environ.get("ATTNSERVE_STUBS")
if _stubs and os.path.isdir(os.path.join(_stubs, "attnserve")):
    _dir = os.path.join(_stubs, "attnserve")
    if _dir not in __path__:
        __path__.append(_dir)

try:
    from attnserve.v1 import attention_pb2 as pb  # noqa: E402
    from attnserve.v1 import attention_pb2_grpc as pb_grpc  # noqa: E402
    from attnserve.tensors import to_tensor, from_tensor, DTYPES  # noqa: E402,F401
    from attnserve.client import Client, AsyncClient, Result, RetryPolicy  # noqa: E402,F401
    from attnserve.safetensors import (  # noqa: E402,F401
        write_safetensors, read_safetensors, export_state_dict, REFERENCE_NAMES)
except ImportError as _e:
    # attnserve.reflection needs no stubs: importing the package must not fail without them.
    # Everything else says plainly what is missing when it is first used.
    _stub_error = ImportError(
        "attnserve: the generated stubs attnserve/v1/attention_pb2.py were not found; build "
        "the target attnserve_python_stubs and put <build>/python/attnserve_pb on PYTHONPATH "
        f"(or name it in ATTNSERVE_STUBS). ({_e}; sys.path was {sys.path})")

    def __getattr__(name):
        raise _stub_error

__all__ = ["pb", "pb_grpc", "Client", "AsyncClient", "Result", "RetryPolicy", "to_tensor",
           "from_tensor", "DTYPES", "write_safetensors", "read_safetensors", "export_state_dict",
           "REFERENCE_NAMES"]
