#!/usr/bin/env bash
# Collects what tests/gpu/run_h200.sh needs on a GPU machine into BUILD/gpu_bundle: the two
# standalone executables and the shared libraries they need that a CUDA image may lack (Abseil,
# Google Benchmark, ...). System libraries (libc, libstdc++, ...) and the CUDA libraries
# (libcuda from the driver, cuBLAS/cuBLASLt 13 from the machine's CUDA 13) are not copied; the
# CUDA runtime is linked statically.
#
#   tests/gpu/make_bundle.sh [build folder, default build-cuda]
set -euo pipefail
BUILD=${1:-build-cuda}
DEST="$BUILD/gpu_bundle"
rm -rf "$DEST"
mkdir -p "$DEST/lib"
for exe in cuda_backend_test flash_bench; do
  path=$(find "$BUILD" -maxdepth 3 -type f -name "$exe" -perm -u+x | head -1)
  [[ -n "$path" ]] || { echo "make_bundle: $exe not built in $BUILD"; exit 1; }
  cp "$path" "$DEST/"
  ldd "$path" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      libcuda.so*|libcublas*|libcudart*) ;;
      *) cp -L "$lib" "$DEST/lib/" ;;
    esac
  done
done
du -sh "$DEST"
