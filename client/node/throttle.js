// Client-side adaptive throttling (Google's SRE book, "Handling Overload"), the same as the
// Python client's attnserve/throttle.py: both pass tests/testing/throttle_cases.json.
//
// A client keeps, over a sliding window (30 s by default, as 1-second buckets), `requests`:
// every throttled call the application attempted, including those the ratio below rejected here
// (not those a pushback held back), and `accepts`: those the server accepted. Before sending a
// call it rejects it locally with probability
//
//   p = min(maxProbability, max(0, (requests - k * accepts) / (requests + 1)))
//
// (k = 2 and maxProbability = 0.95 by default). While the server accepts at least one call in k,
// p stays 0; when it refuses most, the client sheds the excess itself, before it costs the server
// anything, yet keeps sending a fraction, so that it notices the server's recovery: at least
// 1 - maxProbability of the calls attempted (as in Envoy's admission control; uncapped, a
// throttle that saw most of its first calls fail took longer than an overload lasted to reopen:
// tests/bench/OVERLOAD.md). Beyond 1 / (1 - maxProbability) times a server's capacity the
// callers no longer shed enough by themselves, and the server's own refusals take the rest.
//
// Accepted is every answer but UNAVAILABLE and DEADLINE_EXCEEDED (overload, shutdown, a refusal
// at arrival, a deadline that passed): INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED and the
// rest show a server able to take and judge the call, and a caller's own bad requests must
// never make it throttle itself. A failed answer carrying the trailer grpc-retry-pushback-ms (a
// non-negative integer; the server's overload refusals send it) also holds back every throttled
// call until that many milliseconds have passed; a call held back so is not counted (the server
// never judged it, and counting it as refused made each pushback raise p for a whole window).
'use strict';
const { performance } = require('node:perf_hooks');
const grpc = require('@grpc/grpc-js');

/** The trailer of gRPC's retry pushback (gRFC A6): no retry before that many milliseconds. */
const PUSHBACK_KEY = 'grpc-retry-pushback-ms';
// The outcomes that are not accepts. Everything else, OK included, is.
const NOT_ACCEPTED = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);
const ADVICE = '; retry later or disable with {throttle: false}';
const DEFAULTS = Object.freeze({ enabled: true, k: 2, windowSeconds: 30, maxProbability: 0.95 });

/** Whether an answer with `code` (a grpc.status value) counts as accepted by the server. */
function isAccept(code) {
  return !NOT_ACCEPTED.has(code);
}

/**
 * The milliseconds of a grpc-retry-pushback-ms value (a string or Buffer), or null unless it is
 * a non-negative decimal integer (gRPC's C core rewrites a value it cannot parse as a negative
 * one).
 */
function parsePushback(value) {
  if (Buffer.isBuffer(value)) value = value.toString('latin1');
  if (typeof value !== 'string' || !/^[0-9]+$/.test(value)) return null;
  return Number(value);
}

/** The first grpc-retry-pushback-ms value of trailing metadata (a grpc.Metadata), or null. */
function pushbackValue(metadata) {
  const values = metadata && typeof metadata.get === 'function' ? metadata.get(PUSHBACK_KEY) : [];
  return values.length > 0 ? values[0] : null;
}

function show(x) {
  return typeof x === 'number' ? String(x) : JSON.stringify(x);
}

/** The options with the defaults filled in; throws naming the field and value of a bad one. */
function checkOptions(options) {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`throttle must be an options object; was ${show(options)}`);
  }
  for (const key of Object.keys(options)) {
    if (!(key in DEFAULTS)) {
      throw new RangeError(
        `throttle.${key} is not an option (enabled, k, windowSeconds, maxProbability)`);
    }
  }
  const o = {};
  for (const key of Object.keys(DEFAULTS)) o[key] = options[key] ?? DEFAULTS[key];
  if (typeof o.k !== 'number') throw new TypeError(`throttle.k must be a number; was ${show(o.k)}`);
  if (!(o.k >= 1)) throw new RangeError(`throttle.k must be >= 1; was ${show(o.k)}`);
  // Infinity * 0 accepts is NaN: use enabled: false for a throttle that never rejects.
  if (!Number.isFinite(o.k)) throw new RangeError(`throttle.k must be finite; was ${show(o.k)}`);
  if (!Number.isInteger(o.windowSeconds) || o.windowSeconds < 1) {
    throw new RangeError(
      `throttle.windowSeconds must be an integer >= 1; was ${show(o.windowSeconds)}`);
  }
  if (typeof o.maxProbability !== 'number') {
    throw new TypeError(`throttle.maxProbability must be a number; was ${show(o.maxProbability)}`);
  }
  if (!(o.maxProbability > 0 && o.maxProbability <= 1)) {  // NaN too
    throw new RangeError(
      `throttle.maxProbability must be above 0 and at most 1; was ${show(o.maxProbability)}`);
  }
  o.enabled = !!o.enabled;
  return Object.freeze(o);
}

