#!/bin/sh
# Entrypoint of the attnserve images: configuration by flags, environment variables, or both.
#
#   docker run attnserve:cpu --backend=cpu --max_batch_requests=64          # flags
#   docker run -e ATTNSERVE_BACKEND=cpu -e ATTNSERVE_MAX_BATCH_REQUESTS=64 attnserve:cpu
#
# Every environment variable ATTNSERVE_<NAME> whose lower-cased NAME is a flag of the server
# (`attnserve --helpfull` lists them) becomes --<name>=<value>, placed before the arguments, so
# an argument given on the command line wins (for a repeated flag the last one counts).
# Other ATTNSERVE_* variables are left alone: ATTNSERVE_CUDA_PLUGIN is read by the server
# itself, and Docker links and Kubernetes service links (ATTNSERVE_SERVICE_HOST,
# ATTNSERVE_PORT_50051_TCP, ...) are not flags. An empty value is passed on
# (ATTNSERVE_METRICS_ADDRESS= turns /metrics off).
#
# When the first argument is not a flag, it is run as a command instead (the image also holds
# attnserve-cli, attnserve-bench and attnserve-health-probe):
#   docker run attnserve:cpu attnserve-bench --target=dns:///attnserve:50051 --duration_s=30
set -eu

SERVER=${ATTNSERVE_SERVER_BINARY_PATH:-/opt/attnserve/bin/attnserve}

case "${1:-}" in
  ""|-*) ;;
  *) exec "$@" ;;
esac

# The flags the server knows, one name a line ("    --listen (host:port ...); default: ...").
known=$("$SERVER" --helpfull 2>&1 | sed -n 's/^ *--\([a-z0-9_]*\) .*/\1/p' || true)

env_flags=""
for var in $(env | sed -n 's/^\(ATTNSERVE_[A-Z0-9_]*\)=.*/\1/p'); do
  name=$(printf '%s' "${var#ATTNSERVE_}" | tr 'A-Z' 'a-z')
  if printf '%s\n' "$known" | grep -qx -- "$name"; then
    env_flags="$env_flags $var"
  fi
done

# Prepend the mapped flags, last variable first, so that "$@" keeps its order after them.
value=""
for var in $env_flags; do
  eval "value=\${$var}"
  name=$(printf '%s' "${var#ATTNSERVE_}" | tr 'A-Z' 'a-z')
  set -- "--$name=$value" "$@"
done

if [ "${ATTNSERVE_ENTRYPOINT_VERBOSE:-}" = "1" ]; then
  echo "attnserve-entrypoint: exec $SERVER $*" >&2
fi
exec "$SERVER" "$@"
