"""A person follows a broker-mode run in RabbitMQ's management UI, in a real Chromium.

``podracer train --broker`` runs its services as OS processes; once the generator and
updater consume, headless Chromium (Debian's package, driven by playwright) logs in,
opens Queues and must show the experiment's work queues with a consumer each and their
dead-letter queues. The screenshot is the docs' one (``tests/ui/management_ui.py``
makes it). Chromium is ``PODRACER_CHROMIUM``, else ``chromium`` on the PATH. Without
Chromium or playwright the test skips, unless ``PODRACER_REQUIRE_RABBITMQ=1`` (CI),
where it fails like every broker test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from management_ui import CHROMIUM, QUEUES, parse_and_capture

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(300)]


def _require(what: str, present: bool) -> None:
    if present:
        return
    reason = f"{what} missing (apt-get install chromium; pip install -e '.[test]')"
    if os.environ.get("PODRACER_REQUIRE_RABBITMQ") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of Debian's Chromium with playwright importable, or skip/fail."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _require("playwright", False)
    path = os.environ.get("PODRACER_CHROMIUM") or shutil.which("chromium") or CHROMIUM
    _require(f"Chromium ({path})", Path(path).is_file() and os.access(path, os.X_OK))
    return path


def test_queues_page_shows_the_run(amqp_url: str, experiment: str, chromium: str,
                                   tmp_path: Path) -> None:
    # the documented command (docs/tutorials/management_ui.md), into tmp_path
    shot, rows = parse_and_capture(["--broker", amqp_url, "--name", experiment,
                                    "--chromium", chromium,
                                    "--out", str(tmp_path / "management_ui_queues.png")])

    prefix = f"podracer.{experiment}."
    assert sorted(rows) == sorted(prefix + short for short in QUEUES), rows
    for short in ("generator", "updater"):
        row = rows[prefix + short]
        assert int(row["Consumers"]) >= 1, row
        assert row["Type"] == "quorum", row
        # the work queue dead-letters into dlx; the page's feature badges say so
        assert "DLX" in row["Features"].split(), row
        assert row["State"] == "running", row
        dead = rows[f"{prefix}{short}.dead"]
        assert dead["Type"] == "classic" and int(dead["Total"]) == 0, dead
    # a PNG of the page, of a size that is a page and not an error stub
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000
