#!/bin/bash
# `BINARY --help` lists the binary's own flags with their defaults (Abseil's default listed none
# for our binaries: base/flags_usage.h).
#   help_test.sh BINARY FLAG DEFAULT [FLAG DEFAULT ...]
set -uo pipefail
bin=$1
shift
out=$("$bin" --help 2>&1)
rc=$?
# Abseil exits 1 after printing the usage.
if [[ $rc -ne 0 && $rc -ne 1 ]]; then echo "$bin --help exited $rc"; echo "$out"; exit 1; fi
if grep -q "No flags matched" <<< "$out"; then echo "$bin --help lists no flags"; echo "$out"; exit 1; fi
# One line per flag: "--name (help text); default: value;" (Abseil wraps long ones).
flat=$(tr '\n' ' ' <<< "$out" | tr -s ' ')
while (($# >= 2)); do
  if [[ $flat != *" --$1 ("* ]]; then echo "$bin --help does not list --$1"; echo "$out"; exit 1; fi
  entry=${flat#*" --$1 ("}
  entry="${entry%%"; --"*};"  # up to the next flag
  if [[ $entry != *"; default: $2;"* ]]; then
    echo "$bin --help does not give --$1's default $2: ($entry"; exit 1
  fi
  shift 2
done
echo "$bin --help lists its flags"
