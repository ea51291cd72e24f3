"""docker-compose.yml ships no default credentials and exposes nothing beyond localhost.

The stack file (docker-compose.yml, also what ``docker stack deploy`` reads) publishes
no port at all; docker-compose.override.yml, which only ``docker compose`` reads,
publishes the broker on localhost. Each service logs in as its role's user and gets
the experiment's secret as a Docker secret.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
OVERRIDE = COMPOSE.with_name("docker-compose.override.yml")
ROLE_ENV = {f"PODRACER_{role}_{what}": f"{role.lower()}-{what.lower()}-for-test"
            for role in ("POD", "GENERATOR", "UPDATER", "ORCHESTRATOR", "OPERATOR")
            for what in ("USER", "PASSWORD")}
"""What ``podracer users env`` puts in compose's .env (values made up)."""
REQUIRED = re.compile(r"\$\{(?P<var>[A-Z][A-Z0-9_]*):\?[^}]+\}")
"""``${VAR:?message}``: compose refuses to start when VAR is unset or empty."""
WITH_DEFAULT = re.compile(r"\$\{(?P<var>[A-Z][A-Z0-9_]*):?-(?P<default>[^}]*)\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The parsed compose file (anchors and merges resolved by the YAML loader)."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def strings(node: Any) -> Iterator[str]:
    """Every string (keys and values) anywhere in a parsed YAML tree."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a map (compose allows a list of ``K=V`` too)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_broker_credentials_come_from_required_variables(compose: dict[str, Any]) -> None:
    env = environment(compose["services"]["rabbitmq"])
    for name in ("RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS"):
        assert name in env, f"{name} must be set explicitly (the image defaults to guest)"
        assert REQUIRED.fullmatch(env[name]), f"{name}={env[name]!r} is not ${{VAR:?...}}"


def test_services_reach_the_broker_as_their_role_with_required_credentials(
    compose: dict[str, Any],
) -> None:
    roles = {"updater": "UPDATER", "generator": "GENERATOR", "orchestrator": "ORCHESTRATOR",
             "pod": "POD", "pod-gpu": "POD", "users": "RABBITMQ"}
    for name, service in compose["services"].items():
        url = environment(service).get("PODRACER_BROKER")
        if name == "rabbitmq":
            continue
        assert url is not None, f"{name} has no PODRACER_BROKER"
        match = re.fullmatch(r"amqps?://(?P<user>\$\{[^}]*\}|[^:@]*)"
                             r":(?P<password>\$\{[^}]*\}|[^@]*)@.+", url)
        assert match, f"{name}: PODRACER_BROKER {url!r} carries no credentials"
        for part in ("user", "password"):
            required = REQUIRED.fullmatch(match[part])
            assert required, (name, match[part])
            assert required["var"].startswith(f"PODRACER_{roles[name]}_"), (name, match[part])


def test_services_get_the_message_secret_as_a_docker_secret(compose: dict[str, Any]) -> None:
    path = compose["secrets"]["podracer_secret"]["file"]
    assert REQUIRED.fullmatch(path), path
    for name in ("updater", "generator", "orchestrator", "pod", "pod-gpu"):
        service = compose["services"][name]
        assert "podracer_secret" in service["secrets"], name
        assert environment(service)["PODRACER_SECRET_FILE"] == "/run/secrets/podracer_secret"


def test_no_guest_account_or_literal_password_anywhere(compose: dict[str, Any]) -> None:
    text = " ".join(strings(compose)).lower()
    assert "guest" not in text
    for value in strings(compose):
        # a default after ":-" must never be a credential
        for found in WITH_DEFAULT.finditer(value):
            assert not re.search(r"USER|PASS|SECRET|TOKEN|COOKIE", found["var"]), found[0]


def published_ports(service: dict[str, Any]) -> list[str]:
    """The short-syntax port mappings of a service (the long syntax is not used here)."""
    ports = service.get("ports") or []
    assert all(isinstance(p, str) for p in ports), "use the short syntax HOST_IP:HOST:CONTAINER"
    return list(ports)


def default_host_ip(mapping: str) -> str:
    """The host address a short port mapping binds to when no variable is set."""
    resolved = WITH_DEFAULT.sub(lambda m: m["default"], mapping)
    parts = resolved.split(":")
    return parts[0] if len(parts) == 3 else "0.0.0.0"


def test_the_stack_publishes_no_port_and_compose_only_on_localhost(
    compose: dict[str, Any],
) -> None:
    # a Swarm publishes on every node's 0.0.0.0 whatever host address is written
    assert not any(published_ports(s) for s in compose["services"].values())
    override: dict[str, Any] = yaml.safe_load(OVERRIDE.read_text())
    seen = {}
    for name, service in override["services"].items():
        for mapping in published_ports(service):
            container_port = mapping.rsplit(":", 1)[-1]
            seen[container_port] = name
            assert default_host_ip(mapping) == "127.0.0.1", f"{name}: {mapping}"
    assert seen.get("15672") == "rabbitmq"  # the management UI is published, on localhost


@pytest.fixture
def compose_cli() -> str:
    """The docker-compose binary (CI installs it); skipped where it is absent."""
    found = shutil.which("docker-compose")
    if found is None:
        pytest.skip("docker-compose is not installed")
    return found


def run_config(cli: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` of the project file with exactly ``env`` (plus PATH)."""
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run([cli, "-f", str(COMPOSE), "-f", str(OVERRIDE), "config"],
                          capture_output=True, text=True, env=clean, timeout=60, check=False)


def test_compose_refuses_to_start_without_credentials(compose_cli: str) -> None:
    complete = {"PODRACER_RABBITMQ_USER": "ops", "PODRACER_RABBITMQ_PASSWORD": "pw",
                "PODRACER_SECRET_PATH": "/tmp/secret", **ROLE_ENV}
    for name in ("PODRACER_RABBITMQ_USER", "PODRACER_RABBITMQ_PASSWORD", "PODRACER_POD_USER",
                 "PODRACER_POD_PASSWORD", "PODRACER_SECRET_PATH"):
        missing = run_config(compose_cli, {k: v for k, v in complete.items() if k != name})
        assert missing.returncode != 0, name
        assert name in missing.stderr + missing.stdout


def test_compose_config_binds_published_ports_to_localhost(compose_cli: str) -> None:
    done = run_config(compose_cli, {"PODRACER_RABBITMQ_USER": "ops",
                                    "PODRACER_RABBITMQ_PASSWORD": "s3cret-for-test",
                                    "PODRACER_SECRET_PATH": "/tmp/secret", **ROLE_ENV})
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    published = {}
    for port in config["services"]["rabbitmq"]["ports"]:
        if isinstance(port, dict):  # compose v2 prints the long syntax
            published[str(port["target"])] = port.get("host_ip")
        else:  # docker-compose 1.x: "127.0.0.1:15672:15672/tcp"
            host_ip, _, target = port.split("/")[0].split(":")
            published[target] = host_ip
    assert published == {"15672": "127.0.0.1", "5672": "127.0.0.1"}
    env = config["services"]["rabbitmq"]["environment"]
    assert env["RABBITMQ_DEFAULT_USER"] == "ops"
    assert env["RABBITMQ_DEFAULT_PASS"] == "s3cret-for-test"


def test_each_pod_of_the_pods_override_is_the_pod_service_as_its_own_user(
    compose: dict[str, Any],
) -> None:
    from podracer.users_compose import pods_override

    def without_login(service: dict[str, Any]) -> dict[str, Any]:
        env = {k: v for k, v in environment(service).items() if k != "PODRACER_BROKER"}
        deploy = {k: v for k, v in service["deploy"].items() if k != "replicas"}
        return {**service, "environment": env, "deploy": deploy}

    base = compose["services"]["pod"]
    services = pods_override(2)["services"]
    assert set(services) == {"users", "pod", "pod-1", "pod-2"}
    for k in (1, 2):
        pod = services[f"pod-{k}"]
        assert without_login(pod) == without_login(base), k  # the base service, spelled out
        assert pod["deploy"]["replicas"] == 1
        user, password = re.findall(r"\$\{[^}]*\}", environment(pod)["PODRACER_BROKER"])[:2]
        for part, what in ((user, "USER"), (password, "PASSWORD")):
            required = REQUIRED.fullmatch(part)
            assert required and required["var"] == f"PODRACER_POD_{k}_{what}", part
    assert services["pod"]["deploy"]["replicas"] == 0  # what a Swarm reads
    assert services["users"]["command"][-2:] == ["--pods", "2"]


def test_compose_config_runs_each_pod_as_the_user_users_env_made(
    compose_cli: str, tmp_path: Path,
) -> None:
    """``podracer users env --pods 2 --compose-file`` -> ``docker-compose config`` with
    both files: pod-1 and pod-2 log in as their own users, the shared pod service is
    off, and the users service makes the pod users with the passwords of the .env."""
    import sys

    pods = tmp_path / "docker-compose.pods.yml"
    done = subprocess.run(
        [sys.executable, "-m", "podracer", "users", "env", "--name", "pendulum", "--pods", "2",
         "--secret-file", str(tmp_path / "secret"), "--compose-file", str(pods)],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in done.stdout.splitlines())
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
             "PODRACER_RABBITMQ_USER": "ops", "PODRACER_RABBITMQ_PASSWORD": "pw", **env}

    def config(variables: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([compose_cli, "-f", str(COMPOSE), "-f", str(pods), "config"],
                              capture_output=True, text=True, env=variables, timeout=60,
                              check=False, cwd=COMPOSE.parent)

    done = config(clean)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    for k in (1, 2):
        url = services[f"pod-{k}"]["environment"]["PODRACER_BROKER"]
        assert url == (f"amqp://podracer-pendulum-pod-{k}:{env[f'PODRACER_POD_{k}_PASSWORD']}"
                       "@rabbitmq:5672/")
        assert services["users"]["environment"][f"PODRACER_POD_{k}_PASSWORD"] == \
            env[f"PODRACER_POD_{k}_PASSWORD"]
    assert services["pod"]["profiles"] == ["shared-pod-user"]
    assert services["users"]["command"] == ["--name", "pendulum", "--pods", "2"]
    missing = config({k: v for k, v in clean.items() if k != "PODRACER_POD_2_PASSWORD"})
    assert missing.returncode != 0 and "PODRACER_POD_2_PASSWORD" in missing.stderr
