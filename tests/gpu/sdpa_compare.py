#!/usr/bin/env python3
"""Merges flash_bench's JSON with PyTorch SDPA timings taken in the same run.

usage: sdpa_compare.py flash_bench.json gpu_results.json [gpu_tests.json]

For each shape of the sweep (dtype, head dim, causal, L; B = 16384 / L, 16 heads) it reports
the fused kernel's TFLOP/s, the cuBLAS naive attention's, their ratio, and, where torch is
importable, torch.nn.functional.scaled_dot_product_attention's TFLOP/s (timed with CUDA events,
median of 20 after 3 warm-ups, layout [B, H, L, d]) and the ratio to it. Prints a table last.
"""
import json
import re
import sys

NAME = re.compile(r"(flash|naive)/(fp16|bf16)/d(\d+)/causal([01])/L(\d+)")


def sdpa_tflops(torch, dtype, d, causal, length, heads=16, tokens=16384):
    import torch.nn.functional as F
    b = tokens // length
    q, k, v = (torch.randn(b, heads, length, d, device="cuda", dtype=dtype) for _ in range(3))
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    flops = 4.0 * b * heads * length * length * d / (2.0 if causal else 1.0)
    return flops / times[len(times) // 2] / 1e12


def main():
    bench_path, out_path = sys.argv[1], sys.argv[2]
    tests_path = sys.argv[3] if len(sys.argv) > 3 else None
    rows = {}
    try:
        with open(bench_path) as f:
            bench = json.load(f)
    except (OSError, ValueError) as e:
        bench = {"benchmarks": []}
        print(f"sdpa_compare: no benchmark results ({e})")
    for bm in bench.get("benchmarks", []):
        m = NAME.match(bm["name"])
        if not m or bm.get("error_occurred"):
            continue
        impl, dt, d, causal, length = m.group(1), m.group(2), int(m.group(3)), m.group(4) == "1", int(m.group(5))
        key = (dt, d, causal, length)
        rows.setdefault(key, {"dtype": dt, "head_dim": d, "causal": causal, "L": length,
                              "B": 16384 // length, "H": 16})
        rows[key][impl + "_tflops"] = bm.get("TFLOPS", 0.0) / 1.0
        rows[key][impl + "_ms"] = bm.get("real_time")
        if impl == "flash":
            rows[key]["kernel"] = bm.get("label", "")
    torch = None
    try:
        import torch as _torch
        if _torch.cuda.is_available():
            torch = _torch
            torch.backends.cuda.matmul.allow_tf32 = False
    except Exception as e:  # noqa: BLE001 - report and carry on without SDPA
        print(f"sdpa_compare: torch not usable ({e}); no SDPA ratios")
    for key, row in sorted(rows.items()):
        if "flash_tflops" in row and "naive_tflops" in row and row["naive_tflops"] > 0:
            row["ratio_vs_naive"] = row["flash_tflops"] / row["naive_tflops"]
        if torch is not None:
            try:
                dtype = torch.float16 if row["dtype"] == "fp16" else torch.bfloat16
                row["sdpa_tflops"] = sdpa_tflops(torch, dtype, row["head_dim"], row["causal"], row["L"])
                if row.get("flash_tflops"):
                    row["ratio_vs_sdpa"] = row["flash_tflops"] / row["sdpa_tflops"]
            except Exception as e:  # noqa: BLE001
                row["sdpa_error"] = str(e)
    result = {"sweep": [rows[k] for k in sorted(rows)],
              "torch": getattr(torch, "__version__", None),
              "device": torch.cuda.get_device_name() if torch is not None else None}
    target = rows.get(("fp16", 128, False, 4096))
    if target is not None:
        result["target_fp16_d128_L4096"] = {
            "tflops": target.get("flash_tflops"), "needs": 350.0,
            "ratio_vs_sdpa": target.get("ratio_vs_sdpa"), "needs_ratio": 0.8,
            "met": bool(target.get("flash_tflops", 0) >= 350.0 and
                        (target.get("ratio_vs_sdpa") or 0) >= 0.8)}
    if tests_path:
        try:
            with open(tests_path) as f:
                t = json.load(f)
            result["gpu_tests"] = {k: t.get(k) for k in ("tests", "failures", "disabled", "errors")}
        except (OSError, ValueError) as e:
            result["gpu_tests"] = {"error": str(e)}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'dtype':5} {'d':>4} {'causal':>6} {'L':>6} {'flash':>8} {'naive':>8} {'x naive':>8} {'sdpa':>8} {'x sdpa':>7}  kernel")
    for r in result["sweep"]:
        def f(x, w=8):
            return f"{x:{w}.1f}" if isinstance(x, (int, float)) else " " * (w - 1) + "-"
        def g(x, w=8):
            return f"{x:{w}.2f}" if isinstance(x, (int, float)) else " " * (w - 1) + "-"
        print(f"{r['dtype']:5} {r['head_dim']:4d} {int(r['causal']):6d} {r['L']:6d} {f(r.get('flash_tflops'))} "
              f"{f(r.get('naive_tflops'))} {g(r.get('ratio_vs_naive'))} {f(r.get('sdpa_tflops'))} "
              f"{g(r.get('ratio_vs_sdpa'), 7)}  {r.get('kernel', '')}")
    if "target_fp16_d128_L4096" in result:
        print("target fp16 d128 L4096 non-causal:", json.dumps(result["target_fp16_d128_L4096"]))
    print(f"results: {out_path}")


if __name__ == "__main__":
    main()
