"""Client-side adaptive throttling (Google's SRE book, "Handling Overload").

A client keeps, over a sliding window (30 s by default, as 1-second buckets), `requests`: every
throttled call the application attempted, including those the ratio below rejected locally (not
those a pushback held back), and `accepts`: those the server accepted. Before sending a call it
rejects it locally with probability

    p = min(max_probability, max(0, (requests - k * accepts) / (requests + 1)))

(k = 2 and max_probability = 0.95 by default). While the server accepts at least one call in k,
p stays 0; when it refuses most, the client sheds the excess itself, before it costs the server
anything, yet keeps sending a fraction, so that it notices the server's recovery: at least
1 - max_probability of the calls attempted (as in Envoy's admission control; uncapped, a
throttle that saw most of its first calls fail took longer than an overload lasted to reopen:
tests/bench/OVERLOAD.md). Beyond 1 / (1 - max_probability) times a server's capacity the callers
no longer shed enough by themselves, and the server's own refusals take the rest.

Accepted is every answer but UNAVAILABLE and DEADLINE_EXCEEDED (overload, shutdown, a refusal
at arrival, a deadline that passed): INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED and the
rest show a server able to take and judge the call, and a caller's own bad requests must never
make it throttle itself. A failed answer carrying the trailer grpc-retry-pushback-ms (a
non-negative integer, the server's overload refusals send it) also holds back every throttled
call until that many milliseconds have passed; a call held back so is not counted (the server
never judged it, and counting it as refused made each pushback raise p for a whole window).

Client and AsyncClient own one Throttle each (ThrottleOptions: on by default; throttle=None
turns it off) and apply it to the compute calls: attend, multi_head_attention, a session's
extend and extend_sessions. Control calls (server_info, modules, creating, describing, forking,
listing and closing sessions) and streams are neither throttled nor counted. A locally
rejected call raises ThrottledError, a grpc.RpcError with code() UNAVAILABLE, before anything
is sent. One call of the application's is judged once: an extend_sessions whatever the number
of replicas it reaches (each replica's answer is counted), and a call sent again where its
session went (a move followed) is counted but never rejected.
"""
from __future__ import annotations

import math
import random
import threading
import time
from typing import Callable, NamedTuple, Optional, Tuple, Union

import grpc
import grpc.aio

# The trailer of gRPC's retry pushback (gRFC A6): the server asks for no retry before that many
# milliseconds.
PUSHBACK_KEY = "grpc-retry-pushback-ms"

# The outcomes that are not accepts. Everything else, OK included, is.
_NOT_ACCEPTED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_ADVICE = "; retry later or disable with throttle=None"


class ThrottleOptions(NamedTuple):
    """Client-side adaptive throttling: `enabled` (default True), `k` (a call is rejected
    locally with probability min(max_probability, max(0, (requests - k * accepts) / (requests +
    1))); >= 1, default 2.0: lower sheds sooner), `window_seconds` (the sliding window the
    counts cover, in whole seconds, default 30) and `max_probability` (above 0, at most 1: 1 is
    the SRE book's formula, uncapped; default 0.95)."""
    enabled: bool = True
    k: float = 2.0
    window_seconds: int = 30
    max_probability: float = 0.95


def is_accept(code: grpc.StatusCode) -> bool:
    """Whether an answer with `code` counts as accepted by the server: every code but
    UNAVAILABLE and DEADLINE_EXCEEDED."""
    return code not in _NOT_ACCEPTED


