#!/usr/bin/python3
"""A module session's prefill against MultiHeadAttention on the same tokens, through gRPC.

Both compute the causal self-attention of one module (d_model, heads) over L tokens:
  mha:      one MultiHeadAttention call, query [1, L, d_model], causal;
  session:  CreateSession bound to the module, one ExtendSession of the L tokens' inputs
            [L, d_model] (the server projects Q, K, V, caches K and V, computes the attention
            over its pages in chunks of --session_prefill_chunk_tokens, applies W_o), then
            CloseSession.
Rounds alternate the two ways; the figure is the median wall time per call of each way and
their ratio (mha / session: 1.0 means the session's prefill is as fast), beside the largest
difference between their outputs (they compute the same thing). Also given: the extend alone
(the prefill without the two session rpcs around it) and the server's compute time of each
(the responses' Timing.compute_us).

  /usr/bin/python3 tests/bench/module_prefill.py --server=build/server/attnserve \\
      [--tokens=512] [--d_model=512] [--heads=8] [--rounds=15] [--json=out.json]

Figures: tests/bench/DECODE.md ("A module session's prefill").
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
sys.path.insert(0, os.path.dirname(__file__))
import attnserve  # noqa: E402
from decode_grpc import cpu_model, start_server  # noqa: E402


def module_weights(d, seed):
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(d)
    sd = {}
    for name in ("W_q", "W_k", "W_v", "W_o"):
        sd[f"{name}.weight"] = (rng.standard_normal((d, d)) * scale).astype(np.float32)
        sd[f"{name}.bias"] = (rng.standard_normal(d) * 0.1).astype(np.float32)
    return sd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="the attnserve binary to start (else --target)")
    ap.add_argument("--target", help="a running server's host:port")
    ap.add_argument("--flags", default="--backend=cpu", help="server flags (space-separated)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--d_model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    server = None
    if a.server:
        server, target = start_server(a.server, a.flags.split())
    else:
        target = a.target
    try:
        with attnserve.Client(target, timeout=600) as client:
            info = client.server_info()
            client.load_module("bench", module_weights(a.d_model, 1), num_heads=a.heads,
                               replace=True)
            x = np.random.default_rng(2).standard_normal((a.tokens, a.d_model)).astype(
                np.float32)

            times = {"mha": [], "session": [], "extend": [], "mha_compute": [],
                     "extend_compute": []}

            def mha():
                result = client.multi_head_attention("bench", x[None], causal=True)
                return result.output[0], result.timing

            def session():
                with client.create_session(module="bench") as s:
                    t0 = time.perf_counter()
                    result = s.extend(input=x)
                    return result.output, result.timing, time.perf_counter() - t0

            outputs = {}
            for r in range(a.rounds + 1):  # the first round warms up
                for name, fn in (("mha", mha), ("session", session)) if r % 2 else (
                        ("session", session), ("mha", mha)):
                    t0 = time.perf_counter()
                    out = fn()
                    elapsed = time.perf_counter() - t0
                    outputs[name] = np.asarray(out[0])
                    if r > 0:
                        times[name].append(elapsed)
                        compute_s = out[1].compute_us * 1e-6
                        if name == "mha":
                            times["mha_compute"].append(compute_s)
                        else:
                            times["extend"].append(out[2])
                            times["extend_compute"].append(compute_s)
            med = {k: statistics.median(v) for k, v in times.items()}
            diff = float(np.max(np.abs(outputs["mha"] - outputs["session"])))
            result = {
                "machine": cpu_model(), "cpus": os.cpu_count(),
                "backend": info.backends[0].name if info.backends else "?",
                "tokens": a.tokens, "d_model": a.d_model, "heads": a.heads,
                "rounds": a.rounds, "mha_ms": med["mha"] * 1e3,
                "session_ms": med["session"] * 1e3,
                "session_speed_vs_mha": med["mha"] / med["session"],
                "extend_ms": med["extend"] * 1e3,
                "extend_speed_vs_mha": med["mha"] / med["extend"],
                "mha_compute_ms": med["mha_compute"] * 1e3,
                "extend_compute_ms": med["extend_compute"] * 1e3,
                "max_abs_difference": diff,
            }
            print(f"{result['machine']} ({result['cpus']} CPUs), backend {result['backend']}, "
                  f"L={a.tokens} d_model={a.d_model} heads={a.heads}, median of {a.rounds}:")
            print(f"  MultiHeadAttention {result['mha_ms']:.2f} ms, session prefill "
                  f"{result['session_ms']:.2f} ms (create + extend + close): session speed "
                  f"{result['session_speed_vs_mha']:.2f}x of MHA; outputs differ by {diff:.2e}")
            print(f"  the extend alone {result['extend_ms']:.2f} ms: "
                  f"{result['extend_speed_vs_mha']:.2f}x of MHA; server compute "
                  f"{result['extend_compute_ms']:.2f} ms against MHA's "
                  f"{result['mha_compute_ms']:.2f} ms")
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(result, f, indent=1)
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
