// What the Node.js tests compare the server's answers with, computed here in float64: attention
// in Attend's layout and a decode session's causal attention in its token-major layout, with a
// small deterministic generator of standard normals for the inputs.
'use strict';

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

function tensor(shape, normal) {
  const n = shape.reduce((a, b) => a * b, 1);
  return { shape, data: Float32Array.from({ length: n }, normal) };
}

function maxError(got, want) {
  if (got.length !== want.length) throw new RangeError(`${got.length} values, want ${want.length}`);
  let err = 0;
  for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
  return err;
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

// A decode session's answer in float64: the queries of tokens from..to-1 of q [L, Hq, D] over
// the keys and values of tokens 0..to-1 of k, v [L, Hkv, D] (token-major, as sessions take
// them), causal. { output [to-from, Hq, D], lse [to-from, Hq] (natural log of the sum of
// exp(scaled score)) }.
function sessionAttention64(q, k, v, [Hq, Hkv, D], from, to) {
  const out = new Float64Array((to - from) * Hq * D);
  const lse = new Float64Array((to - from) * Hq);
  const scale = 1 / Math.sqrt(D);
  for (let i = from; i < to; i++) for (let h = 0; h < Hq; h++) {
    const g = Math.floor(h / (Hq / Hkv));
    const s = new Float64Array(i + 1);  // token i sees tokens 0..i
    let max = -Infinity;
    for (let j = 0; j <= i; j++) {
      let dot = 0;
      for (let d = 0; d < D; d++) dot += q[(i * Hq + h) * D + d] * k[(j * Hkv + g) * D + d];
      s[j] = dot * scale;
      max = Math.max(max, s[j]);
    }
    let sum = 0;
    for (let j = 0; j <= i; j++) sum += (s[j] = Math.exp(s[j] - max));
    lse[(i - from) * Hq + h] = max + Math.log(sum);
    for (let d = 0; d < D; d++) {
      let acc = 0;
      for (let j = 0; j <= i; j++) acc += (s[j] / sum) * v[(j * Hkv + g) * D + d];
      out[((i - from) * Hq + h) * D + d] = acc;
    }
  }
  return { output: out, lse };
}

module.exports = { rng, tensor, maxError, attention64, sessionAttention64 };
