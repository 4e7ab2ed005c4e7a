# The registry's image: fleetbench[registry] alone (no llama.cpp, no compiler).
#   docker build -f deploy/container/registry.Dockerfile -t fleetbench-registry:0.1.0 .
#   docker run -e FLEETBENCH_DATABASE_URL=postgresql+psycopg://... fleetbench-registry migrate
#   docker run -p 127.0.0.1:8787:8787 -e FLEETBENCH_DATABASE_URL=... fleetbench-registry
# It speaks plain HTTP on 8787: put a TLS-terminating proxy (or an ingress) in front of it.
FROM python:3.11.11-slim-bookworm

# A fixed uid, so that Kubernetes can run as it and own its volumes (fsGroup)
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/fleetbench fleetbench
COPY . /src
RUN python -m venv /opt/fleetbench/venv \
    && /opt/fleetbench/venv/bin/pip install --no-cache-dir "/src[registry]" \
    && rm -rf /src

USER fleetbench
ENV FLEETBENCH_DATA_DIR=/var/lib/fleetbench
EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=5s \
    CMD ["/opt/fleetbench/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=4)"]
ENTRYPOINT ["/opt/fleetbench/venv/bin/fleetbench-registry"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8787", "--workers", "2"]
