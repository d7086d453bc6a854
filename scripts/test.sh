#!/usr/bin/env bash
# Installs everything needed, builds attnserve (CUDA too when nvcc is present) and runs every
# test. The one test command: README.md and .ci/run both call exactly this.
#   scripts/test.sh            # build/ (RelWithDebInfo), all tests
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# buf (pinned in proto/package-lock.json) for the proto lint test.
(cd proto && npm ci --no-audit --no-fund --loglevel=error)

cmake --preset default
cmake --build --preset default
ctest --preset default
