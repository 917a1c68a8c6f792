# privbert cloud service: `cloud-api serve` on port 8000, $PRIVBERT_HOME on a volume.
#
#   docker build -t privbert .                                   # CPU (default)
#   docker build -t privbert:cuda \
#       --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#   docker run -p 8000:8000 -v privbert:/var/lib/privbert \
#       -e PRIVBERT_API_KEYS=... -e PRIVBERT_ADMIN_KEYS=... privbert
#   docker run --rm -v privbert:/var/lib/privbert privbert cloud-api bootstrap --data /data/train.tsv
#
# torch is pinned exactly as in README "Set up" (2.13.0); the CPU build by default.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# CUDA base images come without Python
RUN command -v python3 >/dev/null || (apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv && rm -rf /var/lib/apt/lists/*)
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY edge_agent ./edge_agent
COPY models ./models
COPY cloud_api ./cloud_api
RUN pip install ".[edge,cloud]"

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN command -v python3 >/dev/null || (apt-get update && apt-get install -y --no-install-recommends \
        python3 && rm -rf /var/lib/apt/lists/*)
COPY --from=build /opt/venv /opt/venv
RUN useradd --system --uid 10001 --home-dir /var/lib/privbert --create-home privbert
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    PRIVBERT_HOME=/var/lib/privbert
USER privbert
WORKDIR /var/lib/privbert
VOLUME ["/var/lib/privbert"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
CMD ["cloud-api", "serve", "--host", "0.0.0.0", "--port", "8000"]
