"""attnserve-bench against a live attnserve: its accounting (sent = ok + errors), its percentiles
(ordered, and within the server's own Timing plus the network), its open-loop rate, schedules,
the stream rpc, CSV output, and the echo server it is compared with.

Timing bounds are loose on purpose: CI shares 2 cores between server, client and other tests.
"""
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from live_server import LiveServer  # noqa: E402

BENCH = os.environ["ATTNSERVE_BENCH"]


def bench(target, *flags, expect_rc=0):
    p = subprocess.run([BENCH, f"--target={target}", "--json=-", "--progress=off", *flags],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != expect_rc:
        raise AssertionError(f"attnserve-bench exited {p.returncode}: {p.stderr}\n{p.stdout}")
    return json.loads(p.stdout)


class BenchLiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer("--max_sequence_length=256")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def check_accounting(self, phase):
        self.assertEqual(phase["sent"], phase["ok"] + sum(phase["errors"].values()), phase)
        lat = phase["latency_ms"]
        self.assertLessEqual(lat["p50"], lat["p90"])
        self.assertLessEqual(lat["p90"], lat["p99"])
        self.assertLessEqual(lat["p99"], lat["p999"])
        self.assertLessEqual(lat["p999"], lat["max"])

    def test_closed_loop_by_count(self):
        report = bench(self.server.target, "--mode=closed", "--concurrency=4", "--requests=300",
                       "--warmup_s=0.5", "--shapes=1,4,64,32")
        (phase,) = report["phases"]
        self.check_accounting(phase)
        self.assertEqual(phase["sent"], 300)
        self.assertEqual(phase["ok"], 300)
        self.assertEqual(report["config"]["server_version"] != "", True)
        # The client's latency contains the server's time, and exceeds it only by the network
        # and the client's own work (a loaded 2-core machine: allow 30 ms + 50%).
        lat, srv = phase["latency_ms"], phase["server_ms"]
        for p in ("p50", "p90"):
            self.assertGreaterEqual(lat[p] + 0.05, srv[p], (p, lat, srv))
            self.assertLessEqual(lat[p], 1.5 * srv[p] + 30, (p, lat, srv))
        self.assertLessEqual(phase["queued_ms_mean"] + phase["compute_ms_mean"],
                             srv["mean"] + 0.01)
        self.assertGreater(phase["requests_per_s"], 0)
        self.assertGreater(phase["gflops_per_s"], 0)
        self.assertAlmostEqual(phase["tokens_per_s"] / phase["requests_per_s"], 64, places=3)

    def test_open_loop_hits_its_rate(self):
        report = bench(self.server.target, "--mode=open", "--rate=80", "--duration_s=4",
                       "--warmup_s=0.5", "--shapes=1,1,16,16")
        (phase,) = report["phases"]
        self.check_accounting(phase)
        self.assertEqual(phase["errors"], {})
        self.assertAlmostEqual(phase["sent_per_s"], 80, delta=8)
        self.assertAlmostEqual(phase["requests_per_s"], 80, delta=12)
        self.assertAlmostEqual(phase["sent"], 320, delta=4)

    def test_poisson_rate_on_average(self):
        report = bench(self.server.target, "--mode=open", "--arrival=poisson", "--rate=100",
                       "--requests=400", "--warmup_s=0", "--shapes=1,1,16,16")
        (phase,) = report["phases"]
        self.check_accounting(phase)
        self.assertEqual(phase["sent"], 400)
        # 400 exponential gaps: the mean rate is within ~5% (1 sigma); allow 25%.
        self.assertAlmostEqual(phase["sent_per_s"], 100, delta=25)

    def test_errors_are_counted_by_code(self):
        # Lengths over the server's --max_sequence_length=256 are RESOURCE_EXHAUSTED.
        report = bench(self.server.target, "--requests=60", "--concurrency=2", "--warmup_s=0",
                       "--shapes=1,1,32,8;1,1,512,8", expect_rc=1)
        (phase,) = report["phases"]
        self.check_accounting(phase)
        self.assertGreater(phase["ok"], 0)
        self.assertGreater(phase["errors"].get("RESOURCE_EXHAUSTED", 0), 0)
        self.assertEqual(set(phase["errors"]), {"RESOURCE_EXHAUSTED"})

    def test_stream_steps_and_csv(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.csv")
            report = bench(self.server.target, "--rpc=stream", "--stream_payload=mha",
                           "--steps=1,4", "--duration_s=1", "--warmup_s=0.2", "--connections=2",
                           "--shapes=1,32;2,16@0.5", f"--csv={path}")
            with open(path) as f:
                rows = list(csv.DictReader(f))
        self.assertEqual([p["level"] for p in report["phases"]], [1, 4])
        self.assertEqual(len(rows), 2)
        for phase, row in zip(report["phases"], rows):
            self.check_accounting(phase)
            self.assertEqual(phase["errors"], {})
            self.assertEqual(int(row["sent"]), phase["sent"])
            self.assertGreater(phase["ok"], 0)

    def test_ramp_seq_len_distribution_and_text_report(self):
        p = subprocess.run([BENCH, f"--target={self.server.target}", "--mode=open",
                            "--ramp=20:60:3", "--duration_s=1", "--warmup_s=0",
                            "--rpc=mha", "--shapes=1,64", "--seq_len=lognormal:32:0.5:200",
                            "--pool=8"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [l for l in p.stdout.splitlines() if l.startswith("step")]
        self.assertEqual(len(lines), 3, p.stdout)
        self.assertIn("rate=40", lines[1])
        self.assertNotIn("\r", p.stdout)  # no progress line when stdout is not a terminal


class EchoServerTest(unittest.TestCase):
    def test_bench_runs_against_the_echo_server(self):
        with tempfile.TemporaryDirectory() as d:
            port_file = os.path.join(d, "port")
            proc = subprocess.Popen([os.environ["ATTNSERVE_BENCH_ECHO"], "--listen=127.0.0.1:0",
                                     f"--port_file={port_file}"], stdout=subprocess.DEVNULL)
            try:
                for _ in range(600):
                    if os.path.exists(port_file):
                        break
                    import time
                    time.sleep(0.05)
                with open(port_file) as f:
                    port = int(f.read())
                report = bench(f"127.0.0.1:{port}", "--requests=200", "--concurrency=2",
                               "--warmup_s=0", "--shapes=1,1,4,8")
            finally:
                proc.kill()
                proc.wait()
        (phase,) = report["phases"]
        self.assertEqual(phase["ok"], 200)
        self.assertEqual(report["config"]["server_backend"], "echo")


if __name__ == "__main__":
    unittest.main()
