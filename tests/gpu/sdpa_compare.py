#!/usr/bin/env python3
"""Merges flash_bench's JSON lines with PyTorch SDPA timings taken in the same run.

usage: sdpa_compare.py flash_bench.jsonl gpu_results.json [gpu_tests.json]

For each shape flash_bench finished (dtype, head dim, causal, L; B = 4096 / L, 16 heads) it
reports the fused kernel's TFLOP/s, the cuBLAS naive attention's where measured, their ratio,
and, where torch is importable, torch.nn.functional.scaled_dot_product_attention's TFLOP/s
(layout [B, H, L, d], inputs drawn once per shape on the device, 1 warm-up + 3 timed calls
with CUDA events, median) with the ratio to it and the SDPA backend torch chose for that shape
(torch._fused_sdp_choice: flash_attention, efficient_attention, cudnn_attention, math).
gpu_results.json is rewritten after every shape, so a run cut short keeps what it measured.
"""
import json
import re
import sys

NAME = re.compile(r"(flash|naive)/(fp16|bf16)/d(\d+)/causal([01])/L(\d+)")
TOKENS = 4096
HEADS = 16
BACKENDS = {0: "math", 1: "flash_attention", 2: "efficient_attention", 3: "cudnn_attention",
            4: "overrideable"}


def sdpa(torch, dtype, d, causal, length):
    import torch.nn.functional as F
    b = TOKENS // length
    q, k, v = (torch.randn(b, HEADS, length, d, device="cuda", dtype=dtype) for _ in range(3))
    try:
        backend = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal)), "?")
    except Exception as e:  # noqa: BLE001 - a private API; report and carry on
        backend = f"unknown ({e.__class__.__name__})"
    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    times = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    flops = 4.0 * b * HEADS * length * length * d / (2.0 if causal else 1.0)
    return flops / times[len(times) // 2] / 1e12, backend


def read_bench(path):
    rows = {}
    try:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"sdpa_compare: no benchmark results ({e})")
        lines = []
    for bm in lines:
        m = NAME.fullmatch(bm["name"])  # not the windowed shapes: SDPA has no window
        if not m:
            continue
        impl, dt, d, causal, length = m.group(1), m.group(2), int(m.group(3)), m.group(4) == "1", int(m.group(5))
        key = (dt, d, causal, length)
        rows.setdefault(key, {"dtype": dt, "head_dim": d, "causal": causal, "L": length,
                              "B": TOKENS // length, "H": HEADS})
        rows[key][impl + "_tflops"] = bm.get("TFLOPS")
        rows[key][impl + "_ms"] = bm.get("median_ms")
        rows[key][impl + "_iters"] = bm.get("iters")
        if impl == "flash":
            rows[key]["kernel"] = bm.get("kernel", "")
        if rows[key].get("flash_tflops") and rows[key].get("naive_tflops"):
            rows[key]["ratio_vs_naive"] = rows[key]["flash_tflops"] / rows[key]["naive_tflops"]
    return rows


def write(result, out_path):
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


def main():
    bench_path, out_path = sys.argv[1], sys.argv[2]
    tests_path = sys.argv[3] if len(sys.argv) > 3 else None
    rows = read_bench(bench_path)
    result = {"sweep": [rows[k] for k in rows], "torch": None, "device": None}
    if tests_path:
        try:
            with open(tests_path) as f:
                t = json.load(f)
            result["gpu_tests"] = {k: t.get(k) for k in ("tests", "failures", "disabled", "errors")}
        except (OSError, ValueError) as e:
            result["gpu_tests"] = {"error": str(e)}
    write(result, out_path)
    torch = None
    try:
        import torch as _torch
        if _torch.cuda.is_available():
            torch = _torch
            torch.backends.cuda.matmul.allow_tf32 = False
            result["torch"] = torch.__version__
            result["device"] = torch.cuda.get_device_name()
    except Exception as e:  # noqa: BLE001 - report and carry on without SDPA
        print(f"sdpa_compare: torch not usable ({e}); no SDPA ratios")
    print(f"{'dtype':5} {'d':>4} {'causal':>6} {'L':>6} {'flash':>8} {'naive':>8} {'x naive':>8} "
          f"{'sdpa':>8} {'x sdpa':>7}  kernel / sdpa backend", flush=True)
    for key in rows:  # flash_bench's order: most valuable first
        row = rows[key]
        if torch is not None and row.get("flash_tflops"):
            try:
                dtype = torch.float16 if row["dtype"] == "fp16" else torch.bfloat16
                row["sdpa_tflops"], row["sdpa_backend"] = sdpa(torch, dtype, row["head_dim"],
                                                               row["causal"], row["L"])
                row["ratio_vs_sdpa"] = row["flash_tflops"] / row["sdpa_tflops"]
            except Exception as e:  # noqa: BLE001
                row["sdpa_error"] = str(e)
        write(result, out_path)

        def f(x, w=8):
            return f"{x:{w}.1f}" if isinstance(x, (int, float)) else " " * (w - 1) + "-"

        def g(x, w=8):
            return f"{x:{w}.2f}" if isinstance(x, (int, float)) else " " * (w - 1) + "-"
        print(f"{row['dtype']:5} {row['head_dim']:4d} {int(row['causal']):6d} {row['L']:6d} "
              f"{f(row.get('flash_tflops'))} {f(row.get('naive_tflops'))} "
              f"{g(row.get('ratio_vs_naive'))} {f(row.get('sdpa_tflops'))} "
              f"{g(row.get('ratio_vs_sdpa'), 7)}  {row.get('kernel', '')} / "
              f"{row.get('sdpa_backend', '-')}", flush=True)
    target = rows.get(("fp16", 128, False, 4096))
    if target is not None:
        result["target_fp16_d128_L4096"] = {
            "tflops": target.get("flash_tflops"), "needs": 350.0,
            "ratio_vs_sdpa": target.get("ratio_vs_sdpa"), "needs_ratio": 0.8,
            "met": bool((target.get("flash_tflops") or 0) >= 350.0 and
                        (target.get("ratio_vs_sdpa") or 0) >= 0.8)}
        print("target fp16 d128 L4096 non-causal:", json.dumps(result["target_fp16_d128_L4096"]))
    write(result, out_path)
    print(f"results: {out_path}")


if __name__ == "__main__":
    main()
