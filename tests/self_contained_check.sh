#!/usr/bin/env bash
# Fails when a tracked file refers to a place outside the repository: a user's clone has nothing
# beside it, so a test, script or document that reads `../shared/...`, an absolute path of the
# machine the project was developed on, or the folder above the repository's root only works on
# that machine. Run by ctest (self_contained_check).
#   tests/self_contained_check.sh [REPO_ROOT]
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"
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
# One grep over every file (binary files, which cannot name a path, skipped: -I); a grep per
# file took 6-11 s of a CI run.
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  count=$(git ls-files | wc -l)
  hits=$(git grep -nIE "$regex" -- . ":(exclude)$self") || true
else
  mapfile -t files < <(find . -type f -not -path './build*' -not -path '*/node_modules/*' \
    -not -path './.git/*' -not -path "./$self" | sed 's|^\./||')
  count=${#files[@]}
  hits=$( ((count)) && grep -nIE "$regex" -- "${files[@]}") || true
fi
if [[ -n $hits ]]; then
  echo "$hits"
  echo "FAIL: the lines above refer to paths outside the repository; keep what the project needs inside it"
  exit 1
fi
echo "self_contained_check: $count files, none refers outside the repository"
