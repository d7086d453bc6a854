"""Writes the float16/bfloat16 expectations codec_test.js checks the Node package against,
computed with NumPy (an independent implementation): float32 inputs (normals over many
magnitudes, float16 subnormals, ties, overflow, signed zero, infinities), their float16 bits
(NumPy's cast, round to nearest even), their bfloat16 bits (round to nearest even, as the
server does) and every float16 bit pattern widened to float32.
    /usr/bin/python3 codec_vectors.py DIR
"""
import os
import sys

import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(0)
x = np.concatenate([
    rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000),
    rng.standard_normal(1000) * 1e-6,  # float16 subnormals
    [1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 6.1e-5,
     65504, 65519, 65520, 1e6, -0.0, np.inf, -np.inf]]).astype(np.float32)
x.tofile(os.path.join(out, "in.f32"))
with np.errstate(over="ignore"):
    x.astype(np.float16).view(np.uint16).tofile(os.path.join(out, "want.f16"))
b = x.view(np.uint32)
((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16).tofile(os.path.join(out, "want.bf16"))
halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
halves.astype(np.float32).tofile(os.path.join(out, "halves.f32"))
