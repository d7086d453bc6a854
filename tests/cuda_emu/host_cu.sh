#!/usr/bin/env bash
# Rewrites a CUDA source of kernels/cuda/ into host C++ for the emulation (README.md): each
# launch `kernel<<<grid, block, smem, stream>>>(args)` becomes
# `::emu::LaunchKernel(grid, block, smem, stream, kernel, args)` (shim/cuda_runtime_api.h);
# nothing else changes. Fails if the file has a `<<<` the rewrite did not consume.
# Usage: host_cu.sh IN OUT
set -euo pipefail
mkdir -p "$(dirname "$2")"
perl -0pe 's/([A-Za-z_][A-Za-z0-9_:<>]*)\s*<<<(.*?)>>>\s*\(/::emu::LaunchKernel($2, $1, /sg' "$1" > "$2.tmp"
if grep -q '<<<' "$2.tmp"; then
  echo "host_cu.sh: a launch in $1 was not rewritten" >&2
  exit 1
fi
mv "$2.tmp" "$2"
