#!/usr/bin/python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/), small valid inputs
that reach deep into each parser, plus a few near misses. Deterministic: rerunning it rewrites
the same files. Run with Debian's python3 from the repository root:
    /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, "client/python")
from attnserve.v1 import attention_pb2 as pb  # noqa: E402

OUT = "tests/fuzz/corpus"
rng = np.random.default_rng(13)


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def tensor(shape, dtype=pb.DTYPE_FLOAT32):
    n = int(np.prod(shape))
    x = rng.standard_normal(n).astype(np.float32)
    if dtype == pb.DTYPE_FLOAT16:
        data = x.astype(np.float16).tobytes()
    elif dtype == pb.DTYPE_BFLOAT16:
        data = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    elif dtype == pb.DTYPE_BOOL:
        data = (rng.random(n) < 0.7).astype(np.uint8).tobytes()
    else:
        data = x.tobytes()
    return pb.Tensor(dtype=dtype, shape=shape, data=data)


def attend(b, hq, hkv, lq, lk, d, dv, dtype=pb.DTYPE_FLOAT32, **opts):
    r = pb.AttendRequest(query=tensor([b, hq, lq, d], dtype), key=tensor([b, hkv, lk, d], dtype),
                         value=tensor([b, hkv, lk, dv], dtype))
    if opts.get("causal"):
        r.options.causal = True
    if opts.get("weights"):
        r.options.return_weights = True
    if "mask" in opts:
        r.options.mask.CopyFrom(tensor(opts["mask"], pb.DTYPE_BOOL))
    if "key_lengths" in opts:
        r.options.key_lengths.extend(opts["key_lengths"])
    if "scale" in opts:
        r.options.scale = opts["scale"]
    return r


attends = {
    "plain": attend(1, 2, 2, 3, 4, 8, 8),
    "gqa_causal_weights": attend(2, 4, 2, 3, 5, 4, 6, causal=True, weights=True),
    "fp16_mask": attend(1, 2, 1, 2, 3, 4, 4, pb.DTYPE_FLOAT16, mask=[2, 3]),
    "bf16_key_lengths": attend(2, 1, 1, 2, 4, 4, 4, pb.DTYPE_BFLOAT16, key_lengths=[4, 1]),
    "full_mask_scale": attend(1, 2, 2, 2, 2, 4, 4, mask=[1, 2, 2, 2], scale=0.5),
}
bad = attend(1, 2, 2, 3, 4, 8, 8)
bad.key.shape[3] = 4  # key.shape[3] != query.shape[3]
attends["bad_key_dim"] = bad
for name, r in attends.items():
    write("attend_request", name, r.SerializeToString())


def mha(b, lq, lk=None, **opts):
    r = pb.MultiHeadAttentionRequest(module="demo", query=tensor([b, lq, 64]))
    if lk is not None:
        r.key.CopyFrom(tensor([b, lk, 64]))
        r.value.CopyFrom(tensor([b, lk, 64]))
    if opts.get("causal"):
        r.options.causal = True
    if opts.get("weights"):
        r.options.return_weights = True
    if "mask" in opts:
        r.options.mask.CopyFrom(tensor(opts["mask"], pb.DTYPE_BOOL))
    return r


mhas = {
    "self": mha(1, 3),
    "cross_weights": mha(2, 2, 3, weights=True),
    "causal_mask": mha(1, 4, causal=True, mask=[4, 4]),
}
unknown = mha(1, 2)
unknown.module = "nope"
mhas["unknown_module"] = unknown
for name, r in mhas.items():
    write("multi_head_request", name, r.SerializeToString())

for i, (name, r) in enumerate(attends.items()):
    write("stream_item", "attend_" + name,
          pb.AttentionStreamRequest(request_id=i, attend=r).SerializeToString())
for i, (name, r) in enumerate(mhas.items()):
    write("stream_item", "mha_" + name,
          pb.AttentionStreamRequest(request_id=100 + i, multi_head_attention=r).SerializeToString())
write("stream_item", "neither", pb.AttentionStreamRequest(request_id=7).SerializeToString())


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def module_file(d, heads=None, dtype="F32"):
    np_type = {"F32": np.float32, "F16": np.float16}[dtype]
    t = {}
    for p in "qkvo":
        t[f"W_{p}.weight"] = (dtype, [d, d], (rng.standard_normal((d, d)) / d).astype(np_type).tobytes())
        t[f"W_{p}.bias"] = (dtype, [d], rng.standard_normal(d).astype(np_type).tobytes())
    return safetensors(t, {"num_heads": str(heads)} if heads else None)


write("safetensors", "two_tensors",
      safetensors({"a": ("F32", [2, 2], np.arange(4, dtype=np.float32).tobytes()),
                   "b": ("F16", [3], np.ones(3, dtype=np.float16).tobytes())},
                  {"format": "pt"}))
write("safetensors", "bf16_bool_empty",
      safetensors({"x": ("BF16", [2], b"\x80\x3f\x00\x40"), "m": ("BOOL", [3], b"\x01\x00\x01"),
                   "e": ("F32", [0, 4], b"")}))
write("safetensors", "empty", safetensors({}))
write("safetensors", "module_d4", module_file(4, heads=2))
write("module_load", "d4_heads_from_metadata", b"\x00" + module_file(4, heads=2))
write("module_load", "d8_heads_given", b"\x04" + module_file(8, dtype="F16"))
write("module_load", "d6_bad_heads", b"\x04" + module_file(6))

# mask: B H Lq Lk rank d0 d1 d2 d3, then data (see fuzz_mask.cc)
write("mask", "full", bytes([1, 1, 2, 2, 4, 2, 2, 3, 3]) + bytes(range(36)))
write("mask", "broadcast_rows", bytes([3, 3, 2, 4, 2, 1, 5, 0, 0]) + b"\x01\x00\x01\x01\x00")
write("mask", "mismatch", bytes([1, 2, 3, 4, 3, 2, 3, 5, 0]) + b"\x01" * 30)
write("mask", "rank5", bytes([0, 0, 0, 0, 5, 1, 1, 1, 1]))
