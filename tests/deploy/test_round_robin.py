"""Scale-out on one machine: three attnserve servers and one client with gRPC's round_robin
policy spreading calls over them; every server must have answered (its own /metrics counts it).

- test_bench_ipv4_list: attnserve-bench --target=ipv4:127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
  (a static list, as for a fixed set of replicas or a sidecar-less test);
- test_bench_dns_headless: the Kubernetes headless-Service pattern. The three servers listen on
  the same port of 127.0.0.1, 127.0.0.2 and 127.0.0.3, and a tiny DNS server on loopback answers
  the name attnserve-grpc.test with those three A records, as cluster DNS answers a headless
  Service's name with the ready pods' IPs. attnserve-bench targets
  dns://127.0.0.1:<dns port>/attnserve-grpc.test:<port> (gRPC's c-ares resolver, the DNS server
  named in the target's authority), exactly as a client in the cluster targets
  dns:///attnserve-grpc.<namespace>.svc.cluster.local:50051.

Environment (tests/deploy/CMakeLists.txt): ATTNSERVE_BIN, ATTNSERVE_BENCH, ATTNSERVE_PYTHON_TESTS
(the folder of live_server.py).
"""
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.environ.get("ATTNSERVE_PYTHON_TESTS",
                                  os.path.join(os.path.dirname(__file__), "..", "python")))
from live_server import LiveServer  # noqa: E402

REQUESTS = 90  # 30 per server when the spread is even


def metrics_port(server):
    m = re.search(r"metrics on port (\d+)", server.log())
    if not m:
        raise AssertionError(f"no metrics port in the server's log: {server.log()}")
    return int(m.group(1))


def ok_count(server, rpc="Attend"):
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port(server)}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("attnserve_requests_total{") and f'rpc="{rpc}"' in line and 'code="OK"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def free_port(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


class FakeClusterDns:
    """A DNS server on 127.0.0.1:<port> (UDP) that answers A queries for one name with a list of
    IPv4 addresses, and every other query with no answer (NOERROR, or NXDOMAIN for other names).
    Enough for gRPC's c-ares resolver; a stand-in for cluster DNS answering a headless Service."""

    def __init__(self, name, addresses):
        self.name = name.lower().rstrip(".")
        self.addresses = addresses
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queries = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(512)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self.sock.sendto(self._answer(data), peer)
            except Exception:  # a malformed query gets no answer
                pass

    def _answer(self, query):
        qid, flags, qdcount = struct.unpack(">HHH", query[:6])
        pos, labels = 12, []
        while query[pos] != 0:
            n = query[pos]
            labels.append(query[pos + 1:pos + 1 + n].decode())
            pos += 1 + n
        qtype, qclass = struct.unpack(">HH", query[pos + 1:pos + 5])
        question = query[12:pos + 5]
        name = ".".join(labels).lower()
        self.queries += 1
        answers = b""
        count = 0
        rcode = 0 if name == self.name else 3  # NXDOMAIN for other names
        if name == self.name and qtype == 1 and qclass == 1:
            for a in self.addresses:
                # name pointer to the question (0xC00C), A, IN, TTL 5 s (re-resolution sees changes)
                answers += struct.pack(">HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(a)
                count += 1
        rd = flags & 0x0100
        header = struct.pack(">HHHHHH", qid, 0x8000 | 0x0400 | rd | 0x0080 | rcode, 1, count, 0, 0)
        return header + question + answers

    def close(self):
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


class RoundRobinTest(unittest.TestCase):
    def run_bench(self, target, servers):
        before = [ok_count(s) for s in servers]
        cmd = [os.environ["ATTNSERVE_BENCH"], f"--target={target}", "--rpc=attend",
               "--shapes=1,2,16,16", "--mode=closed", "--concurrency=3",
               f"--requests={REQUESTS}", "--warmup_s=0", "--progress=off", "--timeout_ms=20000"]
        env = dict(os.environ, GRPC_DNS_RESOLVER="ares")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        print(out.stdout, out.stderr, sep="\n", file=sys.stderr)
        self.assertEqual(out.returncode, 0, f"attnserve-bench failed: {out.stdout}\n{out.stderr}")
        served = [ok_count(s) - b for s, b in zip(servers, before)]
        print(f"{target}: requests served per server {served}", file=sys.stderr)
        self.assertEqual(sum(served), REQUESTS, f"served {served}")
        for i, n in enumerate(served):
            # round_robin over one channel: an even spread; allow for the calls in flight when
            # a subchannel became ready later than the others.
            self.assertGreaterEqual(n, REQUESTS / 3 / 2, f"server {i} served {n} of {REQUESTS}: {served}")
        return served

    def start(self, *flags):
        server = LiveServer("--backend=cpu", "--backend_threads=1", *flags)
        self.addCleanup(lambda: self.assertEqual(server.stop(), 0, "the server did not drain and exit 0"))
        return server

    def test_bench_ipv4_list(self):
        servers = [self.start() for _ in range(3)]
        target = "ipv4:" + ",".join(s.target for s in servers)
        self.run_bench(target, servers)

    def test_bench_dns_headless(self):
        port = free_port()
        ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        servers = [self.start(f"--listen={ip}:{port}") for ip in ips]
        dns = FakeClusterDns("attnserve-grpc.test", ips)
        self.addCleanup(dns.close)
        self.run_bench(f"dns://127.0.0.1:{dns.port}/attnserve-grpc.test:{port}", servers)
        self.assertGreater(dns.queries, 0, "the client never asked the DNS server")


if __name__ == "__main__":
    unittest.main()