/**
 * The counts and the decision of one client (with several replicas, one for all of them).
 * options: { enabled (default true), k (default 2, >= 1), windowSeconds (default 30) }.
 * hooks.clock: milliseconds, monotonic (default performance.now()); hooks.rand: uniform in
 * [0, 1) (default Math.random). Both are for tests: a fake clock and fake draws make every
 * decision deterministic. A Throttle with enabled false never rejects and counts nothing.
 *
 * The counts live in windowSeconds buckets of one whole second of the clock
 * (floor(clock() / 1000)): at second s the window holds the buckets of seconds
 * s - windowSeconds + 1 to s. A locally rejected call is counted when it is rejected; a sent
 * call when its answer comes (record), so that calls in flight weigh nothing.
 */
class Throttle {
  constructor(options = {}, { clock = () => performance.now(), rand = Math.random } = {}) {
    /** The options, defaults filled in. */
    this.options = checkOptions(options);
    this.clock = clock;
    this.rand = rand;
    const n = this.options.windowSeconds;
    // A ring: slot s % n holds second s's counts while seconds[s % n] says it is second s.
    this.seconds = new Array(n).fill(-Infinity);
    this.requests = new Array(n).fill(0);
    this.accepts = new Array(n).fill(0);
    this.pushbackUntil = -Infinity;
    this.pushbackMs = 0;
  }

  add(second, accepted) {
    const i = second % this.seconds.length;
    if (this.seconds[i] !== second) {
      this.seconds[i] = second;
      this.requests[i] = 0;
      this.accepts[i] = 0;
    }
    this.requests[i]++;
    if (accepted) this.accepts[i]++;
  }

  countsAt(second) {
    const first = second - this.seconds.length;
    let requests = 0;
    let accepts = 0;
    this.seconds.forEach((s, i) => {
      if (first < s && s <= second) {
        requests += this.requests[i];
        accepts += this.accepts[i];
      }
    });
    return { requests, accepts };
  }

  p({ requests, accepts }) {
    const p = (requests - this.options.k * accepts) / (requests + 1);
    return Math.min(this.options.maxProbability, Math.max(0, p));
  }

  /** { requests, accepts } in the window now. */
  counts() {
    return this.countsAt(Math.floor(this.clock() / 1000));
  }

  /**
   * The probability that a call made now is rejected by the ratio (a pushback in force rejects
   * every call whatever this says).
   */
  probability() {
    return this.p(this.counts());
  }

  /**
   * Before a throttled call: null to send it, or why it is rejected locally (the message of its
   * ThrottledError; counted as a request when the ratio rejects it, not when a pushback holds it
   * back). Draws from rand only when the probability is above 0 and no pushback is in force.
   */
  check() {
    if (!this.options.enabled) return null;
    const now = this.clock();
    const second = Math.floor(now / 1000);
    if (now < this.pushbackUntil) {  // not counted (the comment at the top)
      return 'throttled by the client: the server asked for no calls for ' +
        `${this.pushbackMs} ms (${PUSHBACK_KEY})${ADVICE}`;
    }
    const { requests, accepts } = this.countsAt(second);
    const p = this.p({ requests, accepts });
    if (p > 0 && this.rand() < p) {
      this.add(second, false);
      return `throttled by the client: the server accepted ${accepts} of the last ${requests} ` +
        `calls in ${this.options.windowSeconds} s (adaptive throttling, k=${this.options.k})` +
        ADVICE;
    }
    return null;
  }

  /**
   * A sent call's answer: its status `code` (grpc.status.OK for a success) and, for a failure,
   * the value of its grpc-retry-pushback-ms trailer if any (pushbackValue).
   */
  record(code, pushback = null) {
    if (!this.options.enabled) return;
    const now = this.clock();
    this.add(Math.floor(now / 1000), isAccept(code));
    const ms = code !== grpc.status.OK ? parsePushback(pushback) : null;
    // A later, shorter pushback (a call that was already in flight) does not shorten the one in
    // force.
    if (ms !== null && now + ms > this.pushbackUntil) {
      this.pushbackUntil = now + ms;
      this.pushbackMs = ms;
    }
  }
}

/**
 * A call rejected by the client's throttle before anything was sent: grpc-js's error fields,
 * code grpc.status.UNAVAILABLE and details the reason.
 */
class ThrottledError extends Error {
  constructor(details) {
    super(`${grpc.status.UNAVAILABLE} UNAVAILABLE: ${details}`);
    this.name = 'ThrottledError';
    this.code = grpc.status.UNAVAILABLE;
    this.details = details;
    this.metadata = new grpc.Metadata();
  }
}

/**
 * The Throttle of a client's `throttle` option: undefined or true for the defaults, false or
 * null for none, an options object, or a Throttle (e.g. with a fake clock, or shared).
 */
function makeThrottle(throttle) {
  if (throttle === undefined || throttle === true) return new Throttle();
  if (throttle === false || throttle === null) return null;
  if (throttle instanceof Throttle) return throttle.options.enabled ? throttle : null;
  if (typeof throttle !== 'object' || Array.isArray(throttle)) {
    throw new TypeError('throttle must be an options object, a Throttle, true or false; was ' +
      show(throttle));
  }
  const options = checkOptions(throttle);  // also when disabled: a bad k is a bug either way
  return options.enabled ? new Throttle(options) : null;
}

module.exports = {
  Throttle, ThrottledError, makeThrottle, isAccept, parsePushback, pushbackValue, PUSHBACK_KEY,
};
