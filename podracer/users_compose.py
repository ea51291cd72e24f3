"""The compose override that runs each pod as its own RabbitMQ user
(``podracer users env --pods N --compose-file FILE``).

``docker-compose.yml`` scales one ``pod`` service, whose replicas share one
environment and so the ``pod`` role's user. This override turns that service off
(``profiles`` for compose, ``replicas: 0`` for a Swarm, which ignores profiles) and
adds ``pod-1`` .. ``pod-N``, each logged in as ``podracer-<exp>-pod-<k>`` with the
password ``env`` printed as ``PODRACER_POD_<k>_PASSWORD``; the one-shot ``users``
service creates those users too. Each pod service is the base ``pod`` service spelled
out (a Swarm stack cannot ``extends``); ``tests/security/test_compose.py`` checks that
they stay alike. The file is JSON, which compose and ``docker stack deploy`` read as
YAML.
"""

from __future__ import annotations

import json
from typing import Any

_NEEDS = "run podracer users env --pods {n}"


def _variable(k: int, what: str) -> str:
    return f"PODRACER_POD_{k}_{what}"


def _pod(k: int, pods: int) -> dict[str, Any]:
    """Service ``pod-<k>``: the base ``pod`` service, logged in as pod k's own user."""
    need = _NEEDS.format(n=pods)
    user, password = (f"${{{_variable(k, w)}:?{need}}}" for w in ("USER", "PASSWORD"))
    return {
        "image": "${PODRACER_IMAGE:-podracer:cpu}",
        "build": {"context": ".", "args": {"TORCH_VARIANT": "${PODRACER_TORCH_VARIANT:-cpu}"}},
        "command": ["pod"],
        "environment": {
            "PODRACER_EXPERIMENT_FILE":
                "${PODRACER_EXPERIMENT_FILE:-/opt/podracer/examples/pendulum.toml}",
            "PODRACER_STORE": "/data",
            "PODRACER_LOG_LEVEL": "${PODRACER_LOG_LEVEL:-INFO}",
            "PODRACER_SECRET_FILE": "/run/secrets/podracer_secret",
            # the cluster file's nodes: PODRACER_POD_BROKER_HOSTS=rabbitmq:5672,rabbitmq-2:5672,...
            "PODRACER_BROKER":
                f"amqp://{user}:{password}@${{PODRACER_POD_BROKER_HOSTS:-rabbitmq:5672}}/",
        },
        "secrets": ["podracer_secret"],
        "volumes": ["store:/data"],
        "networks": ["podracer"],
        "depends_on": {"users": {"condition": "service_completed_successfully"}},
        "restart": "on-failure",
        "stop_grace_period": "5m",
        "deploy": {"replicas": 1, "resources": {"limits": {"cpus": "${PODRACER_POD_CPUS:-2}"}}},
    }


def pods_override(pods: int) -> dict[str, Any]:
    """The override's content for ``pods`` pods (at least one)."""
    need = _NEEDS.format(n=pods)
    services: dict[str, Any] = {
        "users": {
            "command": ["--name", "${PODRACER_EXPERIMENT:-pendulum}", "--pods", str(pods)],
            "environment": {_variable(k, "PASSWORD"): f"${{{_variable(k, 'PASSWORD')}:?{need}}}"
                            for k in range(1, pods + 1)},
        },
        # the pods sharing the pod role's user: off (compose: a profile nobody starts)
        "pod": {"profiles": ["shared-pod-user"], "deploy": {"replicas": 0}},
    }
    services.update({f"pod-{k}": _pod(k, pods) for k in range(1, pods + 1)})
    return {"services": services}


def pods_override_text(pods: int) -> str:
    """``pods_override`` as the file's text."""
    return json.dumps(pods_override(pods), indent=2) + "\n"
