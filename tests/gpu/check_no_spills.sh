#!/usr/bin/env bash
# Compiles the CUDA attention kernels with `ptxas -v` for sm_80 and sm_90 and fails if any
# kernel reports spill stores or spill loads (local-memory traffic in the inner loop would cost
# far more than it saves). Needs nvcc only, no GPU: registered with ctest (label "cuda").
#
#   tests/gpu/check_no_spills.sh [path/to/nvcc] [repository root]
set -euo pipefail
NVCC=${1:-/usr/local/cuda/bin/nvcc}
ROOT=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

SOURCES=(
  flash_fwd_hdim32_fp16.cu flash_fwd_hdim32_bf16.cu
  flash_fwd_hdim64_fp16.cu flash_fwd_hdim64_bf16.cu
  flash_fwd_hdim96_fp16.cu flash_fwd_hdim96_bf16.cu
  flash_fwd_hdim128_fp16.cu flash_fwd_hdim128_bf16.cu
  flash_fwd_hdim160_fp16.cu flash_fwd_hdim160_bf16.cu
  flash_fwd_hdim192_fp16.cu flash_fwd_hdim192_bf16.cu
  flash_fwd_hdim256_fp16.cu flash_fwd_hdim256_bf16.cu
  flash_fwd_generic_fp16.cu flash_fwd_generic_bf16.cu
  naive_attention.cu elementwise.cu flash_decode.cu paged_attention.cu
)
status=0
for src in "${SOURCES[@]}"; do
  log="$TMP/${src%.cu}.log"
  "$NVCC" -std=c++17 --expt-relaxed-constexpr -I"$ROOT" -c "$ROOT/kernels/cuda/$src" \
    -o "$TMP/${src%.cu}.o" -Xptxas -v \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 >"$log" 2>&1 || {
    cat "$log"; echo "FAIL: $src did not compile"; exit 1; }
  entries=$(grep -c "Compiling entry function" "$log" || true)
  if [[ "$entries" -eq 0 ]]; then
    cat "$log"; echo "FAIL: no ptxas resource report for $src"; exit 1
  fi
  # ptxas prints, per entry function: "N bytes stack frame, S bytes spill stores, L bytes spill loads".
  bad=$(grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$log" || true)
  regs=$(grep -oE "Used [0-9]+ registers" "$log" | awk '{print $2}' | sort -n | tail -1)
  if [[ -n "$bad" ]]; then
    echo "FAIL: $src spills:"; grep -B2 -E "[1-9][0-9]* bytes spill" "$log"; status=1
  else
    echo "ok   $src: $entries kernels x arch, no spills (max $regs registers)"
  fi
done
exit $status
