"""The installed attnserve Python package (built from client/python as a wheel) against a live
attnserve: numpy in and out, float16/bfloat16, masks and options, the seed vectors through
load_module, the safetensors writer and export_state_dict (with torch when importable), the
stream, retries, errors, and the reflection client. Expected values come from float64 NumPy
written here.

Run by tests/python/package_test.sh from a folder outside the source tree with the virtual
environment the wheel was installed into: `attnserve` must be the installed package, never the
repository's client/python (test_the_package_is_the_installed_one).
"""
import os
import sys
import unittest

import grpc
import numpy as np

import attnserve
from attnserve import pb
from attnserve import reflection

from live_server import LiveServer

SEEDS = os.environ["ATTNSERVE_SEED_VECTORS_DIR"]
SEED_CASES = ("blocked_rows", "causal", "cross_padding", "seed_demo")

try:
    import torch
except ImportError:  # torch is optional
    torch = None


def attention64(q, k, v, allowed=None, scale=None):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * (scale or 1 / np.sqrt(q.shape[-1]))
    if allowed is not None:
        s = np.where(allowed, s, -1e9)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", w, v), w


def module64(t, num_heads, query, key, value, mask=None):
    def lin(x, n):
        return np.asarray(x, np.float64) @ np.asarray(t[n + ".weight"], np.float64).T + t[n + ".bias"]
    b, lq, dm = query.shape
    lk = key.shape[1]
    dk = dm // num_heads

    def heads(x, n):
        return x.reshape(b, n, num_heads, dk).transpose(0, 2, 1, 3)
    out, w = attention64(heads(lin(query, "W_q"), lq), heads(lin(key, "W_k"), lk),
                         heads(lin(value, "W_v"), lk), mask)
    return lin(out.transpose(0, 2, 1, 3).reshape(b, lq, dm), "W_o"), w


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer()
        cls.client = attnserve.Client(cls.server.target, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_the_package_is_the_installed_one(self):
        # Imported from the environment's site-packages, with the stubs inside it.
        site = os.path.realpath(sys.prefix)
        for module in (attnserve, attnserve.pb, attnserve.pb_grpc, reflection):
            self.assertTrue(os.path.realpath(module.__file__).startswith(site + os.sep),
                            f"{module.__name__} from {module.__file__}, not under {site}")
        self.assertNotIn("client/python", os.pathsep.join(sys.path))

    def test_public_api_is_documented_and_typed(self):
        import inspect
        self.assertTrue(attnserve.__doc__)
        for name in attnserve.__all__:
            obj = getattr(attnserve, name)
            if callable(obj):
                self.assertTrue(inspect.getdoc(obj), name)
        for cls in (attnserve.Client, attnserve.AsyncClient):
            for name, fn in inspect.getmembers(cls, inspect.isfunction):
                if name.startswith("_") and name != "__init__":
                    continue
                self.assertTrue(inspect.getdoc(fn), f"{cls.__name__}.{name}")
                sig = inspect.signature(fn)
                if name != "__init__":
                    self.assertIsNot(sig.return_annotation, sig.empty, f"{cls.__name__}.{name}")
            # help(Client) shows the settings by name, not **kwargs.
            self.assertLessEqual({"target", "timeout", "tls", "token", "retry", "torch_out"},
                                 set(inspect.signature(cls).parameters))

    def test_server_info_and_modules(self):
        info = self.client.server_info()
        self.assertEqual(info.version, attnserve.__version__)  # the client follows the server
        self.assertIn("demo", [m.name for m in self.client.list_modules()])

    def test_attend_numpy_in_and_out(self):
        rng = np.random.default_rng(1)
        q = rng.standard_normal((2, 4, 5, 16), dtype=np.float32)
        k = rng.standard_normal((2, 2, 7, 16), dtype=np.float32)
        v = rng.standard_normal((2, 2, 7, 8), dtype=np.float32)
        mask = rng.random((2, 1, 5, 7)) > 0.3
        r = self.client.attend(q, k, v, mask=mask, causal=True, key_lengths=[7, 4],
                               return_weights=True)
        i, j = np.arange(5)[:, None], np.arange(7)[None, :]
        allowed = mask & (j <= i + 2) & (j[None, None] < np.array([7, 4])[:, None, None, None])
        want, want_w = attention64(q, k, v, allowed)
        self.assertIsInstance(r.output, np.ndarray)
        self.assertEqual(r.output.dtype, np.float32)
        np.testing.assert_allclose(r.output, want, atol=1e-5)
        np.testing.assert_allclose(r.weights, want_w, atol=1e-6)
        self.assertGreaterEqual(r.timing.server_us, r.timing.compute_us)
        r = self.client.attend(q, k, v, scale=0.5)
        self.assertIsNone(r.weights)
        np.testing.assert_allclose(r.output, attention64(q, k, v, scale=0.5)[0], atol=1e-5)

    def test_window_softcap_and_alibi(self):
        # The three FlashAttention options together, with causality, against float64 NumPy
        # written from the proto's definitions (soft-cap, then ALiBi, then the -1e9 fill).
        rng = np.random.default_rng(5)
        q = 3 * rng.standard_normal((1, 4, 40, 16), dtype=np.float32)
        k = rng.standard_normal((1, 2, 60, 16), dtype=np.float32)
        v = rng.standard_normal((1, 2, 60, 8), dtype=np.float32)
        options = dict(causal=True, window=(7, -1), softcap=4.0, alibi="standard",
                       return_weights=True)
        r = self.client.attend(q, k, v, **options)
        i = np.arange(40)[:, None] + 20  # aligned positions i + Lk - Lq
        j = np.arange(60)[None, :]
        slopes = 2.0 ** -(2.0 * np.arange(1, 5))  # 4 heads: 2^(-8h/4)
        kk, vv = np.repeat(k, 2, axis=1).astype(np.float64), np.repeat(v, 2, axis=1)
        s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), kk) / 4.0
        s = 4.0 * np.tanh(s / 4.0) - slopes[None, :, None, None] * np.abs(j - i)
        s = np.where((j <= i) & (j >= i - 7), s, -1e9)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        np.testing.assert_allclose(r.weights, w, atol=2e-6)
        np.testing.assert_allclose(r.output, np.einsum("bhij,bhjd->bhid", w, vv), atol=2e-5)
        with self.assertRaises(grpc.RpcError) as e:
            self.client.attend(q, k, v, alibi=[0.5])
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("options.alibi.slopes must hold H (4) entries; had 1", e.exception.details())

    def test_linear_attention(self):
        # Katharopoulos et al.'s form in float64 NumPy: φ(q)ᵀ S / φ(q)·z over the causal keys.
        rng = np.random.default_rng(6)
        q = rng.standard_normal((1, 2, 30, 8), dtype=np.float32)
        k = rng.standard_normal((1, 2, 30, 8), dtype=np.float32)
        v = rng.standard_normal((1, 2, 30, 4), dtype=np.float32)

        def phi(x):
            x = x.astype(np.float64)
            return np.where(x > 0, x + 1, np.exp(x))
        w = np.einsum("bhid,bhjd->bhij", phi(q), phi(k)) * np.tril(np.ones((30, 30)))
        want = np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), v)
        r = self.client.attend(q, k, v, causal=True, kind="linear")
        np.testing.assert_allclose(r.output, want, atol=2e-5)
        with self.assertRaises(grpc.RpcError) as e:
            self.client.attend(q, k, v, kind="linear", return_weights=True)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("options.return_weights does not apply to kind ATTENTION_KIND_LINEAR",
                      e.exception.details())

    def test_float16_and_bfloat16(self):
        rng = np.random.default_rng(2)
        q = rng.standard_normal((1, 2, 4, 8)).astype(np.float16)
        r = self.client.attend(q, q, q)
        self.assertEqual(r.output.dtype, np.float16)
        np.testing.assert_allclose(r.output, attention64(q, q, q)[0], atol=2e-3)
        x = rng.standard_normal((1, 2, 4, 8), dtype=np.float32)
        t = attnserve.to_tensor(x, "bfloat16")
        self.assertEqual(t.dtype, pb.DTYPE_BFLOAT16)
        xb = attnserve.from_tensor(t)  # x rounded to bfloat16, widened back
        self.assertLess(np.abs(xb - x).max(), 2 ** -7 * np.abs(x).max())
        r = self.client.attend(x, x, x, dtype="bfloat16")
        self.assertEqual(r.output.dtype, np.float32)  # widened: numpy has no bfloat16
        np.testing.assert_allclose(r.output, attention64(xb, xb, xb)[0], atol=2e-2)

    def test_bfloat16_rounding_is_nearest_even(self):
        vals = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, np.inf, -0.0], np.float32)
        bits = np.frombuffer(attnserve.to_tensor(vals, "bfloat16").data, "<u2")
        self.assertEqual(list(bits), [0x3F80, 0x3F80, 0x3F82, 0x7F80, 0x8000])

    def test_seed_vectors_through_load_module(self):
        for name in SEED_CASES:
            with self.subTest(name):
                path = os.path.join(SEEDS, name + ".safetensors")
                t, meta = attnserve.read_safetensors(path)
                info = self.client.load_module("pyc-" + name, path, replace=True)
                self.assertEqual(info.num_heads, int(meta["num_heads"]))
                mask = t["input.mask"] != 0 if "input.mask" in t else None
                r = self.client.multi_head_attention(
                    "pyc-" + name, t["input.query"], t["input.key"], t["input.value"],
                    mask=mask, return_weights=True)
                np.testing.assert_allclose(r.output, t["expected.output"], atol=1e-5)
                np.testing.assert_allclose(r.weights, t["expected.weights"], atol=1e-5)

    def test_export_state_dict_round_trip(self):
        # The seed file's weights re-exported by our writer: same answers as the original.
        t, meta = attnserve.read_safetensors(os.path.join(SEEDS, "cross_padding.safetensors"))
        state = {n: t[n] for n in attnserve.REFERENCE_NAMES}
        state["unrelated.tensor"] = np.zeros(3, np.float32)
        blob = attnserve.export_state_dict(state, num_heads=int(meta["num_heads"]))
        back, back_meta = attnserve.read_safetensors(blob)
        self.assertEqual(sorted(back), sorted(attnserve.REFERENCE_NAMES))
        self.assertEqual(back_meta["num_heads"], meta["num_heads"])
        for n in attnserve.REFERENCE_NAMES:
            np.testing.assert_array_equal(back[n], t[n])
        self.client.load_module("pyc-export", blob, replace=True)  # num_heads from metadata
        r = self.client.multi_head_attention("pyc-export", t["input.query"], t["input.key"],
                                             t["input.value"], mask=t["input.mask"] != 0)
        np.testing.assert_allclose(r.output, t["expected.output"], atol=1e-5)
        with self.assertRaises(KeyError):
            attnserve.export_state_dict({"W_q.weight": t["W_q.weight"]})

    def test_safetensors_format_by_hand(self):
        blob = attnserve.write_safetensors({"b": np.arange(3, dtype=np.float16),
                                            "a": np.ones((2, 2), np.float32)}, {"k": 1})
        n = int.from_bytes(blob[:8], "little")
        self.assertEqual((8 + n) % 8, 0)
        import json
        header = json.loads(blob[8:8 + n])
        self.assertEqual(header["a"], {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]})
        self.assertEqual(header["b"]["data_offsets"], [16, 22])
        self.assertEqual(header["__metadata__"], {"k": "1"})
        tensors, _ = attnserve.read_safetensors(blob)
        np.testing.assert_array_equal(tensors["b"], [0, 1, 2])

    @unittest.skipIf(torch is None, "torch is not importable")
    def test_torch_module_export_and_tensors(self):
        torch.manual_seed(0)

        class Reference(torch.nn.Module):  # the reference module's layout (state_dict names)
            def __init__(self, d_model, num_heads):
                super().__init__()
                self.num_heads = num_heads
                self.W_q = torch.nn.Linear(d_model, d_model)
                self.W_k = torch.nn.Linear(d_model, d_model)
                self.W_v = torch.nn.Linear(d_model, d_model)
                self.W_o = torch.nn.Linear(d_model, d_model)

        ref = Reference(32, 4)
        self.client.load_module("pyc-torch", ref, replace=True)
        x = torch.randn(2, 6, 32)
        sd = {k: v.numpy() for k, v in ref.state_dict().items()}
        want, _ = module64(sd, 4, x.numpy(), x.numpy(), x.numpy())
        r = self.client.multi_head_attention("pyc-torch", x)  # torch tensor in
        np.testing.assert_allclose(r.output, want, atol=1e-4)

        # torch.nn.MultiheadAttention: in_proj split into W_q/W_k/W_v, out_proj into W_o.
        mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
        self.client.load_module("pyc-torch-mha", mha, replace=True)
        q, kv = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
        with torch.no_grad():
            want_t, _ = mha(q, kv, kv)
        torch_client = attnserve.Client(self.server.target, torch_out=True)
        r = torch_client.multi_head_attention("pyc-torch-mha", q, kv, kv)
        self.assertIsInstance(r.output, torch.Tensor)
        np.testing.assert_allclose(r.output.numpy(), want_t.numpy(), atol=1e-4)
        r = torch_client.attend(q[:, None].bfloat16(), kv[:, None].bfloat16(),
                                kv[:, None].bfloat16())
        self.assertEqual(r.output.dtype, torch.bfloat16)
        torch_client.close()

    def test_stream_answers_every_id(self):
        rng = np.random.default_rng(4)
        reqs = []
        for i in range(20):
            q = rng.standard_normal((1, 2, 1 + i % 4, 8), dtype=np.float32)
            reqs.append((100 + i, attnserve.attend_request(q, q, q)))
        bad = attnserve.attend_request(np.zeros((1, 2, 3, 8)), np.zeros((1, 2, 3, 4)),
                                              np.zeros((1, 2, 3, 4)))
        reqs.append((999, bad))
        reqs.append((1000, attnserve.multi_head_request("demo", np.ones((1, 3, 64)))))
        got = {r.request_id: r for r in self.client.stream(iter(reqs), timeout=60)}
        self.assertEqual(set(got), {i for i, _ in reqs})
        self.assertEqual(got[999].code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("key.shape[3]", got[999].message)
        self.assertEqual(got[1000].code, 0)
        for i, r in reqs[:20]:
            q = attnserve.from_tensor(r.query)
            np.testing.assert_allclose(attnserve.from_tensor(got[i].attend.output),
                                       attention64(q, q, q)[0], atol=1e-5)

    def test_errors_carry_code_and_message(self):
        with self.assertRaises(grpc.RpcError) as caught:
            self.client.attend(np.zeros((1, 2, 3, 8)), np.zeros((1, 2, 3, 4)),
                               np.zeros((1, 2, 3, 4)))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("key.shape[3] must equal query.shape[3] (8); was 4",
                      caught.exception.details())
        with self.assertRaises(grpc.RpcError) as caught:
            self.client.multi_head_attention("no-such-module", np.zeros((1, 2, 64)))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_round_robin_over_two_servers(self):
        other = LiveServer()
        try:
            target = f"ipv4:127.0.0.1:{self.server.port},127.0.0.1:{other.port}"
            with attnserve.Client(target) as c:
                for _ in range(10):
                    c.server_info()
                self.assertEqual(c.attend(np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)),
                                          np.ones((1, 1, 2, 4))).output.shape, (1, 1, 2, 4))
        finally:
            other.stop()

    def test_unavailable_is_retried_until_the_server_is_up(self):
        # A port nobody listens on yet: with retries and a deadline, the call fails
        # UNAVAILABLE after its attempts rather than at once; without retries at once.
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        policy = attnserve.RetryPolicy(max_attempts=3, initial_backoff_s=0.2, max_backoff_s=0.2)
        import time
        with attnserve.Client(f"127.0.0.1:{port}", retry=policy, timeout=10) as c:
            start = time.monotonic()
            with self.assertRaises(grpc.RpcError) as caught:
                c.server_info()
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
            retried = time.monotonic() - start
        with attnserve.Client(f"127.0.0.1:{port}", retry=None, timeout=10) as c:
            start = time.monotonic()
            with self.assertRaises(grpc.RpcError):
                c.server_info()
            once = time.monotonic() - start
        self.assertGreater(retried, once)

    def test_reflection_client_calls_without_the_proto(self):
        with grpc.insecure_channel(self.server.target) as ch:
            r = reflection.ReflectionClient(ch)
            self.assertIn("attnserve.v1.AttentionService", r.services())
            text = reflection.describe(r.service("attnserve.v1.AttentionService"))
            self.assertIn("rpc AttentionStream(stream attnserve.v1.AttentionStreamRequest)", text)
            import json
            info = json.loads(reflection.call(ch, r, "attnserve.v1.AttentionService/GetServerInfo",
                                              "{}"))
            self.assertEqual(info["version"], self.client.server_info().version)
            out = json.loads(reflection.call(
                ch, r, "attnserve.v1.AttentionService/Attend",
                '{"query": {"dtype": "DTYPE_FLOAT32", "shape": [1,1,1,2], "data": "AACAPwAAAAA="},'
                ' "key": {"dtype": "DTYPE_FLOAT32", "shape": [1,1,1,2], "data": "AACAPwAAAAA="},'
                ' "value": {"dtype": "DTYPE_FLOAT32", "shape": [1,1,1,2], "data": "AAAAQAAAQEA="}}'))
            self.assertEqual(out["output"]["data"], "AAAAQAAAQEA=")  # [2.0, 3.0]


if __name__ == "__main__":
    unittest.main()
