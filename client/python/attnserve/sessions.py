"""Decode sessions: attention over a key/value cache the server keeps between calls.

A session is bound to a loaded module (extends send inputs [L, d_model]) or to a raw head
layout (extends send projected q [L, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv], token-major).
Client.create_session / AsyncClient.create_session return a Session / AsyncSession; see their
docstrings. Every extend carries expected_length (the tokens the object knows the session
holds), so a retried extend can never append twice.

Codes (grpc.RpcError): FAILED_PRECONDITION "session lost (evicted|expired|restarted): ..." for
a lost session (is_session_lost; create a new session and prefill again), ABORTED for an extend
while another of the same session is in flight or a length other than expected, NOT_FOUND for
an id the server never issued or already closed, RESOURCE_EXHAUSTED when the pool is full.
Extends go through the client's throttle (attnserve.throttle): UNAVAILABLE ThrottledError when
it rejects one, before anything is sent.

Several replicas: a session id "<owner>/<instance>/<key>" names the replica holding it. A
client given a list of addresses sends create_session to the next address in turn and every
call naming a session to the address equal to its owner; an owner that is none of them raises
ValueError before anything is sent.

Moved sessions (Client.move_session, and a replica's drain with --session_peers) are followed
by the client (attnserve.client's docstring says how): a Session's calls reach it on its new
replica, and its `id` becomes the new id with the first extend answered there
(ExtendSessionResponse.session_id). session_moved_to(error) reads the new id from a "session
moved to" error the client did not follow (more than 8 hops, a stream's item).
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import grpc

from attnserve.v1 import attention_pb2 as pb
from attnserve.tensors import ArrayLike, to_tensor, from_tensor


class SessionResult(NamedTuple):
    """One extend's answer: `output` (raw sessions [L, Hq, Dv], module sessions [L, d_model]),
    `lse` ([L, Hq] float32 log-sum-exp, None unless return_lse=True), `length` (tokens held
    after the extend) and the server's `timing`."""
    output: Any
    lse: Any
    length: int
    timing: pb.Timing


class StepError(Exception):
    """A failed item of extend_sessions: `code` (grpc.StatusCode) and `details`, as
    ExtendSession would have failed."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class ExtendAlreadyApplied(Exception):
    """An extend refused ABORTED because an earlier attempt of it (whose response was lost) was
    applied: the session holds `length` tokens, and that attempt's output is lost."""

    def __init__(self, session_id: str, length: int, details: str):
        super().__init__(f"the extend of session {session_id} was applied by an earlier attempt "
                         f"whose response was lost; the session now holds {length} tokens "
                         f"({details})")
        self.session_id = session_id
        self.length = length


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def is_session_lost(error: BaseException) -> bool:
    """Whether `error` (a grpc.RpcError or StepError) says the session was lost: evicted,
    expired, or its server restarted. Create a new session and prefill it again."""
    return session_lost_reason(error) != ""


def _error_field(error: BaseException, prefix: str, close: str) -> str:
    """The text between `prefix` and the first `close` after it, when `error` (a grpc.RpcError
    or StepError) is FAILED_PRECONDITION and its details start with `prefix`; "" otherwise (as
    base/session_errors.h reads the same errors)."""
    if isinstance(error, StepError):
        code, details = error.code, error.details
    elif isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        code, details = error.code(), error.details() or ""
    else:
        return ""
    if code != grpc.StatusCode.FAILED_PRECONDITION or not details.startswith(prefix):
        return ""
    rest = details[len(prefix):]
    return rest.split(close, 1)[0] if close in rest else ""


def session_lost_reason(error: BaseException) -> str:
    """"evicted", "expired" or "restarted" for a lost session's error; "" otherwise."""
    return _error_field(error, "session lost (", ")")


def session_moved_to(error: BaseException) -> str:
    """The new id when `error` (a grpc.RpcError or StepError) says the session was moved to
    another replica (FAILED_PRECONDITION "session moved to '<new id>'"); "" otherwise. The
    client follows such answers itself; this is for the ones it could not."""
    return _error_field(error, "session moved to '", "'")


def session_owner(session_id: str) -> str:
    """The owner of "<owner>/<instance>/<key>" (the owner may hold '/'); ValueError
    otherwise."""
    parts = session_id.rsplit("/", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f'session_id must be "<owner>/<instance>/<key>"; was {session_id!r}')
    return parts[0]


def layout(num_heads: int, head_dim: int, num_kv_heads: Optional[int] = None,
           v_head_dim: int = 0) -> pb.HeadLayout:
    """A raw session's pb.HeadLayout: Hq = num_heads, Hkv = num_kv_heads (default Hq), D, Dv
    (0: D)."""
    return pb.HeadLayout(num_heads=num_heads, num_kv_heads=num_kv_heads or num_heads,
                         head_dim=head_dim, v_head_dim=v_head_dim)


