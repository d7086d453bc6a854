#!/bin/bash
# The installed package from a user's side: `cmake --install` this build into a temporary
# prefix, configure and build tests/client/outside (find_package(attnserve), attnserve::client)
# against it, and run it against a live attnserve.
#   install_test.sh BUILD_DIR SERVER_BINARY
set -euo pipefail
build=$1
server=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$work/prefix" --component client > "$work/install.log"
test -f "$work/prefix/include/attnserve/client/client.h"
test -f "$work/prefix/include/attnserve/v1/attention.grpc.pb.h"
test -f "$work/prefix/include/attnserve/base/mutex.h"
test -f "$work/prefix/include/attnserve/base/float16.h"
ls "$work"/prefix/lib*/cmake/attnserve/attnserveConfig.cmake > /dev/null

# A sanitizer build installs instrumented libraries: the outside project must link the runtime.
sanitize=()
if [[ -n "${ATTNSERVE_SANITIZE:-}" ]]; then
  sanitize=(-DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$ATTNSERVE_SANITIZE")
fi
# The same compiler as this build (the clang leg compiles the installed headers with clang), with
# every warning an error: a user's -Werror must not trip on our headers.
compiler=()
flags="-Wall -Wextra -Werror"
if [[ -n "${ATTNSERVE_CXX:-}" ]]; then compiler=(-DCMAKE_CXX_COMPILER="$ATTNSERVE_CXX"); fi
if [[ "${ATTNSERVE_CXX:-}" == *clang* ]]; then flags+=" -Wthread-safety"; fi
cmake -S "$here/outside" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" "${sanitize[@]}" \
  "${compiler[@]}" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

"$server" --listen=127.0.0.1:0 --port_file="$work/port" --metrics_address= > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do [[ -s $work/port ]] && break; sleep 0.05; done
[[ -s $work/port ]] || { echo "server did not start"; cat "$work/server.log"; exit 1; }
"$work/build/outside" "127.0.0.1:$(cat "$work/port")"
