#!/usr/bin/env bash
# Builds the CPU image (Dockerfile, target cpu) with podman, starts it, and checks it the way a
# user would: the image's HEALTHCHECK (grpc.health.v1 through attnserve-health-probe), an
# Attend call from the host's attnserve-cli and one from inside the container, /metrics counting
# them, the environment-variable configuration, the unprivileged user, no toolchain or -dev
# package in the image, and a clean drain on stop. Run by ctest (tests/deploy, label "deploy").
#
# There is no Docker engine and no registry here, so:
#   - the base image is Debian bookworm made locally with debootstrap (minbase, the packages a
#     debian:bookworm-slim has), cached as a tarball in $ATTNSERVE_IMAGE_CACHE (default
#     /var/tmp/attnserve-image-cache) and imported as localhost/attnserve-base:bookworm; the
#     first run downloads it from the Debian archive this machine's apt uses, later runs
#     import the tarball or find the image already in podman's storage;
#   - podman builds with --isolation chroot and runs with --runtime runc, on the host network
#     (the server listens on free loopback ports);
#   - by default the image takes the host's binaries (--build-arg BINARIES=prebuilt, staged by
#     deploy/docker/stage-binaries.sh) instead of compiling them a second time; --from-source
#     runs the Dockerfile's compile stage instead (a full Release build: slow on 2 cores).
#
# Usage:
#   deploy/build_and_check_image.sh --server=BUILD/server/attnserve \
#       --cli=BUILD/client/attnserve-cli --bench=BUILD/client/bench/attnserve-bench \
#       --probe=BUILD/.../attnserve-health-probe [--from-source] [--keep]
#   (--from-source needs only --cli and --probe, to check from the host.)
# Exit status: 0 all checks passed, 1 a check failed, 77 podman/debootstrap cannot be used here
# (not root, tools missing and not installable); the reason is printed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ATTNSERVE_IMAGE_CACHE:-/var/tmp/attnserve-image-cache}
# The Debian archive and its security archive are the ones this machine's apt already uses (no
# host is named here); ATTNSERVE_DEBIAN_MIRROR and ATTNSERVE_DEBIAN_SECURITY_MIRROR override them.
apt_uri_for_suite() {  # prints the first URI that the machine's apt sources serve suite $1 from
  local files=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  awk -v want="$1" '
    function flush() {
      if (uris != "" && (" " suites " ") ~ (" " want " ") && enabled != "no") {
        split(uris, u, " "); print u[1]; done = 1; exit
      }
      uris = ""; suites = ""; enabled = ""
    }
    FNR == 1 { flush() }
    /^[[:space:]]*#/ { next }
    /^[[:space:]]*$/ { flush(); next }
    /^URIs:/ { sub(/^URIs:[[:space:]]*/, ""); uris = $0 }
    /^Suites:/ { sub(/^Suites:[[:space:]]*/, ""); suites = $0 }
    /^Enabled:/ { sub(/^Enabled:[[:space:]]*/, ""); enabled = tolower($0) }
    /^deb[[:space:]]/ {
      line = $0; sub(/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?/, "", line)
      split(line, f, /[[:space:]]+/)
      if (f[2] == want) { print f[1]; done = 1; exit }
    }
    END { if (!done) flush() }' "${files[@]}"
}
MIRROR=${ATTNSERVE_DEBIAN_MIRROR:-$(apt_uri_for_suite bookworm)}
SECURITY_MIRROR=${ATTNSERVE_DEBIAN_SECURITY_MIRROR:-$(apt_uri_for_suite bookworm-security)}
BASE_IMAGE=localhost/attnserve-base:bookworm
IMAGE=${ATTNSERVE_TEST_IMAGE:-localhost/attnserve:cpu-test}
SERVER="" CLI="" BENCH="" PROBE="" FROM_SOURCE=0 KEEP=0
for arg in "$@"; do
  case "$arg" in
    --server=*) SERVER=${arg#*=} ;;
    --cli=*) CLI=${arg#*=} ;;
    --bench=*) BENCH=${arg#*=} ;;
    --probe=*) PROBE=${arg#*=} ;;
    --from-source) FROM_SOURCE=1 ;;
    --keep) KEEP=1 ;;
    *) echo "build_and_check_image: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ -x $CLI && -x $PROBE ]] || { echo "build_and_check_image: --cli and --probe are required" >&2; exit 2; }
if ((!FROM_SOURCE)); then
  [[ -x $SERVER && -x $BENCH ]] || { echo "build_and_check_image: --server and --bench are required" >&2; exit 2; }
fi

T0=$SECONDS
step() { echo "== [$((SECONDS - T0))s] $*"; }
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# --- Tools ---------------------------------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root: rootful podman with --isolation chroot and debootstrap"
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  command -v apt-get >/dev/null || skip "missing ${need[*]} and no apt-get to install them"
  step "installing ${need[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" \
    containernetworking-plugins >/dev/null \
    || skip "cannot install ${need[*]} with apt-get"
