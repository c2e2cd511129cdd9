# syntax=docker/dockerfile:1
# The gpuevents image: agent, engine and runner in one (docs/deploy.md, "Container").
#   docker build -t REGISTRY/gpuevents:0.1.0 .
#
# Engine and runner: run as they are (user 10001, no capabilities needed):
#   docker run -v ./config.yaml:/etc/gpuevents/config.yaml:ro -v ./rules:/etc/gpuevents/rules:ro \
#     -e NATS_USER=gpuevents-engine -e NATS_PASSWORD=... -e SLACK_BOT_TOKEN=... REGISTRY/gpuevents:0.1.0
# Agent: it must see and signal the host's GPU processes, so it runs as root with the host's pid
# namespace and two capabilities, and NVML through the NVIDIA container runtime:
#   docker run --pid=host --user 0 --cap-drop ALL --cap-add KILL --cap-add SYS_PTRACE \
#     --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all -e NVIDIA_DRIVER_CAPABILITIES=utility \
#     -v /etc/gpuevents/config.yaml:/etc/gpuevents/config.yaml:ro --env-file /etc/gpuevents/agent.env \
#     REGISTRY/gpuevents:0.1.0 agent -c /etc/gpuevents/config.yaml
# (with Docker's `--gpus all` instead of --runtime nvidia, the same NVIDIA_* variables apply.)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gpuevents
WORKDIR /src
# The package and nothing else (.dockerignore keeps tests, docs and local state out).
COPY pyproject.toml README.md ./
COPY gpuevents ./gpuevents
COPY agent ./agent
COPY rules ./rules
COPY actions ./actions
RUN /opt/gpuevents/bin/pip install --upgrade pip \
 && /opt/gpuevents/bin/pip install . \
 && /opt/gpuevents/bin/gpuevents --help >/dev/null

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="gpuevents" \
      org.opencontainers.image.description="GPU waste rules engine: node agents, rules engine, action runners" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 gpuevents \
 && useradd --system --uid 10001 --gid gpuevents --home-dir /var/lib/gpuevents --create-home \
      --shell /usr/sbin/nologin gpuevents \
 && mkdir -p /etc/gpuevents/rules
COPY --from=build /opt/gpuevents /opt/gpuevents
COPY deploy/container/entrypoint.sh /usr/local/bin/gpuevents-entrypoint
ENV PATH=/opt/gpuevents/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/gpuevents
# 9400: agent metrics (dcgm-exporter's port); 9500: engine metrics; 8080: engine dashboard
EXPOSE 9400 9500 8080
USER 10001:10001
ENTRYPOINT ["gpuevents-entrypoint"]
CMD ["engine", "-c", "/etc/gpuevents/config.yaml"]
