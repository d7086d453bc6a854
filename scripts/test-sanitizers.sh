#!/usr/bin/env bash
# The test suite under sanitizers; CI runs it after scripts/test.sh.
#   AddressSanitizer + UndefinedBehaviorSanitizer: every test (CPU build, preset "asan")
#   ThreadSanitizer: the batcher and server tests, and the CUDA kernels on the host emulation
#   (tests/cuda_emu; hdim32, hdim64 and generic in fp16, preset "tsan")
# Any report fails the run (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
(cd proto && npm ci --no-audit --no-fund --loglevel=error)

export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cmake --preset asan
cmake --build --preset asan
# The container image is built from the plain build; the emulated CUDA kernels run their fp16
# half here (ASan and UBSan findings do not depend on the operand type), the plain attention
# path (naive_attention_emu_test) and the backend on the emulated device (backend_emu_test)
# too; the paged attention kernel its FLOAT16 cases (the other
# cache types run the same schedule on other element types).
ctest --preset asan -LE deploy \
  -E "(FlashEmu|NaiveAttentionEmu|BackendEmu)Test.*bfloat16|PagedAttentionEmuTest.*(BFLOAT16|FLOAT32)"

export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
cmake --preset tsan
cmake --build --preset tsan --target batcher_test server_test session_test kv_pool_test attnserve \
  flash_emu_test paged_attention_emu_test flash_launch_emu_test naive_attention_emu_test \
  elementwise_emu_test linear_emu_test cuda_backend_emu_test
# The C++ batcher and server tests (the Python process tests drive a TSan server through
# gRPC's uninstrumented core, where reports are third-party noise).
ctest --preset tsan -L "batcher|server" -LE python
# The emulated CUDA kernels: races between the emulated threads of a block (a missing barrier or
# cp.async wait). hdim32, hdim64 and generic in fp16: the other head dims are the same template
# body with the same barriers (hdim32 runs the zero-padded copies), and bf16 runs the same
# schedules with other numbers (about 3 minutes on 2 cores); the paged attention kernel in
# FLOAT16 (its other cache types: same schedule, other element types); the plain attention
# path's softmax kernel (block reductions through shared memory) in fp16 on its odd lengths
# and mask layouts (its other cases run the same block schedule, about 2 minutes more), the
# elementwise kernels and linear.cc's fallback. backend_emu_test, paged_store_emu_test and
# session_emu_test call the backend from one thread (their kernels' races are the kernel
# tests': the scatter kernel's is PagedScatterEmuTest in paged_attention_emu_test), and are left
# to ASan (backend_emu_test: about 6 minutes under TSan here).
ctest --preset tsan -L cuda_emu -E \
  "bfloat16|hdim(96|128|160|192|256)|BFLOAT16|FLOAT32|BackendEmuTest|PagedStoreEmuTest|SessionEmu(Layouts)?Test|NaiveAttentionEmuTest.(HeadDims|Causal|KeyLengths|GroupedQueryAttention|WithoutWeights|NaNRule)"
