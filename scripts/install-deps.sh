#!/usr/bin/env bash
# Installs everything attnserve needs to build, run and test on Debian 12 (bookworm).
# Idempotent: when every package is present it only checks and exits in about a second.
# Usage: scripts/install-deps.sh            (build + test dependencies)
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ca-certificates clang-format
  # the sanitizer leg's compiler (scripts/test-sanitizers.sh) and its runtimes (ASan, libFuzzer)
  clang libclang-rt-dev
  # a compiler cache: a second build of the same sources on a machine is mostly hits
  ccache
  # RPC stack
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev libssl-dev zlib1g-dev libc-ares-dev libre2-dev
  # the servers' allocator (base/malloc_conf.cc)
  libjemalloc-dev
  # metrics
  prometheus-cpp-dev
  # promtool and a real Prometheus server for the metrics tests
  prometheus
  # attnserve-bench's HTML report, loaded headless by tests/client/bench_html_test.py
  chromium
  # model: JSON for safetensors headers; kernels: BLAS for projections
  nlohmann-json3-dev libopenblas-dev
  # kernels: bfloat16 matmul (AMX / AVX512_BF16 kernels chosen by oneDNN at run time)
  libdnnl-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  openssl
  # Python client and its tests (use /usr/bin/python3)
  python3 python3-grpcio python3-grpc-tools python3-protobuf python3-numpy python3-yaml
  # the Python package built as a wheel and installed into a venv, offline (tests/python)
  python3-setuptools python3-wheel python3-venv python3-pip
)
# proto lint uses buf from npm: Debian's nodejs+npm, unless a node with npm is already on PATH
# (some images ship NodeSource's nodejs, which bundles npm and conflicts with Debian's npm).
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(nodejs npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
