#!/bin/sh
# Runs promtool with the given arguments, or exits 77 (ctest's SKIP_RETURN_CODE) with a message
# when it is not installed (Debian package: prometheus).
if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool not found; install Debian's 'prometheus' package to run this check" >&2
  exit 77
fi
exec promtool "$@"
