"""Sync (grpc) and asyncio (grpc.aio) clients for attnserve.v1.AttentionService.

Errors are grpc.RpcError (sync) / grpc.aio.AioRpcError (async) with the server's canonical code
and message (see the proto): e.g. INVALID_ARGUMENT "key.shape[3] must equal query.shape[3]".
Retries (UNAVAILABLE, with backoff) and load balancing (round_robin over the addresses a
target resolves to, e.g. "ipv4:127.0.0.1:5001,127.0.0.1:5002") are gRPC's, through the
channel's service config.

Decode sessions (create_session, extend_sessions, list_sessions; attnserve.sessions): given a
list of addresses, a client routes each session's calls to the address its id names.

Moved sessions (the server's MoveSession, move_session here, and drains with --session_peers)
are followed as the C++ client follows them: a call answered "session moved to '<new id>'"
(FAILED_PRECONDITION with the trailing metadata attnserve-session-moved; nothing was done) is
sent again under the new id to its owner, at most 8 hops, and the client remembers the move, so
later calls naming the old id go to the new one (ExtendSessionResponse.session_id says the id in
use; a Session takes it). extend_sessions sends again only the items whose moved_to is set. A
call to a session being moved (UNAVAILABLE "... is moving") is sent again after the server's
pushback, within its deadline. When a session's replica cannot be reached (UNAVAILABLE without
a pushback: it may have moved its sessions and stopped), a client of several replicas asks the
others whether the session moved to them; it then sends GetSession and CloseSession again, and
ExtendSession when it carries expected_length (a Session's always do), and otherwise raises the
UNAVAILABLE with the move remembered, so that the caller's retry reaches the session. A new
process at the replica's address (a restart in place) answers FAILED_PRECONDITION "session lost
(restarted)" for a session the old one moved away before it stopped: the client asks the others
too, and sends any call again (nothing was done). Streams do not follow (stream_for_session
routes by the remembered id).

Client-side adaptive throttling (attnserve.throttle; on by default, throttle=None turns it off):
when the server refuses most calls (UNAVAILABLE, DEADLINE_EXCEEDED), the compute calls are
rejected locally with ThrottledError, a grpc.RpcError with code() UNAVAILABLE.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import threading
import time
from typing import (Any, AsyncIterable, AsyncIterator, Iterable, Iterator, List, NamedTuple,
                    Optional, Sequence, Tuple, Union)

import grpc

from attnserve.v1 import attention_pb2 as pb
from attnserve.v1 import attention_pb2_grpc as pb_grpc
from attnserve.tensors import ArrayLike, to_tensor, from_tensor
from attnserve import sessions as _s
from attnserve.sessions import Session, AsyncSession, SessionResult, Step
from attnserve.throttle import (PUSHBACK_KEY, Throttle, ThrottleOptions, ThrottledError,
                                make_throttle, pushback_value)

# A request of a stream: AttendRequest, MultiHeadAttentionRequest, or a session's
# ExtendSessionRequest / ExtendSessionsRequest.
Request = Union[pb.AttendRequest, pb.MultiHeadAttentionRequest, pb.ExtendSessionRequest,
                pb.ExtendSessionsRequest]
# Weights for load_module: safetensors bytes or a path, a state_dict or a torch module.
Weights = Any


class Result(NamedTuple):
    """One answer: `output` (and `weights`, None unless return_weights=True) as numpy arrays,
    or torch tensors with torch_out=True; `timing` is the server's pb.Timing (queued_us,
    compute_us, server_us, batch_size, backend)."""
    output: Any
    weights: Any
    timing: pb.Timing


class RetryPolicy(NamedTuple):
    """gRPC's retry policy for every rpc of the service: up to `max_attempts` attempts on the
    status `codes`, waiting a random time up to initial_backoff_s, growing by `multiplier` to at
    most max_backoff_s. RetryPolicy(): 4 attempts on UNAVAILABLE, 0.1 s doubling to 2 s."""
    max_attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    codes: Tuple[str, ...] = ("UNAVAILABLE",)


def _service_config(retry: Optional[RetryPolicy], load_balancing: Optional[str]) -> str:
    config: dict = {}
    if retry is not None and retry.max_attempts > 1:
        config["methodConfig"] = [{
            "name": [{"service": "attnserve.v1.AttentionService"}],
            "retryPolicy": {
                "maxAttempts": retry.max_attempts,
                "initialBackoff": f"{retry.initial_backoff_s:.6f}s",
                "maxBackoff": f"{retry.max_backoff_s:.6f}s",
                "backoffMultiplier": retry.multiplier,
                "retryableStatusCodes": list(retry.codes),
            }}]
    if load_balancing:
        config["loadBalancingConfig"] = [{load_balancing: {}}]
    return json.dumps(config)


def _multi_address_target(addresses: Sequence[str]) -> str:
    """The "ipv4:a,b" / "ipv6:[a],[b]" target for a list of replicas (as the C++ client's)."""
    if not addresses:
        raise ValueError("addresses must not be empty")
    if len(addresses) == 1:
        return addresses[0]

    def v4(a):
        host, _, port = a.rpartition(":")
        return port.isdigit() and host.count(".") == 3 and host.replace(".", "").isdigit()
    if all(v4(a) for a in addresses):
        return "ipv4:" + ",".join(addresses)
    if all(a.startswith("[") and "]:" in a for a in addresses):
        return "ipv6:" + ",".join(addresses)
    raise ValueError("addresses must all be IPv4 or all IPv6 literals with ports (use a "
                     f"dns:/// target for host names); were {','.join(addresses)}")


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _channel_args(target, *, tls, root_certs, client_cert, client_key, server_name, token,
                  retry, load_balancing):
    """(credentials or None, options) for grpc.*_channel."""
    options = [("grpc.max_receive_message_length", -1),
               ("grpc.max_send_message_length", -1),
               ("grpc.enable_retries", 1),
               ("grpc.per_rpc_retry_buffer_size", 64 << 20),
               ("grpc.service_config", _service_config(retry, load_balancing))]
    creds = None
    if tls or root_certs or client_cert:
        def pem(x):
            return _read(x) if isinstance(x, str) and os.path.exists(x) else x
        creds = grpc.ssl_channel_credentials(root_certificates=pem(root_certs),
                                             private_key=pem(client_key),
                                             certificate_chain=pem(client_cert))
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
    return creds, options


def _metadata(token, secure):
    # Over TLS the token rides in call credentials; over plaintext (tests, loopback) gRPC
    # refuses call credentials, so it is sent as metadata.
    return (("authorization", f"Bearer {token}"),) if token and not secure else None


def _options(causal, mask, key_lengths, scale, return_weights, window=None, softcap=0.0,
             alibi=None, kind="softmax", feature_map=None) -> pb.AttentionOptions:
    o = pb.AttentionOptions(causal=causal, return_weights=return_weights, softcap=float(softcap))
    _s.set_kind(o, kind, feature_map)
    if mask is not None:
        o.mask.CopyFrom(to_tensor(mask, "bool"))
    if key_lengths is not None:
        o.key_lengths.extend(int(x) for x in key_lengths)
    if scale is not None:
        o.scale = float(scale)
    if window is not None:
        o.window.left, o.window.right = (int(x) for x in window)
    _s.set_alibi(o, alibi)
    return o


def attend_request(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False,
                   mask: Optional[ArrayLike] = None,
                   key_lengths: Optional[Sequence[int]] = None, scale: Optional[float] = None,
                   return_weights: bool = False, dtype: Optional[str] = None,
                   window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                   alibi: Union[None, str, Sequence[float]] = None, kind: str = "softmax",
                   feature_map: Optional[str] = None) -> pb.AttendRequest:
    """A pb.AttendRequest: attention on caller-projected tensors.

    q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (grouped-query when Hkv < Hq);
    numpy arrays, torch tensors or nested lists. causal: bottom-right aligned causal mask.
    mask: booleans broadcastable to [B, Hq, Lq, Lk] (True = attend). key_lengths: B valid key
    counts. scale: instead of 1/sqrt(D). return_weights: the softmax weights come back too.
    dtype: "float32", "float16" or "bfloat16" (default: q's own, float32 for other dtypes);
    k and v are sent in q's dtype. window: (left, right) sliding window (-1: that side open);
    softcap: logit soft-cap (0: none); alibi: "standard" or one slope per query head
    (attention.proto, AttentionOptions, says how they combine). kind: "softmax" or "linear"
    (linear attention; feature_map "elu_plus_one" by default, "relu" or "identity").
    """
    query = to_tensor(q, dtype)
    return pb.AttendRequest(query=query, key=to_tensor(k, query.dtype),
                            value=to_tensor(v, query.dtype),
                            options=_options(causal, mask, key_lengths, scale, return_weights,
                                             window, softcap, alibi, kind, feature_map))


def multi_head_request(module: str, query: ArrayLike, key: Optional[ArrayLike] = None,
                       value: Optional[ArrayLike] = None, *, causal: bool = False,
                       mask: Optional[ArrayLike] = None,
                       key_lengths: Optional[Sequence[int]] = None,
                       scale: Optional[float] = None, return_weights: bool = False,
                       dtype: Optional[str] = None, window: Optional[Tuple[int, int]] = None,
                       softcap: float = 0.0,
                       alibi: Union[None, str, Sequence[float]] = None, kind: str = "softmax",
                       feature_map: Optional[str] = None) -> pb.MultiHeadAttentionRequest:
    """A pb.MultiHeadAttentionRequest: the registered module `module` on query
    [B, Lq, d_model] and key/value [B, Lk, d_model] (both, or neither for self-attention).
    The options are attend_request's."""
    if (key is None) != (value is None):
        raise ValueError("give both key and value, or neither (self-attention)")
    q = to_tensor(query, dtype)
    r = pb.MultiHeadAttentionRequest(module=module, query=q,
                                     options=_options(causal, mask, key_lengths, scale,
                                                      return_weights, window, softcap, alibi,
                                                      kind, feature_map))
    if key is not None:
        r.key.CopyFrom(to_tensor(key, q.dtype))
        r.value.CopyFrom(to_tensor(value, q.dtype))
    return r


def stream_request(request_id: int, request: Request) -> pb.AttentionStreamRequest:
    """The AttentionStream message carrying `request` (from attend_request or
    multi_head_request) under the caller's `request_id`, which its answer echoes."""
    if isinstance(request, pb.AttendRequest):
        return pb.AttentionStreamRequest(request_id=request_id, attend=request)
    if isinstance(request, pb.MultiHeadAttentionRequest):
        return pb.AttentionStreamRequest(request_id=request_id, multi_head_attention=request)
    if isinstance(request, pb.ExtendSessionRequest):
        return pb.AttentionStreamRequest(request_id=request_id, extend_session=request)
    if isinstance(request, pb.ExtendSessionsRequest):
        return pb.AttentionStreamRequest(request_id=request_id, extend_sessions=request)
    raise TypeError("a stream carries AttendRequest, MultiHeadAttentionRequest, "
                    f"ExtendSessionRequest or ExtendSessionsRequest; was {type(request).__name__}")


def _result(response, torch_out: bool) -> Result:
    weights = from_tensor(response.weights, torch_out) if response.HasField("weights") else None
    return Result(from_tensor(response.output, torch_out), weights, response.timing)


def _module_bytes(weights, num_heads) -> bytes:
    """LoadModule's safetensors bytes from bytes, a path, a state_dict or a module."""
    from attnserve.safetensors import export_state_dict
    if isinstance(weights, (bytes, bytearray)):
        return bytes(weights)
    if isinstance(weights, (str, os.PathLike)):
        return _read(weights)
    return export_state_dict(weights, num_heads=num_heads)


# Moved sessions. Hops a call follows (a session moved on while the call followed it is rare;
# a loop of moves is a server's bug), and the moves remembered (old id -> new id): beyond it the
# client forgets them all and learns again from the servers, which remember them too.
_MAX_HOPS = 8
# A call to a session being moved waits and is sent again, within its deadline; at most this
# many times (a move takes milliseconds; without a deadline, a bound all the same).
_MAX_MOVING_WAITS = 1000
_MAX_MOVES_REMEMBERED = 65536
MOVED_KEY = "attnserve-session-moved"


def _trailer(error: BaseException, key: str) -> str:
    """The first `key` value of a failed call's trailing metadata, or ""."""
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for k, v in trailers or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else str(v)
    return ""


def _with_id(request, session_id: str):
    """`request` naming `session_id`: itself when it does, else a copy (the caller's request is
    left as it was, and a prefill's tensors are not copied when nothing moved)."""
    if request.session_id == session_id:
        return request
    copy = type(request)()
    copy.CopyFrom(request)
    copy.session_id = session_id
    return copy


def _code(error: BaseException):
    return error.code() if hasattr(error, "code") else None


def _unreachable(error: grpc.RpcError) -> bool:
    """Whether a call that failed with `error` found its replica unreachable or shutting down:
    UNAVAILABLE without a pushback (an overload refusal has one), or CANCELLED (gRPC cancels
    the calls that reach a server as it shuts down, grpc#41785)."""
    return (_code(error) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            and not _trailer(error, PUSHBACK_KEY))


def _is_moving(code, details: str) -> bool:
    """Whether a call's answer says its session is being moved (UNAVAILABLE, send it again)."""
    return code == grpc.StatusCode.UNAVAILABLE and "' is moving to another replica" in details


def _remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left before `deadline` (time.monotonic()), at least a microsecond; None: none."""
    return None if deadline is None else max(deadline - time.monotonic(), 1e-6)


def _expired(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _moving_wait(error: BaseException, deadline: Optional[float]) -> float:
    """Seconds to wait before sending a call to a moving session again: the server's pushback
    (grpc-retry-pushback-ms, 20 ms without one), within the deadline. A millisecond more: the
    client's throttle holds its calls back for the same pushback and must let this one out."""
    try:
        ms = min(max(int(_trailer(error, PUSHBACK_KEY) or 20), 1), 1000) + 1
    except ValueError:
        ms = 21
    left = _remaining(deadline)
    return ms / 1000 if left is None else min(ms / 1000, left)


def _drive(plan):
    """Runs a plan of _Base's to its end, calling each step; returns what the plan returns."""
    result = None
    while True:
        try:
            result = plan.send(result)()
        except StopIteration as done:
            return done.value


async def _drive_async(plan):
    """_drive for AsyncClient: awaits each step."""
    step_result = None
    while True:
        try:
            step_result = await plan.send(step_result)()
        except StopIteration as end:
            return end.value


class _Base:
    """What Client and AsyncClient share: the channel's settings."""

    def __init__(self, target: Union[str, Sequence[str]], *, timeout: float = 60.0,
                 tls: bool = False,
                 root_certs: Union[bytes, str, None] = None,
                 client_cert: Union[bytes, str, None] = None,
                 client_key: Union[bytes, str, None] = None, server_name: Optional[str] = None,
                 token: Optional[str] = None, retry: Optional[RetryPolicy] = None,
                 load_balancing: Optional[str] = None, torch_out: bool = False,
                 throttle: Union[ThrottleOptions, Throttle, bool, None] = ThrottleOptions()):
        """target: "host:port", "dns:///name:port" or "ipv4:a:p1,b:p2"; or a list of
        "host:port" replicas: stateless calls are balanced over them (round_robin; IP literals
        only, as in "ipv4:"), and decode sessions are routed to the replica their id names.

        timeout: seconds per call. tls / root_certs / client_cert / client_key (PEM bytes or
        file paths): TLS and mutual TLS; server_name overrides the name checked. token: a
        bearer token. retry: a RetryPolicy, or None (the default, as in the C++ client) for no
        retries. load_balancing: "round_robin" or "pick_first" (default: round_robin when the
        target lists addresses). torch_out: results as torch tensors instead of numpy arrays.

        throttle: client-side adaptive throttling of the compute calls (attend,
        multi_head_attention, sessions' extend and extend_sessions; attnserve.throttle): a
        ThrottleOptions (the default, ThrottleOptions(): on, k=2.0, window_seconds=30), a
        Throttle (e.g. one shared by several clients), or None (or False) for none. One per
        client, whatever the number of replicas.
        """
        replicas: List[str] = []
        if not isinstance(target, str):
            replicas = list(target)
            target = _multi_address_target(replicas)
            if len(replicas) < 2:
                replicas = []
        if load_balancing is None and target.startswith(("ipv4:", "ipv6:", "dns:")):
            load_balancing = "round_robin"
        self.timeout = timeout
        self.torch_out = torch_out
        # Before the channels: a bad option fails before anything is opened.
        self.throttle: Optional[Throttle] = make_throttle(throttle)
        self._creds, self._options = _channel_args(
            target, tls=tls, root_certs=root_certs, client_cert=client_cert,
            client_key=client_key, server_name=server_name, token=token, retry=retry,
            load_balancing=load_balancing)
        self._metadata = _metadata(token, self._creds is not None)
        self.target = target
        self.channel = self._channel(target)
        self.stub = pb_grpc.AttentionServiceStub(self.channel)
        self.replicas = replicas
        self._replica_channels = [self._replica_channel(a) for a in replicas]
        self._replica_stubs = [pb_grpc.AttentionServiceStub(c) for c in self._replica_channels]
        self._retired_channels: list = []  # replaced by _adopt; closed with the client
        self._next_replica = itertools.count()  # next() is atomic: thread-safe turns
        self._moved: dict = {}  # old session id -> new id (see "Moved sessions" above)
        self._moved_lock = threading.Lock()

    def _session_address(self, session_id: str) -> str:
        """The replica address of `session_id` ("" for a client of one target)."""
        if not self.replicas:
            return ""
        owner = _s.session_owner(session_id)
        if owner not in self.replicas:
            raise ValueError(
                f"session_id {session_id!r} names owner {owner!r}, which is none of this "
                f"client's addresses ({', '.join(self.replicas)}); start each replica with its "
                "owner set to the address clients reach it by")
        return owner

    def _session_stub(self, session_id: str):
        address = self._session_address(session_id)
        return self._replica_stubs[self.replicas.index(address)] if address else self.stub

    def _replica_channel(self, address: str):
        """A channel to one replica with its own connection (a local subchannel pool): its
        reconnect backoff is its own, not shared with another channel to the same address."""
        return self._channel(address, [("grpc.use_local_subchannel_pool", 1)])

    def _adopt(self, i: int, channel) -> None:
        """Replica i's calls go over `channel` from now on (a new one that reached it while the
        old one backs off); the old one is closed with the client (calls may be on it)."""
        with self._moved_lock:
            self._retired_channels.append(self._replica_channels[i])
            self._replica_channels[i] = channel
            self._replica_stubs[i] = pb_grpc.AttentionServiceStub(channel)

    # --- Moved sessions (see the module docstring) ---

    def _resolve(self, session_id: str) -> str:
        """The id a session has now, following the moves this client has seen from it."""
        with self._moved_lock:
            for _ in range(_MAX_HOPS):
                to = self._moved.get(session_id)
                if to is None:
                    break
                session_id = to
        return session_id

    def _remember_move(self, old: str, new: str) -> None:
        with self._moved_lock:
            if len(self._moved) >= _MAX_MOVES_REMEMBERED:
                self._moved.clear()
            self._moved[old] = new

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        """The time.monotonic() by which a call of `timeout` (None: the client's) ends."""
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    # The session calls that follow moves are written once, as plans: generators that yield
    # each step with I/O as a function of no arguments (functools.partial of _try, _sleep,
    # _extend_sessions_once) and are sent back its result. Client runs a plan with _drive, calling
    # each step; AsyncClient with _drive_async, awaiting each (its _try, _sleep and
    # _extend_sessions_once are coroutines).

    def _session_steps(self, method: str, request, timeout: Optional[float], throttled: bool,
                       resend: bool):
        """The plan of the session rpc `method` with `request`, following moves (see the module
        docstring). resend: the call may be sent again after its replica could not be reached
        and another said the session moved there."""
        deadline = self._deadline(timeout)
        request = _with_id(request, self._resolve(request.session_id))
        asked_others = False
        moves = waits = 0
        vouched = False  # a replica said the session is on the one asked now
        while True:
            rpc = getattr(self._session_stub(request.session_id), method)
            if vouched:  # it is up: wait for a channel still backing off from its last process
                rpc = functools.partial(rpc, wait_for_ready=True)
            if throttled:
                response, error = yield functools.partial(
                    self._try, self._throttled, rpc, request, _remaining(deadline),
                    admit=not (moves or waits or asked_others))
            else:
                response, error = yield functools.partial(
                    self._try, rpc, request, **self._kw(_remaining(deadline)))
            if error is None:
                return response
            action = self._follow(error, request.session_id, moves, waits, deadline, asked_others)
            if action is None:
                raise error
            what, value = action
            if what == "moved":
                moves += 1
                vouched = True
                request = _with_id(request, value)
            elif what == "wait":
                waits += 1
                yield functools.partial(self._sleep, value)
            else:
                asked_others = True
                to = yield from self._find_moved_steps(request.session_id, deadline)
                if not to:
                    raise error
                self._remember_move(request.session_id, to)
                if not (resend or value):
                    raise error
                vouched = True
                request = _with_id(request, to)

    def _find_moved_steps(self, session_id: str, deadline: Optional[float]):
        """The plan that finds the new id of `session_id` as a replica other than its owner
        knows it (one it was moved to), asked by GetSession; "" when none answers so. A replica
        that cannot be reached is asked again once over a new channel, which connects at once:
        the old one may be backing off from a process that stopped while a new one now listens
        at its address. If the new channel reaches it, it replaces the old one (_adopt)."""
        unreachable = []
        for i in self._others(session_id):
            request, kw = self._ask_moved(session_id, deadline)
            _, error = yield functools.partial(self._try, self._replica_stubs[i].GetSession,
                                               request, **kw)
            if error is not None:
                to, down = self._moved_answer(error)
                if to:
                    return to
                if down:
                    unreachable.append(i)
        for i in unreachable:
            channel = self._replica_channel(self.replicas[i])
            request, kw = self._ask_moved(session_id, deadline)
            _, error = yield functools.partial(
                self._try, pb_grpc.AttentionServiceStub(channel).GetSession, request, **kw)
            to, down = self._moved_answer(error) if error is not None else ("", False)
            if down:
                yield functools.partial(self._try, channel.close)
            else:
                self._adopt(i, channel)
                if to:
                    return to
        return ""

    def _extend_sessions_steps(self, steps: Sequence[Step], timeout: Optional[float]):
        """The plan of extend_sessions (see Client.extend_sessions)."""
        requests = _s._step_requests(self, steps)
        deadline = self._deadline(timeout)
        first = yield functools.partial(self._extend_sessions_once, requests,
                                        range(len(requests)), _remaining(deadline))
        results = [first[i] for i in range(len(requests))]
        asked: set = set()  # the sessions looked for on the other replicas
        # Items whose session moved (sent again under its new id), is moving (again, after a
        # pause) or was found on another replica, until none is left or the deadline passes.
        for _ in range(_MAX_HOPS + _MAX_MOVING_WAITS):
            if _expired(deadline):
                break
            again, moving = self._moved_items(requests, results)
            for i in self._lost_items(requests, results, asked):
                to = yield from self._find_moved_steps(requests[i].session_id, deadline)
                if self._found(requests, results, i, to):
                    again.append(i)
            if not again:
                break
            if moving:
                yield functools.partial(self._sleep, min(0.021, _remaining(deadline) or 0.021))
            more = yield functools.partial(self._extend_sessions_once, requests, sorted(again),
                                           _remaining(deadline), admit=False)
            for i in again:
                results[i] = more[i]
        return self._step_results(steps, results)

    def _follow(self, error: grpc.RpcError, session_id: str, moves: int, waits: int,
                deadline: Optional[float], asked_others: bool):
        """What a session call that failed with `error` does next, after `moves` moves followed
        and `waits` waits for a moving session: ("moved", new id), ("wait", seconds), ("ask",
        nothing_done): ask the other replicas (_find_moved_steps; nothing_done: the call may be sent
        again whatever it is), or None: raise it."""
        if isinstance(error, ThrottledError) or _expired(deadline):
            return None
        to = _trailer(error, MOVED_KEY)
        if to:
            if moves == _MAX_HOPS:
                return None
            self._remember_move(session_id, to)
            return "moved", to
        code = _code(error)
        if _is_moving(code, (error.details() if hasattr(error, "details") else "") or ""):
            return None if waits == _MAX_MOVING_WAITS else ("wait", _moving_wait(error, deadline))
        # Its replica unreachable (or shutting down), or a new process at its address that
        # never held it ("session lost (restarted)": nothing was done, so the call may be sent
        # again): did the session move to another replica before?
        if asked_others or len(self.replicas) < 2:
            return None
        if _unreachable(error):
            return "ask", False
        if _s.session_lost_reason(error) == "restarted":
            return "ask", True
        return None

    def _others(self, session_id: str) -> List[int]:
        """The index of each replica but the owner of `session_id`."""
        try:
            owner = _s.session_owner(session_id)
        except ValueError:
            owner = ""
        return [i for i, a in enumerate(self.replicas) if a != owner]

    def _ask_moved(self, session_id: str, deadline: Optional[float]):
        """(request, keyword arguments) of the GetSession that asks a replica for the new id of
        `session_id`, at most 2 s."""
        left = _remaining(deadline)
        return (pb.GetSessionRequest(session_id=session_id),
                {"timeout": 2.0 if left is None else min(left, 2.0), "metadata": self._metadata})

    @staticmethod
    def _moved_answer(error: grpc.RpcError) -> Tuple[str, bool]:
        """(the new id a GetSession's `error` names, or ""; whether its replica could not be
        reached: UNAVAILABLE without a server's answer)."""
        return _trailer(error, MOVED_KEY), _code(error) == grpc.StatusCode.UNAVAILABLE

    def _moved_items(self, requests, results) -> Tuple[List[int], bool]:
        """extend_sessions: the indices of the items to send again (moved: their request now
        names the new id; or moving), and whether any is moving (wait first)."""
        again, moving = [], False
        for i, r in enumerate(results):
            if not isinstance(r, pb.ExtendSessionResult):
                continue  # its replica's call failed as a whole
            if r.moved_to:
                self._remember_move(requests[i].session_id, r.moved_to)
                requests[i].session_id = r.moved_to
            elif _is_moving(_s._CODES.get(r.code), r.message):
                moving = True
            else:
                continue
            again.append(i)
        return again, moving

    def _lost_items(self, requests, results, asked: set) -> List[int]:
        """extend_sessions: the indices of the items to look for on the other replicas (as
        _follow does for one session's call): their replica's call failed UNAVAILABLE without a
        pushback or CANCELLED, or they were answered "session lost (restarted)". Each session
        once: `asked` holds those looked for already."""
        if len(self.replicas) < 2:
            return []
        out = []
        for i, r in enumerate(results):
            if isinstance(r, ThrottledError):
                continue
            if isinstance(r, grpc.RpcError):
                lost = _unreachable(r)
            else:
                step = _s.StepError(_s._CODES.get(r.code, grpc.StatusCode.UNKNOWN), r.message)
                lost = _s.session_lost_reason(step) == "restarted"
            if lost and requests[i].session_id not in asked:
                asked.add(requests[i].session_id)
                out.append(i)
        return out

    def _found(self, requests, results, i: int, to: str) -> bool:
        """extend_sessions: item i's session was found on another replica as `to` ("": not
        found). The move is remembered; whether to send the item again under `to`: when its
        step carries expected_length (a Session's always do), or nothing was done (a
        "session lost (restarted)" answer)."""
        if not to:
            return False
        self._remember_move(requests[i].session_id, to)
        if not (requests[i].HasField("expected_length")
                or isinstance(results[i], pb.ExtendSessionResult)):
            return False
        requests[i].session_id = to
        return True

    def _step_results(self, steps, results):
        """extend_sessions' answer: a SessionResult or StepError per step; raises the error of
        the one replica's call when that call failed as a whole for every step."""
        first = results[0] if results else None
        if isinstance(first, grpc.RpcError) and all(r is first for r in results):
            raise first
        return _s._merge(steps, results, self.torch_out)

    @staticmethod
    def _results_of(group, response):
        """(index, pb.ExtendSessionResult) of each item of `group` from its call's response."""
        short = pb.ExtendSessionResult(code=grpc.StatusCode.INTERNAL.value[0],
                                       message="the replica answered fewer results than steps")
        results = list(response.results)
        return ((i, results[j] if j < len(results) else short) for j, i in enumerate(group))

    def _groups(self, requests, indices):
        """[(stub, [indices], pb.ExtendSessionsRequest)]: the items of `indices`, one call per
        replica."""
        groups: dict = {}
        for i in indices:
            key = self._session_address(requests[i].session_id)
            stub, group, request = groups.setdefault(
                key, (self._session_stub(requests[i].session_id), [], pb.ExtendSessionsRequest()))
            group.append(i)
            request.steps.append(requests[i])
        return list(groups.values())

    def _replica_stub(self, replica: Optional[str] = None):
        """(stub, address) of `replica`, or of the next replica in turn."""
        if not self.replicas:
            if replica:
                raise ValueError(f"replica {replica!r}: this client has one target")
            return self.stub, ""
        if replica is None:
            i = next(self._next_replica) % len(self.replicas)
        elif replica in self.replicas:
            i = self.replicas.index(replica)
        else:
            raise ValueError(f"replica {replica!r} is none of this client's addresses "
                             f"({', '.join(self.replicas)})")
        return self._replica_stubs[i], self.replicas[i]

    def _check_owner(self, info: pb.SessionInfo, address: str) -> Optional[str]:
        """The error to raise when the replica at `address` issued an id naming another."""
        if address and _s.session_owner(info.session_id) != address:
            return (f"the replica at {address} issued session_id {info.session_id!r}, whose "
                    "owner is not that address; start each replica with its owner set to the "
                    "address clients reach it by")
        return None

    def _kw(self, timeout):
        return {"timeout": self.timeout if timeout is None else timeout,
                "metadata": self._metadata}

    def _admit(self) -> None:
        """Raises ThrottledError when the throttle rejects a compute call now."""
        if self.throttle is not None:
            reason = self.throttle.check()
            if reason is not None:
                raise ThrottledError(reason)

    def _record(self, error: Optional[grpc.RpcError]) -> None:
        """A sent compute call's outcome: None for a success, else its error."""
        if self.throttle is None:
            return
        if error is None:
            self.throttle.record(grpc.StatusCode.OK)
            return
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = (error.details() if hasattr(error, "details") else "") or ""
        if _is_moving(code, details):
            # A session being moved is no sign of overload: the server took and judged the call
            # (its pushback is for that session's retry, not for every call of this client).
            self.throttle.record(grpc.StatusCode.OK)
            return
        trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
        self.throttle.record(code, pushback_value(trailers))


class Client(_Base):
    """Blocking client of one target. Thread-safe; use as a context manager or call close().
    The arguments are described under __init__ below."""

    def _channel(self, target, more_options=()):
        options = list(self._options) + list(more_options)
        if self._creds is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, self._creds, options=options)

    def close(self) -> None:
        """Closes the channels; calls in flight are cancelled."""
        for channel in [self.channel, *self._replica_channels, *self._retired_channels]:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _throttled(self, rpc, request, timeout, admit: bool = True):
        """rpc(request), a compute call, through the throttle (admit=False: counted, never
        rejected; a call sent again to where its session went is one call of the
        application's). A call interrupted without an answer (KeyboardInterrupt) is not
        counted."""
        if admit:
            self._admit()
        try:
            response = rpc(request, **self._kw(timeout))
        except grpc.RpcError as e:
            self._record(e)
            raise
        self._record(None)
        return response

    def _try(self, fn, *args, **kw):
        """fn(*args, **kw): (its result, None), or (None, the grpc.RpcError it raised)."""
        try:
            return fn(*args, **kw), None
        except grpc.RpcError as e:
            return None, e

    _sleep = staticmethod(time.sleep)

    def _session_call(self, method: str, request, timeout: Optional[float], *,
                      throttled: bool = False, resend: bool = False):
        """The session rpc `method` with `request` (naming a session), following moves (see the
        module docstring and _session_steps)."""
        return _drive(self._session_steps(method, request, timeout, throttled, resend))

    def _extend_sessions_once(self, requests, indices, timeout, admit=True):
        """{index: pb.ExtendSessionResult, or the grpc.RpcError of its replica's call} for the
        items of `indices`, one call per replica. admit: the throttle judges them once, as one
        call of the application's (a ThrottledError raised before any is sent; see _throttled).
        """
        if admit:
            self._admit()
        groups = self._groups(requests, indices)
        out = {}
        for stub, group, request in groups:
            try:
                response = self._throttled(stub.ExtendSessions, request, timeout, admit=False)
            except grpc.RpcError as e:
                out.update((i, e) for i in group)
                continue
            out.update(self._results_of(group, response))
        return out

    def attend(self, q: ArrayLike, k: ArrayLike, v: ArrayLike, *,
               timeout: Optional[float] = None, **options: Any) -> Result:
        """Attention on projected tensors q [B, Hq, Lq, D], k [B, Hkv, Lk, D],
        v [B, Hkv, Lk, Dv]. options: causal, mask, key_lengths, scale, return_weights, dtype,
        window, softcap, alibi, kind, feature_map (see attnserve.attend_request). Returns a
        Result with output [B, Hq, Lq, Dv]."""
        response = self._throttled(self.stub.Attend, attend_request(q, k, v, **options), timeout)
        return _result(response, self.torch_out)

    def multi_head_attention(self, module: str, query: ArrayLike,
                             key: Optional[ArrayLike] = None, value: Optional[ArrayLike] = None,
                             *, timeout: Optional[float] = None, **options: Any) -> Result:
        """The registered module `module` ("demo" is built in) on query [B, Lq, d_model] and
        key/value [B, Lk, d_model], or self-attention without them. options as attend's.
        Returns a Result with output [B, Lq, d_model], weights [B, h, Lq, Lk]."""
        response = self._throttled(self.stub.MultiHeadAttention,
                                   multi_head_request(module, query, key, value, **options),
                                   timeout)
        return _result(response, self.torch_out)

    def load_module(self, name: str, weights: Weights, *, num_heads: int = 0,
                    replace: bool = False, timeout: Optional[float] = None) -> pb.ModuleInfo:
        """Registers weights under `name`: safetensors bytes or a path, a state_dict or a torch
        module (see export_state_dict). num_heads: 0 reads it from the file's metadata.
        replace: overwrite a module of that name. Returns the pb.ModuleInfo."""
        request = pb.LoadModuleRequest(name=name, safetensors=_module_bytes(weights, num_heads),
                                       num_heads=num_heads, replace=replace)
        return self.stub.LoadModule(request, **self._kw(timeout)).module

    def unload_module(self, name: str, *, timeout: Optional[float] = None) -> None:
        """Removes the module `name` (NOT_FOUND when there is none)."""
        self.stub.UnloadModule(pb.UnloadModuleRequest(name=name), **self._kw(timeout))

    def list_modules(self, *, timeout: Optional[float] = None) -> List[pb.ModuleInfo]:
        """The registered modules: name, d_model, num_heads, bytes."""
        return list(self.stub.ListModules(pb.ListModulesRequest(), **self._kw(timeout)).modules)

    def server_info(self, *, timeout: Optional[float] = None) -> pb.GetServerInfoResponse:
        """The server's version, backends and devices, limits and batching settings."""
        return self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self._kw(timeout))

    # --- Decode sessions (attnserve.sessions) ---

    def create_session(self, module: Optional[str] = None,
                       layout: Optional[pb.HeadLayout] = None, *,
                       cache_dtype: str = "float32", scale: Optional[float] = None,
                       pinned: bool = False, idle_ttl_s: Optional[float] = None,
                       window: Optional[int] = None, softcap: float = 0.0,
                       alibi: Union[None, str, Sequence[float]] = None,
                       kind: str = "softmax", feature_map: Optional[str] = None,
                       timeout: Optional[float] = None) -> Session:
        """A new decode session: bound to the loaded `module` (extend(input=[L, d_model])), or
        to a raw `layout` (attnserve.layout(num_heads, head_dim, num_kv_heads); extend(q, k,
        v) token-major). cache_dtype: "float32", "float16" or "bfloat16". window (keys before
        each token), softcap and alibi as in attend (the session is causal). kind="linear" makes
        a linear-attention session (feature_map as in attend): it keeps only its running state,
        so its memory and step time do not grow with its length. Use the Session as a context
        manager, or close() it. With several replicas it goes to the next in turn."""
        request = _s.create_session_request(module, layout, cache_dtype=cache_dtype,
                                            scale=scale, pinned=pinned, idle_ttl_s=idle_ttl_s,
                                            window=window, softcap=softcap, alibi=alibi,
                                            kind=kind, feature_map=feature_map)
        stub, address = self._replica_stub()
        info = stub.CreateSession(request, **self._kw(timeout)).session
        error = self._check_owner(info, address)
        if error:
            stub.CloseSession(pb.CloseSessionRequest(session_id=info.session_id),
                              **self._kw(timeout))
            raise ValueError(error)
        return Session(self, info)

    def extend_sessions(self, steps: Sequence[Step], *,
                        timeout: Optional[float] = None) -> List[Union[SessionResult, Exception]]:
        """One step for each of many sessions in one ExtendSessions call (one per replica):
        steps are (session, (q, k, v)), (session, {"input": x}) or (session,
        session.request(...)). Returns, in order, a SessionResult or a StepError (code,
        details) per step; each session's length follows its successful step. Raises
        grpc.RpcError only when the call itself fails with one replica. Steps whose session
        moved (ExtendSessionResult.moved_to) are sent again under the new id, to its owner,
        and their results merged in place; steps of a moving session, after a pause. Steps
        whose replica could not be reached, or a new process at whose address answered
        "session lost (restarted)", are looked for on the other replicas as a session's own
        calls are (see the module docstring) and sent again where found."""
        return _drive(self._extend_sessions_steps(steps, timeout))

    def move_session(self, session_id: str, peer: str, *,
                     timeout: Optional[float] = None) -> pb.MoveSessionResponse:
        """An operator's move of a session to another replica (the admin role; see the proto's
        MoveSession): sent to the session's replica, which must list `peer` in its
        --session_peers. Returns pb.MoveSessionResponse(session_id: the new id, bytes,
        pause_us); the client remembers the move, so calls naming the old id (a Session's
        included) go to the new one."""
        response = self._session_call("MoveSession",
                                      pb.MoveSessionRequest(session_id=session_id, peer=peer),
                                      timeout)
        self._remember_move(self._resolve(session_id), response.session_id)
        return response

    def list_sessions(self, *, replica: Optional[str] = None, page_size: int = 0,
                      page_token: str = "",
                      timeout: Optional[float] = None) -> pb.ListSessionsResponse:
        """One replica's sessions (`replica`, default the next in turn) and its pool's usage:
        pb.ListSessionsResponse(sessions, next_page_token, usage)."""
        stub, _ = self._replica_stub(replica)
        return stub.ListSessions(pb.ListSessionsRequest(page_size=page_size,
                                                        page_token=page_token),
                                 **self._kw(timeout))

    def stream_for_session(self, session_id: str, requests: Iterable[Tuple[int, Request]], *,
                           timeout: Optional[float] = None
                           ) -> Iterator[pb.AttentionStreamResponse]:
        """stream() on the replica holding `session_id` (after the moves the client knows of): a
        stream reaches one replica, so its session extends must name sessions of that one. A
        stream does not follow moves: a moved item fails FAILED_PRECONDITION with
        ExtendSessionResult.moved_to (Session.request names the id the client knows)."""
        messages = (stream_request(i, r) for i, r in requests)
        return self._session_stub(self._resolve(session_id)).AttentionStream(
            messages, timeout=timeout, metadata=self._metadata)

    def stream(self, requests: Iterable[Tuple[int, Request]], *,
               timeout: Optional[float] = None) -> Iterator[pb.AttentionStreamResponse]:
        """AttentionStream: sends (request_id, request) pairs from `requests` (requests from
        attend_request or multi_head_request) as it reads them, and yields each
        pb.AttentionStreamResponse in completion order. A failed request's response has a
        nonzero `code` and a `message`; the stream goes on. `timeout` bounds the whole stream
        (default: none)."""
        messages = (stream_request(i, r) for i, r in requests)
        return self.stub.AttentionStream(messages, timeout=timeout, metadata=self._metadata)


