#!/usr/bin/env bash
# Lints the proto with the pinned buf. Exit 77 (ctest: skipped) when buf is not installed.
set -euo pipefail
cd "$1"
if [[ ! -x node_modules/.bin/buf ]]; then
  echo "buf is not installed: run 'npm ci' in proto/ (scripts/test.sh does)" >&2
  exit 77
fi
node_modules/.bin/buf lint
echo "buf lint: ok"