def create_session_request(module: Optional[str] = None,
                           layout: Optional[pb.HeadLayout] = None, *,
                           cache_dtype: str = "float32", scale: Optional[float] = None,
                           pinned: bool = False, idle_ttl_s: Optional[float] = None,
                           window: Optional[int] = None, softcap: float = 0.0,
                           alibi: Union[None, str, Sequence[float]] = None,
                           kind: str = "softmax", feature_map: Optional[str] = None
                           ) -> pb.CreateSessionRequest:
    """A pb.CreateSessionRequest bound to `module` or to `layout` (exactly one).
    cache_dtype: "float32", "float16" or "bfloat16". idle_ttl_s: None for the server's.
    window: the keys before each token's position it attends (a sliding window; Mistral's
    window of w keys is window=w - 1); softcap: logit soft-cap (0: none); alibi: "standard" or
    one slope per query head. A session with them computes what Attend computes with the same
    options and causal=True. kind: "softmax" or "linear" (a linear-attention session, which
    keeps only its running state; feature_map "elu_plus_one" by default, "relu" or
    "identity")."""
    from attnserve.tensors import DTYPES
    if (module is None) == (layout is None):
        raise ValueError("give exactly one of module and layout")
    r = pb.CreateSessionRequest(cache_dtype=DTYPES[cache_dtype], pinned=pinned,
                                idle_ttl_us=0 if idle_ttl_s is None else int(idle_ttl_s * 1e6))
    if module is not None:
        r.module = module
    else:
        r.layout.CopyFrom(layout)
    if scale is not None:
        r.scale = float(scale)
    if window is not None:
        r.window.left, r.window.right = int(window), 0
    r.softcap = float(softcap)
    set_alibi(r, alibi)
    set_kind(r, kind, feature_map)
    return r


# "softmax" and an unset feature map go as the protos' unset values (nothing on the wire).
KINDS = {"softmax": pb.ATTENTION_KIND_UNSPECIFIED, "linear": pb.ATTENTION_KIND_LINEAR}
FEATURE_MAPS = {None: pb.FEATURE_MAP_UNSPECIFIED, "elu_plus_one": pb.FEATURE_MAP_ELU_PLUS_ONE,
                "relu": pb.FEATURE_MAP_RELU, "identity": pb.FEATURE_MAP_IDENTITY}


def set_kind(message, kind: str, feature_map: Optional[str]) -> None:
    """message.kind and message.feature_map (AttentionOptions or CreateSessionRequest) from
    "softmax" or "linear" and None, "elu_plus_one", "relu" or "identity"."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}; was {kind!r}")
    if feature_map not in FEATURE_MAPS:
        names = sorted(k for k in FEATURE_MAPS if k)
        raise ValueError(f"feature_map must be one of {names}; was {feature_map!r}")
    message.kind = KINDS[kind]
    message.feature_map = FEATURE_MAPS[feature_map]


def set_alibi(message, alibi: Union[None, str, Sequence[float]]) -> None:
    """message.alibi (AttentionOptions or CreateSessionRequest) from "standard", one slope per
    query head, or None (none)."""
    if isinstance(alibi, str):
        if alibi != "standard":
            raise ValueError(f'alibi must be "standard" or one slope per query head; was {alibi!r}')
        message.alibi.standard = True
    elif alibi is not None:
        message.alibi.slopes.extend(float(x) for x in alibi)


def extend_request(session_id: str = "", q: Optional[ArrayLike] = None,
                   k: Optional[ArrayLike] = None, v: Optional[ArrayLike] = None, *,
                   input: Optional[ArrayLike] = None, expected_length: Optional[int] = None,
                   return_lse: bool = False,
                   dtype: Optional[str] = None) -> pb.ExtendSessionRequest:
    """A pb.ExtendSessionRequest: raw sessions q [L, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv];
    module sessions input [L, d_model] (keyword). dtype: as attend_request's; k and v go in
    q's dtype. Session.request fills session_id and expected_length for you."""
    r = pb.ExtendSessionRequest(session_id=session_id, return_lse=return_lse)
    if input is not None:
        if q is not None or k is not None or v is not None:
            raise ValueError("give input (module sessions) or q, k, v (raw sessions), not both")
        r.input.CopyFrom(to_tensor(input, dtype))
    else:
        if q is None or k is None or v is None:
            raise ValueError("raw sessions need q, k and v; module sessions input=")
        r.query.CopyFrom(to_tensor(q, dtype))
        r.key.CopyFrom(to_tensor(k, r.query.dtype))
        r.value.CopyFrom(to_tensor(v, r.query.dtype))
    if expected_length is not None:
        r.expected_length = expected_length
    return r


