#!/bin/sh
# The runtime stages of the Dockerfile: installs the runtime libraries listed in
# runtime-packages.txt (never a compiler or a -dev package), then the unprivileged user the
# server runs as (uid/gid 10001, no login shell, no home content), and cleans apt's caches.
#
#   setup-runtime.sh RUNTIME_PACKAGES_TXT
set -eu
export DEBIAN_FRONTEND=noninteractive
dpkg-query -W -f='${Package}\n' | sort > /tmp/packages-before
apt-get update
# shellcheck disable=SC2046
apt-get install -y --no-install-recommends $(cat "$1")
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

# Guard the promise: what this step added holds no toolchain and no headers.
added=$(dpkg-query -W -f='${Package}\n' | sort | comm -13 /tmp/packages-before -)
rm -f /tmp/packages-before
bad=$(printf '%s\n' "$added" | grep -E -- '-dev$|^(gcc|g\+\+|cpp|clang|cmake|make|binutils)(-[0-9.]+)?$' || true)
if [ -n "$bad" ]; then
  echo "setup-runtime: build tools or -dev packages in a runtime image: $bad" >&2
  exit 1
fi
echo "setup-runtime: added $(printf '%s ' $added)"

groupadd --system --gid 10001 attnserve
useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
  --shell /usr/sbin/nologin attnserve
mkdir -p /models
