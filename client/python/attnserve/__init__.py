"""attnserve: a Python client for the attnserve gRPC service (Transformer attention).

    import numpy as np
    import attnserve

    with attnserve.Client("localhost:50051") as client:
        x = np.ones((1, 10, 64), np.float32)                 # [batch, length, d_model]
        result = client.multi_head_attention("demo", x)    # the server's built-in module
        result.output                                      # a numpy array [1, 10, 64]
        result.timing.compute_us                           # the server's timing

numpy arrays (or nested lists) go in and come out; torch tensors go in too when torch is
importable, and come out with Client(..., torch_out=True). float32, float16 and bfloat16.

- Client: blocking calls (attend, multi_head_attention, load_module, unload_module,
  list_modules, server_info) and stream() over the AttentionStream rpc.
- AsyncClient: the same as coroutines on asyncio (grpc.aio); stream() as an async iterator.
- attend_request, multi_head_request, stream_request: the request messages, for streams.
- Decode sessions: Client.create_session -> Session (extend, fork, describe, close; a context
  manager), extend_sessions (many sessions' steps in one call), list_sessions; AsyncSession
  for AsyncClient. layout() describes a raw session's heads; is_session_lost() recognises the
  FAILED_PRECONDITION "session lost (...)" of an evicted, expired or restarted session. A
  client given a list of addresses routes each session to the replica its id names, and
  follows sessions moved to another replica (Client.move_session, a drain with
  --session_peers) by itself; session_moved_to() reads the new id from a "session moved to"
  error it did not follow.
- Client-side adaptive throttling (attnserve.throttle), on by default: when the server refuses
  most calls (UNAVAILABLE, DEADLINE_EXCEEDED), the compute calls fail at once with
  ThrottledError (a grpc.RpcError, code UNAVAILABLE) instead of adding to its load.
  Client(..., throttle=ThrottleOptions(k=..., window_seconds=...)) tunes it, throttle=None
  turns it off; client.throttle.probability() and counts() say where it stands.
- to_tensor / from_tensor: arrays <-> attnserve.v1.Tensor.
- export_state_dict, write_safetensors, read_safetensors: a PyTorch module's weights as
  safetensors bytes ready for load_module.
- pb, pb_grpc: the generated messages and stub (attnserve.v1.attention_pb2, _pb2_grpc).
- ``python3 -m attnserve.reflection TARGET list|describe|call``: a generic client through the
  server's reflection service (needs no stubs).

Errors are grpc.RpcError (grpc.aio.AioRpcError in AsyncClient) with the server's canonical
code and a message naming the field and value, e.g. INVALID_ARGUMENT
"key.shape[3] must equal query.shape[3] (8); was 4".

Needs grpcio, protobuf and numpy (Debian 12: python3-grpcio, python3-protobuf, python3-numpy);
torch is optional. The version is the server's it was released with (GetServerInfo().version).
"""
from attnserve._version import __version__
from attnserve.v1 import attention_pb2 as pb
from attnserve.v1 import attention_pb2_grpc as pb_grpc
from attnserve.tensors import to_tensor, from_tensor, DTYPES
from attnserve.client import (Client, AsyncClient, Result, RetryPolicy, attend_request,
                              multi_head_request, stream_request)
from attnserve.sessions import (Session, AsyncSession, SessionResult, StepError,
                                ExtendAlreadyApplied, is_session_lost, session_lost_reason,
                                session_moved_to, session_owner, layout,
                                create_session_request, extend_request, session_result)
from attnserve.safetensors import (write_safetensors, read_safetensors, export_state_dict,
                                   REFERENCE_NAMES)
from attnserve.throttle import Throttle, ThrottleOptions, ThrottledError

__all__ = ["__version__", "pb", "pb_grpc", "Client", "AsyncClient", "Result", "RetryPolicy",
           "attend_request", "multi_head_request", "stream_request", "to_tensor",
           "from_tensor", "DTYPES", "write_safetensors", "read_safetensors",
           "export_state_dict", "REFERENCE_NAMES", "Session", "AsyncSession", "SessionResult",
           "StepError", "ExtendAlreadyApplied", "is_session_lost", "session_lost_reason",
           "session_moved_to", "session_owner", "layout", "create_session_request",
           "extend_request", "session_result", "Throttle", "ThrottleOptions", "ThrottledError"]