def _tokens(request: pb.ExtendSessionRequest) -> int:
    t = request.input if request.HasField("input") else request.query
    return t.shape[0] if t.shape else 0


def session_result(response: pb.ExtendSessionResponse, torch_out: bool = False) -> SessionResult:
    """A SessionResult from a pb.ExtendSessionResponse (e.g. a stream's extend_session)."""
    lse = from_tensor(response.lse, torch_out) if response.HasField("lse") else None
    return SessionResult(from_tensor(response.output, torch_out), lse, response.length,
                         response.timing)


class _SessionBase:
    """What Session and AsyncSession share: the id, the known length, request building."""

    def __init__(self, client, info: pb.SessionInfo):
        self._client = client
        self.info = info
        self.closed = False

    @property
    def id(self) -> str:
        """The session id, "<owner>/<instance>/<key>"."""
        return self.info.session_id

    @property
    def length(self) -> int:
        """Tokens the session holds, as far as this object knows."""
        return self.info.length

    def request(self, q: Optional[ArrayLike] = None, k: Optional[ArrayLike] = None,
                v: Optional[ArrayLike] = None, **kwargs: Any) -> pb.ExtendSessionRequest:
        """This session's extend request (extend_request's arguments) with session_id (the id
        the client knows it by now, after a move) and expected_length filled in: for
        extend_sessions and streams. Give its answer to applied()."""
        r = kwargs.pop("request", None) or extend_request(self.id, q, k, v, **kwargs)
        r = pb.ExtendSessionRequest.FromString(r.SerializeToString())
        r.session_id = self._client._resolve(self.id)
        if not r.HasField("expected_length"):
            r.expected_length = self.length
        return r

    def applied(self, response: pb.ExtendSessionResponse) -> None:
        """Records an extend's answer obtained elsewhere: its length, and the session's id when
        the extend reached it under another (it was moved)."""
        self.info.length = response.length
        if response.session_id and response.session_id != self.info.session_id:
            self.info.session_id = response.session_id

    def _check_open(self):
        if self.closed:
            raise ValueError(f"session {self.id} was closed by this object")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} length={self.length}>"


