"""Runs, side by side in one go on this machine: attnserve's CPU backend (multi-head module and
attention alone, tests/bench/cpu_backend_bench) on float32 and on bfloat16 requests, OpenBLAS
sgemm at the projection's size (the float32 ceiling), oneDNN's bfloat16 matmul at the same size
(the bfloat16 ceiling) and PyTorch's torch.nn.MultiheadAttention(batch_first=True) in inference
mode with need_weights=False, in float32 and, where it runs, in bfloat16, all on the same number
of threads, and prints GFLOP/s, ratios and the instruction set each path used.

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
    modules, modules16 = {}, {}
    for (b, l, d, h) in SHAPES:
        torch.manual_seed(0)
        modules[(b, l, d, h)] = (torch.nn.MultiheadAttention(d, h, batch_first=True).eval(),
                                 torch.randn(b, l, d))
        try:  # bfloat16 where this PyTorch runs it on the CPU
            m16 = torch.nn.MultiheadAttention(d, h, batch_first=True).eval().to(torch.bfloat16)
            x16 = torch.randn(b, l, d).to(torch.bfloat16)
            with torch.inference_mode():
                m16(x16, x16, x16, need_weights=False)
            modules16[(b, l, d, h)] = (m16, x16)
        except (RuntimeError, TypeError) as e:
            print(f"torch bfloat16 {(b, l, d, h)}: not run ({e})".splitlines()[0])
    return torch, modules, modules16


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
    torch, modules, modules16 = make_torch(threads)
    rows = {shape: [] for shape in SHAPES}  # per round: GFLOP/s, ms, MiB of every contender
    sgemms, onednns = [], []
    labels = {}
    cpu_rate = lambda bm: bm["GFLOP/s"] * bm["real_time"] / bm["cpu_time"] * threads
    for _ in range(ROUNDS):
        ceil = run_ours(binary, threads, "BM_Sgemm/4096/1536/512/|BM_OneDnnBf16/4096/1536/512/")
        sgemm, onednn = ceil["BM_Sgemm/4096/1536/512/0"], ceil["BM_OneDnnBf16/4096/1536/512/0"]
        labels["onednn"] = onednn.get("label", "")
        sgemms.append(sgemm["GFLOP/s"])
        onednns.append(onednn["GFLOP/s"])
        for shape in SHAPES:
            key = "/".join(map(str, shape))
            ours = run_ours(binary, threads, f"BM_(MultiHead|Attention)(Bf16)?/{key}/")
            t, t_cpu = time_torch(torch, *modules[shape])
            t16, t16_cpu = time_torch(torch, *modules16[shape]) if shape in modules16 else (0, 0)
            mha, attn = ours[f"BM_MultiHead/{key}"], ours[f"BM_Attention/{key}"]
            mha16, attn16 = ours[f"BM_MultiHeadBf16/{key}"], ours[f"BM_AttentionBf16/{key}"]
            for name, bm in (("mha", mha), ("attn", attn), ("mha16", mha16), ("attn16", attn16)):
                labels[name] = bm.get("label", "")
            flops = multi_head_flops(*shape)
            rows[shape].append({
                # CPU-normalised rate: flops per (process CPU time / threads), what the run would
                # reach with the threads' cores to itself (spinning threads count against their
                # owner).
                "mha_cpu": cpu_rate(mha), "attn_cpu": cpu_rate(attn),
                "mha16_cpu": cpu_rate(mha16), "attn16_cpu": cpu_rate(attn16),
                "torch_cpu": flops / (t_cpu / threads) / 1e9,
                "torch16_cpu": flops / (t16_cpu / threads) / 1e9 if t16 else float("nan"),
                "sgemm_cpu": cpu_rate(sgemm), "onednn_cpu": cpu_rate(onednn),
                "mha": mha["GFLOP/s"], "attn": attn["GFLOP/s"],
                "mha16": mha16["GFLOP/s"], "attn16": attn16["GFLOP/s"],
                "torch": flops / t / 1e9,
                "torch16": flops / t16 / 1e9 if t16 else float("nan"),
                "sgemm": sgemm["GFLOP/s"], "onednn": onednn["GFLOP/s"],
                "mha_ms": mha["real_time"], "mha16_ms": mha16["real_time"],
                "torch_ms": t * 1e3,
                "mha_mib": mha["peak_extra_MiB"], "attn_mib": attn["peak_extra_MiB"],
                "mha16_mib": mha16["peak_extra_MiB"], "attn16_mib": attn16["peak_extra_MiB"],
            })
    once = run_ours(binary, threads,
                    "BM_Sgemm/4096/512/512/|16384|BM_AttentionIsa|BM_AttentionBf16Path", 0.5)
    tiles = run_ours(binary, 1, "BM_OneDnnBf16/(64|256)/|BM_AttentionBf16Path/3", 0.5)

    med = statistics.median
    print(f"threads: {threads}; torch {torch.__version__}; medians of {ROUNDS} rounds "
          "(ratios taken within each round)")
    print(f"OpenBLAS sgemm 4096x1536x512 (fp32 ceiling): {med(sgemms):7.1f} GFLOP/s "
          f"(rounds: {', '.join(f'{g:.0f}' for g in sgemms)})")
    print(f"oneDNN bf16 4096x1536x512 (bf16 ceiling):    {med(onednns):7.1f} GFLOP/s "
          f"(rounds: {', '.join(f'{g:.0f}' for g in onednns)}; {labels['onednn']})")
    print(f"OpenBLAS sgemm 4096x512x512:                 "
          f"{once['BM_Sgemm/4096/512/512/0']['GFLOP/s']:7.1f} GFLOP/s")
    print("paths: fp32 MHA", labels["mha"], "| fp32 attention", labels["attn"],
          "| bf16 MHA", labels["mha16"], "| bf16 attention", labels["attn16"])
    print()

    def table(title, sfx):
        print(title)
        print(f"{'(B, L, d_model, h)':<22}{'MHA32':>8}{'att32':>8}{'MHA16':>8}{'att16':>8}"
              f"{'torch32':>9}{'torch16':>9}{'sgemm':>8}{'oneDNN':>8}"
              f"{'M16/sg':>8}{'M16/dnn':>8}{'a16/sg':>8}{'a16/dnn':>8}{'M32/sg':>8}"
              f"{'M16/M32':>8}{'M16/t16':>8}{'M32/t32':>8}")
        for shape in SHAPES:
            r = rows[shape]
            f = lambda k: med(x[k + sfx] for x in r)
            ratio = lambda a, b: med(x[a + sfx] / x[b + sfx] for x in r)
            print(f"{str(shape):<22}{f('mha'):8.1f}{f('attn'):8.1f}{f('mha16'):8.1f}"
                  f"{f('attn16'):8.1f}{f('torch'):9.1f}{f('torch16'):9.1f}{f('sgemm'):8.1f}"
                  f"{f('onednn'):8.1f}{ratio('mha16', 'sgemm'):8.2f}{ratio('mha16', 'onednn'):8.2f}"
                  f"{ratio('attn16', 'sgemm'):8.2f}{ratio('attn16', 'onednn'):8.2f}"
                  f"{ratio('mha', 'sgemm'):8.2f}{ratio('mha16', 'mha'):8.2f}"
                  f"{ratio('mha16', 'torch16'):8.2f}{ratio('mha', 'torch'):8.2f}")
        print()

    table("Wall clock GFLOP/s:", "")
    table("CPU-normalised (flops per process CPU-second x threads: the rate with the cores to "
          "itself; robust to other load, but spinning counts against its owner):", "_cpu")
    print(f"{'(B, L, d_model, h)':<22}{'MHA32 ms':>9}{'MHA16 ms':>9}{'torch ms':>9}"
          f"{'MHA32 MiB':>10}{'att32 MiB':>10}{'MHA16 MiB':>10}{'att16 MiB':>10}")
    for shape in SHAPES:
        r = rows[shape]
        f = lambda k: med(x[k] for x in r)
        print(f"{str(shape):<22}{f('mha_ms'):9.2f}{f('mha16_ms'):9.2f}{f('torch_ms'):9.2f}"
              f"{f('mha_mib'):10.1f}{f('attn_mib'):10.1f}{f('mha16_mib'):10.1f}"
              f"{f('attn16_mib'):10.1f}")
    print("\nPer round at (4, 1024, 512, 8) (a busy machine shows as the ceilings far below their "
          "best):")
    for n, x in enumerate(rows[(4, 1024, 512, 8)]):
        print(f"  round {n + 1}: sgemm {x['sgemm']:6.1f} oneDNN {x['onednn']:6.1f}  MHA32 "
              f"{x['mha']:6.1f} att32 {x['attn']:6.1f}  MHA16 {x['mha16']:6.1f} att16 "
              f"{x['attn16']:6.1f}   M16/sg {x['mha16'] / x['sgemm']:.2f} M16/dnn "
              f"{x['mha16'] / x['onednn']:.2f} a16/sg {x['attn16'] / x['sgemm']:.2f} a16/dnn "
              f"{x['attn16'] / x['onednn']:.2f}")
    print()
    for name in ("BM_Attention/1/16384/64/1", "BM_MultiHead/1/16384/64/1",
                 "BM_AttentionBf16/1/16384/64/1", "BM_MultiHeadBf16/1/16384/64/1"):
        bm = once[name]
        print(f"{name}: {bm['GFLOP/s']:.1f} GFLOP/s, {bm['real_time']:.1f} ms, "
              f"peak extra memory {bm['peak_extra_MiB']:.1f} MiB (heap), "
              f"{bm['peak_rss_extra_MiB']:.1f} MiB (resident)")
    for isa, name in ((3, "avx512"), (2, "avx2"), (1, "generic")):
        key = f"BM_AttentionIsa/{isa}"
        if key in once:
            print(f"fp32 attention (1, 1024, 512, 8) forced to {name:>11}: "
                  f"{once[key]['GFLOP/s']:6.1f} GFLOP/s")
    for path, name in ((3, "amx_bf16"), (2, "avx512_bf16")):
        key = f"BM_AttentionBf16Path/{path}"
        if key in once:
            print(f"bf16 attention (4, 1024, 512, 8) forced to {name:>11}: "
                  f"{once[key]['GFLOP/s']:6.1f} GFLOP/s")
    print("\nOne thread: the attention core's products as oneDNN calls (M x N x K) against the "
          "whole AMX attention (products, softmax, packing):")
    for key, bm in sorted(tiles.items()):
        print(f"  {key}: {bm['GFLOP/s']:7.1f} GFLOP/s, {bm['real_time'] * 1e3:8.1f} us per call "
              f"({bm.get('label', '')})")
    print("(GFLOP/s: attention 4·B·h·L²·d_k, each projection 2·B·L·d_model²; MiB: peak extra "
          "memory of one call, bytes live through operator new)")


if __name__ == "__main__":
    main()
