// The Node package's float16/bfloat16 conversions against NumPy's (codec_vectors.py): every
// float32 input rounds to the same bits, and every float16 bit pattern widens to the same
// float32 (NaNs compared as NaN).
//   node codec_test.js DIR     (run where `require('attnserve')` is installed)
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const attnserve = require('attnserve');

const dir = process.argv[2];
const read = (name, Type) => {
  const b = fs.readFileSync(path.join(dir, name));
  return new Type(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
};
const x = read('in.f32', Float32Array);
for (const [dtype, file] of [['float16', 'want.f16'], ['bfloat16', 'want.bf16']]) {
  const want = read(file, Uint16Array);
  const got = attnserve.toTensor({ shape: [x.length], data: x }, dtype).data;
  let bad = 0;
  for (let i = 0; i < x.length; i++) {
    if (got.readUInt16LE(2 * i) !== want[i]) {
      if (bad++ < 5) console.log(`${dtype}(${x[i]}): ${got.readUInt16LE(2 * i)} want ${want[i]}`);
    }
  }
  assert.equal(bad, 0, `${dtype}: ${bad} of ${x.length} values rounded differently`);
}
const halves = read('halves.f32', Float32Array);
const bits = Buffer.alloc(2 << 16);
for (let i = 0; i < 1 << 16; i++) bits.writeUInt16LE(i, 2 * i);
const widened = attnserve.fromTensor({ dtype: 'DTYPE_FLOAT16', shape: [1 << 16], data: bits }).data;
for (let i = 0; i < 1 << 16; i++) {
  if (Number.isNaN(halves[i])) assert.ok(Number.isNaN(widened[i]), `half ${i}`);
  else assert.ok(Object.is(widened[i], halves[i]), `half ${i}: ${widened[i]} want ${halves[i]}`);
}
console.log(`codec: ${x.length} floats to float16 and bfloat16, all 65536 float16 widened, ` +
            'as NumPy does');