class Session(_SessionBase):
    """A decode session on the server (Client.create_session). Use it as a context manager,
    or call close(). Not for concurrent use from several threads (a session's extends are
    applied one at a time anyway)."""

    def extend(self, q: Optional[ArrayLike] = None, k: Optional[ArrayLike] = None,
               v: Optional[ArrayLike] = None, *, input: Optional[ArrayLike] = None,
               return_lse: bool = False, dtype: Optional[str] = None,
               timeout: Optional[float] = None) -> SessionResult:
        """Appends tokens (a prefill of many, or one decode step) and returns their attention
        over the whole cache, causal. Raw sessions: q [L, Hq, D], k [L, Hkv, D],
        v [L, Hkv, Dv]; module sessions: input=[L, d_model]. Raises grpc.RpcError with the
        server's code, or ExtendAlreadyApplied after a retried extend whose first attempt was
        applied."""
        self._check_open()
        request = self.request(q, k, v, input=input, return_lse=return_lse, dtype=dtype)
        try:
            response = self._client._session_call(
                "ExtendSession", request, timeout, throttled=True,
                resend=request.HasField("expected_length"))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ABORTED:
                self._check_applied(request, e, timeout)
            raise
        self.applied(response)
        return session_result(response, self._client.torch_out)

    def _check_applied(self, request, error, timeout):
        try:
            now = self.describe(timeout=timeout)
        except grpc.RpcError:
            return
        if now.length == request.expected_length + _tokens(request):
            raise ExtendAlreadyApplied(self.id, now.length, error.details()) from error

    def fork(self, *, pinned: bool = False, idle_ttl_s: Optional[float] = None,
             timeout: Optional[float] = None) -> Session:
        """A new session holding the same tokens, sharing the pages copy-on-write (beam
        search, parallel sampling). idle_ttl_s: None for the parent's."""
        self._check_open()
        r = pb.ForkSessionRequest(session_id=self.id, pinned=pinned,
                                  idle_ttl_us=0 if idle_ttl_s is None else int(idle_ttl_s * 1e6))
        info = self._client._session_call("ForkSession", r, timeout)
        return Session(self._client, info.session)

    def describe(self, *, timeout: Optional[float] = None) -> pb.SessionInfo:
        """The server's pb.SessionInfo (length, pages, bytes, idle time...); updates length."""
        self._check_open()
        r = self._client._session_call("GetSession", pb.GetSessionRequest(session_id=self.id),
                                       timeout, resend=True)
        self.info = r.session
        return r.session

    def close(self, *, timeout: Optional[float] = None) -> None:
        """Ends the session and frees its pages. Only the first call reaches the server."""
        if self.closed:
            return
        self.closed = True
        self._client._session_call("CloseSession", pb.CloseSessionRequest(session_id=self.id),
                                   timeout, resend=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        except grpc.RpcError:
            if exc[0] is None:
                raise


class AsyncSession(_SessionBase):
    """Session for AsyncClient: the same methods as coroutines; `async with` closes it."""

    async def extend(self, q: Optional[ArrayLike] = None, k: Optional[ArrayLike] = None,
                     v: Optional[ArrayLike] = None, *, input: Optional[ArrayLike] = None,
                     return_lse: bool = False, dtype: Optional[str] = None,
                     timeout: Optional[float] = None) -> SessionResult:
        """Session.extend as a coroutine."""
        self._check_open()
        request = self.request(q, k, v, input=input, return_lse=return_lse, dtype=dtype)
        try:
            response = await self._client._session_call(
                "ExtendSession", request, timeout, throttled=True,
                resend=request.HasField("expected_length"))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ABORTED:
                try:
                    now = await self.describe(timeout=timeout)
                except grpc.RpcError:
                    raise e
                if now.length == request.expected_length + _tokens(request):
                    raise ExtendAlreadyApplied(self.id, now.length, e.details()) from e
            raise
        self.applied(response)
        return session_result(response, self._client.torch_out)

    async def fork(self, *, pinned: bool = False, idle_ttl_s: Optional[float] = None,
                   timeout: Optional[float] = None) -> AsyncSession:
        """Session.fork as a coroutine."""
        self._check_open()
        r = pb.ForkSessionRequest(session_id=self.id, pinned=pinned,
                                  idle_ttl_us=0 if idle_ttl_s is None else int(idle_ttl_s * 1e6))
        info = await self._client._session_call("ForkSession", r, timeout)
        return AsyncSession(self._client, info.session)

    async def describe(self, *, timeout: Optional[float] = None) -> pb.SessionInfo:
        """Session.describe as a coroutine."""
        self._check_open()
        r = await self._client._session_call(
            "GetSession", pb.GetSessionRequest(session_id=self.id), timeout, resend=True)
        self.info = r.session
        return r.session

    async def close(self, *, timeout: Optional[float] = None) -> None:
        """Session.close as a coroutine."""
        if self.closed:
            return
        self.closed = True
        await self._client._session_call(
            "CloseSession", pb.CloseSessionRequest(session_id=self.id), timeout, resend=True)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.close()
        except grpc.RpcError:
            if exc[0] is None:
                raise


# One step of extend_sessions: a session and its request (from session.request(...)), or a
# session and the (q, k, v) / {"input": x} it extends with.
Step = Tuple[_SessionBase, Union[pb.ExtendSessionRequest, Sequence[ArrayLike], dict]]


def _step_request(session: _SessionBase, what) -> pb.ExtendSessionRequest:
    if isinstance(what, pb.ExtendSessionRequest):
        return session.request(request=what)
    if isinstance(what, dict):
        return session.request(**what)
    return session.request(*what)


def _step_requests(client, steps: Sequence[Step]) -> List[pb.ExtendSessionRequest]:
    """One request per step, in order, each naming the id the client knows its session by."""
    if not steps:
        raise ValueError("steps must not be empty")
    seen = set()
    requests = []
    for i, (session, what) in enumerate(steps):
        request = _step_request(session, what)
        if request.session_id in seen:
            raise ValueError(f"steps[{i}] names session {session.id} a second time")
        seen.add(request.session_id)
        client._session_address(request.session_id)  # an unknown owner: raise before sending
        requests.append(request)
    return requests


def _merge(steps: Sequence[Step], results, torch_out) -> List[Any]:
    """A SessionResult or StepError per step from its pb.ExtendSessionResult (or the
    grpc.RpcError of its replica's call); each session takes its successful step's answer."""
    out: List[Any] = []
    for (session, _), result in zip(steps, results):
        if isinstance(result, grpc.RpcError):
            out.append(StepError(result.code(), result.details() or ""))
        elif result.code == 0:
            session.applied(result.response)
            out.append(session_result(result.response, torch_out))
        else:
            out.append(StepError(_CODES.get(result.code, grpc.StatusCode.UNKNOWN),
                                 result.message))
    return out
