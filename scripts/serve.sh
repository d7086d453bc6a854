#!/usr/bin/env bash
# Installs what is needed, builds attnserve (Release) and starts the server in the foreground
# on 0.0.0.0:50051 (CPU backend when there is no GPU). Extra arguments go to the server:
#   scripts/serve.sh --listen=127.0.0.1:6000 --module=bert=/models/bert.safetensors:12
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target attnserve attnserve-cli
exec build-release/server/attnserve "$@"
