#!/usr/bin/env bash
# Keeps what the Python package derives from the rest of the repository in step with it:
#   attnserve/v1/attention_pb2.py, attention_pb2_grpc.py  generated from
#       proto/attnserve/v1/attention.proto by protoc and grpc_python_plugin (Debian 12:
#       protobuf-compiler, protobuf-compiler-grpc), exactly as the CMake build generates them;
#   attnserve/_version.py  the server's version, project(attnserve VERSION ...) in CMakeLists.txt.
# They are checked in so that `pip install ./client/python` needs neither protoc nor the proto.
#   client/python/update_stubs.sh          rewrite them
#   client/python/update_stubs.sh --check  exit 1 when they differ (ctest python_package_sources)
# PROTOC, GRPC_PYTHON_PLUGIN and ATTNSERVE_VERSION override the tools on PATH and the version
# read from CMakeLists.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check=0
[[ ${1:-} == --check ]] && check=1
protoc=${PROTOC:-$(command -v protoc)}
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin)}
version=${ATTNSERVE_VERSION:-$(sed -nE 's/^project\(attnserve VERSION ([0-9.]+).*/\1/p' \
  "$root/CMakeLists.txt")}
if [[ -z $version ]]; then
  echo "no project(attnserve VERSION ...) in $root/CMakeLists.txt" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$protoc" -I "$root/proto" --python_out="$tmp" --grpc_python_out="$tmp" \
  --plugin=protoc-gen-grpc_python="$plugin" "$root/proto/attnserve/v1/attention.proto"
mv "$tmp/attnserve/v1/attention_pb2.py" "$tmp/attnserve/v1/attention_pb2_grpc.py" "$tmp/"
{
  echo '"""The server'"'"'s version (the CMake project version), written by update_stubs.sh."""'
  echo "__version__ = \"$version\""
} > "$tmp/_version.py"

status=0
for pair in attention_pb2.py:v1/attention_pb2.py attention_pb2_grpc.py:v1/attention_pb2_grpc.py \
            _version.py:_version.py; do
  new=$tmp/${pair%%:*}
  old=$here/attnserve/${pair#*:}
  if ((check)); then
    if ! diff -u "$old" "$new" > "$tmp/diff"; then
      head -n 40 "$tmp/diff"
      echo "client/python/attnserve/${pair#*:} is out of date: run client/python/update_stubs.sh"
      status=1
    fi
  else
    cp "$new" "$old"
  fi
done
((check)) && ((status == 0)) && echo "update_stubs: stubs match the proto, version $version"
exit $status
