#!/usr/bin/env bash
# The clang leg of CI (after scripts/test.sh and scripts/test-sanitizers.sh), kept lean:
#   - every library and binary of ours built by clang with -Wthread-safety -Werror (base/mutex.h's
#     annotations checked), under AddressSanitizer + UndefinedBehaviorSanitizer;
#   - the unit tests (base, kernels, model, batcher, metrics), each binary's --help, attnserve-cli
#     holding no kernels code, and the installed client header compiled by clang in the
#     find_package test;
#   - each libFuzzer target of tests/fuzz for a bounded time from its checked-in corpus
#     (FUZZ_SECONDS each, 25 by default; tests/fuzz/README.md).
#   scripts/test-clang.sh      # build-clang/ (preset "clang")
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cmake --preset clang
fuzzers=(fuzz_attend_request fuzz_multi_head_request fuzz_stream_item fuzz_safetensors
         fuzz_module_load fuzz_mask)
cmake --build --preset clang --target attnserve attnserve-cli attnserve-bench attnserve_testing \
  base_test kernels_test model_test batcher_test metrics_test "${fuzzers[@]}"
# The unit tests (the binaries themselves: the clang leg builds no other test binary, so ctest's
# labels, which name those too, would report them as not built).
for t in tests/base/base_test tests/kernels/kernels_test tests/model/model_test \
         tests/server/batching/batcher_test \
         tests/server/metrics/metrics_test; do
  build-clang/$t --gtest_brief=1
done
# Each binary's --help, the fuzz corpora, and the installed headers compiled by clang.
ctest --preset clang -L fuzz
ctest --preset clang -R "_help$|^client_install_find_package$|^attnserve_cli_links_no_kernels$"

# A bounded run of each fuzz target, starting from its corpus (read only: new inputs go to a
# scratch directory). Any crash, leak or sanitizer report fails the run.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for f in "${fuzzers[@]}"; do
  corpus=tests/fuzz/corpus/${f#fuzz_}
  mkdir -p "$scratch/$f"
  echo "fuzz: $f for ${FUZZ_SECONDS:-25} s"
  rc=0
  build-clang/tests/fuzz/"$f" -max_total_time="${FUZZ_SECONDS:-25}" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$scratch/$f/" "$scratch/$f" "$corpus" \
    > "$scratch/$f.log" 2>&1 || rc=$?
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$scratch/$f.log" || true
  if ((rc != 0)); then tail -n 80 "$scratch/$f.log"; exit "$rc"; fi
done
