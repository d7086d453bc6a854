#!/bin/sh
# Prints the Debian/Ubuntu packages that hold the shared libraries the given ELF files load,
# one a line, sorted: the runtime stage of the Dockerfile installs exactly these, so it needs
# no hand-kept list of library package names (they differ between Debian bookworm and the
# Ubuntu of the CUDA images: libgrpc++1.51 vs libgrpc++1.51t64, ...).
#
#   deploy/docker/runtime-packages.sh /opt/attnserve/bin/* > runtime-packages.txt
#
# Run it where the binaries were built (the build stage, or the host for a prebuilt image),
# with the same distribution as the runtime base. libcuda.so.1 (the driver, injected into a
# GPU container at run time) is skipped; any other library that cannot be found or that no
# package owns is an error.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 ELF..." >&2; exit 2; }

owner() {
  # dpkg knows a file under the path its package shipped; with merged /usr that may be the
  # /lib or the /usr/lib spelling, or the target of a symlink (openblas alternatives).
  for p in "$1" "$(readlink -f "$1")"; do
    for q in "$p" "/usr$p" "${p#/usr}"; do
      pkg=$(dpkg-query -S "$q" 2>/dev/null | head -n1 | cut -d: -f1) || true
      if [ -n "$pkg" ]; then echo "$pkg"; return 0; fi
    done
  done
  return 1
}

status=0
for f in "$@"; do ldd "$f"; done | awk '/=>/ { print $1, $3 }' | sort -u | while read -r soname path; do
  case "$soname" in linux-vdso.so.*) continue ;; esac
  if [ "$path" = "not" ]; then
    case "$soname" in
      libcuda.so.1) continue ;;
      *) echo "runtime-packages: $soname not found" >&2; echo FAIL; continue ;;
    esac
  fi
  if ! owner "$path"; then
    echo "runtime-packages: no package owns $path" >&2
    echo FAIL
  fi
done | sort -u > "${TMPDIR:-/tmp}/runtime-packages.$$"
if grep -qx FAIL "${TMPDIR:-/tmp}/runtime-packages.$$"; then status=1; fi
grep -vx FAIL "${TMPDIR:-/tmp}/runtime-packages.$$" || true
rm -f "${TMPDIR:-/tmp}/runtime-packages.$$"
exit $status
