#!/bin/bash
# The Node.js client test: installs the pinned @grpc/grpc-js and @grpc/proto-loader (npm ci,
# package-lock.json) into a work directory, starts attnserve, runs attend_test.js against it.
#   node_test.sh SERVER_BINARY WORK_DIR
# Exits 77 (skipped) when node or npm is not installed.
set -euo pipefail
server=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "node or npm not installed: skipped"
  exit 77
fi
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/attend_test.js" "$work/"
# npm ci is skipped when node_modules already matches the lock file (a second run is offline).
if ! cmp -s "$here/package-lock.json" "$work/node_modules/.attnserve-lock" 2> /dev/null; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$here/package-lock.json" "$work/node_modules/.attnserve-lock"
fi

tmp=$(mktemp -d)
"$server" --listen=127.0.0.1:0 --port_file="$tmp/port" --metrics_address= > "$tmp/log" 2>&1 &
pid=$!
trap 'kill $pid 2> /dev/null; wait $pid 2> /dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 600); do [[ -s $tmp/port ]] && break; sleep 0.05; done
[[ -s $tmp/port ]] || { echo "attnserve did not start"; cat "$tmp/log"; exit 1; }
node "$work/attend_test.js" "127.0.0.1:$(cat "$tmp/port")" "$root/proto"
