#!/usr/bin/env bash
# Installs everything needed, builds attnserve (CUDA too when nvcc is present) and runs every
# test. The one test command: README.md and .ci/run both call exactly this. At the end it prints
# what the run cost (the slowest tests, the time per label) and checks that every test has
# exactly one tier label (tests/README.md).
#   scripts/test.sh            # build/ (RelWithDebInfo), all tests
# For the edit loop, on a build already made: ctest --preset unit (the unit tier alone).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# buf (pinned in proto/package-lock.json) for the proto lint test.
(cd proto && npm ci --no-audit --no-fund --loglevel=error)

cmake --preset default
cmake --build --preset default
rc=0
ctest --preset default || rc=$?
/usr/bin/python3 tests/ctest_cost.py build
/usr/bin/python3 tests/tiers_check.py build || rc=1
exit "$rc"
