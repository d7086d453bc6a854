"""Safetensors, written and read here (no safetensors package needed): an 8-byte little-endian
header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then
the raw little-endian data. And the export of a PyTorch module's weights under the names
attnserve's LoadModule expects.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

# The reference module's state_dict() names LoadModule reads.
REFERENCE_NAMES = tuple(f"W_{p}.{k}" for p in "qkvo" for k in ("weight", "bias"))

_TO_ST = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<f8"): "F64",
          np.dtype("<i8"): "I64", np.dtype("<i4"): "I32", np.dtype("u1"): "U8",
          np.dtype("bool"): "BOOL"}
_FROM_ST = {v: k for k, v in _TO_ST.items()}


def _numpy(x):
    """(numpy array, safetensors dtype) from a numpy array or torch tensor (bf16 kept)."""
    if type(x).__module__.startswith("torch"):
        import torch
        x = x.detach().cpu().contiguous()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view("<u2"), "BF16"
        x = x.numpy()
    a = np.asarray(x)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.dtype not in _TO_ST:
        raise ValueError(f"unsupported dtype {a.dtype} for safetensors")
    return a, _TO_ST[a.dtype]


def write_safetensors(tensors: Mapping[str, Any],
                      metadata: Optional[Mapping[str, Any]] = None) -> bytes:
    """bytes of a safetensors file holding `tensors` (name -> array/torch tensor); metadata
    values are stringified. Names are sorted; data is 8-byte aligned after the header."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        a, st = _numpy(tensors[name])
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": st, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad with spaces, as the format allows
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def read_safetensors(data: Union[bytes, str, "os.PathLike[str]"]
                     ) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """(tensors, metadata) from safetensors bytes (or a path); BF16 is widened to float32."""
    if isinstance(data, (str, os.PathLike)):
        with open(data, "rb") as f:
            data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(body[begin:end], dtype="<u2").astype("<u4") << 16
            a = bits.view("<f4")
        else:
            a = np.frombuffer(body[begin:end], dtype=_FROM_ST[info["dtype"]])
        tensors[name] = a.reshape(info["shape"])
    return tensors, header.get("__metadata__", {})


def _state_dict(module_or_dict):
    if hasattr(module_or_dict, "state_dict"):
        return module_or_dict.state_dict()
    return dict(module_or_dict)


def export_state_dict(module_or_dict: Any, num_heads: Optional[int] = None,
                      prefix: str = "") -> bytes:
    """safetensors bytes of a multi-head attention module's weights, for LoadModule.

    Accepts the reference module (or its state_dict(): W_q.weight ... W_o.bias), or a
    torch.nn.MultiheadAttention (in_proj_weight/in_proj_bias split into W_q, W_k, W_v and
    out_proj into W_o; num_heads taken from it). `prefix` selects a submodule's entries in a
    larger state_dict ("encoder.attn."). num_heads, when known, goes into the metadata so that
    LoadModule needs no num_heads. Other entries are left out. float16/bfloat16 weights stay
    as they are (the server widens them).
    """
    if not num_heads and hasattr(module_or_dict, "num_heads"):
        num_heads = int(module_or_dict.num_heads)
    sd = {k[len(prefix):]: v for k, v in _state_dict(module_or_dict).items()
          if k.startswith(prefix)}
    out = {}
    if "in_proj_weight" in sd:  # torch.nn.MultiheadAttention with equal q/k/v widths
        w, b = sd["in_proj_weight"], sd["in_proj_bias"]
        d = w.shape[1]
        for i, p in enumerate("qkv"):
            out[f"W_{p}.weight"] = w[i * d:(i + 1) * d]
            out[f"W_{p}.bias"] = b[i * d:(i + 1) * d]
        out["W_o.weight"] = sd["out_proj.weight"]
        out["W_o.bias"] = sd["out_proj.bias"]
    else:
        missing = [n for n in REFERENCE_NAMES if n not in sd]
        if missing:
            raise KeyError(f"state_dict lacks {missing} (has {sorted(sd)[:12]})")
        out = {n: sd[n] for n in REFERENCE_NAMES}
    d_model = int(np.asarray(out["W_q.weight"].shape)[0])
    metadata = {"d_model": d_model}
    if num_heads:
        metadata["num_heads"] = int(num_heads)
    return write_safetensors(out, metadata)