def parse_pushback(value: Union[str, bytes, None]) -> Optional[int]:
    """The milliseconds of a grpc-retry-pushback-ms value, or None unless it is a non-negative
    decimal integer (gRPC's core rewrites a value it cannot parse as a negative one)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    # isdigit() alone would take "²" or "٣"; only ASCII digits are an integer here.
    if not isinstance(value, str) or not value or not value.isascii() or not value.isdigit():
        return None
    return int(value)


def pushback_value(metadata) -> Union[str, bytes, None]:
    """The first grpc-retry-pushback-ms value of trailing metadata (pairs, or grpc's
    _Metadatum and grpc.aio.Metadata), or None."""
    for key, value in metadata or ():
        if key == PUSHBACK_KEY:
            return value
    return None


def _number(x) -> str:
    # As JavaScript's String(x), so that both clients' messages read the same: 2.0 -> "2".
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if isinstance(x, float) and x == int(x):
        return str(int(x))
    return repr(x)


def _check_options(options: ThrottleOptions) -> None:
    k, window = options.k, options.window_seconds
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        raise ValueError(f"throttle.k must be a number; was {k!r}")
    if not k >= 1:  # NaN too
        raise ValueError(f"throttle.k must be >= 1; was {_number(k)}")
    if math.isinf(k):
        # inf * 0 accepts is NaN: use enabled=False for a throttle that never rejects.
        raise ValueError(f"throttle.k must be finite; was {_number(k)}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"throttle.window_seconds must be an integer >= 1; was {window!r}")
    cap = options.max_probability
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        raise ValueError(f"throttle.max_probability must be a number; was {cap!r}")
    if not 0 < cap <= 1:  # NaN too
        raise ValueError(
            f"throttle.max_probability must be above 0 and at most 1; was {_number(cap)}")


class Throttle:
    """The counts and the decision of one client (shared by its threads and tasks; with
    several replicas, one for all of them).

    clock: seconds, monotonic (default time.monotonic); rand: uniform in [0, 1) (default
    random.random). Both are for tests: a fake clock and fake draws make every decision
    deterministic. A Throttle with options.enabled False never rejects and counts nothing.

    The counts live in window_seconds buckets of one whole second of the clock
    (floor(clock())): at second s the window holds the buckets of seconds s - window_seconds + 1
    to s. A locally rejected call is counted when it is rejected; a sent call when its answer
    comes (record), so that calls in flight weigh nothing.
    """

    def __init__(self, options: ThrottleOptions = ThrottleOptions(), *,
                 clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random):
        _check_options(options)
        self.options = options
        self._clock = clock
        self._rand = rand
        self._lock = threading.Lock()
        n = options.window_seconds
        # A ring: slot s % n holds second s's counts while _seconds says it is second s.
        self._seconds = [-math.inf] * n
        self._requests = [0] * n
        self._accepts = [0] * n
        self._pushback_until = -math.inf
        self._pushback_ms = 0

    def _add(self, second: int, accepted: bool) -> None:
        i = second % len(self._seconds)
        if self._seconds[i] != second:
            self._seconds[i] = second
            self._requests[i] = self._accepts[i] = 0
        self._requests[i] += 1
        if accepted:
            self._accepts[i] += 1

    def _counts(self, second: int) -> Tuple[int, int]:
        first = second - len(self._seconds)
        requests = accepts = 0
        for s, r, a in zip(self._seconds, self._requests, self._accepts):
            if first < s <= second:
                requests += r
                accepts += a
        return requests, accepts

    def _p(self, requests: int, accepts: int) -> float:
        p = (requests - self.options.k * accepts) / (requests + 1)
        return min(self.options.max_probability, max(0.0, p))

    def counts(self) -> Tuple[int, int]:
        """(requests, accepts) in the window now."""
        with self._lock:
            return self._counts(math.floor(self._clock()))

    def probability(self) -> float:
        """The probability that a call made now is rejected by the ratio (a pushback in force
        rejects every call whatever this says)."""
        with self._lock:
            return self._p(*self._counts(math.floor(self._clock())))

    def check(self) -> Optional[str]:
        """Before a throttled call: None to send it, or why it is rejected locally (the
        message of its ThrottledError; counted as a request when the ratio rejects it, not when
        a pushback holds it back). Draws from rand only when the probability is above 0 and no
        pushback is in force."""
        if not self.options.enabled:
            return None
        with self._lock:
            now = self._clock()
            second = math.floor(now)
            if now < self._pushback_until:  # not counted (the module's docstring)
                return ("throttled by the client: the server asked for no calls for "
                        f"{self._pushback_ms} ms ({PUSHBACK_KEY}){_ADVICE}")
            requests, accepts = self._counts(second)
            p = self._p(requests, accepts)
            if p > 0 and self._rand() < p:
                self._add(second, accepted=False)
                return (f"throttled by the client: the server accepted {accepts} of the last "
                        f"{requests} calls in {self.options.window_seconds} s (adaptive "
                        f"throttling, k={_number(self.options.k)}){_ADVICE}")
            return None

    def record(self, code: grpc.StatusCode, pushback: Union[str, bytes, None] = None) -> None:
        """A sent call's answer: its status `code` (grpc.StatusCode.OK for a success) and, for a
        failure, the value of its grpc-retry-pushback-ms trailer if any (pushback_value)."""
        if not self.options.enabled:
            return
        with self._lock:
            now = self._clock()
            self._add(math.floor(now), accepted=is_accept(code))
            ms = parse_pushback(pushback) if code != grpc.StatusCode.OK else None
            # A later, shorter pushback (a call that was already in flight) does not shorten
            # the one in force.
            if ms is not None and now + ms / 1000 > self._pushback_until:
                self._pushback_until = now + ms / 1000
                self._pushback_ms = ms


class ThrottledError(grpc.aio.AioRpcError):
    """A call rejected by the client's throttle before anything was sent: code() UNAVAILABLE,
    details() the reason. A grpc.RpcError, as Client's errors are, and a grpc.aio.AioRpcError,
    as AsyncClient's are, so that `except` clauses for either catch it."""

    def __init__(self, details: str):
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                         details=details,
                         debug_error_string="rejected by the client's throttle, never sent")


def make_throttle(throttle: Union[ThrottleOptions, Throttle, bool, None]) -> Optional[Throttle]:
    """The Throttle of a client's `throttle` argument: True for ThrottleOptions(), None or
    False for none, ThrottleOptions, or a Throttle (e.g. with a fake clock, or shared)."""
    if throttle is None or throttle is False:
        return None
    if throttle is True:
        throttle = ThrottleOptions()
    if isinstance(throttle, Throttle):
        return throttle if throttle.options.enabled else None
    if isinstance(throttle, ThrottleOptions):
        _check_options(throttle)  # also when disabled: a bad k is a bug either way
        return Throttle(throttle) if throttle.enabled else None
    raise TypeError("throttle must be a ThrottleOptions, a Throttle, True or None; was "
                    f"{throttle!r}")
