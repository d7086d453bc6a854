"""numpy (and torch) arrays <-> attnserve.v1.Tensor.

Float dtypes: float32, float16 and bfloat16. numpy has no bfloat16: bfloat16 tensors are
widened to float32 on the way out (exact), and arrays are rounded to bfloat16 (nearest even,
as the server does) on the way in when dtype="bfloat16" is asked for.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import numpy as np

from attnserve.v1 import attention_pb2 as pb

# What goes in as a tensor: a numpy array, anything np.asarray takes (nested lists), or a torch
# tensor (any device; bfloat16 included).
ArrayLike = Any

DTYPES = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16,
          "bfloat16": pb.DTYPE_BFLOAT16, "bool": pb.DTYPE_BOOL}


def _to_numpy(x: ArrayLike) -> Tuple[np.ndarray, Optional[str]]:
    """numpy view of x; torch tensors (any device, bfloat16 included) are accepted."""
    if type(x).__module__.startswith("torch"):
        import torch  # only when given a torch tensor
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.float().numpy(), "bfloat16"
        return x.numpy(), None
    return np.asarray(x), None


def _bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """float32 array -> uint16 bfloat16 bits, rounded to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    return np.where(nan, ((bits >> 16) | 0x40).astype("<u2"), rounded)


def to_tensor(x: ArrayLike, dtype: Union[str, int, None] = None) -> pb.Tensor:
    """A pb.Tensor from a numpy array, torch tensor or nested list.

    dtype: "float32", "float16", "bfloat16", "bool" or a pb.Dtype; default: from the array
    (float16 stays float16, torch bfloat16 stays bfloat16, bool is a mask, others float32).
    """
    a, hint = _to_numpy(x)
    if dtype is None:
        if hint:
            dtype = hint
        elif a.dtype == np.bool_:
            dtype = "bool"
        elif a.dtype == np.float16:
            dtype = "float16"
        else:
            dtype = "float32"
    code = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if code == pb.DTYPE_BOOL:
        data = np.ascontiguousarray(a != 0, dtype=np.uint8).tobytes()
    elif code == pb.DTYPE_FLOAT32:
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
    elif code == pb.DTYPE_FLOAT16:
        data = np.ascontiguousarray(a, dtype="<f2").tobytes()
    elif code == pb.DTYPE_BFLOAT16:
        data = _bfloat16_bits(np.asarray(a, dtype=np.float32)).tobytes()
    else:
        raise ValueError(f"dtype must be float32, float16, bfloat16 or bool; was {dtype!r}")
    return pb.Tensor(dtype=code, shape=list(a.shape), data=data)


def from_tensor(t: pb.Tensor, torch_out: bool = False) -> Any:
    """A numpy array from a pb.Tensor (float32, float16, bfloat16 widened to float32, bool).

    torch_out: return a torch tensor instead (bfloat16 as torch.bfloat16)."""
    shape = tuple(t.shape)
    if t.dtype == pb.DTYPE_FLOAT32:
        a = np.frombuffer(t.data, dtype="<f4")
    elif t.dtype == pb.DTYPE_FLOAT16:
        a = np.frombuffer(t.data, dtype="<f2")
    elif t.dtype == pb.DTYPE_BFLOAT16:
        a = (np.frombuffer(t.data, dtype="<u2").astype("<u4") << 16).view("<f4")
    elif t.dtype == pb.DTYPE_BOOL:
        a = np.frombuffer(t.data, dtype=np.uint8) != 0
    else:
        raise ValueError(f"unknown tensor dtype {t.dtype}")
    a = a.reshape(shape)
    if torch_out:
        import torch
        out = torch.from_numpy(a.copy())
        return out.bfloat16() if t.dtype == pb.DTYPE_BFLOAT16 else out
    return a
