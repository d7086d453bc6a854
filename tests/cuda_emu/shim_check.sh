#!/usr/bin/env bash
# The emulator's shim of kernels/cuda/device_utils.h replaces only the inline-PTX wrappers: from
# "Two floats -> one register" to the end, it must be the real file's text, so that the helpers
# without PTX (PackPair, ToFloat, the shuffle reductions) the emulated kernels run are the real
# ones. Usage: shim_check.sh REPO_ROOT
set -euo pipefail
cd "$1"
tail_of() { sed -n '/^\/\/ Two floats -> one register/,$p' "$1"; }
real=$(tail_of kernels/cuda/device_utils.h)
shim=$(tail_of tests/cuda_emu/shim/kernels/cuda/device_utils.h)
if [[ -z "$real" ]]; then
  echo "kernels/cuda/device_utils.h: marker line not found; update shim_check.sh" >&2
  exit 1
fi
if [[ "$real" != "$shim" ]]; then
  echo "tests/cuda_emu/shim/kernels/cuda/device_utils.h differs from kernels/cuda/device_utils.h" >&2
  diff <(echo "$real") <(echo "$shim") >&2 || true
  exit 1
fi
echo "shim: the non-PTX helpers match kernels/cuda/device_utils.h"
