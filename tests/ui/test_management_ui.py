"""A person follows a broker-mode run in RabbitMQ's management UI, in a real Chromium.

``podracer train --broker`` runs its services as OS processes; once the generator and
updater consume, headless Chromium (Debian's package, driven by playwright) logs in,
opens Queues and must show the experiment's work queues with a consumer each and their
dead-letter queues. Then the run's pod refuses a forged initialization: the
dead-letter queue's page, under "Get messages" (ack mode "Nack message requeue true"),
must show its ``x-podracer-*`` headers with the pod's reason, and ``podracer
dead-letters`` must still list it afterwards (nothing was consumed). The screenshots are
the docs' ones (``tests/ui/management_ui.py`` makes them). Chromium is
``PODRACER_CHROMIUM``, else ``chromium`` on the PATH. Without Chromium or playwright
the test skips, unless ``PODRACER_REQUIRE_RABBITMQ=1`` (CI), where it fails like every
broker test.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.ui.management_ui import CHROMIUM, QUEUES, REFUSAL, parse_and_capture

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


def _is_png_of_a_page(path: Path) -> bool:
    """A PNG of a size that is a page and not an error stub."""
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def test_queues_page_shows_the_run_and_a_dead_letter_its_reason(
        amqp_url: str, experiment: str, chromium: str, tmp_path: Path) -> None:
    # the documented command (docs/tutorials/management_ui.md), into tmp_path
    got = parse_and_capture(["--broker", amqp_url, "--name", experiment,
                             "--chromium", chromium,
                             "--out", str(tmp_path / "management_ui_queues.png"),
                             "--dead-letter-out",
                             str(tmp_path / "management_ui_dead_letter.png")])

    rows = got.queues
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

    # the dead letter as "Get messages" shows it: the pod's reason, who refused it, when
    shown = got.dead_letter
    assert shown.get("message_id") == got.refused_id, shown
    assert shown.get("type") == "initialization", shown
    reason = shown.get("x-podracer-reason", "")
    assert reason.startswith(f"unusable initialization {got.refused_id}: "), shown
    assert REFUSAL in reason, shown
    assert re.fullmatch(r"pod@\S+-\d+", shown.get("x-podracer-service", "")), shown
    assert shown.get("x-podracer-queue") == "generator", shown
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                        shown.get("x-podracer-time", "")), shown

    # nothing was consumed: read afterwards with podracer dead-letters, it is still there
    assert f"{prefix}generator.dead: 1 dead letter(s)" in got.listed, got.listed
    [line] = [line for line in got.listed.splitlines() if got.refused_id in line]
    assert REFUSAL in line and shown["x-podracer-service"] in line, got.listed

    assert _is_png_of_a_page(got.queues_png)
    assert _is_png_of_a_page(got.dead_letter_png)
