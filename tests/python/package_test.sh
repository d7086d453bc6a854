#!/usr/bin/env bash
# The Python client as a user gets it: a wheel built from client/python alone, installed into a
# fresh virtual environment that sees Debian's site packages, and the client tests run from a
# folder outside the source tree, so that an import which only works from the repository fails.
#   package_test.sh install WORK         copy client/python to WORK/src, build the wheel
#                                        (WORK/dist), install it into a new WORK/venv
#   package_test.sh run WORK MODULE      run tests/python/MODULE.py with WORK/venv's python in
#                                        a fresh WORK/run-MODULE holding only the test files
# pip runs with --no-index --no-build-isolation: no network; setuptools and wheel are Debian's,
# and grpcio, protobuf and numpy must be met by Debian's python3-* packages.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=/usr/bin/python3
command=$1
work=$2
unset PYTHONPATH PYTHONHOME PIP_REQUIRE_VIRTUALENV

case $command in
  install)
    rm -rf "$work/src" "$work/dist" "$work/venv"
    mkdir -p "$work"
    # What git tracks or would track (new files, not ignored build leftovers), so a stray file
    # in the source folder cannot make the wheel work; the whole folder outside a checkout.
    mkdir -p "$work/src"
    if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
      (cd "$root/client/python" &&
        git ls-files --cached --others --exclude-standard . | while IFS= read -r f; do
          if [[ -f $f ]]; then cp --parents "$f" "$work/src/"; fi
        done)
    else
      cp -r "$root/client/python/." "$work/src"
      rm -rf "$work/src/build" "$work/src/dist" "$work/src"/*.egg-info
    fi
    "$python" -m pip wheel --no-index --no-build-isolation --no-deps --quiet \
      --wheel-dir "$work/dist" "$work/src"
    wheels=("$work"/dist/attnserve-*.whl)
    [[ -f ${wheels[0]} ]] || { echo "no wheel in $work/dist"; exit 1; }
    "$python" -m venv --system-site-packages "$work/venv"
    # Dependencies are resolved (not --no-deps): they must be met by the system site packages.
    "$work/venv/bin/python" -m pip install --no-index --no-build-isolation --quiet "${wheels[0]}"
    echo "installed $(basename "${wheels[0]}") into $work/venv"
    ;;
  run)
    module=$3
    run=$work/run-$module
    rm -rf "$run"
    mkdir -p "$run"
    cp "$here/$module.py" "$here/live_server.py" "$run/"
    cd "$run"
    exec "$work/venv/bin/python" -m unittest -v "$module"
    ;;
  *)
    echo "usage: package_test.sh install|run WORK [MODULE]" >&2
    exit 2
    ;;
esac
