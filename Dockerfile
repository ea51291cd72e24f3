# One image for every Podracer role: `podracer serve <role>`.
#   CPU:  docker build -t podracer:cpu .
#   CUDA: docker build -t podracer:cuda --build-arg TORCH_VARIANT=cuda .
# The CUDA variant takes PyPI's torch wheel, which bundles the CUDA runtime; the host
# needs only the NVIDIA driver and the container toolkit.
FROM python:3.11-slim

ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PODRACER_STORE=/data \
    MUJOCO_GL=egl

RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libegl1 tini \
    && rm -rf /var/lib/apt/lists/*

RUN if [ "$TORCH_VARIANT" = "cpu" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu; \
    elif [ "$TORCH_VARIANT" = "cuda" ]; then \
        pip install "torch==${TORCH_VERSION}"; \
    else \
        echo "TORCH_VARIANT must be cpu or cuda, got '$TORCH_VARIANT'" >&2; exit 2; \
    fi

WORKDIR /opt/podracer
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY agents ./agents
COPY orchestrator ./orchestrator
COPY leaderboard ./leaderboard
COPY envs ./envs
COPY podracer ./podracer
COPY examples ./examples
# swarm: the orchestrator scales Swarm services; gpu: it counts GPUs. The charts and
# TensorBoard (viz) are drawn where `podracer train` or `report` runs, not in a service.
RUN pip install ".[mujoco,swarm,gpu]"

RUN useradd --create-home --uid 1000 podracer && mkdir -p /data && chown podracer /data
USER podracer
VOLUME ["/data"]

# tini forwards SIGTERM so a pod finishes its round (or returns it to the queue).
ENTRYPOINT ["tini", "--", "podracer", "serve"]
CMD ["pod"]
