"""PyTorch attending over a cached K/V tensor in a loop: the comparison for paged_decode_bench.

The same decode step as paged_decode_bench's: `seqs` sequences x `context` cached keys, one new
query row each, Hq query heads over Hkv kv heads (GQA), D = Dv. PyTorch 1.13 (Debian's) has no
scaled_dot_product_attention, so the step is matmul + softmax + matmul over a dense
[seqs, Hkv, context, D] cache (the query heads of a group batched as rows: K and V read once,
no repeat_interleave), softmax in float32. Bytes counted as in paged_decode_bench: every K and V
element once per step.

Usage: decode_torch.py THREADS [REPS] [SEQS] [CONTEXT] [HQ] [HKV] [D] [DTYPES]
Prints one line per dtype: "torch dtype=... mode=... gbps_median=... gbps_best=...". mode=native:
the matmuls in the cache's dtype; widened_per_step: that failed (float16: PyTorch 1.13 has no
float16 CPU matmul), so the step widens K and V to float32 itself.
"""
import statistics
import sys
import time

import torch


def main():
    args = sys.argv[1:]
    threads = int(args[0])
    reps = int(args[1]) if len(args) > 1 else 7
    seqs, context, hq, hkv, d = (int(a) for a in (args[2:7] if len(args) > 6 else (64, 4096, 32, 8, 128)))
    dtypes = args[7].split(",") if len(args) > 7 else ["float16", "bfloat16", "float32"]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    group = hq // hkv
    scale = d ** -0.5
    print(f"torch_version {torch.__version__} threads={torch.get_num_threads()}", flush=True)
    for name in dtypes:
        dtype = getattr(torch, name)
        k = torch.randn(seqs, hkv, context, d).to(dtype)
        v = torch.randn(seqs, hkv, context, d).to(dtype)
        q = torch.randn(seqs, hkv, group, d).to(dtype)

        def step():
            s = torch.matmul(q, k.transpose(-1, -2)).float() * scale
            p = torch.softmax(s, dim=-1).to(dtype)
            return torch.matmul(p, v)

        def step_widened():
            # The cache widened to float32 inside the step (what a CPU float16 cache costs in
            # PyTorch 1.13, which has no float16 CPU matmul).
            s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
            return torch.matmul(torch.softmax(s, dim=-1), v.float())

        mode = "native"
        try:
            step()
        except RuntimeError as e:  # e.g. "addmm_impl_cpu_" not implemented for 'Half'
            print(f"torch dtype={name} native_error='{str(e).splitlines()[0].replace(chr(34), '')}'", flush=True)
            step, mode = step_widened, "widened_per_step"
            step()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        gb = 2.0 * seqs * context * hkv * d * k.element_size() / 1e9
        med, best = statistics.median(times), min(times)
        print(f"torch dtype={name} mode={mode} threads={threads} seqs={seqs} context={context} hq={hq} "
              f"hkv={hkv} d={d} kv_gb={gb:.3f} ms_median={1e3 * med:.2f} ms_best={1e3 * best:.2f} "
              f"gbps_median={gb / med:.2f} gbps_best={gb / best:.2f}", flush=True)
        del k, v, q


if __name__ == "__main__":
    main()
