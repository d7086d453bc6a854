#!/usr/bin/env bash
# Runs a mutant emulation test binary (make_mutant.sh) and succeeds only if it FAILS (a failed
# check or an abort by the emulator): the harness caught the injected bug.
# Usage: expect_failure.sh BINARY GTEST_FILTER
set -uo pipefail
"$1" --gtest_filter="$2" --gtest_fail_fast > mutant.log 2>&1
rc=$?
tail -n 20 mutant.log
if ((rc == 0)); then
  echo "MUTANT SURVIVED: $1 passed $2; the emulation harness missed an injected bug" >&2
  exit 1
fi
echo "caught (exit status $rc)"
