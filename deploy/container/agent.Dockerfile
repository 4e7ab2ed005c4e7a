# The agent's image: fleetbench[llama], llama.cpp compiled in for the CPU by default.
#   docker build -f deploy/container/agent.Dockerfile -t fleetbench-agent .
# For NVIDIA GPUs, compile it with CUDA on a CUDA development image (the node needs the
# NVIDIA container toolkit; run with --gpus all):
#   docker build -f deploy/container/agent.Dockerfile \
#       --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu24.04 \
#       --build-arg GGML_CUDA=ON --build-arg CUDA_ARCHITECTURES=90 -t fleetbench-agent:cuda .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG GGML_CUDA=OFF
# With GGML_CUDA=ON, the GPU architectures to compile for (e.g. 80;90); `native` needs a GPU
# on the build machine, and all of them takes far longer.
ARG CUDA_ARCHITECTURES=native
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential cmake git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# A fixed uid, so that Kubernetes can run as it and own its volumes (fsGroup)
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/fleetbench fleetbench
COPY . /src
RUN python3 -m venv /opt/fleetbench/venv \
    && CMAKE_ARGS="-DGGML_CUDA=${GGML_CUDA} -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
        /opt/fleetbench/venv/bin/pip install --no-cache-dir "/src[llama]" \
    && rm -rf /src

USER fleetbench
# The spool: mount a volume here so that a run never dies with its container.
ENV XDG_STATE_HOME=/var/lib/fleetbench/state XDG_CACHE_HOME=/var/lib/fleetbench/cache
VOLUME ["/var/lib/fleetbench"]
ENTRYPOINT ["/opt/fleetbench/venv/bin/fleetbench-agent"]
CMD ["daemon", "--config", "/etc/fleetbench/agent.toml"]
