#!/usr/bin/env bash
# Writes a copy of kernels/cpu/attention_bf16.cc with one bug injected into its AMX path, for the
# mutation check of the AMX emulation (tests/kernels/cpu/CMakeLists.txt): the emulated-AMX tests
# built against the copy must fail, or they could pass without looking.
# Usage: make_amx_mutant.sh NAME SOURCE OUT_FILE
# Each mutation replaces an exact piece of kernel text; if the text is not found (the kernel
# changed), this fails, so that a mutation never silently becomes a no-op.
set -euo pipefail
name=$1 src=$2 out=$3
mkdir -p "$(dirname "$out")"
cp "$src" "$out"
case "$name" in
  b_stride)  # B's pair rows read at half their stride
    from="const int64_t b_stride = int64_t{n} * 4;"
    to="const int64_t b_stride = int64_t{n} * 2;" ;;
  swapped_tile)  # the second column block multiplied by the wrong A rows
    from="_tile_dpbf16ps(1, 4, 7);"
    to="_tile_dpbf16ps(1, 5, 7);" ;;
  second_row_block)  # rows 16-31 of A read from rows 0-15
    from="_tile_loadd(5, a + int64_t{i + 16} * lda + x, a_stride);"
    to="_tile_loadd(5, a + int64_t{i} * lda + x, a_stride);" ;;
  released_early)  # the tiles released after the first key tile's scores
    from="GemmAmx(s.qa, t.dp, t.kp + tile * sh.k_tile_elems(), s.s, kN, m_rows, kN, t.dp);"
    to="GemmAmx(s.qa, t.dp, t.kp + tile * sh.k_tile_elems(), s.s, kN, m_rows, kN, t.dp); _tile_release();" ;;
  *) echo "unknown mutation $name" >&2; exit 2 ;;
esac
FROM="$from" TO="$to" perl -0pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/ or die "mutation text not found\n"' "$out"
