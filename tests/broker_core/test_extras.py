"""Optional libraries: a missing one raises ``MissingExtra`` naming the extra to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker.core.errors import ConfigError
from broker.core.extras import MissingExtra, importable, require


def test_require_returns_the_module_when_installed() -> None:
    assert require("json", extra="viz", purpose="x").dumps([1]) == "[1]"
    assert importable("json")


def test_a_missing_library_names_its_extra_and_what_needs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import finds uninstalled
    with pytest.raises(MissingExtra) as caught:
        require("matplotlib", extra="viz", purpose="the charts")
    assert isinstance(caught.value, ConfigError)  # the CLI prints it as one line
    assert str(caught.value) == ("matplotlib: not installed, needed for the charts "
                                 "(pip install 'podracer[viz]')")
    assert not importable("matplotlib")


def test_a_broken_dependency_below_the_library_stays_loud(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the library itself missing means "install the extra"; anything else is a bug."""
    (tmp_path / "podracer_broken_lib.py").write_text("import podracer_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as caught:
        require("podracer_broken_lib", extra="viz", purpose="x")
    assert not isinstance(caught.value, MissingExtra)
    assert caught.value.name == "podracer_absent_dependency"