class AsyncClient(_Base):
    """asyncio client over grpc.aio: the same methods as Client, as coroutines. Create it
    inside the event loop that uses it; use `async with` or `await close()`."""

    def _channel(self, target, more_options=()):
        options = list(self._options) + list(more_options)
        if self._creds is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, self._creds, options=options)

    async def close(self) -> None:
        """Closes the channels; calls in flight are cancelled."""
        for channel in [self.channel, *self._replica_channels, *self._retired_channels]:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _throttled(self, rpc, request, timeout, admit: bool = True):
        """Client._throttled as a coroutine. A call cancelled without an answer (its task
        cancelled) is not counted."""
        if admit:
            self._admit()
        try:
            response = await rpc(request, **self._kw(timeout))
        except grpc.RpcError as e:
            self._record(e)
            raise
        self._record(None)
        return response

    async def _try(self, fn, *args, **kw):
        """Client._try, awaiting fn's call."""
        try:
            return await fn(*args, **kw), None
        except grpc.RpcError as e:
            return None, e

    _sleep = staticmethod(asyncio.sleep)

    async def _session_call(self, method: str, request, timeout: Optional[float], *,
                            throttled: bool = False, resend: bool = False):
        """Client._session_call as a coroutine."""
        return await _drive_async(self._session_steps(method, request, timeout, throttled,
                                                      resend))

    async def _extend_sessions_once(self, requests, indices, timeout, admit=True):
        """Client._extend_sessions_once as a coroutine (the replicas' calls run concurrently)."""
        if admit:
            self._admit()
        groups = self._groups(requests, indices)
        responses = await asyncio.gather(
            *(self._throttled(stub.ExtendSessions, request, timeout, admit=False)
              for stub, _, request in groups),
            return_exceptions=True)
        for r in responses:
            if isinstance(r, BaseException) and not isinstance(r, grpc.RpcError):
                raise r
        out = {}
        for (_, group, _), response in zip(groups, responses):
            if isinstance(response, grpc.RpcError):
                out.update((i, response) for i in group)
            else:
                out.update(self._results_of(group, response))
        return out

    async def attend(self, q: ArrayLike, k: ArrayLike, v: ArrayLike, *,
                     timeout: Optional[float] = None, **options: Any) -> Result:
        """Client.attend as a coroutine."""
        response = await self._throttled(self.stub.Attend, attend_request(q, k, v, **options),
                                         timeout)
        return _result(response, self.torch_out)

    async def multi_head_attention(self, module: str, query: ArrayLike,
                                   key: Optional[ArrayLike] = None,
                                   value: Optional[ArrayLike] = None, *,
                                   timeout: Optional[float] = None, **options: Any) -> Result:
        """Client.multi_head_attention as a coroutine."""
        response = await self._throttled(
            self.stub.MultiHeadAttention,
            multi_head_request(module, query, key, value, **options), timeout)
        return _result(response, self.torch_out)

    async def load_module(self, name: str, weights: Weights, *, num_heads: int = 0,
                          replace: bool = False,
                          timeout: Optional[float] = None) -> pb.ModuleInfo:
        """Client.load_module as a coroutine."""
        request = pb.LoadModuleRequest(name=name, safetensors=_module_bytes(weights, num_heads),
                                       num_heads=num_heads, replace=replace)
        return (await self.stub.LoadModule(request, **self._kw(timeout))).module

    async def unload_module(self, name: str, *, timeout: Optional[float] = None) -> None:
        """Client.unload_module as a coroutine."""
        await self.stub.UnloadModule(pb.UnloadModuleRequest(name=name), **self._kw(timeout))

    async def list_modules(self, *, timeout: Optional[float] = None) -> List[pb.ModuleInfo]:
        """Client.list_modules as a coroutine."""
        return list((await self.stub.ListModules(pb.ListModulesRequest(),
                                                 **self._kw(timeout))).modules)

    async def server_info(self, *,
                          timeout: Optional[float] = None) -> pb.GetServerInfoResponse:
        """Client.server_info as a coroutine."""
        return await self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self._kw(timeout))

    async def create_session(self, module: Optional[str] = None,
                             layout: Optional[pb.HeadLayout] = None, *,
                             cache_dtype: str = "float32", scale: Optional[float] = None,
                             pinned: bool = False, idle_ttl_s: Optional[float] = None,
                             window: Optional[int] = None, softcap: float = 0.0,
                             alibi: Union[None, str, Sequence[float]] = None,
                             kind: str = "softmax", feature_map: Optional[str] = None,
                             timeout: Optional[float] = None) -> AsyncSession:
        """Client.create_session as a coroutine; the AsyncSession's methods are coroutines."""
        request = _s.create_session_request(module, layout, cache_dtype=cache_dtype,
                                            scale=scale, pinned=pinned, idle_ttl_s=idle_ttl_s,
                                            window=window, softcap=softcap, alibi=alibi,
                                            kind=kind, feature_map=feature_map)
        stub, address = self._replica_stub()
        info = (await stub.CreateSession(request, **self._kw(timeout))).session
        error = self._check_owner(info, address)
        if error:
            await stub.CloseSession(pb.CloseSessionRequest(session_id=info.session_id),
                                    **self._kw(timeout))
            raise ValueError(error)
        return AsyncSession(self, info)

    async def extend_sessions(self, steps: Sequence[Step], *, timeout: Optional[float] = None
                              ) -> List[Union[SessionResult, Exception]]:
        """Client.extend_sessions as a coroutine (the replicas' calls run concurrently)."""
        return await _drive_async(self._extend_sessions_steps(steps, timeout))

    async def move_session(self, session_id: str, peer: str, *,
                           timeout: Optional[float] = None) -> pb.MoveSessionResponse:
        """Client.move_session as a coroutine."""
        response = await self._session_call(
            "MoveSession", pb.MoveSessionRequest(session_id=session_id, peer=peer), timeout)
        self._remember_move(self._resolve(session_id), response.session_id)
        return response

    async def list_sessions(self, *, replica: Optional[str] = None, page_size: int = 0,
                            page_token: str = "",
                            timeout: Optional[float] = None) -> pb.ListSessionsResponse:
        """Client.list_sessions as a coroutine."""
        stub, _ = self._replica_stub(replica)
        return await stub.ListSessions(pb.ListSessionsRequest(page_size=page_size,
                                                              page_token=page_token),
                                       **self._kw(timeout))

    def stream(self, requests: Union[Iterable[Tuple[int, Request]],
                                     AsyncIterable[Tuple[int, Request]], None] = None, *,
               timeout: Optional[float] = None) -> Any:
        """An AttentionStream call; `async for response in call` reads the answers
        (pb.AttentionStreamResponse) in completion order.

        With `requests` (an iterable or async iterable of (request_id, request) pairs), the
        call sends them as it reads them and closes its side after the last. Without, write
        yourself: `await call.write(attnserve.stream_request(id, request))`, then
        `await call.done_writing()`. `timeout` bounds the whole stream (default: none)."""
        if requests is None:
            return self.stub.AttentionStream(timeout=timeout, metadata=self._metadata)
        return self.stub.AttentionStream(_stream_messages(requests), timeout=timeout,
                                         metadata=self._metadata)


async def _stream_messages(requests) -> AsyncIterator[pb.AttentionStreamRequest]:
    if hasattr(requests, "__aiter__"):
        async for request_id, request in requests:
            yield stream_request(request_id, request)
    else:
        for request_id, request in requests:
            yield stream_request(request_id, request)
