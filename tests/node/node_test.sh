#!/bin/bash
# The Node.js package client/node as a user gets it: `npm pack`, the tarball installed into an
# empty folder (its npm-shrinkwrap.json pins @grpc/grpc-js, @grpc/proto-loader and everything
# under them), and attend_test.js run there against a live attnserve; types_check.ts compiled
# against the installed index.d.ts with the package's pinned TypeScript, and codec_test.js
# checks its float16/bfloat16 conversions against NumPy's, throttle_test.js its client-side
# throttling (tests/testing/throttle_cases.json, fake stubs, an in-process grpc-js server);
# routing_test.js then gives a client two more servers and checks decode sessions are routed to
# their owners, and moves_test.js three more (A with --session_peers naming B and C) and checks
# sessions moved between them are followed. Checks first that the package's version is the server's, and its lock file names no registry (no "resolved" URLs: npm fetches
# from whatever registry it is set to).
#   node_test.sh SERVER_BINARY WORK_DIR VERSION
# Exits 77 (skipped) when node or npm is not installed.
set -euo pipefail
server=$1
work=$2
version=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
package=$root/client/node
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "node or npm not installed: skipped"
  exit 77
fi
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false \
  npm_config_loglevel=error npm_config_prefer_offline=true

got=$(node -p "require('$package/package.json').version")
if [[ $got != "$version" ]]; then
  echo "client/node/package.json has version $got, the server $version"
  exit 1
fi
if grep -n '"resolved"' "$package/npm-shrinkwrap.json"; then
  echo "client/node/npm-shrinkwrap.json names registry URLs: strip the \"resolved\" fields"
  exit 1
fi

rm -rf "$work"
mkdir -p "$work/app"
tarball=$(cd "$work" && npm pack "$package" --pack-destination "$work" | tail -n 1)
echo "packed $tarball"
contents=$(tar -tzf "$work/$tarball")
for f in package/index.js package/index.d.ts package/throttle.js package/npm-shrinkwrap.json \
         package/proto/attnserve/v1/attention.proto; do
  grep -qx "$f" <<< "$contents" || { echo "$tarball lacks $f"; exit 1; }
done
# The proto the package ships is the repository's (prepack.js copied it when npm packed).
tar -xzf "$work/$tarball" -C "$work" package/proto/attnserve/v1/attention.proto
cmp "$root/proto/attnserve/v1/attention.proto" "$work/package/proto/attnserve/v1/attention.proto"
# --prefix .: into this folder even if a folder above it holds a package.json or node_modules.
(cd "$work/app" && npm install --prefix . "../$tarball")
# What npm installed: the package's direct dependencies exactly as package.json pins them. The
# rest of the tree npm resolves within the ranges those declare: npm (11.19.1 here) does not apply
# a dependency's npm-shrinkwrap.json when it installs the package from a tarball, so a newer
# release of, say, @types/node is installed as soon as it is published. The shrinkwrap pins the
# whole tree for `npm ci` in client/node (development, and the TypeScript check below); drift
# from it is listed here, not failed on, so that the registry's releases cannot fail this test.
(cd "$work/app" && node -e '
const lock = require("./package-lock.json");
const pkg = require("./node_modules/attnserve/package.json");
const pinned = require("./node_modules/attnserve/npm-shrinkwrap.json").packages;
const installed = (p) => lock.packages["node_modules/attnserve/" + p] || lock.packages[p];
let bad = 0;
for (const [name, version] of Object.entries(pkg.dependencies)) {
  const got = installed("node_modules/" + name);
  if (!got || got.version !== version) {
    console.log(`${name}: package.json pins ${version}, installed ${got && got.version}`);
    bad++;
  }
}
for (const [p, info] of Object.entries(pinned)) {
  if (!p || info.dev) continue;
  const got = installed(p);
  if (got && got.version !== info.version) {
    console.log(`note: ${p} ${got.version} installed, ${info.version} in npm-shrinkwrap.json`);
  }
}
if (bad) process.exit(1);
console.log("direct dependencies installed as pinned");')

# The types: the package's pinned TypeScript (a devDependency, from a copy of client/node with
# npm ci) compiles types_check.ts against the installed package's index.d.ts.
mkdir -p "$work/dev"
cp "$package/package.json" "$package/npm-shrinkwrap.json" "$work/dev/"
(cd "$work/dev" && npm ci)
cp "$here/types_check.ts" "$work/app/"
(cd "$work/app" && "$work/dev/node_modules/.bin/tsc" --noEmit --strict --target es2020 \
  --module commonjs --moduleResolution node types_check.ts)
echo "index.d.ts: types_check.ts compiles"
cp "$here/attend_test.js" "$work/app/"

# The dtype conversions against NumPy's.
mkdir -p "$work/codec"
/usr/bin/python3 "$here/codec_vectors.py" "$work/codec"
cp "$here/codec_test.js" "$work/app/"
(cd "$work/app" && node codec_test.js "$work/codec")

# Client-side throttling, with no attnserve process: the cases the Python client passes too.
cp "$here/throttle_test.js" "$root/tests/testing/throttle_cases.json" "$work/app/"
(cd "$work/app" && node throttle_test.js throttle_cases.json)

tmp=$(mktemp -d)
pids=()
stop_servers() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; wait "$p" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap stop_servers EXIT
# start_server NAME [FLAGS...]: attnserve on a free loopback port, its port in $tmp/NAME.port once
# it is SERVING.
start_server() {
  local name=$1
  shift
  "$server" --listen=127.0.0.1:0 --port_file="$tmp/$name.port" --metrics_address= "$@" \
    > "$tmp/$name.log" 2>&1 &
  pids+=($!)
}
# wait_for NAME: its port, once written (a generous wait: the machine may be loaded).
wait_for() {
  for _ in $(seq 1200); do [[ -s $tmp/$1.port ]] && break; sleep 0.05; done
  [[ -s $tmp/$1.port ]] || { echo "attnserve $1 did not start" >&2; cat "$tmp/$1.log" >&2; exit 1; }
  cat "$tmp/$1.port"
}
# One server for attend_test.js; two more (A and B, each naming itself in session ids by the
# address it listens on) for routing_test.js, and a third (C) whose --session_owner names an
# address no client uses.
start_server one
start_server a
start_server b
start_server c --session_owner=10.254.0.2:9
# Three for moves_test.js: B and C, then A, which may move its sessions to them.
start_server move_b
start_server move_c
cp "$here/reference.js" "$here/routing_test.js" "$here/moves_test.js" "$work/app/"
port_one=$(wait_for one)
port_a=$(wait_for a)
port_b=$(wait_for b)
port_c=$(wait_for c)
port_move_b=$(wait_for move_b)
port_move_c=$(wait_for move_c)
start_server move_a --session_peers="127.0.0.1:$port_move_b,127.0.0.1:$port_move_c"
pid_move_a=${pids[-1]}  # moves_test.js drains it (SIGTERM) and waits for its exit
port_move_a=$(wait_for move_a)
cd "$work/app"
node attend_test.js "127.0.0.1:$port_one" "$version"
node routing_test.js "127.0.0.1:$port_a" "127.0.0.1:$port_b" "127.0.0.1:$port_c"
node moves_test.js "127.0.0.1:$port_move_a" "127.0.0.1:$port_move_b" "127.0.0.1:$port_move_c" \
  "$pid_move_a"
