"""Starts an attnserve process on a free loopback port for a test, and stops it."""
import os
import signal
import subprocess
import tempfile
import time


class LiveServer:
    """attnserve in a child process; `port` is set once it reports SERVING.

    `flags` are extra command-line flags, e.g. "--metrics_address=127.0.0.1:9999". Unless they
    name one, /metrics listens on a free loopback port (127.0.0.1:0), so that servers of tests
    run in parallel do not collide on the default 0.0.0.0:9464 (the last of a repeated flag
    wins). `wrapper` is a command line the server's is appended to (it must exec the server, so
    that `process` stays the server). `env`: variables set for the server on top of the test's.
    """

    def __init__(self, *flags, wrapper=(), env=None):
        self._dir = tempfile.TemporaryDirectory()
        self._port_file = os.path.join(self._dir.name, "port")
        self._log = open(os.path.join(self._dir.name, "log"), "w+")
        self.process = subprocess.Popen(
            [*wrapper, os.environ["ATTNSERVE_BIN"], "--listen=127.0.0.1:0",
             "--metrics_address=127.0.0.1:0", f"--port_file={self._port_file}", *flags],
            stdout=self._log, stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env})
        try:
            self.port = self._wait_for_port(timeout_s=60)
        except BaseException:
            # Leave no process or temporary directory behind when start-up fails.
            self.process.kill()
            self.process.wait()
            self._log.close()
            self._dir.cleanup()
            raise
        self.target = f"127.0.0.1:{self.port}"

    def _wait_for_port(self, timeout_s):
        # Poll for the port file the server writes once it is SERVING; fail fast if it exits.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"attnserve exited with {self.process.returncode}: {self.log()}")
            if os.path.exists(self._port_file):
                with open(self._port_file) as f:
                    return int(f.read())
            time.sleep(0.02)
        raise TimeoutError(f"attnserve did not report a port within {timeout_s}s: {self.log()}")

    def log(self):
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def stop(self, timeout_s=30):
        """SIGTERM, and the exit code once the process has drained and exited."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self._log.close()
            self._dir.cleanup()
