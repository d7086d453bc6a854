"""A rolling restart of three live replicas under a decode load loses no session and changes no
step (issue 33): three attnserve processes on fixed loopback ports, each with the other two as
--session_peers, hold SESSIONS sessions; one thread per session steps it a token at a time
through one client of all three (which follows moves) while each replica in turn gets SIGTERM
(its drain moves its sessions to the others), exits 0 having moved every session, and a new
process starts on the same address. Then every session's steps, replayed on one replica that
never stopped, must be the same bits.

No timing windows: the restarts wait for events (every session has stepped again since the last
exit, so that its caller has followed its move before a new process answers at the old address;
a server is up when it reports its port), and the load's steps count, not its time.

Run by tests/python/package_test.sh with the installed wheel (see test_python_client.py).
"""
import re
import socket
import threading
import unittest

import numpy as np

import attnserve

from live_server import LiveServer

HQ, HKV, D = 4, 2, 8
LAYOUT = attnserve.layout(HQ, D, HKV)
SESSIONS, PREFILL = 6, 20
WAIT_S = 120  # a failure guard on every wait: the waits end by events


def tokens(i, a, b):
    """Tokens [a, b) of session i's sequence: q [n, Hq, D], k and v [n, Hkv, D], the same
    whenever asked (generated from the session and the position)."""
    out = [[], [], []]
    for n in range(a, b):
        rng = np.random.default_rng((33, i, n))
        for j, h in enumerate((HQ, HKV, HKV)):
            out[j].append(rng.standard_normal((1, h, D)).astype(np.float32))
    return tuple(np.concatenate(x) for x in out)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Load:
    """One thread per session, a decode step after another; every output kept, in order."""

    def __init__(self, sessions):
        self.sessions = sessions
        self.outputs = [[] for _ in sessions]
        self.errors = []
        self.stop = threading.Event()
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(len(sessions))]
        for t in self.threads:
            t.start()

    def run(self, i):
        s = self.sessions[i]
        n = PREFILL
        while not self.stop.is_set():
            try:
                r = s.extend(*tokens(i, n, n + 1), timeout=WAIT_S)
            except Exception as e:  # noqa: BLE001: any failure fails the test
                with self.cond:
                    self.errors.append(f"session {i} at {n}: {e!r}")
                    self.cond.notify_all()
                return
            with self.cond:
                self.outputs[i].append(np.array(r.output, copy=True))
                self.cond.notify_all()
            n += 1

    def steps(self):
        with self.cond:
            return [len(o) for o in self.outputs]

    def wait_steps(self, more):
        """Until every session has stepped `more` times more than now (or an error)."""
        with self.cond:
            want = [len(o) + more for o in self.outputs]
            done = self.cond.wait_for(
                lambda: self.errors or all(len(o) >= w for o, w in zip(self.outputs, want)),
                timeout=WAIT_S)
        return done and not self.errors

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(WAIT_S)


class RollingRestartTest(unittest.TestCase):
    def test_rolling_restart_under_decode_load_loses_nothing(self):
        addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]

        def start(i):
            peers = ",".join(a for j, a in enumerate(addresses) if j != i)
            return LiveServer("--backend=cpu", "--backend_threads=1", f"--listen={addresses[i]}",
                              f"--session_peers={peers}")

        servers = [start(i) for i in range(3)]
        client = attnserve.Client(addresses)
        load = None
        try:
            sessions = [client.create_session(layout=LAYOUT) for _ in range(SESSIONS)]
            owners = {attnserve.session_owner(s.id) for s in sessions}
            self.assertEqual(owners, set(addresses), "new sessions go to each replica in turn")
            for i, s in enumerate(sessions):
                s.extend(*tokens(i, 0, PREFILL))
            # An idle session of replica 0: nobody calls it while the replicas restart, so its
            # caller learns nothing of its moves until its next step, when a new process
            # answers at its old owner's address.
            with attnserve.Client(addresses[0]) as on_0:
                idle = attnserve.Session(client, on_0.create_session(layout=LAYOUT).info)
            idle_id = idle.id
            idle.extend(*tokens(SESSIONS, 0, PREFILL))
            load = Load(sessions)
            self.assertTrue(load.wait_steps(3), load.errors)
            for i in range(3):
                servers[i].process.terminate()
                self.assertEqual(servers[i].process.wait(timeout=WAIT_S), 0, servers[i].log())
                log = servers[i].log()
                drain = re.search(r"moved (\d+) sessions .*; (\d+) not moved", log)
                self.assertIsNotNone(drain, log)
                self.assertEqual(drain.group(2), "0", log)
                self.assertGreater(int(drain.group(1)), 0, log)
                servers[i].stop()
                # Every caller has followed its session before an address answers again.
                self.assertTrue(load.wait_steps(2), load.errors)
                for s in sessions:
                    self.assertNotEqual(attnserve.session_owner(s.id), addresses[i])
                servers[i] = start(i)
                self.assertTrue(load.wait_steps(2), load.errors)
            load.end()
            self.assertEqual(load.errors, [])
            steps = load.steps()

            # The idle session: its old owner's address answers "session lost (restarted)" (a
            # new process); the client asks the others, and the one that holds it now knows
            # the id it had on replica 0, two restarts ago.
            idle_out = idle.extend(*tokens(SESSIONS, PREFILL, PREFILL + 1)).output
            self.assertNotEqual(idle.id, idle_id)
            sessions.append(idle)
            steps.append(1)
            load.outputs.append([idle_out])

            # Every session is held once, by a replica that started after the restarts began.
            held = {}
            for a in addresses:  # (a new channel: `client`'s may still back off from a restart)
                with attnserve.Client(a) as on_a:
                    for info in on_a.list_sessions().sessions:
                        held[info.session_id] = info.length
            self.assertEqual(held, {s.id: PREFILL + n for s, n in zip(sessions, steps)})

            # The same steps on a session that never moved: the same bits.
            with attnserve.Client(addresses[0]) as one:
                for i, n in enumerate(steps):
                    with one.create_session(layout=LAYOUT) as replay:
                        replay.extend(*tokens(i, 0, PREFILL))
                        for t in range(n):
                            out = replay.extend(*tokens(i, PREFILL + t, PREFILL + t + 1)).output
                            self.assertTrue(np.array_equal(out, load.outputs[i][t]),
                                            f"session {i}, step {t}")
            for s in sessions:
                s.close()
        finally:
            if load is not None:
                load.end()
            client.close()
            for s in servers:
                s.stop()


if __name__ == "__main__":
    unittest.main()
