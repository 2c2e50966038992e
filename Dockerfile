# ModelForge control plane: one image for the web, worker and beat processes (compose/compose.yaml), three
# commands. The node agent has its own image (Dockerfile.agent).
FROM python:3.11-slim-bookworm

# The processes run from the source tree in /app (PYTHONPATH): settings find templates/ and static/
# beside the packages, and `pip install .` alone does not install those two folders.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    MODELFORGE_HOME=/var/lib/modelforge

WORKDIR /app

# Dependencies and packages first, so that a change to templates or static files reuses this layer.
COPY pyproject.toml ./
COPY modelforge ./modelforge
COPY apps ./apps
COPY agent ./agent
# [backups]: pg_dump/pg_restore of PostgreSQL 16 (the pgserver wheel's binaries), the server's major.
# The node agent (agent/pyproject.toml, which the control plane depends on) comes from ./agent.
# Local source trees: their dependency ranges are in their pyproject.toml files (hadolint's DL3013
# asks for pins on index packages).
# hadolint ignore=DL3013
RUN pip install ./agent '.[backups]'

COPY manage.py ./
COPY templates ./templates
COPY static ./static
# Runtime profiles; a deployment may mount its own over it (compose.production.yaml does).
COPY config ./config

# Never run as root. MODELFORGE_HOME/static is STATIC_ROOT; WhiteNoise warns when it is missing.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/modelforge --create-home \
        --shell /usr/sbin/nologin modelforge \
    && mkdir -p /var/lib/modelforge/static /var/lib/modelforge/backups /var/lib/modelforge/artifacts \
    && chown -R modelforge:modelforge /var/lib/modelforge
# Numeric, so that a runtime can tell it is not root (Kubernetes runAsNonRoot) without the image's passwd.
USER 10001:10001

EXPOSE 8000
# The web process's liveness (/healthz; `web` is always among the allowed hosts in compose/). The worker
# and beat run from this image too: compose/compose.yaml gives them their own check instead.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:8000/healthz', headers={'Host': 'web'}), timeout=4)"]
CMD ["gunicorn", "-c", "python:modelforge.gunicorn_conf", "modelforge.asgi:application"]
