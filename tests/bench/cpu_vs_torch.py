"""Runs, side by side in one go on this machine: attnserve's CPU backend (multi-head module and
attention alone, tests/bench/cpu_backend_bench), OpenBLAS sgemm at the projection's size (the
practical ceiling) and PyTorch's torch.nn.MultiheadAttention(batch_first=True) in inference mode
with need_weights=False, all on the same number of threads, and prints GFLOP/s and ratios.

Run through cpu_vs_torch.sh (which installs Debian's python3-torch and builds the benchmark), or
directly: /usr/bin/python3 tests/bench/cpu_vs_torch.py BENCH_BINARY [THREADS]
"""
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = [(4, 128, 512, 8), (4, 1024, 512, 8), (1, 4096, 512, 8), (1, 4096, 1024, 8)]
# The machine may be shared and its speed drift by the minute, so the contenders are measured
# back to back, shape by shape: each round runs sgemm, then for every shape ours and PyTorch in
# turn. Ratios are taken within a round and the medians over ROUNDS are printed.
ROUNDS = 5


def multi_head_flops(b, l, d, h):
    # 4 projections of 2·B·L·d² plus attention 4·B·L²·d (= 4·B·h·L²·d_k).
    return 4 * 2.0 * b * l * d * d + 4.0 * b * l * l * d


def run_ours(binary, threads, regex, min_time=0.3):
    """One run of the benchmarks matching regex: {name: benchmark json}."""
    out = subprocess.run(
        [binary, f"--threads={threads}", "--benchmark_format=json",
         f"--benchmark_filter={regex}", f"--benchmark_min_time={min_time}"],
        check=True, capture_output=True, text=True).stdout
    results = {}
    for bm in json.loads(out)["benchmarks"]:
        if "GFLOP/s" in bm:  # skipped benchmarks (an ISA this CPU lacks) have no counters
            results[bm["run_name"].split("/process_time")[0]] = bm
    return results


def make_torch(threads):
    import torch
    torch.set_num_threads(threads)
    modules = {}
    for (b, l, d, h) in SHAPES:
        torch.manual_seed(0)
        modules[(b, l, d, h)] = (torch.nn.MultiheadAttention(d, h, batch_first=True).eval(),
                                 torch.randn(b, l, d))
    return torch, modules