fi
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
# podman's default ulimits (nofile 1048576, nproc 32768) are above what this sandbox lets runc
# set (no CAP_SYS_RESOURCE here: "error setting rlimit type 7: operation not permitted"), so
# containers get limits at or under the current hard limits. Healthchecks run on demand
# (`podman healthcheck run`): there is no systemd for podman's healthcheck timers.
nofile=$(ulimit -Hn)
[[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
RUN_OPTS=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
"${PODMAN[@]}" info >/dev/null 2>&1 || skip "podman info fails: $("${PODMAN[@]}" info 2>&1 | tail -n3)"

# --- Base image: Debian bookworm from debootstrap ------------------------------------------
mkdir -p "$CACHE"
if ! "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  tarball=$CACHE/debian-bookworm-minbase.tar
  if [[ ! -s $tarball ]]; then
    step "debootstrap bookworm (minbase) from $MIRROR into $CACHE (first run only)"
    [[ -n $MIRROR ]] || skip "no apt source serves bookworm here; set ATTNSERVE_DEBIAN_MIRROR"
    rootfs=$CACHE/rootfs.tmp
    rm -rf "$rootfs"
    debootstrap --variant=minbase --components=main bookworm "$rootfs" "$MIRROR" \
      > "$CACHE/debootstrap.log" 2>&1 \
      || { tail -n 20 "$CACHE/debootstrap.log"; fail "debootstrap failed (log: $CACHE/debootstrap.log)"; }
    # What debian:bookworm-slim has besides minbase: the updates and security suites, no apt
    # caches, no package lists, no docs.
    rm -f "$rootfs/etc/apt/sources.list"
    {
      printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\n' "$MIRROR"
      printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
      if [[ -n $SECURITY_MIRROR ]]; then
        printf '\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: main\n' "$SECURITY_MIRROR"
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
      fi
    } > "$rootfs/etc/apt/sources.list.d/debian.sources"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
      "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/tmp/*
    tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  step "importing $tarball as $BASE_IMAGE"
  "${PODMAN[@]}" import --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
fi

# --- Build ---------------------------------------------------------------------------------
WORK=$(mktemp -d /tmp/attnserve-image-check.XXXXXX)
NAME=attnserve-image-check-$$
cleanup() {
  local rc=$?
  if ((KEEP)); then
    echo "kept: container $NAME, work dir $WORK"
  else
    "${PODMAN[@]}" rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT

build_args=(--isolation chroot --network host --pull=never --format docker --layers
            --target cpu --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" -f "$ROOT/Dockerfile")
if ((FROM_SOURCE)); then
  step "podman build (compile stage, BINARIES=source)"
  build_args+=(--build-arg BINARIES=source --build-arg "JOBS=${JOBS:-2}")
else
  step "staging the host's binaries"
  "$ROOT/deploy/docker/stage-binaries.sh" "$WORK/prebuilt" "$SERVER" "$CLI" "$BENCH" "$PROBE"
  build_args+=(--build-arg BINARIES=prebuilt --build-context "prebuilt=$WORK/prebuilt")
fi
step "podman build ${build_args[*]} $ROOT"
"${PODMAN[@]}" build "${build_args[@]}" "$ROOT" > "$WORK/build.log" 2>&1 \
  || { tail -n 40 "$WORK/build.log"; fail "podman build failed"; }
grep -E '^(setup-runtime: added|--> Using cache)' "$WORK/build.log" | sed 's/^/   /' > "$WORK/build-summary.txt" || true
tail -n 20 "$WORK/build-summary.txt"
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
step "built $IMAGE: $((size / 1000000)) MB"

# --- Static checks of the image ------------------------------------------------------------
inspect() { "${PODMAN[@]}" image inspect --format "$1" "$IMAGE"; }
[[ $(inspect '{{.Config.User}}') == 10001:10001 ]] || fail "image user is '$(inspect '{{.Config.User}}')'"
ports=$(inspect '{{range $p, $v := .Config.ExposedPorts}}{{$p}} {{end}}')
[[ $ports == *50051/tcp* && $ports == *9464/tcp* ]] || fail "exposed ports are '$ports'"
health=$(inspect '{{.Config.Healthcheck.Test}}')
[[ $health == *attnserve-health-probe* ]] || fail "no HEALTHCHECK with the probe: '$health'"
echo "   user 10001:10001, exposes $ports, healthcheck $health"
contents=$("${PODMAN[@]}" run --rm "${RUN_OPTS[@]}" --no-healthcheck --network none --entrypoint /bin/sh "$IMAGE" -c \
  'dpkg-query -W -f="\${Package}\n" | grep -E -- "-dev$" ; for t in gcc g++ cc c++ cmake ld; do command -v $t; done; true')
[[ -z $contents ]] || fail "the runtime image holds build tools or -dev packages: $contents"
echo "   no -dev package, no compiler, linker or cmake in the image"

# --- Run -----------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GRPC_PORT=$(free_port)
METRICS_PORT=$(free_port)
step "podman run: gRPC 127.0.0.1:$GRPC_PORT, metrics 127.0.0.1:$METRICS_PORT (host network)"
"${PODMAN[@]}" run -d --name "$NAME" "${RUN_OPTS[@]}" --health-interval=disable --network host \
  -e ATTNSERVE_LISTEN="127.0.0.1:$GRPC_PORT" \
  -e ATTNSERVE_METRICS_ADDRESS="127.0.0.1:$METRICS_PORT" \
  -e ATTNSERVE_BACKEND_THREADS=2 \
  -e ATTNSERVE_SERVICE_HOST=10.0.0.1 -e ATTNSERVE_PORT=tcp://10.0.0.1:50051 \
  -e ATTNSERVE_ENTRYPOINT_VERBOSE=1 \
  "$IMAGE" --shutdown_grace_ms=3000 >/dev/null \
  || fail "podman run failed"

# The image's own HEALTHCHECK, run by podman: healthy once the server reports SERVING.
healthy=0
for _ in $(seq 1 150); do
  if "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1; then healthy=1; break; fi
  [[ $("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME") == true ]] \
    || { "${PODMAN[@]}" logs "$NAME"; fail "the container exited"; }
  sleep 0.2
done
((healthy)) || { "${PODMAN[@]}" logs "$NAME"; fail "HEALTHCHECK never passed"; }
step "HEALTHCHECK passes (podman healthcheck run)"
"${PODMAN[@]}" logs "$NAME" > "$WORK/container.log" 2>&1
sed 's/^/   container: /' "$WORK/container.log"
grep -q -- "--listen=127.0.0.1:$GRPC_PORT" "$WORK/container.log" \
  || fail "ATTNSERVE_LISTEN was not passed as --listen"
if grep -q -- "--service_host" "$WORK/container.log"; then
  fail "a Kubernetes service-link variable was passed as a flag"
fi

"$PROBE" --addr="127.0.0.1:$GRPC_PORT" -v | sed 's/^/   host probe: /'
[[ $("${PODMAN[@]}" exec "$NAME" id -u) == 10001 ]] || fail "the server does not run as uid 10001"

# Attention requests: from the host's CLI, and from the CLI inside the image.
step "attnserve-cli attend from the host"
"$CLI" --target="127.0.0.1:$GRPC_PORT" attend --shape=1,4,32,16 --causal > "$WORK/attend.txt" 2>&1 \
  || { cat "$WORK/attend.txt"; fail "attend from the host failed"; }
sed -n '1,8s/^/   /p' "$WORK/attend.txt"
step "attnserve-cli info and mha inside the container"
"${PODMAN[@]}" exec "$NAME" attnserve-cli --target="127.0.0.1:$GRPC_PORT" info > "$WORK/info.txt" 2>&1 \
  || { cat "$WORK/info.txt"; fail "attnserve-cli info inside the container failed"; }
sed -n '1,12s/^/   /p' "$WORK/info.txt"
"${PODMAN[@]}" exec "$NAME" attnserve-cli --target="127.0.0.1:$GRPC_PORT" mha --shape=2,10 \
  > "$WORK/mha.txt" 2>&1 || { cat "$WORK/mha.txt"; fail "mha inside the container failed"; }
sed -n '1,4s/^/   /p' "$WORK/mha.txt"

step "GET /metrics"
curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" > "$WORK/metrics.txt" || fail "/metrics did not answer"
grep -E '^attnserve_(requests_total|build_info)' "$WORK/metrics.txt" | sed 's/^/   /'
python3 - "$WORK/metrics.txt" <<'EOF' || fail "/metrics does not count the calls"
import re, sys
text = open(sys.argv[1]).read()
def total(rpc):
    return sum(float(v) for v in re.findall(
        r'^attnserve_requests_total\{[^}]*rpc="%s"[^}]*code="OK"[^}]*\}\s+(\S+)' % rpc, text, re.M)
        + re.findall(r'^attnserve_requests_total\{[^}]*code="OK"[^}]*rpc="%s"[^}]*\}\s+(\S+)' % rpc,
                     text, re.M))
assert total("Attend") >= 1, "no Attend counted"
assert total("MultiHeadAttention") >= 1, "no MultiHeadAttention counted"
assert "attnserve_build_info" in text, "no attnserve_build_info"
EOF

# --- Stop: SIGTERM, drain, exit 0 ----------------------------------------------------------
step "podman stop (SIGTERM, drain)"
"${PODMAN[@]}" stop -t 20 "$NAME" >/dev/null
code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")
"${PODMAN[@]}" logs "$NAME" > "$WORK/container.log" 2>&1
tail -n 2 "$WORK/container.log" | sed 's/^/   container: /'
[[ $code == 0 ]] || fail "the server exited $code on SIGTERM"
step "all image checks passed"
