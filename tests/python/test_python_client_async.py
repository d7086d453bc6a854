"""attnserve.AsyncClient (grpc.aio) against a live attnserve: concurrent calls, the stream,
errors."""
import asyncio
import os
import sys
import unittest

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.environ["ATTNSERVE_STUBS"])
import attnserve  # noqa: E402
from attnserve import pb  # noqa: E402

from live_server import LiveServer  # noqa: E402


def attention64(q, k, v):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), v)


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    async def test_concurrent_calls(self):
        rng = np.random.default_rng(5)
        qs = [rng.standard_normal((1, 2, 3 + i % 3, 8), dtype=np.float32) for i in range(24)]
        async with attnserve.AsyncClient(self.server.target) as c:
            info = await c.server_info()
            self.assertTrue(info.version)
            results = await asyncio.gather(*(c.attend(q, q, q) for q in qs))
            for q, r in zip(qs, results):
                np.testing.assert_allclose(r.output, attention64(q, q, q), atol=1e-5)
            r = await c.multi_head_attention("demo", np.ones((2, 4, 64), np.float32))
            self.assertEqual(r.output.shape, (2, 4, 64))
            self.assertIn("demo", [m.name for m in await c.list_modules()])

    async def test_stream(self):
        async with attnserve.AsyncClient(self.server.target) as c:
            call = c.stream(timeout=60)
            q = np.ones((1, 1, 2, 4), np.float32)
            for i in range(10):
                await call.write(pb.AttentionStreamRequest(
                    request_id=i, attend=attnserve.client.attend_request(q, q, q)))
            await call.done_writing()
            ids = [r.request_id async for r in call]
            self.assertEqual(sorted(ids), list(range(10)))

    async def test_errors(self):
        async with attnserve.AsyncClient(self.server.target) as c:
            with self.assertRaises(grpc.aio.AioRpcError) as caught:
                await c.multi_head_attention("missing", np.zeros((1, 2, 64)))
            self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    async def test_seed_vector(self):
        path = os.path.join(os.environ["ATTNSERVE_SEED_VECTORS_DIR"], "causal.safetensors")
        t, _ = attnserve.read_safetensors(path)
        async with attnserve.AsyncClient(self.server.target) as c:
            await c.load_module("async-causal", path, replace=True)
            r = await c.multi_head_attention("async-causal", t["input.query"],
                                             mask=t["input.mask"] != 0, return_weights=True)
            np.testing.assert_allclose(r.output, t["expected.output"], atol=1e-5)
            np.testing.assert_allclose(r.weights, t["expected.weights"], atol=1e-5)


if __name__ == "__main__":
    unittest.main()
