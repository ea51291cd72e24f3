"""The one role table (``podracer.roles``): every service is bound from it."""

from __future__ import annotations

import functools
import inspect

import pytest

from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from podracer.cli import build_parser
from podracer.roles import ROLES, Wiring, bind, service


def test_serve_offers_exactly_the_roles_of_the_table() -> None:
    serve = build_parser().parse_args(["serve", "pod"])
    assert serve.role == "pod"
    for role in ROLES:
        assert build_parser().parse_args(["serve", role]).role == role
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "janitor"])


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_takes_what_its_main_asks_for(role: str) -> None:
    registry = default_registry()
    wiring = Wiring(connector("memory://", MemoryBroker()), registry=registry)
    bound = service(role, wiring)
    assert isinstance(bound, functools.partial)
    main = ROLES[role].main()
    assert bound.func is main
    # everything the table binds is a parameter of main, and main's registries are bound
    params = inspect.signature(main).parameters
    assert set(bound.keywords) <= set(params)
    assert {"registry", "strategies", "connect"} & set(params) <= set(bound.keywords)
    if "registry" in bound.keywords:
        assert bound.keywords["registry"] is registry  # the one built where we started


def test_bind_finds_the_role_of_a_main_and_refuses_others() -> None:
    from leaderboard import updater

    wiring = Wiring(connector("memory://", MemoryBroker()))
    bound = bind(updater.main, wiring, reevaluate=True)
    assert isinstance(bound, functools.partial) and bound.keywords["reevaluate"] is True
    with pytest.raises(ConfigError, match="no role's main"):
        bind(print, wiring)
    with pytest.raises(ConfigError, match="use one of"):
        service("janitor", wiring)
