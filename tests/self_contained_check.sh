#!/usr/bin/env bash
# Fails when a tracked file refers to a place outside the repository: a user's clone has nothing
# beside it, so a test, script or document that reads `../shared/...`, an absolute path of the
# machine the project was developed on, or the folder above the repository's root only works on
# that machine. Run by ctest (self_contained_check).
#   tests/self_contained_check.sh [REPO_ROOT]
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  mapfile -t files < <(git ls-files)
else
  mapfile -t files < <(find . -type f -not -path './build*' -not -path '*/node_modules/*' \
    -not -path './.git/*' | sed 's|^\./||')
fi
self=tests/self_contained_check.sh
# What escapes: the sibling folder every checkout of this project used to lean on, the
# workplace's absolute paths, and the repository root's parent taken in CMake or shell.
patterns=(
  '\.\./shared'
  '/work/(shared|main|\.library)'
  '\$\{(ATTNSERVE_ROOT|CMAKE_SOURCE_DIR|PROJECT_SOURCE_DIR)\}/\.\.'
  '\$(root|ROOT)/\.\.(/|$|")'
)
regex=$(IFS='|'; echo "${patterns[*]}")
bad=0
for f in "${files[@]}"; do
  [[ $f == "$self" || ! -f $f ]] && continue
  # Binary files (safetensors data, images) cannot name a path.
  grep -Iq . "$f" 2> /dev/null || continue
  if hits=$(grep -nE "$regex" "$f"); then
    while IFS= read -r line; do echo "$f:$line"; done <<< "$hits"
    bad=1
  fi
done
if ((bad)); then
  echo "FAIL: the lines above refer to paths outside the repository; keep what the project needs inside it"
  exit 1
fi
echo "self_contained_check: ${#files[@]} files, none refers outside the repository"
