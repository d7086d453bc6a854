#!/bin/sh
# Lays out what the runtime image holds, from built binaries, in DEST:
#   DEST/bin/{attnserve,attnserve-cli,attnserve-bench,attnserve-health-probe}   (stripped)
#   DEST/lib/attnserve/libattnserve_cuda.so      (the CUDA plugin, when one is given)
#   DEST/share/attnserve/runtime-packages.txt    (runtime-packages.sh on all of the above)
# The Dockerfile's build stages call it on what they compiled; build_and_check_image.sh calls it
# on the host's build tree for a prebuilt image (--build-arg BINARIES=prebuilt).
#
#   stage-binaries.sh DEST SERVER CLI BENCH PROBE [CUDA_PLUGIN]
set -eu
[ $# -ge 5 ] || { echo "usage: $0 DEST SERVER CLI BENCH PROBE [CUDA_PLUGIN]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
dest=$1
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/share/attnserve"
for pair in "attnserve:$2" "attnserve-cli:$3" "attnserve-bench:$4" "attnserve-health-probe:$5"; do
  name=${pair%%:*}
  src=${pair#*:}
  # Debug info stays in the build tree; the image gets the stripped binary.
  strip --strip-debug -o "$dest/bin/$name" "$src"
  chmod 0755 "$dest/bin/$name"
done
if [ $# -ge 6 ] && [ -n "$6" ]; then
  mkdir -p "$dest/lib/attnserve"
  strip --strip-debug -o "$dest/lib/attnserve/libattnserve_cuda.so" "$6"
fi
set -- "$dest"/bin/*
if [ -d "$dest/lib/attnserve" ]; then set -- "$@" "$dest"/lib/attnserve/*.so; fi
"$here/runtime-packages.sh" "$@" > "$dest/share/attnserve/runtime-packages.txt"
echo "stage-binaries: $dest: $(ls "$dest/bin" | tr '\n' ' ')"
echo "stage-binaries: runtime packages: $(tr '\n' ' ' < "$dest/share/attnserve/runtime-packages.txt")"
