# The agent's image: fleetbench[llama], llama.cpp compiled in for the CPU by default.
#   docker build -f deploy/container/agent.Dockerfile -t fleetbench-agent:0.1.0 .
# For NVIDIA GPUs, compile it with CUDA on a CUDA development image and run it on the
# matching runtime image (the node needs the NVIDIA container toolkit; run with --gpus all):
#   docker build -f deploy/container/agent.Dockerfile \
#       --build-arg BUILD_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu24.04 \
#       --build-arg RUNTIME_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 \
#       --build-arg GGML_CUDA=ON --build-arg CUDA_ARCHITECTURES=90 -t fleetbench-agent:0.1.0-cuda .
# Two stages: the compilers stay in the first; the image keeps Python and the built venv.
ARG BUILD_IMAGE=debian:12.8-slim
ARG RUNTIME_IMAGE=debian:12.8-slim
FROM ${BUILD_IMAGE} AS build

ARG GGML_CUDA=OFF
# With GGML_CUDA=ON, the GPU architectures to compile for (e.g. 80;90); `native` needs a GPU
# on the build machine, and all of them takes far longer.
ARG CUDA_ARCHITECTURES=native
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential cmake git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python3 -m venv /opt/fleetbench/venv \
    && CMAKE_ARGS="-DGGML_CUDA=${GGML_CUDA} -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
        /opt/fleetbench/venv/bin/pip install --no-cache-dir "/src[llama]"

FROM ${RUNTIME_IMAGE}
# libgomp: llama.cpp's CPU threads (OpenMP)
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 libgomp1 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# A fixed uid, so that Kubernetes can run as it and own its volumes (fsGroup)
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/fleetbench fleetbench
COPY --from=build /opt/fleetbench/venv /opt/fleetbench/venv

USER fleetbench
# The spool: mount a volume here so that a run never dies with its container.
ENV XDG_STATE_HOME=/var/lib/fleetbench/state XDG_CACHE_HOME=/var/lib/fleetbench/cache
VOLUME ["/var/lib/fleetbench"]
ENTRYPOINT ["/opt/fleetbench/venv/bin/fleetbench-agent"]
CMD ["daemon", "--config", "/etc/fleetbench/agent.toml"]
