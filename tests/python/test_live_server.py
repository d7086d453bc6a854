"""The proto's Python stubs (python3-grpcio) and attnserve-cli against a live attnserve.

Expected values come from an independent float64 NumPy implementation of the module written
here, and from the PyTorch seed vectors.
"""
import json
import os
import struct
import subprocess
import sys
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.environ["ATTNSERVE_STUBS"])
from attnserve.v1 import attention_pb2 as pb  # noqa: E402
from attnserve.v1 import attention_pb2_grpc as pb_grpc  # noqa: E402

from live_server import LiveServer  # noqa: E402

SEEDS = os.environ["ATTNSERVE_SEED_VECTORS_DIR"]
NP_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_FLOAT16: np.float16}


def tensor(array, dtype=pb.DTYPE_FLOAT32):
    array = np.ascontiguousarray(array)
    if dtype == pb.DTYPE_BOOL:
        data = array.astype(np.uint8).tobytes()
    else:
        data = array.astype(np.dtype(NP_DTYPES[dtype]).newbyteorder("<")).tobytes()
    return pb.Tensor(dtype=dtype, shape=list(array.shape), data=data)


def array(t):
    return np.frombuffer(t.data, dtype=NP_DTYPES[t.dtype]).reshape(tuple(t.shape))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        assert info["dtype"] == "F32"
        out[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
    return raw, header.get("__metadata__", {}), out


def attention64(q, k, v, allowed, scale):
    """softmax(scale·q·kᵀ with blocked scores at -1e9)·v in float64. q [B,H,Lq,D]."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), group, axis=1)
    v = np.repeat(v.astype(np.float64), group, axis=1)
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k) * scale
    scores = np.where(allowed, scores, -1e9)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", weights, v), weights


def multi_head64(t, num_heads, mask):
    """The reference module in float64 NumPy: projections, per-head attention, output."""
    def linear(x, name):
        return x.astype(np.float64) @ t[name + ".weight"].astype(np.float64).T + t[name + ".bias"]

    b, lq, dm = t["input.query"].shape
    lk = t["input.key"].shape[1]
    dk = dm // num_heads

    def heads(x, length):
        return x.reshape(b, length, num_heads, dk).transpose(0, 2, 1, 3)

    q = heads(linear(t["input.query"], "W_q"), lq)
    k = heads(linear(t["input.key"], "W_k"), lk)
    v = heads(linear(t["input.value"], "W_v"), lk)
    out, weights = attention64(q, k, v, np.broadcast_to(mask, (b, num_heads, lq, lk)),
                               1 / np.sqrt(dk))
    return linear(out.transpose(0, 2, 1, 3).reshape(b, lq, dm), "W_o"), weights


class LiveServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer()
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.stub = pb_grpc.AttentionServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.server.stop()
        assert code == 0, f"attnserve exited {code} after SIGTERM"

    def test_server_info_and_health(self):
        info = self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
        self.assertTrue(info.version)
        self.assertEqual(sum(b.active for b in info.backends), 1)
        health = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda x: x, response_deserializer=lambda x: x)
        self.assertEqual(health(b"", timeout=10), b"\x08\x01")  # status: SERVING

    def test_attend_matches_numpy_float64(self):
        rng = np.random.default_rng(7)
        b, hq, hkv, lq, lk, d = 2, 4, 2, 5, 9, 16
        q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
        k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
        v = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
        mask = rng.random((b, 1, lq, lk)) > 0.3
        mask[0, 0, 1, :] = False  # a fully blocked row
        lengths = [9, 6]
        options = pb.AttentionOptions(mask=tensor(mask, pb.DTYPE_BOOL), causal=True,
                                      key_lengths=lengths, return_weights=True)
        response = self.stub.Attend(pb.AttendRequest(
            query=tensor(q), key=tensor(k), value=tensor(v), options=options), timeout=30)
        i = np.arange(lq)[:, None]
        j = np.arange(lk)[None, :]
        allowed = mask & (j <= i + lk - lq)[None, None]
        allowed = allowed & (j[None, None] < np.array(lengths)[:, None, None, None])
        want_out, want_w = attention64(q, k, v, allowed, 1 / np.sqrt(d))
        np.testing.assert_allclose(array(response.output), want_out, atol=1e-5)
        np.testing.assert_allclose(array(response.weights), want_w, atol=1e-6)
        np.testing.assert_allclose(array(response.weights)[0, :, 1, :], 1 / lk, atol=1e-7)
        self.assertGreaterEqual(response.timing.server_us,
                                response.timing.queued_us + response.timing.compute_us)

    def test_float16_answers_in_float16(self):
        rng = np.random.default_rng(3)
        q = rng.standard_normal((1, 2, 4, 8)).astype(np.float16)
        response = self.stub.Attend(pb.AttendRequest(
            query=tensor(q, pb.DTYPE_FLOAT16), key=tensor(q, pb.DTYPE_FLOAT16),
            value=tensor(q, pb.DTYPE_FLOAT16)), timeout=30)
        self.assertEqual(response.output.dtype, pb.DTYPE_FLOAT16)
        want, _ = attention64(q, q, q, np.ones((1, 2, 4, 4), bool), 1 / np.sqrt(8))
        np.testing.assert_allclose(array(response.output).astype(np.float64), want, atol=2e-3)

    def test_seed_vectors_through_load_module(self):
        for name in ("blocked_rows", "causal", "cross_padding", "seed_demo"):
            with self.subTest(name):
                raw, meta, t = read_safetensors(os.path.join(SEEDS, name + ".safetensors"))
                self.stub.LoadModule(pb.LoadModuleRequest(
                    name="py-" + name, safetensors=raw, replace=True), timeout=30)
                request = pb.MultiHeadAttentionRequest(
                    module="py-" + name, query=tensor(t["input.query"]),
                    key=tensor(t["input.key"]), value=tensor(t["input.value"]),
                    options=pb.AttentionOptions(return_weights=True))
                if "input.mask" in t:
                    request.options.mask.CopyFrom(tensor(t["input.mask"] != 0, pb.DTYPE_BOOL))
                response = self.stub.MultiHeadAttention(request, timeout=60)
                np.testing.assert_allclose(array(response.output), t["expected.output"],
                                           atol=1e-5)
                np.testing.assert_allclose(array(response.weights), t["expected.weights"],
                                           atol=1e-5)
                # And against the independent NumPy module on the same weights and inputs.
                mask = t["input.mask"] != 0 if "input.mask" in t else np.ones((1, 1, 1, 1), bool)
                want_out, want_w = multi_head64(t, int(meta["num_heads"]), mask)
                np.testing.assert_allclose(array(response.output), want_out, atol=1e-5)
                np.testing.assert_allclose(array(response.weights), want_w, atol=1e-6)

    def test_malformed_request_names_field_and_value(self):
        q = np.zeros((1, 2, 3, 8), np.float32)
        k = np.zeros((1, 2, 3, 4), np.float32)
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.Attend(pb.AttendRequest(query=tensor(q), key=tensor(k), value=tensor(k)),
                             timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("key.shape[3] must equal query.shape[3] (8); was 4",
                      caught.exception.details())

    def test_cli_reproduces_every_seed_vector(self):
        for name in ("blocked_rows", "causal", "cross_padding", "seed_demo"):
            with self.subTest(name):
                result = subprocess.run(
                    [os.environ["ATTNSERVE_CLI"], f"--target={self.server.target}", "seed",
                     f"--file={os.path.join(SEEDS, name + '.safetensors')}"],
                    capture_output=True, text=True, timeout=120)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                self.assertIn("PASS", result.stdout)
                self.assertIn("timing: queued", result.stdout)

    def test_cli_random_requests(self):
        for args in (["attend", "--shape=1,4,16,32", "--kv_heads=2", "--dtype=bfloat16",
                      "--causal"],
                     ["mha", "--shape=2,12", "--weights"]):
            result = subprocess.run([os.environ["ATTNSERVE_CLI"],
                                     f"--target={self.server.target}", *args],
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("output:", result.stdout)


if __name__ == "__main__":
    unittest.main()
