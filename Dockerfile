# kvmigrate proxy image: slim, non-root, health-checked.
#
#   docker build -t kvmigrate:0.1.0 .
#   docker run --rm -p 4000:4000 -v "$PWD/config.yaml:/etc/kvmigrate/config.yaml:ro" \
#     -e OPENAI_API_KEY kvmigrate:0.1.0
#
# Stage 1 builds wheels for kvmigrate and every dependency (all of them ship manylinux
# wheels, so no compiler is needed or installed). Stage 2 installs only those wheels into a
# virtual environment; it has no build tools, no pip cache and no source tree.
# For reproducible production builds, pin the base image by digest as well
# (python:3.11.14-slim-trixie@sha256:...) and let Renovate/Dependabot bump it.

ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY kvmigrate ./kvmigrate
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kvmigrate" \
      org.opencontainers.image.description="Proxy that moves LLM agent traffic from a hosted API to self-hosted vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH="/opt/kvmigrate/bin:${PATH}" \
    KVMIGRATE_CONFIG=/etc/kvmigrate/config.yaml \
    KVMIGRATE_HEALTH_URL=http://127.0.0.1:4000/health \
    HOME=/var/lib/kvmigrate

# A fixed numeric uid/gid, so Kubernetes can verify runAsNonRoot without a passwd lookup.
RUN groupadd --system --gid 10001 kvmigrate \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/kvmigrate \
      --no-create-home --shell /usr/sbin/nologin kvmigrate \
 && mkdir -p /etc/kvmigrate /var/lib/kvmigrate \
 && chown 10001:10001 /var/lib/kvmigrate

COPY --from=build /wheels /tmp/wheels
RUN python -m venv /opt/kvmigrate \
 && /opt/kvmigrate/bin/pip install --no-index --find-links=/tmp/wheels /tmp/wheels/kvmigrate-*.whl \
 && rm -rf /tmp/wheels

# State and records: the default config's relative sqlite:///.kvmigrate/... URLs resolve
# here. Mount a volume (Kubernetes: an emptyDir or a PVC) so the root FS can stay read-only.
WORKDIR /var/lib/kvmigrate
VOLUME ["/var/lib/kvmigrate"]

USER 10001:10001
EXPOSE 4000

# No curl in slim images: python's urllib raises (exit 1) on a refused connection or a
# non-2xx answer. /health is liveness only; /ready (the primary answers) is for routing.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['KVMIGRATE_HEALTH_URL'], timeout=4)"]

ENTRYPOINT ["kvmigrate"]
CMD ["proxy", "--config", "/etc/kvmigrate/config.yaml", "--host", "0.0.0.0"]
