#!/bin/bash
# Whether BINARY holds any code of attnserve's kernels (a symbol in namespace attnserve::kernels):
# attnserve-cli must hold none (it reads safetensors through model/'s reader, which links no
# kernels), and the server must hold some (which shows the check can see them).
#   kernels_symbols_check.sh BINARY none|some
# Exit 0 when the binary matches the expectation, 1 when it does not, 2 when nm fails.
set -uo pipefail
bin=$1
want=$2
symbols=$(nm -C "$bin") || { echo "nm -C $bin failed"; exit 2; }
found=$(grep -F 'attnserve::kernels::' <<< "$symbols")
count=$(grep -c . <<< "$found")
if [[ $want == none && -n $found ]]; then
  echo "$bin links kernels code ($count symbols), e.g.:"
  head -n 5 <<< "$found"
  exit 1
fi
if [[ $want == some && -z $found ]]; then
  echo "$bin has no attnserve::kernels:: symbols; the check cannot see kernels code"
  exit 1
fi
echo "$bin: $([[ -n $found ]] && echo "$count" || echo 0) attnserve::kernels:: symbols (expected $want)"
