"""RSS of an attnserve process around one large response: is the memory handed back?

Usage (Debian's python3, stubs built by the default preset):
  PYTHONPATH=build/python/attnserve_pb /usr/bin/python3 tests/bench/response_memory.py \
      build/server/attnserve [OTHER_BINARY ...]

For each binary: start it (reference backend), note VmRSS when idle (after a small warm-up
call), send one Attend whose `weights` are 256 MiB ([1, 16, 2048, 2048] float32; the inputs
are 3 MiB; CASE=output instead: a 250 MiB query answered with a 250 MiB output), then note VmRSS after the answer, and again after 20 small calls. Prints one line
per binary; the figures in SERVING.md come from here.
"""
import os
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
from attnserve.v1 import attention_pb2 as pb
from attnserve.v1 import attention_pb2_grpc as pb_grpc


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def tensor(a):
    return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(a.shape), data=a.tobytes())


def attend(h, length, d, weights, kv_length=None):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, h, length, d), dtype=np.float32)
    kv = q if kv_length is None else q[:, :, :kv_length, :].copy()
    return pb.AttendRequest(query=tensor(q), key=tensor(kv), value=tensor(kv),
                            options=pb.AttentionOptions(return_weights=weights))


def measure(binary):
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_address=",
                                 "--backend=cpu", f"--port_file={port_file}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not os.path.exists(port_file):
                time.sleep(0.05)
            time.sleep(0.1)
            with open(port_file) as f:
                port = int(f.read())
            opts = [("grpc.max_receive_message_length", 1 << 30)]
            stub = pb_grpc.AttentionServiceStub(
                grpc.insecure_channel(f"127.0.0.1:{port}", options=opts))
            small = attend(2, 64, 8, False)
            stub.Attend(small, timeout=60)
            idle = rss_mib(proc.pid)
            if CASE == "weights":
                r = stub.Attend(attend(16, 2048, 8, True), timeout=600)
                assert len(r.weights.data) == 256 << 20
            else:  # a 250 MiB request answered with a 250 MiB output
                r = stub.Attend(attend(32, 8000, 256, False, kv_length=16), timeout=600)
                assert len(r.output.data) == 32 * 8000 * 256 * 4
            del r
            after = rss_mib(proc.pid)
            stub.Attend(small, timeout=60)
            next_call = rss_mib(proc.pid)
            for _ in range(20):
                stub.Attend(small, timeout=60)
            later = rss_mib(proc.pid)
            print(f"{binary} [{CASE}]: idle {idle:.0f} MiB, after a 256 MiB response {after:.0f} MiB "
                  f"(+{after - idle:.0f}), after the next call {next_call:.0f} MiB "
                  f"(+{next_call - idle:.0f}), after 20 small calls {later:.0f} MiB "
                  f"(+{later - idle:.0f})")
        finally:
            proc.terminate()
            proc.wait()


CASE = os.environ.get("CASE", "weights")

if __name__ == "__main__":
    for b in sys.argv[1:]:
        measure(b)
