// Calls a live attnserve from Node.js (@grpc/grpc-js, @grpc/proto-loader, the repository's
// proto file) and checks Attend against a float64 reference written here, GetServerInfo, the
// stream and an error's code and message.
//   node attend_test.js HOST:PORT PROTO_ROOT
'use strict';
const assert = require('node:assert/strict');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, protoRoot] = process.argv.slice(2);
const definition = protoLoader.loadSync(path.join(protoRoot, 'attnserve/v1/attention.proto'), {
  includeDirs: [protoRoot], keepCase: true, longs: Number, enums: String, defaults: true,
  oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).attnserve.v1;
const client = new v1.AttentionService(target, grpc.credentials.createInsecure());

function call(method, request) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + 30000);
    client[method](request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

// A small deterministic generator (mulberry32) and standard normals (Box-Muller).
function rng(seed) {
  let a = seed >>> 0;
  const uniform = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return () => Math.sqrt(-2 * Math.log(uniform() + 1e-12)) * Math.cos(2 * Math.PI * uniform());
}

function tensor(shape, values) {
  const f = Float32Array.from(values);
  const data = Buffer.alloc(f.length * 4);
  f.forEach((x, i) => data.writeFloatLE(x, i * 4));
  return { tensor: { dtype: 'DTYPE_FLOAT32', shape, data }, values: f };
}

function floats(t) {
  const out = new Float64Array(t.data.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = t.data.readFloatLE(i * 4);
  return out;
}

// softmax(q·kᵀ/√d + blocked)·v in float64, grouped-query: q head h reads kv head h / (Hq/Hkv).
function attention64(q, k, v, [B, Hq, Lq, D], Hkv, Lk, causal) {
  const out = new Float64Array(B * Hq * Lq * D);
  const scale = 1 / Math.sqrt(D);
  for (let b = 0; b < B; b++) for (let h = 0; h < Hq; h++) {
    const g = Math.floor(h / (Hq / Hkv));
    for (let i = 0; i < Lq; i++) {
      const s = new Float64Array(Lk);
      let max = -Infinity;
      for (let j = 0; j < Lk; j++) {
        let dot = 0;
        for (let d = 0; d < D; d++) {
          dot += q[((b * Hq + h) * Lq + i) * D + d] * k[((b * Hkv + g) * Lk + j) * D + d];
        }
        s[j] = causal && j > i + Lk - Lq ? -1e9 : dot * scale;
        max = Math.max(max, s[j]);
      }
      let sum = 0;
      for (let j = 0; j < Lk; j++) sum += (s[j] = Math.exp(s[j] - max));
      for (let d = 0; d < D; d++) {
        let acc = 0;
        for (let j = 0; j < Lk; j++) acc += (s[j] / sum) * v[((b * Hkv + g) * Lk + j) * D + d];
        out[((b * Hq + h) * Lq + i) * D + d] = acc;
      }
    }
  }
  return out;
}

async function main() {
  const info = await call('GetServerInfo', {});
  assert.ok(info.version.length > 0, 'version');
  assert.equal(info.backends.filter((b) => b.active).length, 1, 'one active backend');
  assert.ok(info.limits.max_sequence_length > 0);

  const normal = rng(42);
  const [B, Hq, Hkv, Lq, Lk, D] = [2, 4, 2, 5, 7, 16];
  for (const causal of [false, true]) {
    const q = tensor([B, Hq, Lq, D], Array.from({ length: B * Hq * Lq * D }, normal));
    const k = tensor([B, Hkv, Lk, D], Array.from({ length: B * Hkv * Lk * D }, normal));
    const v = tensor([B, Hkv, Lk, D], Array.from({ length: B * Hkv * Lk * D }, normal));
    const response = await call('Attend', {
      query: q.tensor, key: k.tensor, value: v.tensor, options: { causal },
    });
    assert.equal(response.output.dtype, 'DTYPE_FLOAT32');
    assert.deepEqual(response.output.shape.map(Number), [B, Hq, Lq, D]);
    const got = floats(response.output);
    const want = attention64(q.values, k.values, v.values, [B, Hq, Lq, D], Hkv, Lk, causal);
    let err = 0;
    for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
    assert.ok(err < 1e-5, `causal=${causal}: max |error| ${err}`);
    assert.ok(response.timing.server_us >= response.timing.compute_us);
    console.log(`Attend causal=${causal}: max |error| vs float64 ${err.toExponential(2)}, ` +
                `backend ${response.timing.backend}`);
  }

  await assert.rejects(call('Attend', {
    query: tensor([1, 1, 2, 8], new Array(16).fill(0)).tensor,
    key: tensor([1, 1, 2, 4], new Array(8).fill(0)).tensor,
    value: tensor([1, 1, 2, 4], new Array(8).fill(0)).tensor,
  }), (err) => {
    assert.equal(err.code, grpc.status.INVALID_ARGUMENT);
    assert.match(err.details, /key\.shape\[3\] must equal query\.shape\[3\] \(8\); was 4/);
    return true;
  });

  // The stream: ids come back, one per request.
  const ids = await new Promise((resolve, reject) => {
    const seen = [];
    const stream = client.AttentionStream();
    stream.on('data', (r) => { assert.equal(r.code, 0, r.message); seen.push(Number(r.request_id)); });
    stream.on('error', reject);
    stream.on('end', () => resolve(seen));
    const q = tensor([1, 1, 2, 4], Array.from({ length: 8 }, normal)).tensor;
    for (let id = 1; id <= 5; id++) stream.write({ request_id: id, attend: { query: q, key: q, value: q } });
    stream.end();
  });
  assert.deepEqual(ids.sort(), [1, 2, 3, 4, 5]);
  console.log(`GetServerInfo: attnserve ${info.version}; stream answered ${ids.length}; all checks passed`);
  client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
