// The attnserve Node.js package (client/node), packed with npm pack and installed into an empty
// folder, against a live attnserve: Attend (float32, grouped-query, causal; float16 and
// bfloat16) against a float64 reference (reference.js), MultiHeadAttention through "demo",
// GetServerInfo, the stream with a failing request, an error's code and message, and a raw
// decode session (prefill and steps against causal float64 attention, ABORTED, fork, close).
//   node attend_test.js HOST:PORT VERSION     (run where `require('attnserve')` is installed,
//                                              beside reference.js)
'use strict';
const assert = require('node:assert/strict');
const attnserve = require('attnserve');

const [target, version] = process.argv.slice(2);
const client = new attnserve.Client(target, { timeoutMs: 60000 });

const { rng, tensor, maxError, attention64 } = require('./reference');

async function main() {
  // The package is the installed one, with its own copy of the proto.
  const installed = require('node:path').join(__dirname, 'node_modules', 'attnserve');
  assert.ok(require.resolve('attnserve').startsWith(installed), require.resolve('attnserve'));
  assert.ok(attnserve.PROTO_FILE.startsWith(installed), attnserve.PROTO_FILE);

  const info = await client.serverInfo();
  assert.equal(info.version, version, 'the client package follows the server version');
  assert.equal(info.backends.filter((b) => b.active).length, 1, 'one active backend');
  assert.ok(info.limits.maxSequenceLength > 0);

  const normal = rng(42);
  const [B, Hq, Hkv, Lq, Lk, D] = [2, 4, 2, 5, 7, 16];
  const q = tensor([B, Hq, Lq, D], normal);
  const k = tensor([B, Hkv, Lk, D], normal);
  const v = tensor([B, Hkv, Lk, D], normal);
  for (const causal of [false, true]) {
    const r = await client.attend(q, k, v, { causal });
    assert.equal(r.output.dtype, 'float32');
    assert.deepEqual(r.output.shape, [B, Hq, Lq, D]);
    assert.ok(r.output.data instanceof Float32Array);
    assert.equal(r.weights, null);
    const err = maxError(r.output.data, attention64(q.data, k.data, v.data, [B, Hq, Lq, D], Hkv,
      Lk, causal));
    assert.ok(err < 1e-5, `causal=${causal}: max |error| ${err}`);
    assert.ok(r.timing.serverUs >= r.timing.computeUs);
    console.log(`Attend causal=${causal}: max |error| vs float64 ${err.toExponential(2)}, ` +
                `backend ${r.timing.backend}`);
  }

  // A window of one key (the query's own position, Lq == Lk): each output row is that key's
  // value row, whatever the scores; linear attention against its definition, in float64 here.
  {
    const kk = tensor([B, Hkv, Lq, D], normal);
    const vv = tensor([B, Hkv, Lq, D], normal);
    const r = await client.attend(q, kk, vv, { window: [0, 0], softcap: 5, alibi: 'standard' });
    const want = new Float64Array(B * Hq * Lq * D);
    for (let b = 0; b < B; ++b) {
      for (let h = 0; h < Hq; ++h) {
        for (let i = 0; i < Lq; ++i) {
          for (let d = 0; d < D; ++d) {
            want[((b * Hq + h) * Lq + i) * D + d] =
                vv.data[((b * Hkv + Math.floor(h / (Hq / Hkv))) * Lq + i) * D + d];
          }
        }
      }
    }
    const err = maxError(r.output.data, want);
    assert.ok(err < 1e-6, `window [0, 0]: max |error| ${err}`);
    const phi = (x) => (x > 0 ? x + 1 : Math.exp(x));
    const lin = await client.attend(q, kk, vv, { kind: 'linear', causal: true });
    const wantLinear = new Float64Array(B * Hq * Lq * D);
    for (let b = 0; b < B; ++b) {
      for (let h = 0; h < Hq; ++h) {
        const g = b * Hkv + Math.floor(h / (Hq / Hkv));
        for (let i = 0; i < Lq; ++i) {
          let norm = 0;
          const row = new Float64Array(D);
          for (let j = 0; j <= i; ++j) {
            let w = 0;
            for (let d = 0; d < D; ++d) {
              const qd = q.data[((b * Hq + h) * Lq + i) * D + d];
              w += phi(qd) * phi(kk.data[(g * Lq + j) * D + d]);
            }
            norm += w;
            for (let d = 0; d < D; ++d) row[d] += w * vv.data[(g * Lq + j) * D + d];
          }
          for (let d = 0; d < D; ++d) wantLinear[((b * Hq + h) * Lq + i) * D + d] = row[d] / norm;
        }
      }
    }
    const linErr = maxError(lin.output.data, wantLinear);
    assert.ok(linErr < 1e-5, `linear: max |error| ${linErr}`);
    console.log(`Attend window [0, 0]: ${err.toExponential(2)}; ` +
                `linear: ${linErr.toExponential(2)}`);
  }

  // float16 and bfloat16: sent rounded, answered in the same dtype, widened by fromTensor.
  for (const [dtype, tolerance] of [['float16', 5e-3], ['bfloat16', 4e-2]]) {
    const r = await client.attend(q, k, v, { dtype });
    assert.equal(r.output.dtype, dtype);
    const rounded = (t) => attnserve.fromTensor(attnserve.toTensor(t, dtype)).data;
    const qr = rounded(q);
    assert.ok(maxError(qr, q.data) > 0, `${dtype} rounding changes some values`);
    const err = maxError(r.output.data, attention64(qr, rounded(k), rounded(v), [B, Hq, Lq, D],
      Hkv, Lk, false));
    assert.ok(err < tolerance, `${dtype}: max |error| ${err}`);
    console.log(`Attend ${dtype}: max |error| vs float64 of rounded inputs ${err.toExponential(2)}`);
  }
  // Rounding to nearest even, as the server does: 1 + 2^-11 is a float16 tie -> 1.0,
  // 1 + 3·2^-11 -> 1 + 2^-9; 1 + 2^-8 a bfloat16 tie -> 1.0.
  assert.deepEqual([...attnserve.toTensor({ shape: [2], data: [1 + 2 ** -11, 1 + 3 * 2 ** -11] },
    'float16').data], [0x00, 0x3c, 0x02, 0x3c]);
  assert.deepEqual([...attnserve.toTensor({ shape: [1], data: [1 + 2 ** -8] }, 'bfloat16').data],
    [0x80, 0x3f]);
  assert.throws(() => attnserve.toTensor({ shape: [2, 3], data: [1, 2] }), /shape \[2,3\] needs 6/);

  // The built-in module: self-attention, weights rows sum to one.
  const x = { shape: [1, 10, 64], data: new Float32Array(640).fill(1) };
  const m = await client.multiHeadAttention('demo', x, { returnWeights: true });
  assert.deepEqual(m.output.shape, [1, 10, 64]);
  assert.deepEqual(m.weights.shape, [1, 4, 10, 10]);
  for (let row = 0; row < 40; row++) {
    const sum = m.weights.data.slice(row * 10, row * 10 + 10).reduce((a, b) => a + b, 0);
    assert.ok(Math.abs(sum - 1) < 1e-5, `weights row ${row} sums to ${sum}`);
  }
  assert.ok((await client.listModules()).some((mod) => mod.name === 'demo' && mod.numHeads === 4));

  await assert.rejects(client.attend({ shape: [1, 1, 2, 8], data: new Float32Array(16) },
    { shape: [1, 1, 2, 4], data: new Float32Array(8) },
    { shape: [1, 1, 2, 4], data: new Float32Array(8) }), (err) => {
    assert.equal(err.code, attnserve.grpc.status.INVALID_ARGUMENT);
    assert.match(err.details, /key\.shape\[3\] must equal query\.shape\[3\] \(8\); was 4/);
    return true;
  });

  // The stream: every id answered once, a failed request answered with its code, the rest on.
  const stream = client.stream({ timeoutMs: 60000 });
  const small = tensor([1, 1, 2, 4], normal);
  for (let id = 1; id <= 5; id++) stream.write(id, attnserve.attendRequest(small, small, small));
  const three = { shape: [1, 3, 64], data: new Float32Array(192) };
  stream.write(6, attnserve.multiHeadRequest('demo', three));
  stream.write(7, attnserve.multiHeadRequest('no-such-module', x));
  stream.end();
  const answers = new Map();
  for await (const a of stream) {
    assert.ok(!answers.has(a.requestId), `request ${a.requestId} answered twice`);
    answers.set(a.requestId, a);
  }
  assert.deepEqual([...answers.keys()].sort(), [1, 2, 3, 4, 5, 6, 7]);
  const want = attention64(small.data, small.data, small.data, [1, 1, 2, 4], 1, 2, false);
  for (let id = 1; id <= 5; id++) {
    assert.equal(answers.get(id).code, 0, answers.get(id).message);
    assert.ok(maxError(answers.get(id).result.output.data, want) < 1e-5);
  }
  assert.deepEqual(answers.get(6).result.output.shape, [1, 3, 64]);
  assert.equal(answers.get(7).code, attnserve.grpc.status.NOT_FOUND);
  assert.equal(answers.get(7).result, null);
  assert.match(answers.get(7).message, /no-such-module/);
  // A raw decode session: a prefill of 5 tokens and 2 steps of one, each answer equal to causal
  // attention over every token so far (token-major [L, H, D] in, [L, Hq, D] out).
  const [SH, SKV, SD, SL] = [4, 2, 8, 7];
  const sq = tensor([SL, SH, SD], normal);
  const sk = tensor([SL, SKV, SD], normal);
  const sv = tensor([SL, SKV, SD], normal);
  // [L, H, D] rows from..to as [1, H, L', D] for attention64.
  const headMajor = (t, H, from, to) => {
    const out = new Float32Array(H * (to - from) * SD);
    for (let h = 0; h < H; h++) for (let i = from; i < to; i++) for (let d = 0; d < SD; d++) {
      out[(h * (to - from) + (i - from)) * SD + d] = t.data[(i * H + h) * SD + d];
    }
    return out;
  };
  const slice = (t, H, from, to) => ({
    shape: [to - from, H, SD], data: t.data.slice(from * H * SD, to * H * SD),
  });
  const session = await client.createSession({
    layout: { numHeads: SH, numKvHeads: SKV, headDim: SD },
  });
  assert.match(session.sessionId, /^.+\/[0-9a-f]+\/[0-9a-f]{32}$/);
  let have = 0;
  for (const [from, to] of [[0, 5], [5, 6], [6, 7]]) {
    const r = await client.extendSession(session.sessionId, {
      q: slice(sq, SH, from, to), k: slice(sk, SKV, from, to), v: slice(sv, SKV, from, to),
    }, { expectedLength: have });
    assert.equal(r.length, to);
    assert.deepEqual(r.output.shape, [to - from, SH, SD]);
    const ref = attention64(headMajor(sq, SH, from, to), headMajor(sk, SKV, 0, to),
      headMajor(sv, SKV, 0, to), [1, SH, to - from, SD], SKV, to, true);
    const got = headMajor({ data: r.output.data }, SH, 0, to - from);
    const err = maxError(got, ref);
    assert.ok(err < 1e-5, `session extend ${from}..${to}: max |error| ${err}`);
    have = to;
  }
  await assert.rejects(client.extendSession(session.sessionId, {
    q: slice(sq, SH, 0, 1), k: slice(sk, SKV, 0, 1), v: slice(sv, SKV, 0, 1),
  }, { expectedLength: 3 }), (err) => err.code === attnserve.grpc.status.ABORTED);
  const child = await client.forkSession(session.sessionId);
  assert.equal(Number(child.length), SL);
  assert.equal(Number((await client.getSession(session.sessionId)).length), SL);
  await client.closeSession(child.sessionId);
  await client.closeSession(session.sessionId);
  await assert.rejects(client.getSession(session.sessionId),
    (err) => err.code === attnserve.grpc.status.NOT_FOUND);
  console.log('decode session: prefill and steps match float64 causal attention');

  // A session with a window of one key (each token's own), soft-capping and ALiBi: every output
  // row is its own token's value row, whatever the scores (as Attend's window [0, 0] above).
  const windowed = await client.createSession({
    layout: { numHeads: SH, numKvHeads: SKV, headDim: SD }, window: 0, softcap: 5,
    alibi: 'standard',
  });
  assert.equal(windowed.windowLeft, 0);
  assert.equal(windowed.softcap, 5);
  assert.equal(windowed.alibiSlopes.length, SH);
  const w = await client.extendSession(windowed.sessionId, {
    q: slice(sq, SH, 0, SL), k: slice(sk, SKV, 0, SL), v: slice(sv, SKV, 0, SL),
  });
  let werr = 0;
  for (let i = 0; i < SL; i++) for (let h = 0; h < SH; h++) for (let d = 0; d < SD; d++) {
    const own = sv.data[(i * SKV + Math.floor(h / (SH / SKV))) * SD + d];
    werr = Math.max(werr, Math.abs(w.output.data[(i * SH + h) * SD + d] - own));
  }
  assert.ok(werr < 1e-6, `windowed session: max |error| ${werr}`);
  await client.closeSession(windowed.sessionId);
  console.log('decode session with a window of one key: each row is its own value row');

  // A linear-attention session (relu features) over prefills and steps: each extend's rows are
  // those of a causal linear Attend over every token so far.
  const linear = await client.createSession({
    layout: { numHeads: SH, numKvHeads: SKV, headDim: SD }, kind: 'linear', featureMap: 'relu',
  });
  assert.equal(linear.kind, 'ATTENTION_KIND_LINEAR');
  assert.equal(linear.featureMap, 'FEATURE_MAP_RELU');
  const all = await client.attend(
    { shape: [1, SH, SL, SD], data: headMajor(sq, SH, 0, SL) },
    { shape: [1, SKV, SL, SD], data: headMajor(sk, SKV, 0, SL) },
    { shape: [1, SKV, SL, SD], data: headMajor(sv, SKV, 0, SL) },
    { kind: 'linear', featureMap: 'relu', causal: true });
  let lerr = 0;
  for (const [from, to] of [[0, 4], [4, 5], [5, SL]]) {
    const r = await client.extendSession(linear.sessionId, {
      q: slice(sq, SH, from, to), k: slice(sk, SKV, from, to), v: slice(sv, SKV, from, to),
    });
    for (let i = from; i < to; i++) for (let h = 0; h < SH; h++) for (let d = 0; d < SD; d++) {
      const want = all.output.data[(h * SL + i) * SD + d];
      lerr = Math.max(lerr, Math.abs(r.output.data[((i - from) * SH + h) * SD + d] - want));
    }
  }
  assert.ok(lerr < 1e-6, `linear session: max |error| ${lerr}`);
  assert.equal(Number((await client.getSession(linear.sessionId)).pages),
               Math.ceil(SD / Number(info.sessions.pageTokens)));
  await client.closeSession(linear.sessionId);
  console.log(`linear decode session: equals a causal linear Attend (${lerr.toExponential(2)})`);

  console.log(`GetServerInfo: attnserve ${info.version}; stream answered ${answers.size}; ` +
              'all checks passed');
  client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
