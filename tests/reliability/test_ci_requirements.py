"""Under CI a missing test dependency fails the tests that need it; elsewhere they skip."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.required import import_or_skip

TESTS = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """``tests/envs_stock/stock_testdata.data_dir`` (a module of another test folder)."""
    spec = importlib.util.spec_from_file_location(
        "stock_testdata_under_test", TESTS / "envs_stock" / "stock_testdata.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.data_dir()
    return path


def test_missing_stock_data_fails_when_required(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODRACER_DATA_DIR", str(tmp_path / "nowhere"))
    monkeypatch.delenv("PODRACER_REQUIRE_STOCK_DATA", raising=False)
    with pytest.raises(pytest.skip.Exception):
        data_dir()
    monkeypatch.setenv("PODRACER_REQUIRE_STOCK_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match="nowhere"):
        data_dir()


def test_missing_simulator_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PODRACER_REQUIRE_MUJOCO", raising=False)
    with pytest.raises(pytest.skip.Exception):
        import_or_skip("no_such_simulator_module", "PODRACER_REQUIRE_MUJOCO")
    monkeypatch.setenv("PODRACER_REQUIRE_MUJOCO", "1")
    with pytest.raises(pytest.fail.Exception, match="no_such_simulator_module"):
        import_or_skip("no_such_simulator_module", "PODRACER_REQUIRE_MUJOCO")
