"""attnserve-health-probe (the container HEALTHCHECK) against a live server: its exit codes
(0 SERVING, 1 bad arguments, 2 no connection, 3 rpc failed), its default address from
ATTNSERVE_LISTEN, and that it fails once the server has stopped."""
import os
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.environ.get("ATTNSERVE_PYTHON_TESTS",
                                  os.path.join(os.path.dirname(__file__), "..", "python")))
from live_server import LiveServer  # noqa: E402

PROBE = os.environ.get("ATTNSERVE_HEALTH_PROBE", "attnserve-health-probe")


def probe(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k != "ATTNSERVE_LISTEN"}
    e.update(env or {})
    return subprocess.run([PROBE, *args], capture_output=True, text=True, timeout=30, env=e)


class HealthProbeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = LiveServer("--backend=reference")

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.stop()

    def test_serving(self):
        out = probe(f"--addr={self.server.target}", "-v")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("status: SERVING", out.stdout)

    def test_default_address_follows_attnserve_listen(self):
        out = probe("-v", env={"ATTNSERVE_LISTEN": f"0.0.0.0:{self.server.port}"})
        self.assertEqual(out.returncode, 0, out.stderr)

    def test_unknown_service_is_an_rpc_failure(self):
        out = probe(f"--addr={self.server.target}", "--service=no.such.Service")
        self.assertEqual(out.returncode, 3, out.stderr)
        self.assertIn("code 5", out.stderr)  # NOT_FOUND

    def test_no_server(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        out = probe(f"--addr=127.0.0.1:{port}", "--timeout_ms=300")
        self.assertEqual(out.returncode, 2, out.stderr)

    def test_bad_arguments(self):
        self.assertEqual(probe("--no-such-flag").returncode, 1)
        self.assertEqual(probe("--timeout_ms=soon").returncode, 1)

    def test_fails_once_stopped(self):
        server = LiveServer("--backend=reference", "--shutdown_grace_ms=1000")
        self.assertEqual(probe(f"--addr={server.target}").returncode, 0)
        self.assertEqual(server.stop(), 0)
        out = probe(f"--addr={server.target}", "--timeout_ms=500")
        self.assertNotEqual(out.returncode, 0, "a stopped server still looks healthy")


if __name__ == "__main__":
    unittest.main()
