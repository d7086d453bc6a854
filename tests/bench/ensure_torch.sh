#!/usr/bin/env bash
# Installs Debian's python3-torch when /usr/bin/python3 cannot import torch (the benchmarks that
# compare with PyTorch call this first, so that they run on a fresh machine).
# Usage: tests/bench/ensure_torch.sh CALLER   (CALLER names the script in the message)
set -euo pipefail
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then exit 0; fi
echo "${1:-ensure_torch}: installing python3-torch" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-torch >&2
