// attnserve for Node.js: a small client over @grpc/grpc-js and @grpc/proto-loader, with the
// service's proto shipped inside the package (proto/attnserve/v1/attention.proto). Types are in
// index.d.ts; every rpc and field is documented in the proto.
//
//   const { Client } = require('attnserve');
//   const client = new Client('localhost:50051');
//   const x = { shape: [1, 10, 64], data: new Float32Array(640).fill(1) };
//   const result = await client.multiHeadAttention('demo', x);  // result.output.data: Float32Array
//
// Tensors go in as { shape, data } (data: Float32Array or numbers; dtype 'float32' by default,
// 'float16' or 'bfloat16' to send them rounded to that type) and come out as
// { shape, dtype, data: Float32Array } (float16 and bfloat16 widened exactly). Field names are
// the proto's in lowerCamelCase (keyLengths, returnWeights, requestId, computeUs).
//
// Several replicas: new Client(['10.0.0.1:50051', '10.0.0.2:50051']) balances stateless calls
// over them (round_robin) and sends every call naming a decode session to the replica its id
// "<owner>/<instance>/<key>" names (see Client), following sessions moved to another replica
// (moveSession, and drains with --session_peers) as the C++ client does (see sessionCall).
//
// Client-side adaptive throttling (throttle.js), on by default: when the server refuses most
// calls (UNAVAILABLE, DEADLINE_EXCEEDED), the compute calls reject at once with a
// ThrottledError (code UNAVAILABLE) instead of adding to its load; { throttle: false } turns it
// off.
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { Throttle, ThrottledError, makeThrottle, pushbackValue } = require('./throttle');

// The package's copy (prepack.js puts it there); in a checkout of the repository before packing,
// the repository's own proto/.
const PROTO_ROOT =
  [path.join(__dirname, 'proto'), path.join(__dirname, '..', '..', 'proto')].find((dir) =>
    fs.existsSync(path.join(dir, 'attnserve', 'v1', 'attention.proto'))) ||
  path.join(__dirname, 'proto');
const PROTO_FILE = path.join(PROTO_ROOT, 'attnserve', 'v1', 'attention.proto');

let v1Package = null;
/** The loaded attnserve.v1 package of grpc-js (service constructors and message types). */
function v1() {
  if (v1Package === null) {
    const definition = protoLoader.loadSync(PROTO_FILE, {
      includeDirs: [PROTO_ROOT], keepCase: false, longs: Number, enums: String, defaults: true,
      oneofs: true,
    });
    v1Package = grpc.loadPackageDefinition(definition).attnserve.v1;
  }
  return v1Package;
}

const DTYPES = { float32: 'DTYPE_FLOAT32', float16: 'DTYPE_FLOAT16', bfloat16: 'DTYPE_BFLOAT16' };

// The compute calls, which go through the client's throttle. The others (server info, modules,
// creating, forking, describing, listing and closing sessions) must stay usable under overload:
// neither throttled nor counted.
const THROTTLED = new Set(['Attend', 'MultiHeadAttention', 'ExtendSession', 'ExtendSessions']);

// Moved sessions. Hops a call follows (a session moved on while the call followed it is rare; a
// loop of moves is a server's bug), and the moves remembered (old id -> new id): beyond it the
// client forgets them all and learns again from the servers, which remember them too.
const MAX_HOPS = 8;
// A call to a session being moved waits and is sent again, within its deadline; at most this
// many times (a move takes milliseconds).
const MAX_MOVING_WAITS = 1000;
const MAX_MOVES_REMEMBERED = 65536;
const MOVED_KEY = 'attnserve-session-moved';
const PUSHBACK_KEY = 'grpc-retry-pushback-ms';

// The first `key` value of a failed call's trailing metadata (grpc-js's err.metadata), or ''.
function trailer(err, key) {
  const metadata = err && err.metadata;
  if (!metadata || typeof metadata.get !== 'function') return '';
  const values = metadata.get(key);
  return values.length ? String(values[0]) : '';
}

// Whether an answer says its session is being moved (UNAVAILABLE: send it again).
function isMoving(code, details) {
  return code === grpc.status.UNAVAILABLE &&
    String(details || '').includes("' is moving to another replica");
}

// Milliseconds to wait before sending a call to a moving session again: the server's pushback
// (20 without one), within the deadline. Two more: the client's throttle holds its calls back
// for the same pushback and must let this one out (Node's timers may fire a little early).
function movingWaitMs(err, deadline) {
  const ms = Math.min(Math.max(Number.parseInt(trailer(err, PUSHBACK_KEY), 10) || 20, 1), 1000);
  return Math.max(Math.min(ms + 2, deadline - Date.now()), 0);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// float32 -> float16 bits, rounded to nearest even (the server's conversion); NaN stays NaN.
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
function halfBits(x) {
  f32[0] = x;
  const bits = u32[0];
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);  // inf, NaN
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;  // overflow to inf
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rest > mid || (rest === mid && (half & 1)) ? 1 : 0));
  }
  const half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && (half & 1)) ? 1 : 0));
}

function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

