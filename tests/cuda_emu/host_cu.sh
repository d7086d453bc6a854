#!/usr/bin/env bash
# Rewrites a CUDA source of kernels/cuda/ into host C++ for the emulation (README.md): each
# launch `kernel<<<grid, block, smem, stream>>>(args)` becomes
# `::emu::LaunchKernel(::emu::KernelLaunch{}, grid, block, smem, stream, kernel, args)`
# (shim/cuda_runtime_api.h), and a static `__shared__` declaration (not `extern __shared__`,
# the dynamic shared memory emu.cc provides) into a function-local `static`: one object per
# kernel specialisation that every thread of a block names (blocks run one at a time); unlike
# the dynamic shared memory it is neither NaN-filled nor poisoned at a block's start.
# Nothing else changes. Fails if the file has a `<<<` the rewrite did not consume.
# Usage: host_cu.sh IN OUT
set -euo pipefail
mkdir -p "$(dirname "$2")"
perl -0pe 's/([A-Za-z_][A-Za-z0-9_:<>]*)\s*<<<(.*?)>>>\s*\(/::emu::LaunchKernel(::emu::KernelLaunch{}, $2, $1, /sg;
            s/(?<!extern )\b__shared__\b/static/g' "$1" > "$2.tmp"
if grep -q '<<<' "$2.tmp"; then
  echo "host_cu.sh: a launch in $1 was not rewritten" >&2
  exit 1
fi
mv "$2.tmp" "$2"
