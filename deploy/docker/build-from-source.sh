#!/bin/sh
# The Dockerfile's build stages: compiles the server, attnserve-cli, attnserve-bench and the
# health probe (Release, no tests) and stages them with stage-binaries.sh.
#
#   build-from-source.sh SRC DEST [CMAKE_ARGS...]     e.g. -DATTNSERVE_CUDA=OFF
# JOBS (default 0: all cores) bounds the parallel compile.
set -eu
src=$1
dest=$2
shift 2
jobs=${JOBS:-0}
[ "$jobs" -gt 0 ] || jobs=$(nproc)
cmake -S "$src" -B /tmp/attnserve-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DATTNSERVE_BUILD_TESTS=OFF -DATTNSERVE_BUILD_BENCHMARKS=OFF "$@"
cmake --build /tmp/attnserve-build -j "$jobs" --target attnserve attnserve-cli attnserve-bench
cmake -S "$src/deploy/health-probe" -B /tmp/attnserve-probe-build -G Ninja \
  -DCMAKE_BUILD_TYPE=Release
cmake --build /tmp/attnserve-probe-build -j "$jobs"
plugin=$(find /tmp/attnserve-build -name libattnserve_cuda.so -type f | head -n1)
"$src/deploy/docker/stage-binaries.sh" "$dest" \
  /tmp/attnserve-build/server/attnserve \
  /tmp/attnserve-build/client/attnserve-cli \
  /tmp/attnserve-build/client/bench/attnserve-bench \
  /tmp/attnserve-probe-build/attnserve-health-probe \
  "$plugin"
