"""The installed package's attnserve.AsyncClient (grpc.aio) against a live attnserve:
concurrent calls, the stream (written by hand and from an async iterable), errors. Run by
tests/python/package_test.sh as test_python_client.py is."""
import asyncio
import os
import unittest

import grpc
import numpy as np

import attnserve

from live_server import LiveServer


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
                await call.write(attnserve.stream_request(i, attnserve.attend_request(q, q, q)))
            await call.done_writing()
            ids = [r.request_id async for r in call]
            self.assertEqual(sorted(ids), list(range(10)))

    async def test_stream_from_an_async_iterable(self):
        rng = np.random.default_rng(6)
        qs = {i: rng.standard_normal((1, 2, 3, 8), dtype=np.float32) for i in range(8)}

        async def requests():
            for i, q in qs.items():
                yield i, attnserve.attend_request(q, q, q)
            yield 99, attnserve.multi_head_request("missing", np.zeros((1, 2, 64)))
        async with attnserve.AsyncClient(self.server.target) as c:
            got = {r.request_id: r async for r in c.stream(requests(), timeout=60)}
        self.assertEqual(set(got), set(qs) | {99})
        self.assertEqual(got[99].code, grpc.StatusCode.NOT_FOUND.value[0])
        for i, q in qs.items():
            self.assertEqual(got[i].code, 0, got[i].message)
            np.testing.assert_allclose(attnserve.from_tensor(got[i].attend.output),
                                       attention64(q, q, q), atol=1e-5)

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
