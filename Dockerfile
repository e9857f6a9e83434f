# The orchestrator's image: what the Helm chart (helm/orchestrator) runs in every pod (the Ray
# head and workers, the controller). Build it from the root of a checkout and push it where your
# cluster pulls from (the README's "Run it on a cluster"):
#   docker build -t orchestrator:0.1.0 .
#   docker tag orchestrator:0.1.0 REGISTRY/orchestrator:0.1.0 && docker push REGISTRY/orchestrator:0.1.0
# RAY_VERSION is the chart's rayVersion and VLLM_ROUTER_VERSION the tag of the plan's default
# router image; tests/unit/test_k8s_chart.py checks both.
FROM python:3.11-slim-bookworm

ARG RAY_VERSION=2.60.0
ARG VLLM_ROUTER_VERSION=0.1.17

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ORCH_STATE_DIR=/var/lib/orchestrator/state

# KubeRay starts Ray with `bash -lc` and probes it with wget. Everything is installed into the
# system Python (/usr/local), which a login shell keeps on PATH (a venv's bin would be dropped).
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates wget \
 && rm -rf /var/lib/apt/lists/*

# Ray (default: the dashboard and its agent, which KubeRay's probes ask; client: the Ray Client
# server on the head, which the controller Deployment connects through) and vllm-router first:
# the largest layer, rebuilt only when their versions change.
RUN pip install "ray[default,client]==${RAY_VERSION}" "vllm-router==${VLLM_ROUTER_VERSION}"

# The package from this checkout; its build ships migrations/ and manifests/ inside it (setup.py).
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY orchestrator/ orchestrator/
COPY migrations/ migrations/
COPY manifests/ manifests/
RUN pip install "ray[default,client]==${RAY_VERSION}" "vllm-router==${VLLM_ROUTER_VERSION}" . \
 && rm -rf /src
COPY examples/ /opt/orchestrator/examples/

# A numeric non-root user (the chart's runAsUser), with a home and the run-state directory.
RUN groupadd --gid 1000 orch \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/orch --shell /bin/bash orch \
 && mkdir -p /var/lib/orchestrator/state \
 && chown -R 1000:1000 /var/lib/orchestrator
USER 1000:1000
ENV HOME=/home/orch
WORKDIR /home/orch

CMD ["orch", "--help"]
