#!/usr/bin/env bash
# The suite under the sanitizers; CI runs it after scripts/test.sh, which ran every test once in
# the plain build. Two builds, each running the tiers where a sanitizer finds something the plain
# run cannot (tests/README.md):
#   clang (preset "clang", build-clang/): every library, binary and test of ours built by clang
#     with -Wthread-safety -Werror (base/mutex.h's annotations checked) under AddressSanitizer +
#     UndefinedBehaviorSanitizer, with the libFuzzer targets. Runs the unit and emulation tiers
#     (the emulated CUDA kernels at one tensor-core head dim, 64, the only one the preset builds
#     into flash_emu_test (ATTNSERVE_EMU_HEAD_DIMS), besides the generic, decode, paged and plain
#     paths; not the repository checks, labels format and repo, which the
#     plain run did), the installed client header compiled by clang in the
#     find_package test, and each fuzz target for a bounded time from its corpus (FUZZ_SECONDS
#     each, 25 by default, two at a time; tests/fuzz/README.md).
#   tsan (preset "tsan", build-tsan/, -g1: line tables are all a report needs): the batcher,
#     server and session tests of the unit tier, and the emulated CUDA kernels in fp16 at head
#     dims 32 and 64 (the preset's ATTNSERVE_EMU_HEAD_DIMS) and the generic, paged and plain
#     paths: races between the emulated threads of a block (a missing barrier or
#     cp.async wait) and in the server.
# The process-level tests (integration tier) do not run here: they drive the server through
# gRPC's and Python's uninstrumented code, and the plain build ran them.
# Any report fails the run (halt_on_error).
#   scripts/test-sanitizers.sh          # both
#   scripts/test-sanitizers.sh clang    # or one of them
set -euo pipefail
cd "$(dirname "$0")/.."
legs=("${@:-clang tsan}")
legs=(${legs[*]})

scripts/install-deps.sh
for leg in "${legs[@]}"; do
  case "$leg" in clang | tsan) ;; *) echo "usage: $0 [clang] [tsan]" >&2; exit 2 ;; esac
done

cost() { /usr/bin/python3 tests/ctest_cost.py "$1" --top 10; }

run_clang() {
  export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  cmake --preset clang
  cmake --build --preset clang
  # The emulated kernels: hdim 64 of the tensor-core kernel in fp16 and bf16 (the other head
  # dims are the same template body, not built here; the plain build runs them all), every
  # other kernel.
  local rc=0
  # (Not the repository checks, labels format and repo: they build and run none of our code,
  # and the plain run did them.)
  ctest --preset clang -L "^(unit|emulation)$" -LE "python|node|format|repo" \
    -E "Flash(Mods)?EmuTest.*hdim(32|96|128|160|192|256)" || rc=$?
  cost build-clang
  ctest --preset clang -R "^client_install_find_package$" || rc=$?
  ((rc == 0)) || exit "$rc"

  # A bounded run of each fuzz target, starting from its corpus (read only: new inputs go to a
  # scratch directory), two at a time. Any crash, leak or sanitizer report fails the run.
  local fuzzers=(fuzz_attend_request fuzz_multi_head_request fuzz_stream_item fuzz_safetensors
                 fuzz_module_load fuzz_mask)
  local scratch
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' RETURN
  fuzz() {
    local f=$1 corpus=tests/fuzz/corpus/${1#fuzz_}
    mkdir -p "$scratch/$f"
    build-clang/tests/fuzz/"$f" -max_total_time="${FUZZ_SECONDS:-25}" -timeout=10 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$scratch/$f/" "$scratch/$f" \
      "$corpus" > "$scratch/$f.log" 2>&1
  }
  local pids=() names=() failed=0
  for f in "${fuzzers[@]}"; do
    fuzz "$f" & pids+=($!) names+=("$f")
    if ((${#pids[@]} == 2)) || [[ $f == "${fuzzers[-1]}" ]]; then
      for i in "${!pids[@]}"; do
        local frc=0
        wait "${pids[$i]}" || frc=$?
        echo "fuzz: ${names[$i]} for ${FUZZ_SECONDS:-25} s: exit $frc"
        grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$scratch/${names[$i]}.log" || true
        if ((frc != 0)); then tail -n 80 "$scratch/${names[$i]}.log"; failed=$frc; fi
      done
      pids=() names=()
    fi
  done
  ((failed == 0)) || exit "$failed"
}

run_tsan() {
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
  cmake --preset tsan
  cmake --build --preset tsan --target attnserve batcher_test server_test session_test tenants_test \
    session_mobility_test session_codec_test kv_pool_test flash_emu_test paged_attention_emu_test flash_launch_emu_test \
    naive_attention_emu_test elementwise_emu_test linear_emu_test
  local rc=0
  ctest --preset tsan -L "batcher|server" -L "^unit$" || rc=$?
  # The emulated kernels in fp16 (bf16 runs the same schedules with other numbers), the
  # tensor-core kernel at head dims 32 (zero-padded copies) and 64; the backend's host code
  # (cuda_backend_emu_test and the tests built on it) calls the kernels from one thread and is
  # left to ASan; so are the paged kernel's score modifications (ScoreModsAndDroppedPages: the
  # barriers and shared memory of the plain paged runs above, with other arithmetic).
  ctest --preset tsan -L "^emulation$" \
    -E "bfloat16|BFLOAT16|FLOAT32|hdim(96|128|160|192|256)|BackendEmuTest|PagedStoreEmuTest|SessionEmu|ScoreModsAndDroppedPages" \
    || rc=$?
  cost build-tsan
  ((rc == 0)) || exit "$rc"
}

for leg in "${legs[@]}"; do "run_$leg"; done
