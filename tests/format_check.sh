#!/usr/bin/env bash
# Every C++ and CUDA file of the repository is formatted by .clang-format (Google-based).
# Exit 77 (ctest: skipped) when clang-format is missing.
#
# One clang-format for all the files: a process per file took 30 s of a CI run (on a VM where
# starting a process costs its page faults), one takes a second or two. Each file out of format
# is reported by clang-format (file:line:col: error: code should be clang-formatted); the list
# below names each once.
set -euo pipefail
cd "$1"
command -v clang-format > /dev/null || { echo "clang-format not installed" >&2; exit 77; }
files=()
while IFS= read -r f; do files+=("$f"); done \
  < <(git ls-files '*.cc' '*.h' '*.cu' 2> /dev/null || find . -name '*.cc' -o -name '*.h' -o -name '*.cu')
report=$(clang-format --dry-run -Werror "${files[@]}" 2>&1 > /dev/null) && rc=0 || rc=$?
if ((rc != 0)); then
  bad=$(grep -oE '^[^:]+:[0-9]+:[0-9]+: (error|warning): code should be clang-formatted' <<< "$report" |
        cut -d: -f1 | sort -u)
  if [[ -z $bad ]]; then  # clang-format failed for another reason: show it
    printf '%s\n' "$report" >&2
    exit 1
  fi
  printf 'not formatted (run clang-format -i): %s\n' $bad
  exit 1
fi
echo "clang-format: all files formatted (${#files[@]} files)"
