#!/usr/bin/env bash
# Every C++ and CUDA file of the repository is formatted by .clang-format (Google-based).
# Exit 77 (ctest: skipped) when clang-format is missing.
set -euo pipefail
cd "$1"
command -v clang-format > /dev/null || { echo "clang-format not installed" >&2; exit 77; }
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" > /dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cc' '*.h' '*.cu' 2> /dev/null || find . -name '*.cc' -o -name '*.h' -o -name '*.cu')
if ((${#bad[@]})); then
  printf 'not formatted (run clang-format -i): %s\n' "${bad[@]}"
  exit 1
fi
echo "clang-format: all files formatted"
