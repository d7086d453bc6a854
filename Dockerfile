# syntax=docker/dockerfile:1
#
# attnserve container images. Two final targets:
#
#   cpu (the default, last stage)  debian:bookworm-slim + the runtime libraries; the CPU and
#                                  reference backends (built with -DATTNSERVE_CUDA=OFF: no CUDA
#                                  library in the image at all)
#     docker build -t attnserve:cpu .
#
#   gpu                            nvidia/cuda:<CUDA_VERSION>-runtime-ubuntu<CUDA_UBUNTU> + the
#                                  runtime libraries; the server, and the CUDA backend as its
#                                  plugin (/opt/attnserve/lib/attnserve/libattnserve_cuda.so,
#                                  which loads cuBLAS from the base image); sm_80 + sm_90
#     docker build --target gpu -t attnserve:gpu .
#     docker run --gpus all -p 50051:50051 -p 9464:9464 attnserve:gpu
#
# Build arguments:
#   BASE_IMAGE      the CPU image's base, and its build stage's (default debian:bookworm-slim;
#                   the project's dependencies are Debian 12 packages)
#   CUDA_VERSION, CUDA_UBUNTU   pick the nvidia/cuda devel (build) and runtime (final) images;
#                   Ubuntu 24.04 ships the same gRPC 1.51 / protobuf 3.21 / Abseil 20220623 as
#                   Debian 12. The host's NVIDIA driver must support CUDA_VERSION (13.0: >= 580).
#   CUDA_ARCHS      CUDA architectures of the kernels (default 80-real;90-real;90-virtual)
#   BINARIES        source (default): compile in a build stage. prebuilt: take binaries
#                   compiled elsewhere (same distribution as BASE_IMAGE) from a build context
#                   named "prebuilt" laid out by deploy/docker/stage-binaries.sh:
#                     docker build --build-arg BINARIES=prebuilt \
#                       --build-context prebuilt=/path/to/staged -t attnserve:cpu .
#                   deploy/build_and_check_image.sh does this with the host's build tree.
#   JOBS            parallel compile jobs in the build stages (default: all cores)
#
# Ports: 50051 gRPC (attnserve.v1.AttentionService, grpc.health.v1.Health, reflection),
#        9464 Prometheus /metrics.
# Configuration: flags after the image name, or ATTNSERVE_<FLAG> environment variables
# (deploy/docker/entrypoint.sh maps them; ATTNSERVE_BACKEND=cpu is --backend=cpu).
# Health: HEALTHCHECK runs attnserve-health-probe, grpc.health.v1.Health/Check on loopback at
# the port of ATTNSERVE_LISTEN (default 50051); SERVING after warm-up, NOT_SERVING while
# draining on SIGTERM. The server drains for --shutdown_grace_ms (10 s): give `docker stop`
# more (`docker stop -t 30`; compose's stop_grace_period).
# Runs as uid/gid 10001 (attnserve); mount weights read-only under /models and load them with
# --module=NAME=/models/FILE.safetensors[:HEADS].

ARG BASE_IMAGE=debian:bookworm-slim
ARG CUDA_VERSION=13.0.0
ARG CUDA_UBUNTU=24.04
ARG BINARIES=source

# ---------------------------------------------------------------------------------------------
# Build dependencies (the -dev packages of scripts/install-deps.sh that the server, the client
# tools and the probe need; no test tools).
FROM ${BASE_IMAGE} AS cpu-source
ARG JOBS=0
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates binutils \
      libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev \
      libabsl-dev libssl-dev zlib1g-dev libc-ares-dev libre2-dev \
      prometheus-cpp-dev nlohmann-json3-dev libopenblas-dev libdnnl-dev libjemalloc-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN JOBS=${JOBS} /src/deploy/docker/build-from-source.sh /src /opt/attnserve -DATTNSERVE_CUDA=OFF

# Binaries built outside (the host's build tree, staged by deploy/docker/stage-binaries.sh).
FROM ${BASE_IMAGE} AS cpu-prebuilt
COPY --from=prebuilt . /opt/attnserve/

FROM cpu-${BINARIES} AS cpu-binaries

# ---------------------------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${CUDA_UBUNTU} AS gpu-build
ARG JOBS=0
ARG CUDA_ARCHS=80-real;90-real;90-virtual
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates binutils \
      libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev \
      libabsl-dev libssl-dev zlib1g-dev libc-ares-dev libre2-dev \
      prometheus-cpp-dev nlohmann-json3-dev libopenblas-dev libdnnl-dev libjemalloc-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN JOBS=${JOBS} /src/deploy/docker/build-from-source.sh /src /opt/attnserve \
      -DATTNSERVE_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      "-DATTNSERVE_CUDA_ARCHS=${CUDA_ARCHS}" \
 && test -f /opt/attnserve/lib/attnserve/libattnserve_cuda.so

# ---------------------------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${CUDA_UBUNTU} AS gpu
COPY deploy/docker/setup-runtime.sh /usr/local/lib/attnserve/setup-runtime.sh
COPY --from=gpu-build /opt/attnserve/share/attnserve/runtime-packages.txt /usr/local/lib/attnserve/
RUN /usr/local/lib/attnserve/setup-runtime.sh /usr/local/lib/attnserve/runtime-packages.txt
COPY --from=gpu-build /opt/attnserve /opt/attnserve
COPY deploy/docker/entrypoint.sh /usr/local/bin/attnserve-entrypoint
ENV PATH=/opt/attnserve/bin:${PATH}
LABEL org.opencontainers.image.title="attnserve (GPU)" \
      org.opencontainers.image.description="Transformer attention over gRPC; CUDA backend plugin, CPU fallback"
USER 10001:10001
WORKDIR /models
EXPOSE 50051/tcp 9464/tcp
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["/opt/attnserve/bin/attnserve-health-probe", "--timeout_ms=2500"]
ENTRYPOINT ["/usr/local/bin/attnserve-entrypoint"]

# ---------------------------------------------------------------------------------------------
# The CPU image (default target).
FROM ${BASE_IMAGE} AS cpu
COPY deploy/docker/setup-runtime.sh /usr/local/lib/attnserve/setup-runtime.sh
COPY --from=cpu-binaries /opt/attnserve/share/attnserve/runtime-packages.txt /usr/local/lib/attnserve/
RUN /usr/local/lib/attnserve/setup-runtime.sh /usr/local/lib/attnserve/runtime-packages.txt
COPY --from=cpu-binaries /opt/attnserve /opt/attnserve
COPY deploy/docker/entrypoint.sh /usr/local/bin/attnserve-entrypoint
ENV PATH=/opt/attnserve/bin:${PATH}
LABEL org.opencontainers.image.title="attnserve (CPU)" \
      org.opencontainers.image.description="Transformer attention over gRPC; CPU and reference backends"
USER 10001:10001
WORKDIR /models
EXPOSE 50051/tcp 9464/tcp
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["/opt/attnserve/bin/attnserve-health-probe", "--timeout_ms=2500"]
ENTRYPOINT ["/usr/local/bin/attnserve-entrypoint"]
