"""A live server on its allocator (base/malloc_conf.cc: jemalloc, one arena, a background thread
that returns free pages as they age): it runs on jemalloc, reuses its pages under a steady load of
large requests instead of faulting them in again, and gives idle memory back to the system after a
burst of 16 MiB requests, with no further call, instead of keeping it for good.

The decay is shortened to 1 s through MALLOC_CONF (the default's 10 s is the same mechanism,
measured by tests/bench/serving_sweep.py), and the wait for RSS to fall is a poll bounded
generously: a loaded machine only makes the test slower, never wrong.
"""
import concurrent.futures
import os
import sys
import time
import unittest


sys.path.insert(0, os.environ["ATTNSERVE_STUBS"])
from attnserve.v1 import attention_pb2_grpc as pb_grpc  # noqa: E402

from live_server import LiveServer  # noqa: E402
from test_call_admission import attend, own_channel, rss_bytes  # noqa: E402


def minor_faults(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


BIG = attend(2, 8, 2048, 64)  # [1, 8, 2048, 64] float32: 12 MiB of request, 4 MiB answered


class MemoryReturnTest(unittest.TestCase):
    def run_server(self, body, env=None, *flags):
        # The CPU backend named: "auto" would load the CUDA libraries first where nvcc built the
        # plugin (some 160 MiB of RSS on a machine without a GPU), which no request changes.
        server = LiveServer("--backend=cpu", *flags, env=env)
        try:
            self.assertIn("allocator jemalloc", server.log())
            self.assertIn("narenas 1", server.log())
            with own_channel(server.target) as channel:
                body(server.process.pid, pb_grpc.AttentionServiceStub(channel))
        finally:
            log = server.log()
            self.assertEqual(server.stop(), 0, log)

    def test_large_requests_reuse_their_pages(self):
        request = attend(3, 8, 512, 64)  # [1, 8, 512, 64] float32: 3 MiB of request

        def body(pid, stub):
            for _ in range(5):
                stub.Attend(request, timeout=120)
            # In the steady state the pages come from the allocator's free ones: a few faults a
            # call at most, against some 1,000 when each call's buffers are mapped afresh (as with
            # glibc's malloc and the mmap threshold the server had before).
            before = minor_faults(pid)
            calls = 20
            for _ in range(calls):
                stub.Attend(request, timeout=120)
            per_call = (minor_faults(pid) - before) / calls
            self.assertLess(per_call, 50, f"{per_call:.0f} page faults per 3 MiB call")
        # Reuse alone, whatever the pace of the calls: on a loaded machine the gap between two
        # calls can outlast the idle release's 2 s (which then rightly gives the pages back) and
        # the decay's curve (which returns some pages well before its 10 s). Both are tested by
        # test_idle_memory_goes_back_to_the_system.
        self.run_server(body, {"MALLOC_CONF": "dirty_decay_ms:600000"}, "--idle_release_ms=0")

    def test_idle_memory_goes_back_to_the_system(self):
        def body(pid, stub):
            stub.Attend(attend(1, 1, 8, 8), timeout=60)
            fresh = rss_bytes(pid)
            # Eight callers at once, twice: the buffers of every call in flight at the peak.
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for f in [pool.submit(stub.Attend, BIG, timeout=300) for _ in range(16)]:
                    f.result()
            peak = rss_bytes(pid)
            self.assertGreater(peak, 1.5 * fresh,
                               f"the burst did not raise RSS ({fresh} -> {peak}): nothing to test")
            deadline = time.monotonic() + 120
            while rss_bytes(pid) > 1.5 * fresh and time.monotonic() < deadline:
                time.sleep(0.2)
            idle = rss_bytes(pid)
            self.assertLessEqual(idle, 1.5 * fresh,
                                 f"RSS fresh {fresh >> 20} MiB, after the burst {peak >> 20} MiB, "
                                 f"idle {idle >> 20} MiB")
        self.run_server(body, env={"MALLOC_CONF": "dirty_decay_ms:1000"})


if __name__ == "__main__":
    unittest.main()