// float32 -> bfloat16 bits, rounded to nearest even; NaN stays NaN.
function bfloat16Bits(x) {
  f32[0] = x;
  const bits = u32[0];
  if ((bits & 0x7fffffff) > 0x7f800000) return (bits >>> 16) | 0x40;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/**
 * An attnserve.v1.Tensor message from { shape, data, dtype? }. A message already in the
 * proto's form ({ dtype: 'DTYPE_...', shape, data: Buffer }) passes through unchanged.
 * @param {{shape: number[], data: ArrayLike<number>|Buffer, dtype?: string}} t
 * @param {string} [dtype] 'float32' (default), 'float16' or 'bfloat16'
 */
function toTensor(t, dtype) {
  if (Buffer.isBuffer(t.data) && typeof t.dtype === 'string' && t.dtype.startsWith('DTYPE_')) {
    return t;
  }
  const name = dtype || t.dtype || 'float32';
  if (!(name in DTYPES)) {
    throw new RangeError(`dtype must be float32, float16 or bfloat16; was ${JSON.stringify(name)}`);
  }
  const n = t.shape.reduce((a, b) => a * b, 1);
  if (t.data.length !== n) {
    throw new RangeError(`data has ${t.data.length} values; shape [${t.shape}] needs ${n}`);
  }
  let data;
  if (name === 'float32') {
    data = Buffer.alloc(4 * n);
    for (let i = 0; i < n; i++) data.writeFloatLE(t.data[i], 4 * i);
  } else {
    data = Buffer.alloc(2 * n);
    const bits = name === 'float16' ? halfBits : bfloat16Bits;
    for (let i = 0; i < n; i++) data.writeUInt16LE(bits(t.data[i]), 2 * i);
  }
  return { dtype: DTYPES[name], shape: t.shape, data };
}

/** A mask message from { shape, data } of booleans (true: the key may be attended). */
function toMask(m) {
  if (Buffer.isBuffer(m.data) && m.dtype === 'DTYPE_BOOL') return m;
  const data = Buffer.alloc(m.data.length);
  for (let i = 0; i < m.data.length; i++) data[i] = m.data[i] ? 1 : 0;
  return { dtype: 'DTYPE_BOOL', shape: m.shape, data };
}

/**
 * { shape, dtype, data: Float32Array } from an attnserve.v1.Tensor message (float16 and
 * bfloat16 widened exactly; bool as 0/1).
 */
function fromTensor(t) {
  const shape = t.shape.map(Number);
  const d = t.data;
  let data;
  if (t.dtype === 'DTYPE_FLOAT32') {
    data = new Float32Array(d.length / 4);
    for (let i = 0; i < data.length; i++) data[i] = d.readFloatLE(4 * i);
  } else if (t.dtype === 'DTYPE_FLOAT16') {
    data = new Float32Array(d.length / 2);
    for (let i = 0; i < data.length; i++) data[i] = halfToFloat(d.readUInt16LE(2 * i));
  } else if (t.dtype === 'DTYPE_BFLOAT16') {
    data = new Float32Array(d.length / 2);
    const bits = new Uint32Array(data.buffer);
    for (let i = 0; i < data.length; i++) bits[i] = d.readUInt16LE(2 * i) << 16;
  } else if (t.dtype === 'DTYPE_BOOL') {
    data = Float32Array.from(d);
  } else {
    throw new RangeError(`unknown tensor dtype ${t.dtype}`);
  }
  const dtype = t.dtype.slice('DTYPE_'.length).toLowerCase();
  return { shape, dtype, data };
}

const KINDS = { softmax: 'ATTENTION_KIND_UNSPECIFIED', linear: 'ATTENTION_KIND_LINEAR' };
const FEATURE_MAPS = {
  elu_plus_one: 'FEATURE_MAP_ELU_PLUS_ONE',
  relu: 'FEATURE_MAP_RELU',
  identity: 'FEATURE_MAP_IDENTITY',
};

// An Alibi message from 'standard' or one slope per query head.
function alibiMessage(alibi) {
  return alibi === 'standard' ? { standard: true } : { slopes: Array.from(alibi, Number) };
}

function attentionOptions(o = {}) {
  const out = { causal: !!o.causal, returnWeights: !!o.returnWeights };
  if (o.mask) out.mask = toMask(o.mask);
  if (o.keyLengths) out.keyLengths = Array.from(o.keyLengths, Number);
  if (o.scale !== undefined && o.scale !== null) out.scale = o.scale;
  if (o.window) out.window = { left: Number(o.window[0]), right: Number(o.window[1]) };
  if (o.softcap) out.softcap = Number(o.softcap);
  if (o.alibi) out.alibi = alibiMessage(o.alibi);
  setKind(out, o);
  return out;
}

// out.kind and out.featureMap (AttentionOptions or CreateSessionRequest) from o.kind ('softmax'
// or 'linear') and o.featureMap ('elu_plus_one', 'relu', 'identity').
function setKind(out, o) {
  if (o.kind !== undefined) {
    if (!(o.kind in KINDS)) throw new RangeError(`kind must be softmax or linear; was ${o.kind}`);
    out.kind = KINDS[o.kind];
  }
  if (o.featureMap !== undefined) {
    if (!(o.featureMap in FEATURE_MAPS)) {
      const names = Object.keys(FEATURE_MAPS).join(', ');
      throw new RangeError(`featureMap must be one of ${names}; was ${o.featureMap}`);
    }
    out.featureMap = FEATURE_MAPS[o.featureMap];
  }
}

/**
 * An AttendRequest message: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv].
 * options: causal, mask, keyLengths, scale, returnWeights, dtype (k and v are sent in q's),
 * window [left, right] (-1: open), softcap, alibi ('standard' or one slope per query head),
 * kind ('softmax' or 'linear') and featureMap ('elu_plus_one', 'relu', 'identity'): see
 * AttentionOptions in attention.proto.
 */
function attendRequest(q, k, v, options = {}) {
  const query = toTensor(q, options.dtype);
  const dtype = query.dtype.slice('DTYPE_'.length).toLowerCase();
  return {
    query, key: toTensor(k, dtype), value: toTensor(v, dtype), options: attentionOptions(options),
  };
}

/**
 * A MultiHeadAttentionRequest message: the module `module` on query [B, Lq, d_model], with
 * options.key and options.value [B, Lk, d_model] (both, or neither for self-attention) and
 * attendRequest's options.
 */
function multiHeadRequest(module, query, options = {}) {
  if (!options.key !== !options.value) {
    throw new TypeError('give both key and value, or neither (self-attention)');
  }
  const q = toTensor(query, options.dtype);
  const dtype = q.dtype.slice('DTYPE_'.length).toLowerCase();
  const request = { module, query: q, options: attentionOptions(options) };
  if (options.key) {
    request.key = toTensor(options.key, dtype);
    request.value = toTensor(options.value, dtype);
  }
  return request;
}

function toResult(response) {
  return {
    output: fromTensor(response.output),
    weights: response.weights ? fromTensor(response.weights) : null,
    timing: response.timing,
  };
}

/**
 * The owner of a session id "<owner>/<instance>/<key>" (the owner may hold '/'): the address
 * of the replica that holds the session. Throws a RangeError for any other string.
 * @param {string} sessionId
 */
function sessionOwner(sessionId) {
  const parts = typeof sessionId === 'string' ? sessionId.split('/') : [];
  const owner = parts.slice(0, -2).join('/');
  if (parts.length < 3 || !owner || !parts[parts.length - 2] || !parts[parts.length - 1]) {
    throw new RangeError(
      `sessionId must be "<owner>/<instance>/<key>"; was ${JSON.stringify(sessionId)}`);
  }
  return owner;
}

/**
 * An ExtendSessionRequest message for session `sessionId`: tokens.q, tokens.k, tokens.v
 * ([L, Hq, D], [L, Hkv, D], [L, Hkv, Dv], token-major) for raw sessions, or tokens.input
 * ([L, d_model]) for module sessions. options: expectedLength, returnLse, dtype (k and v are
 * sent in q's). For the stream, or built by extendSession and extendSessions.
 */
function extendRequest(sessionId, tokens, options = {}) {
  const request = { sessionId, returnLse: !!options.returnLse };
  if (tokens.input) {
    if (tokens.q || tokens.k || tokens.v) {
      throw new TypeError('give input (module sessions) or q, k, v (raw sessions), not both');
    }
    request.input = toTensor(tokens.input, options.dtype);
  } else {
    if (!tokens.q || !tokens.k || !tokens.v) {
      throw new TypeError('raw sessions need q, k and v; module sessions input');
    }
    request.query = toTensor(tokens.q, options.dtype);
    const dtype = request.query.dtype.slice('DTYPE_'.length).toLowerCase();
    request.key = toTensor(tokens.k, dtype);
    request.value = toTensor(tokens.v, dtype);
  }
  if (options.expectedLength !== undefined && options.expectedLength !== null) {
    request.expectedLength = options.expectedLength;
  }
  return request;
}

/**
 * An ExtendSessionsRequest message (for the stream): one step per session, each
 * { sessionId, tokens, expectedLength?, returnLse?, dtype? } as extendRequest's arguments.
 */
function extendSessionsRequest(steps) {
  return { steps: steps.map((s) => extendRequest(s.sessionId, s.tokens, s)) };
}

/**
 * { output, lse, length, timing, sessionId } from an ExtendSessionResponse message (sessionId:
 * the id the session was extended under, a new one after a move).
 */
function sessionResult(r) {
  return {
    output: fromTensor(r.output), lse: r.lse ? fromTensor(r.lse) : null,
    length: Number(r.length), timing: r.timing, sessionId: r.sessionId || '',
  };
}

/**
 * A failed item of extendSessions (or of a stream's extendSessions answer): `code` (a
 * grpc.status value) and `details`, as ExtendSession would have rejected, grpc-js's error's
 * fields.
 */
class StepError extends Error {
  constructor(code, details) {
    super(`${code} ${grpc.status[code] || 'UNKNOWN'}: ${details}`);
    this.name = 'StepError';
    this.code = code;
    this.details = details;
  }
}

/** SessionResult or StepError for each ExtendSessionResult message. */
function stepResults(results) {
  return results.map((r) => (r.code === 0 ? sessionResult(r.response)
    : new StepError(r.code, r.message)));
}

/**
 * "evicted", "expired" or "restarted" when `error` (grpc-js's error or a StepError) says the
 * session was lost; "" otherwise. A lost session is gone: create a new one and prefill again.
 */
/**
 * Whether a call that failed with `err` found its replica unreachable or shutting down:
 * UNAVAILABLE without a pushback (an overload refusal has one), or CANCELLED (gRPC cancels the
 * calls that reach a server as it shuts down, grpc#41785).
 */
function unreachable(err) {
  return (err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.CANCELLED) &&
    !trailer(err, PUSHBACK_KEY);
}

function sessionLostReason(error) {
  const details = (error && error.details) || '';
  if (!error || error.code !== grpc.status.FAILED_PRECONDITION ||
      !details.startsWith('session lost (')) {
    return '';
  }
  return details.slice('session lost ('.length).split(')', 1)[0];
}

/**
 * The new id when `error` (grpc-js's error or a StepError) says the session was moved to another
 * replica (FAILED_PRECONDITION "session moved to '<new id>'"); "" otherwise. The client follows
 * such answers itself; this is for the ones it could not (more than 8 hops, a stream's item).
 */
function sessionMovedTo(error) {
  const details = (error && error.details) || '';
  const prefix = "session moved to '";
  if (!error || error.code !== grpc.status.FAILED_PRECONDITION || !details.startsWith(prefix)) {
    return '';
  }
  const rest = details.slice(prefix.length);
  const end = rest.indexOf("'");
  return end < 0 ? '' : rest.slice(0, end);
}

/**
 * The "ipv4:a,b" / "ipv6:[a],[b]" target for a list of replicas "host:port" (IP literals:
 * grpc-js resolves those targets itself, no DNS). One address is its own target.
 */
function multiAddressTarget(addresses) {
  if (!Array.isArray(addresses) || addresses.length === 0) {
    throw new RangeError('target: the list of replica addresses must not be empty');
  }
  if (addresses.length === 1) return addresses[0];
  const v4 = /^\d{1,3}(\.\d{1,3}){3}:\d+$/;
  const v6 = /^\[[0-9A-Fa-f:.]+\]:\d+$/;
  if (addresses.every((a) => v4.test(a))) return `ipv4:${addresses.join(',')}`;
  if (addresses.every((a) => v6.test(a))) return `ipv6:${addresses.join(',')}`;
  throw new RangeError('target: replica addresses must all be IPv4 or all [IPv6] literals with ' +
    `ports (use a dns:/// target for host names); were ${addresses.join(',')}`);
}

/**
 * An AttentionStream call: write(requestId, request) any number of times, end(), and read the
 * answers with `for await (const answer of stream)` in completion order. Each answer is
 * { requestId, code, message, result, sessionResult, sessionResults }: code 0 and the result
 * of the request's kind (result for attend and multi-head requests, sessionResult for an
 * extendRequest, sessionResults, one SessionResult or StepError per step, for an
 * extendSessionsRequest; the others null), or a gRPC status code and its message (the stream
 * goes on after a failed request).
 */
class AttentionStream {
  constructor(call) {
    this.call = call;
  }

  /**
   * Sends `request` (from attendRequest, multiHeadRequest, extendRequest or
   * extendSessionsRequest) under `requestId`.
   */
  write(requestId, request) {
    const message = { requestId };
    if ('module' in request) message.multiHeadAttention = request;
    else if ('sessionId' in request) message.extendSession = request;
    else if ('steps' in request) message.extendSessions = request;
    else message.attend = request;
    return this.call.write(message);
  }

  /** Half-closes the stream: no more requests; the answers still arrive. */
  end() {
    this.call.end();
  }

  /** Cancels the stream. */
  cancel() {
    this.call.cancel();
  }

  async* [Symbol.asyncIterator]() {
    for await (const r of this.call) {
      const ok = r.code === 0;
      const answer = r.response === 'attend' ? r.attend
        : r.response === 'multiHeadAttention' ? r.multiHeadAttention : null;
      yield {
        requestId: Number(r.requestId), code: r.code, message: r.message,
        result: ok && answer ? toResult(answer) : null,
        sessionResult: ok && r.response === 'extendSession' ? sessionResult(r.extendSession)
          : null,
        sessionResults: ok && r.response === 'extendSessions'
          ? stepResults(r.extendSessions.results) : null,
      };
    }
  }
}

/**
 * A client of one attnserve target ("host:port", "dns:///name:port", "ipv4:a:p1,b:p2"), or of
 * a list of replicas ["10.0.0.1:50051", "10.0.0.2:50051"] (IPv4 or [IPv6] literals): stateless
 * calls are balanced over them (round_robin, one channel), and decode sessions are routed to
 * the replica their id names. Every method returns a promise; failures reject with grpc-js's
 * error (err.code: a grpc.status value, err.details: the server's message naming field and
 * value). With several replicas, a call naming a session whose owner is none of them rejects
 * with a RangeError before anything is sent.
 *
 * The compute calls (attend, multiHeadAttention, extendSession, extendSessions) go through the
 * client's throttle (throttle.js): a call it rejects rejects with a ThrottledError (code
 * UNAVAILABLE) before anything is sent. Streams are neither throttled nor counted.
 *
 * Moved sessions (moveSession, and drains with --session_peers) are followed: a call answered
 * "session moved to '<new id>'" (FAILED_PRECONDITION with the trailing metadata
 * attnserve-session-moved; nothing was done) is sent again under the new id to its owner, at
 * most 8 hops, and the client remembers the move, so later calls naming the old id go to the
 * new one (an extend's result.sessionId says the id in use); extendSessions sends again only the
 * steps whose movedTo is set. A call to a session being moved (UNAVAILABLE "... is moving") is
 * sent again after the server's pushback, within its deadline. When a session's replica cannot
 * be reached (UNAVAILABLE without a pushback: it may have moved its sessions and stopped), a
 * client of several replicas asks the others whether the session moved to them; it then sends
 * getSession and closeSession again, and extendSession when it carries expectedLength, and
 * otherwise rejects with the UNAVAILABLE with the move remembered, so that the caller's retry
 * reaches the session. A new process at the replica's address (a restart in place) answers
 * FAILED_PRECONDITION "session lost (restarted)" for a session the old one moved away: the
 * client asks the others too, and sends any call again (nothing was done). Streams do not
 * follow (streamForSession routes by the remembered id).
 */
class Client {
  /**
   * @param {string|string[]} target
   * @param {{credentials?: object, timeoutMs?: number, channelOptions?: object,
   *   loadBalancing?: string, throttle?: object|boolean|null}} [options]
   *   credentials: grpc.credentials (default insecure); timeoutMs: per call (default 60000);
   *   channelOptions: grpc-js channel options; loadBalancing: 'round_robin' or 'pick_first'
   *   (default: round_robin when the target lists addresses: a list, "ipv4:", "ipv6:", "dns:");
   *   throttle: client-side adaptive throttling, { enabled, k, windowSeconds, maxProbability }
   *   (default: on, k 2, 30 s, 0.95), a Throttle (e.g. one shared by several clients), or false for none. One per
   *   client, whatever the number of replicas.
   */
  constructor(target, options = {}) {
    const Service = v1().AttentionService;
    /** The client's Throttle, or null. Before the channels: a bad option opens nothing. */
    this.throttle = makeThrottle(options.throttle);
    /** The replicas' addresses, in the order given; [] for a client of one target. */
    this.replicas = [];
    if (typeof target !== 'string') {
      const addresses = Array.from(target || []);
      target = multiAddressTarget(addresses);
      if (addresses.length > 1) this.replicas = addresses;
    }
    /** The channel's target ("ipv4:a,b" for a list of replicas). */
    this.target = target;
    this.timeoutMs = options.timeoutMs ?? 60000;
    const balancing = options.loadBalancing ??
      (/^(ipv4|ipv6|dns):/.test(target) ? 'round_robin' : null);
    const channelOptions = {
      'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': -1,
      ...(balancing ? {
        'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ [balancing]: {} }] }),
      } : {}),
      ...options.channelOptions,
    };
    const credentials = options.credentials || grpc.credentials.createInsecure();
    this.stub = new Service(target, credentials, channelOptions);
    // One stub (and channel) per replica, for the calls naming a session, each with its own
    // connection (a local subchannel pool): its reconnect backoff is its own.
    /** A new stub of replica `address`. */
    this.newReplicaStub = (address) => new Service(address, credentials,
      { ...channelOptions, 'grpc.use_local_subchannel_pool': 1 });
    this.replicaStubs = this.replicas.map((a) => this.newReplicaStub(a));
    /** Replica stubs replaced by findMoved; closed with the client (calls may be on them). */
    this.retiredStubs = [];
    this.nextReplica = 0;
    /** Moves this client has seen: old session id -> new id. */
    this.moved = new Map();
  }

  /**
   * `method`(request) on `stub`. A compute call passes the client's throttle (admit false:
   * counted, never rejected, as the attempts of a call that follow a move are).
   */
  unary(method, request, timeoutMs, stub = this.stub, waitForReady = false, admit = true) {
    const throttle = THROTTLED.has(method) ? this.throttle : null;
    if (throttle && admit) {
      const reason = throttle.check();
      if (reason !== null) return Promise.reject(new ThrottledError(reason));
    }
    const deadline = new Date(Date.now() + (timeoutMs ?? this.timeoutMs));
    return new Promise((resolve, reject) => {
      stub[method](request, { deadline, waitForReady }, (err, r) => {
        // A session being moved is no sign of overload: the server took and judged the call
        // (its pushback is for that session's retry, not for every call of this client).
        if (throttle && err && !isMoving(err.code, err.details)) {
          throttle.record(err.code, pushbackValue(err.metadata));
        } else if (throttle) {
          throttle.record(grpc.status.OK);
        }
        return err ? reject(err) : resolve(r);
      });
    });
  }

  /** The stub of the replica holding `sessionId` (the only stub for a client of one target). */
  sessionStub(sessionId) {
    if (this.replicas.length === 0) return this.stub;
    const owner = sessionOwner(sessionId);
    const i = this.replicas.indexOf(owner);
    if (i < 0) {
      throw new RangeError(`sessionId ${JSON.stringify(sessionId)} names owner ${owner}, which ` +
        `is none of this client's addresses (${this.replicas.join(', ')}); start each replica ` +
        'with --session_owner set to the address clients reach it by');
    }
    return this.replicaStubs[i];
  }

  /** The id a session has now, following the moves this client has seen from `sessionId`. */
  resolve(sessionId) {
    let id = sessionId;
    for (let hop = 0; hop < MAX_HOPS && this.moved.has(id); hop++) id = this.moved.get(id);
    return id;
  }

  rememberMove(from, to) {
    if (this.moved.size >= MAX_MOVES_REMEMBERED) this.moved.clear();
    this.moved.set(from, to);
  }

  /**
   * The session rpc `method` with `request` (naming a session in sessionId), following moves
   * (see Client). resend: the call may be sent again after its replica could not be reached and
   * another said the session moved there.
   */
  async sessionCall(method, request, timeoutMs, resend = false) {
    const deadline = Date.now() + (timeoutMs ?? this.timeoutMs);
    let current = { ...request, sessionId: this.resolve(request.sessionId) };
    let askedOthers = false;
    // A replica said the session is on the one asked now: it is up, so the call waits for a
    // channel still backing off from the last process at its address.
    let vouched = false;
    let moves = 0;
    let waits = 0;
    for (;;) {
      const stub = this.sessionStub(current.sessionId);
      let err;
      try {
        return await this.unary(method, current, Math.max(deadline - Date.now(), 1), stub,
          vouched, moves === 0 && waits === 0 && !askedOthers);
      } catch (e) {
        err = e;
      }
      if (err instanceof ThrottledError || err.code === undefined || Date.now() >= deadline) {
        throw err;
      }
      const to = trailer(err, MOVED_KEY);
      if (to) {
        if (moves++ === MAX_HOPS) throw err;
        this.rememberMove(current.sessionId, to);
        current = { ...current, sessionId: to };
        vouched = true;
        continue;
      }
      if (isMoving(err.code, err.details)) {
        if (waits++ === MAX_MOVING_WAITS) throw err;
        await sleep(movingWaitMs(err, deadline));
        continue;
      }
      // Its replica unreachable (or shutting down), or a new process at its address that never
      // held it ("session lost (restarted)": nothing was done, so the call may be sent again):
      // did the session move to another replica before?
      const restarted = sessionLostReason(err) === 'restarted';
      if ((unreachable(err) || restarted) && !askedOthers && this.replicas.length > 1) {
        askedOthers = true;
        const found = await this.findMoved(current.sessionId, deadline);
        if (found) {
          this.rememberMove(current.sessionId, found);
          if (resend || restarted) {
            current = { ...current, sessionId: found };
            vouched = true;
            continue;
          }
        }
      }
      throw err;
    }
  }

  /**
   * The new id of `sessionId` as a replica other than its owner knows it (one it was moved to),
   * asked by GetSession; '' when none answers so.
   */
  async findMoved(sessionId, deadline) {
    let owner = '';
    try {
      owner = sessionOwner(sessionId);
    } catch (e) { /* asks every replica */ }
    // [the new id `stub` answers for sessionId or '', whether it could not be reached].
    const ask = async (stub) => {
      const timeoutMs = Math.max(Math.min(deadline - Date.now(), 2000), 1);
      try {
        await this.unary('GetSession', { sessionId }, timeoutMs, stub);
      } catch (err) {
        return [trailer(err, MOVED_KEY), err.code === grpc.status.UNAVAILABLE];
      }
      return ['', false];
    };
    const notReached = [];
    for (let i = 0; i < this.replicas.length; i++) {
      if (this.replicas[i] === owner) continue;
      const [to, down] = await ask(this.replicaStubs[i]);
      if (to) return to;
      if (down) notReached.push(i);
    }
    // A replica that could not be reached is asked again once over a new channel, which
    // connects at once: the old one may be backing off from a process that stopped while a new
    // one now listens at its address. If the new channel reaches it, it replaces the old one.
    for (const i of notReached) {
      const stub = this.newReplicaStub(this.replicas[i]);
      const [to, down] = await ask(stub);
      if (down) {
        stub.close();
        continue;
      }
      this.retiredStubs.push(this.replicaStubs[i]);
      this.replicaStubs[i] = stub;
      if (to) return to;
    }
    return '';
  }

  /** [stub, address] of `replica`, or of the next replica in turn ("" for one target). */
  replicaStub(replica) {
    if (this.replicas.length === 0) {
      if (replica) {
        throw new RangeError(`replica ${JSON.stringify(replica)}: this client has one target`);
      }
      return [this.stub, ''];
    }
    let i;
    if (replica === undefined || replica === null) {
      i = this.nextReplica;
      this.nextReplica = (i + 1) % this.replicas.length;
    } else {
      i = this.replicas.indexOf(replica);
      if (i < 0) {
        throw new RangeError(`replica ${JSON.stringify(replica)} is none of this client's ` +
          `addresses (${this.replicas.join(', ')})`);
      }
    }
    return [this.replicaStubs[i], this.replicas[i]];
  }

  /** Attention on projected tensors; resolves to { output, weights, timing }. */
  async attend(q, k, v, options = {}) {
    return toResult(await this.unary('Attend', attendRequest(q, k, v, options),
      options.timeoutMs));
  }

  /** The registered module `module` ("demo" is built in); resolves to a result. */
  async multiHeadAttention(module, query, options = {}) {
    return toResult(await this.unary('MultiHeadAttention',
      multiHeadRequest(module, query, options), options.timeoutMs));
  }

  /**
   * Registers safetensors bytes (a Buffer) under `name`; resolves to the ModuleInfo. With
   * several replicas it reaches one of them: call it on a client of each replica.
   */
  async loadModule(name, safetensors, options = {}) {
    const r = await this.unary('LoadModule', {
      name, safetensors, numHeads: options.numHeads || 0, replace: !!options.replace,
    }, options.timeoutMs);
    return r.module;
  }

  /** Removes the module `name`. */
  async unloadModule(name, options = {}) {
    await this.unary('UnloadModule', { name }, options.timeoutMs);
  }

  /** The registered modules (ModuleInfo: name, dModel, numHeads, headDim, ...). */
  async listModules(options = {}) {
    return (await this.unary('ListModules', {}, options.timeoutMs)).modules;
  }

  /** The server's version, backends, limits and batching settings. */
  serverInfo(options = {}) {
    return this.unary('GetServerInfo', {}, options.timeoutMs);
  }

  /**
   * Creates a decode session: options.module (a loaded module: extends send input
   * [L, d_model]) or options.layout ({numHeads, numKvHeads, headDim, vHeadDim}: extends send
   * projected q [L, Hq, D], k and v [L, Hkv, D], token-major); options.cacheDtype (float32,
   * float16, bfloat16), scale, pinned, idleTtlUs; window (the keys before each token's
   * position it attends: a sliding window), softcap, alibi ('standard' or one slope per query
   * head), as attend takes them with causal set; kind 'linear' (featureMap as attend's) for a
   * linear-attention session, which keeps only its running state: its memory and step time do
   * not grow with its length. Resolves to the SessionInfo (sessionId, ...).
   * With several replicas it goes to options.replica, else to the next replica in turn; a
   * replica that issues an id naming another owner gets the session closed again, and the
   * call rejects with an Error saying to set that replica's --session_owner.
   */
  async createSession(options = {}) {
    const request = {
      cacheDtype: `DTYPE_${(options.cacheDtype || 'float32').toUpperCase()}`,
      pinned: !!options.pinned, idleTtlUs: options.idleTtlUs || 0,
    };
    if (options.module) request.module = options.module;
    else request.layout = options.layout;
    if (options.scale !== undefined) request.scale = options.scale;
    if (options.window !== undefined && options.window !== null) {
      request.window = { left: Number(options.window), right: 0 };
    }
    if (options.softcap) request.softcap = Number(options.softcap);
    if (options.alibi) request.alibi = alibiMessage(options.alibi);
    setKind(request, options);
    const [stub, address] = this.replicaStub(options.replica);
    const info = (await this.unary('CreateSession', request, options.timeoutMs, stub)).session;
    if (address && sessionOwner(info.sessionId) !== address) {
      await this.unary('CloseSession', { sessionId: info.sessionId }, options.timeoutMs, stub);
      throw new Error(`the replica at ${address} issued sessionId ` +
        `${JSON.stringify(info.sessionId)}, whose owner is not that address; start each ` +
        'replica with --session_owner set to the address clients reach it by');
    }
    return info;
  }

  /**
   * Appends tokens to session `sessionId` and resolves to { output, lse, length, timing }:
   * tensors.q, tensors.k, tensors.v for raw sessions, or tensors.input for module sessions.
   * options: expectedLength (the extend applies only at that length, else ABORTED: safe
   * retries), returnLse, dtype, timeoutMs.
   */
  async extendSession(sessionId, tensors, options = {}) {
    const request = extendRequest(sessionId, tensors, options);
    return sessionResult(await this.sessionCall('ExtendSession', request, options.timeoutMs,
      request.expectedLength !== undefined));
  }

  /**
   * One step of each of many sessions (N sessions x 1 token, computed as one batch): steps are
   * { sessionId, tokens, expectedLength?, returnLse?, dtype? } (as extendSession's arguments),
   * each session at most once. One ExtendSessions call per replica, all at once; resolves to
   * one item per step, in the steps' order: a SessionResult, or a StepError (code, details) as
   * ExtendSession would have rejected. A replica's failed call makes a StepError of each of its
   * steps; with one replica, the call's error rejects instead. Steps whose session moved
   * (movedTo) are sent again under the new id; those of a replica whose call failed unreachable
   * (UNAVAILABLE without a pushback, or CANCELLED) or that answered "session lost (restarted)"
   * are looked for on the other replicas and sent again where found, as extendSession does
   * (a one-replica call's error rejects only when none was found). The throttle judges the
   * call once, however many replicas it reaches.
   */
  async extendSessions(steps, options = {}) {
    if (!Array.isArray(steps) || steps.length === 0) {
      throw new RangeError('steps must be a non-empty array');
    }
    const seen = new Set();
    const requests = steps.map((step, i) => {
      const sessionId = this.resolve(step.sessionId);
      if (seen.has(sessionId)) {
        throw new RangeError(`steps[${i}] names session ${step.sessionId} a second time`);
      }
      seen.add(sessionId);
      this.sessionStub(sessionId);  // an unknown owner: rejected before anything is sent
      return extendRequest(sessionId, step.tokens, step);
    });
    const deadline = Date.now() + (options.timeoutMs ?? this.timeoutMs);
    const all = requests.map((_, i) => i);
    const { results, whole } = await this.extendSessionsOnce(requests, all, deadline, true);
    const asked = new Set();  // the sessions looked for on the other replicas
    let sentAgain = false;
    // Steps whose session moved (sent again under its new id), is moving (again, after a
    // pause) or was found on another replica, until none is left or the deadline passes.
    for (let round = 0; round < MAX_HOPS + MAX_MOVING_WAITS && Date.now() < deadline; round++) {
      const again = [];
      let moving = false;
      for (let i = 0; i < results.length; i++) {
        const r = results[i];
        if (r instanceof Error) {
          // Its replica's call failed as a whole: unreachable, or shutting down?
          if (r instanceof ThrottledError || !unreachable(r) ||
              !(await this.found(requests, i, asked, deadline, false))) {
            continue;
          }
        } else if (r.movedTo) {
          this.rememberMove(requests[i].sessionId, r.movedTo);
          requests[i] = { ...requests[i], sessionId: r.movedTo };
        } else if (isMoving(r.code, r.message)) {
          moving = true;
        } else if (sessionLostReason({ code: r.code, details: r.message }) !== 'restarted' ||
                   !(await this.found(requests, i, asked, deadline, true))) {
          continue;
        }
        again.push(i);
      }
      if (again.length === 0) break;
      if (moving) await sleep(Math.max(Math.min(21, deadline - Date.now()), 0));
      let more;
      try {
        more = (await this.extendSessionsOnce(requests, again, deadline, false)).results;
      } catch (err) {
        break;  // the first answer stands for these steps
      }
      sentAgain = true;
      for (const i of again) results[i] = more[i];
    }
    // One replica's call failed and none of its steps was found elsewhere: its error.
    if (whole && !sentAgain) throw whole;
    return results.map((r) => {
      if (r instanceof Error) return new StepError(r.code, r.details || '');
      return r.code === 0 ? sessionResult(r.response) : new StepError(r.code, r.message);
    });
  }

  /**
   * extendSessions: whether step i's session, its replica unreachable or restarted, was found
   * on another replica (each session looked for once: `asked`) and is to be sent again: the
   * move is remembered, and the step sent again when it carries expectedLength or nothing was
   * done (`restarted`).
   */
  async found(requests, i, asked, deadline, restarted) {
    const id = requests[i].sessionId;
    if (this.replicas.length < 2 || asked.has(id)) return false;
    asked.add(id);
    const to = await this.findMoved(id, deadline);
    if (!to) return false;
    this.rememberMove(id, to);
    if (!restarted && requests[i].expectedLength === undefined) return false;
    requests[i] = { ...requests[i], sessionId: to };
    return true;
  }

  /**
   * One ExtendSessions call per replica, all at once, for the steps of `indices`: { results:
   * an array (indexed like `requests`) holding each one's ExtendSessionResult message, or the
   * error of its replica's failed call; whole: that error when all went to one replica }.
   * admit: the throttle judges the calls once, as one call of the application's (a rejection
   * rejects before anything is sent); false: counted, never rejected.
   */
  async extendSessionsOnce(requests, indices, deadline, admit) {
    if (admit && this.throttle) {
      const reason = this.throttle.check();
      if (reason !== null) throw new ThrottledError(reason);
    }
    const groups = new Map();  // stub -> { indices, request }
    for (const i of indices) {
      const stub = this.sessionStub(requests[i].sessionId);
      if (!groups.has(stub)) groups.set(stub, { indices: [], request: { steps: [] } });
      const group = groups.get(stub);
      group.indices.push(i);
      group.request.steps.push(requests[i]);
    }
    const timeoutMs = Math.max(deadline - Date.now(), 1);
    const answers = await Promise.allSettled([...groups].map(([stub, group]) =>
      this.unary('ExtendSessions', group.request, timeoutMs, stub, false, false)));
    const out = new Array(requests.length);
    let whole = null;
    [...groups.values()].forEach((group, g) => {
      const answer = answers[g];
      if (answer.status === 'rejected') {
        if (answer.reason.code === undefined) throw answer.reason;
        if (groups.size === 1) whole = answer.reason;
        for (const i of group.indices) out[i] = answer.reason;
        return;
      }
      group.indices.forEach((i, j) => {
        out[i] = answer.value.results[j] || {
          code: grpc.status.INTERNAL, message: 'the replica answered fewer results than steps',
        };
      });
    });
    return { results: out, whole };
  }

  /** A new session sharing `sessionId`'s tokens copy-on-write; resolves to its SessionInfo. */
  async forkSession(sessionId, options = {}) {
    return (await this.sessionCall('ForkSession', {
      sessionId, pinned: !!options.pinned, idleTtlUs: options.idleTtlUs || 0,
    }, options.timeoutMs)).session;
  }

  /** The session's SessionInfo (length, pages, bytes, idle time, ...; sessionId: its id now). */
  async getSession(sessionId, options = {}) {
    return (await this.sessionCall('GetSession', { sessionId }, options.timeoutMs, true)).session;
  }

  /** Ends the session and frees its pages. */
  async closeSession(sessionId, options = {}) {
    await this.sessionCall('CloseSession', { sessionId }, options.timeoutMs, true);
  }

  /**
   * An operator's move of a session to another replica (the admin role; see the proto's
   * MoveSession): sent to the session's replica, which must list `peer` in its --session_peers.
   * Resolves to { sessionId: the new id, bytes, pauseUs }; the client remembers the move, so
   * calls naming the old id go to the new one.
   */
  async moveSession(sessionId, peer, options = {}) {
    const r = await this.sessionCall('MoveSession', { sessionId, peer }, options.timeoutMs);
    this.rememberMove(this.resolve(sessionId), r.sessionId);
    return { sessionId: r.sessionId, bytes: Number(r.bytes), pauseUs: Number(r.pauseUs) };
  }

  /**
   * One replica's sessions (options.replica, default the next in turn) sorted by id, a page at
   * a time (pageSize, 0: 100; pageToken: a previous answer's nextPageToken), and its pool's
   * usage: resolves to { sessions, nextPageToken, usage }.
   */
  async listSessions(options = {}) {
    const [stub] = this.replicaStub(options.replica);
    const r = await this.unary('ListSessions', {
      pageSize: options.pageSize || 0, pageToken: options.pageToken || '',
    }, options.timeoutMs, stub);
    return { sessions: r.sessions, nextPageToken: r.nextPageToken, usage: r.usage };
  }

  /** Opens an AttentionStream; options.timeoutMs bounds the whole stream (default: none). */
  stream(options = {}) {
    return new AttentionStream(this.stub.AttentionStream(streamCallOptions(options)));
  }

  /**
   * stream() on the replica holding `sessionId` (after the moves the client knows of): a stream
   * reaches one replica, so its session extends must all name sessions of that replica (others
   * are answered NOT_FOUND). A stream does not follow moves: a moved item fails
   * FAILED_PRECONDITION (sessionMovedTo(item) names the new id).
   */
  streamForSession(sessionId, options = {}) {
    const stub = this.sessionStub(this.resolve(sessionId));
    return new AttentionStream(stub.AttentionStream(streamCallOptions(options)));
  }

  /** Closes the channels. */
  close() {
    this.stub.close();
    for (const stub of [...this.replicaStubs, ...this.retiredStubs]) stub.close();
  }
}

function streamCallOptions(options) {
  return options.timeoutMs ? { deadline: new Date(Date.now() + options.timeoutMs) } : {};
}

module.exports = {
  Client, AttentionStream, StepError, Throttle, ThrottledError, attendRequest, multiHeadRequest,
  extendRequest, extendSessionsRequest, sessionOwner, sessionLostReason, sessionMovedTo, toTensor,
  fromTensor, v1, PROTO_FILE, grpc,
};