def time_torch(torch, mha, x):
    """Median (wall seconds, process CPU seconds) per call of mha(x, x, x, need_weights=False)
    in inference mode."""
    times, cpu = [], []
    with torch.inference_mode():
        mha(x, x, x, need_weights=False)
        deadline = time.perf_counter() + 1.0
        while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 30):
            t0, c0 = time.perf_counter(), time.process_time()
            mha(x, x, x, need_weights=False)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def main():
    binary = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    torch, modules = make_torch(threads)
    rows = {shape: [] for shape in SHAPES}  # per round: (mha, attn, torch, sgemm) GFLOP/s, ms
    sgemms = []
    for _ in range(ROUNDS):
        sgemm = run_ours(binary, threads, "BM_Sgemm/4096/1536/512/")["BM_Sgemm/4096/1536/512/0"]
        sgemms.append(sgemm["GFLOP/s"])
        # CPU-normalised rate: flops per (process CPU time / threads), what the run would reach
        # with the threads' cores to itself (spinning threads count against their owner).
        sgemm_cpu = sgemm["GFLOP/s"] * sgemm["real_time"] / sgemm["cpu_time"] * threads
        for shape in SHAPES:
            key = "/".join(map(str, shape))
            ours = run_ours(binary, threads, f"BM_(MultiHead|Attention)/{key}/")
            t, t_cpu = time_torch(torch, *modules[shape])
            mha, attn = ours[f"BM_MultiHead/{key}"], ours[f"BM_Attention/{key}"]
            rows[shape].append({
                "mha_cpu": mha["GFLOP/s"] * mha["real_time"] / mha["cpu_time"] * threads,
                "attn_cpu": attn["GFLOP/s"] * attn["real_time"] / attn["cpu_time"] * threads,
                "torch_cpu": multi_head_flops(*shape) / (t_cpu / threads) / 1e9,
                "sgemm_cpu": sgemm_cpu,
                "mha": ours[f"BM_MultiHead/{key}"]["GFLOP/s"],
                "attn": ours[f"BM_Attention/{key}"]["GFLOP/s"],
                "torch": multi_head_flops(*shape) / t / 1e9,
                "sgemm": sgemm["GFLOP/s"],
                "mha_ms": ours[f"BM_MultiHead/{key}"]["real_time"],
                "torch_ms": t * 1e3,
                "mha_mib": ours[f"BM_MultiHead/{key}"]["peak_extra_MiB"],
                "attn_mib": ours[f"BM_Attention/{key}"]["peak_extra_MiB"],
            })
    once = run_ours(binary, threads, "BM_Sgemm/4096/512/512/|16384|BM_AttentionIsa", 0.5)

    med = statistics.median
    print(f"threads: {threads}; torch {torch.__version__}; medians of {ROUNDS} rounds "
          "(ratios taken within each round)")
    print(f"OpenBLAS sgemm 4096x1536x512 (the ceiling): {med(sgemms):7.1f} GFLOP/s "
          f"(rounds: {', '.join(f'{g:.0f}' for g in sgemms)})")
    print(f"OpenBLAS sgemm 4096x512x512:                "
          f"{once['BM_Sgemm/4096/512/512/0']['GFLOP/s']:7.1f} GFLOP/s")
    print()
    print(f"{'(B, L, d_model, h)':<22}{'ours MHA':>10}{'attn':>9}{'torch':>9}"
          f"{'MHA/sgemm':>11}{'attn/sgemm':>11}{'MHA/torch':>11}{'MHA ms':>9}{'torch ms':>10}"
          f"{'MHA MiB':>9}{'attn MiB':>9}")
    for shape in SHAPES:
        r = rows[shape]
        f = lambda k: med(x[k] for x in r)
        ratio = lambda a, b: med(x[a] / x[b] for x in r)
        print(f"{str(shape):<22}{f('mha'):10.1f}{f('attn'):9.1f}{f('torch'):9.1f}"
              f"{ratio('mha', 'sgemm'):11.2f}{ratio('attn', 'sgemm'):11.2f}"
              f"{ratio('mha', 'torch'):11.2f}{f('mha_ms'):9.2f}{f('torch_ms'):10.2f}"
              f"{f('mha_mib'):9.1f}{f('attn_mib'):9.1f}")
    print("\nCPU-normalised (flops per process CPU-second x threads: the rate with the cores to "
          "itself; robust to other load, but spinning counts against its owner):")
    print(f"{'(B, L, d_model, h)':<22}{'ours MHA':>10}{'attn':>9}{'torch':>9}{'sgemm':>9}"
          f"{'MHA/sgemm':>11}{'attn/sgemm':>11}{'MHA/torch':>11}")
    for shape in SHAPES:
        r = rows[shape]
        f = lambda k: med(x[k] for x in r)
        ratio = lambda a, b: med(x[a] / x[b] for x in r)
        print(f"{str(shape):<22}{f('mha_cpu'):10.1f}{f('attn_cpu'):9.1f}{f('torch_cpu'):9.1f}"
              f"{f('sgemm_cpu'):9.1f}{ratio('mha_cpu', 'sgemm_cpu'):11.2f}"
              f"{ratio('attn_cpu', 'sgemm_cpu'):11.2f}{ratio('mha_cpu', 'torch_cpu'):11.2f}")
    print("\nPer round at (4, 1024, 512, 8) (sgemm / ours MHA / ours attention / torch GFLOP/s; "
          "a busy machine shows as sgemm far below its best):")
    for n, x in enumerate(rows[(4, 1024, 512, 8)]):
        print(f"  round {n + 1}: sgemm {x['sgemm']:6.1f}  MHA {x['mha']:6.1f}  attn {x['attn']:6.1f}"
              f"  torch {x['torch']:6.1f}   MHA/sgemm {x['mha'] / x['sgemm']:.2f}  attn/sgemm "
              f"{x['attn'] / x['sgemm']:.2f}  MHA/torch {x['mha'] / x['torch']:.2f}")
    print()
    for name in ("BM_Attention/1/16384/64/1", "BM_MultiHead/1/16384/64/1"):
        bm = once[name]
        print(f"{name}: {bm['GFLOP/s']:.1f} GFLOP/s, {bm['real_time']:.1f} ms, "
              f"peak extra memory {bm['peak_extra_MiB']:.1f} MiB (heap), "
              f"{bm['peak_rss_extra_MiB']:.1f} MiB (resident)")
    for isa, name in ((3, "avx512"), (2, "avx2"), (1, "generic")):
        key = f"BM_AttentionIsa/{isa}"
        if key in once:
            print(f"attention (1, 1024, 512, 8) forced to {name:>7}: "
                  f"{once[key]['GFLOP/s']:6.1f} GFLOP/s")
    print("(GFLOP/s: attention 4·B·h·L²·d_k, each projection 2·B·L·d_model²; MiB: peak extra "
          "memory of one call, bytes live through operator new)")


if __name__ == "__main__":
    main()
