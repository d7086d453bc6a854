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
'use strict';
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.join(__dirname, 'proto');
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

function attentionOptions(o = {}) {
  const out = { causal: !!o.causal, returnWeights: !!o.returnWeights };
  if (o.mask) out.mask = toMask(o.mask);
  if (o.keyLengths) out.keyLengths = Array.from(o.keyLengths, Number);
  if (o.scale !== undefined && o.scale !== null) out.scale = o.scale;
  return out;
}

/**
 * An AttendRequest message: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv].
 * options: causal, mask, keyLengths, scale, returnWeights, dtype (k and v are sent in q's).
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
 * An AttentionStream call: write(requestId, request) any number of times, end(), and read the
 * answers with `for await (const answer of stream)` in completion order. Each answer is
 * { requestId, code, message, result }: code 0 and a result, or a gRPC status code and its
 * message (the stream goes on after a failed request).
 */
class AttentionStream {
  constructor(call) {
    this.call = call;
  }

  /** Sends `request` (from attendRequest or multiHeadRequest) under `requestId`. */
  write(requestId, request) {
    const message = { requestId };
    if ('module' in request) message.multiHeadAttention = request;
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
      const answer = r.response === 'attend' ? r.attend
        : r.response === 'multiHeadAttention' ? r.multiHeadAttention : null;
      yield {
        requestId: Number(r.requestId), code: r.code, message: r.message,
        result: r.code === 0 && answer ? toResult(answer) : null,
      };
    }
  }
}

/**
 * A client of one attnserve target ("host:port", "dns:///name:port",
 * "ipv4:a:p1,b:p2"). Every method returns a promise; failures reject with grpc-js's error
 * (err.code: a grpc.status value, err.details: the server's message naming field and value).
 */
class Client {
  /**
   * @param {string} target
   * @param {{credentials?: object, timeoutMs?: number, channelOptions?: object}} [options]
   *   credentials: grpc.credentials (default insecure); timeoutMs: per call (default 60000);
   *   channelOptions: grpc-js channel options.
   */
  constructor(target, options = {}) {
    const Service = v1().AttentionService;
    this.timeoutMs = options.timeoutMs ?? 60000;
    this.stub = new Service(target, options.credentials || grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': -1,
      ...options.channelOptions,
    });
  }

  unary(method, request, timeoutMs) {
    const deadline = new Date(Date.now() + (timeoutMs ?? this.timeoutMs));
    return new Promise((resolve, reject) => {
      this.stub[method](request, { deadline }, (err, r) => (err ? reject(err) : resolve(r)));
    });
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

  /** Registers safetensors bytes (a Buffer) under `name`; resolves to the ModuleInfo. */
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
   * float16, bfloat16), scale, pinned, idleTtlUs. Resolves to the SessionInfo (sessionId, ...).
   */
  async createSession(options = {}) {
    const request = {
      cacheDtype: `DTYPE_${(options.cacheDtype || 'float32').toUpperCase()}`,
      pinned: !!options.pinned, idleTtlUs: options.idleTtlUs || 0,
    };
    if (options.module) request.module = options.module;
    else request.layout = options.layout;
    if (options.scale !== undefined) request.scale = options.scale;
    return (await this.unary('CreateSession', request, options.timeoutMs)).session;
  }

  /**
   * Appends tokens to session `sessionId` and resolves to { output, lse, length, timing }:
   * tensors.q, tensors.k, tensors.v for raw sessions, or tensors.input for module sessions.
   * options: expectedLength (the extend applies only at that length, else ABORTED: safe
   * retries), returnLse, dtype, timeoutMs.
   */
  async extendSession(sessionId, tensors, options = {}) {
    const request = { sessionId, returnLse: !!options.returnLse };
    if (tensors.input) {
      request.input = toTensor(tensors.input, options.dtype);
    } else {
      request.query = toTensor(tensors.q, options.dtype);
      const dtype = request.query.dtype.slice('DTYPE_'.length).toLowerCase();
      request.key = toTensor(tensors.k, dtype);
      request.value = toTensor(tensors.v, dtype);
    }
    if (options.expectedLength !== undefined) request.expectedLength = options.expectedLength;
    const r = await this.unary('ExtendSession', request, options.timeoutMs);
    return {
      output: fromTensor(r.output), lse: r.lse ? fromTensor(r.lse) : null,
      length: Number(r.length), timing: r.timing,
    };
  }

  /** A new session sharing `sessionId`'s tokens copy-on-write; resolves to its SessionInfo. */
  async forkSession(sessionId, options = {}) {
    return (await this.unary('ForkSession', {
      sessionId, pinned: !!options.pinned, idleTtlUs: options.idleTtlUs || 0,
    }, options.timeoutMs)).session;
  }

  /** The session's SessionInfo (length, pages, bytes, idle time, ...). */
  async getSession(sessionId, options = {}) {
    return (await this.unary('GetSession', { sessionId }, options.timeoutMs)).session;
  }

  /** Ends the session and frees its pages. */
  async closeSession(sessionId, options = {}) {
    await this.unary('CloseSession', { sessionId }, options.timeoutMs);
  }

  /** Opens an AttentionStream; options.timeoutMs bounds the whole stream (default: none). */
  stream(options = {}) {
    const callOptions = options.timeoutMs ? { deadline: new Date(Date.now() + options.timeoutMs) }
      : {};
    return new AttentionStream(this.stub.AttentionStream(callOptions));
  }

  /** Closes the channel. */
  close() {
    this.stub.close();
  }
}

module.exports = {
  Client, AttentionStream, attendRequest, multiHeadRequest, toTensor, fromTensor, v1,
  PROTO_FILE, grpc,
};
