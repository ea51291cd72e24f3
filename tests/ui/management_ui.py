"""Follow a broker-mode run in RabbitMQ's management UI, in a real (headless) Chromium.

Starts ``podracer train --broker ...`` for a short Pendulum run, waits until the
generator and updater services consume their queues, then logs in to the management UI,
opens Queues, filters on the experiment's namespace, shows the Consumers column and
saves a screenshot. ``tests/ui/test_management_ui.py`` asserts on what the page shows;
run as a script it makes the docs' screenshot::

    python tests/ui/management_ui.py --out docs/img/management_ui_queues.png

Chromium is Debian's package (``apt-get install chromium``), driven by playwright's
Python API; playwright's own browser downloads are never used.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium phones home at start and, on a closed
# network, the refused connections stall it.
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")
QUEUES = ("generator", "updater", "generator.dead", "updater.dead")
"""Short names of the queues a person looks for (``podracer.<experiment>.<short>``)."""


@dataclass(frozen=True)
class Management:
    """The management plugin's address and credentials (taken from the AMQP url)."""

    url: str
    user: str
    password: str

    @classmethod
    def from_amqp(cls, amqp_url: str, url: str = "http://127.0.0.1:15672") -> Management:
        """The management UI at ``url`` with the credentials of ``amqp_url``."""
        parts = urllib.parse.urlsplit(amqp_url)
        return cls(url.rstrip("/"), urllib.parse.unquote(parts.username or "guest"),
                   urllib.parse.unquote(parts.password or "guest"))

    def _call(self, method: str, path: str) -> Any:
        """``method`` on ``/api/<path>`` (vhost ``/``); None when the object is missing."""
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                body = response.read()
                return json.loads(body) if body else None
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def queue(self, name: str) -> dict[str, Any] | None:
        """The HTTP API's view of queue ``name`` (None: no such queue)."""
        data: dict[str, Any] | None = self._call(
            "GET", f"queues/%2F/{urllib.parse.quote(name, safe='')}")
        return data

    def delete_experiment(self, experiment: str) -> None:
        """Delete the work and dead-letter queues and the exchanges of ``experiment``."""
        for short in QUEUES:
            self._call("DELETE", f"queues/%2F/podracer.{experiment}.{short}")
        for short in ("events", "dlx"):
            self._call("DELETE", f"exchanges/%2F/podracer.{experiment}.{short}")


def wait_for_consumers(api: Management, experiment: str, run: subprocess.Popen[bytes],
                       timeout: float = 90.0) -> None:
    """Return once the generator and updater queues have a consumer each (polled through
    the HTTP API); ``RuntimeError`` if the run exits or the time is up first."""
    deadline = time.monotonic() + timeout
    missing: list[str] = []
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise RuntimeError(f"podracer train exited with {run.returncode} before its "
                               "services consumed")
        missing = [short for short in ("generator", "updater")
                   if ((api.queue(f"podracer.{experiment}.{short}") or {})
                       .get("consumers") or 0) < 1]
        if not missing:
            return
        time.sleep(0.5)  # polling a condition with a deadline, not a guess at timing
    raise RuntimeError(f"no consumer on {missing} after {timeout:.0f} s")


@contextlib.contextmanager
def broker_run(amqp_url: str, experiment: str, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A short broker-mode Pendulum run (PPO and SAC, one pod, no target) in its own
    session; stopped with SIGINT on exit, as a person would press Ctrl-C."""
    argv = [sys.executable, "-m", "podracer", "train", "--broker", amqp_url,
            "--name", experiment, "--env", "torch/Pendulum-v1", "--algos", "ppo,sac",
            "--pods", "1", "--budget", "180s", "--round-budget", "10s", "--threads", "1",
            "--quiet", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    with (out.parent / f"{out.name}-train.log").open("wb") as log:
        run = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        yield run
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)  # the session this function started
                run.wait()


TABLE_JS = """() => {
  const table = document.querySelector('#main table.list');
  if (!table) return {};
  const rows = Array.from(table.querySelectorAll('tr'));
  const header = rows.find(r => r.querySelectorAll('th a.sort').length > 0);
  const names = header ? Array.from(header.querySelectorAll('th'))
                              .map(th => th.innerText.trim()) : [];
  const out = {};
  for (const row of rows) {
    const link = row.querySelector('a[href^="#/queues/"]');
    if (!link) continue;
    const values = {};
    Array.from(row.querySelectorAll('td'))
         .forEach((td, i) => { values[names[i] || String(i)] = td.innerText.trim(); });
    out[link.innerText.trim()] = values;
  }
  return out;
}"""
"""Reads the Queues page's table: queue name -> {column header: cell text}."""


def read_queue_table(page: Any) -> dict[str, dict[str, str]]:
    """The rows of the Queues page's table: queue name -> {column header: cell text}."""
    rows: dict[str, dict[str, str]] = page.evaluate(TABLE_JS)
    return rows


def show_queues(api: Management, experiment: str, screenshot: Path,
                chromium: str = CHROMIUM, timeout_s: float = 60.0) -> dict[str, dict[str, str]]:
    """Log in, open Queues, filter on the experiment's work and dead-letter queues, add
    the Consumers column, wait until both work queues show a consumer, save
    ``screenshot``; return the table as the page shows it."""
    from playwright.sync_api import sync_playwright

    prefix = f"podracer.{experiment}."
    with tempfile.TemporaryDirectory(prefix="podracer-chromium-") as profile, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, args=list(CHROMIUM_ARGS), headless=True,
            viewport={"width": 1280, "height": 560})
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout_s * 1000)
            page.goto(f"{api.url}/")
            page.fill("input[name=username]", api.user)
            page.fill("input[name=password]", api.password)
            page.click("input[type=submit]")
            page.click("#tabs a[href='#/queues']")
            # the list shows no consumer count by default: tick it in the "+/-" chooser
            page.click("#main .popup-options-link")
            page.check("input[name=queues-consumers]")
            # the chooser is taller than the window: its Close link lies below the fold
            page.get_by_text("Close", exact=True).dispatch_event("click")
            page.wait_for_selector(".form-popup-options", state="hidden")
            # only the work and dead-letter queues: the per-subscriber event queues
            # (one per service and pod) would push them apart
            pattern = "^" + re.escape(prefix) + "(generator|updater)"
            wanted = sorted(prefix + short for short in QUEUES)
            deadline = time.monotonic() + timeout_s
            while True:
                if (page.input_value("#queues-name") != pattern
                        or not page.is_checked("#queues-filter-regex-mode")):
                    # (re)apply: a refresh that lands while the page loads redraws the filter
                    page.check("#queues-filter-regex-mode")
                    page.fill("#queues-name", pattern)
                    page.press("#queues-name", "Enter")
                rows = read_queue_table(page)
                if sorted(rows) == wanted and all(
                        int(rows[prefix + short].get("Consumers") or 0) >= 1
                        for short in ("generator", "updater")):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Queues page never showed {wanted} with "
                                       f"consumers; it showed {sorted(rows)[:8]}")
                page.wait_for_timeout(500)  # the page refreshes its stats every 5 s
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            return rows
        finally:
            browser.close()


def capture(amqp_url: str, experiment: str, screenshot: Path, workdir: Path,
            management_url: str = "http://127.0.0.1:15672",
            chromium: str = CHROMIUM) -> dict[str, dict[str, str]]:
    """Start a run, show its queues in the management UI, screenshot, stop the run."""
    api = Management.from_amqp(amqp_url, management_url)
    try:
        with broker_run(amqp_url, experiment, workdir / "run") as run:
            wait_for_consumers(api, experiment, run)
            return show_queues(api, experiment, screenshot, chromium)
    finally:
        api.delete_experiment(experiment)


def parse_and_capture(argv: list[str] | None = None) -> tuple[Path, dict[str, dict[str, str]]]:
    """The command line's work: parse ``argv``, capture; return the screenshot's path and
    the Queues table (the test calls this with the documented flags)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default=os.environ.get(
        "PODRACER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--management", default="http://127.0.0.1:15672")
    parser.add_argument("--name", default="ui-demo", help="experiment name")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--out", default=str(REPO / "docs/img/management_ui_queues.png"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="podracer-ui-") as workdir:
        rows = capture(args.broker, args.name, Path(args.out), Path(workdir),
                       args.management, args.chromium)
    return Path(args.out), rows


def main(argv: list[str] | None = None) -> int:
    """``python tests/ui/management_ui.py --out FILE``: the docs' screenshot."""
    out, rows = parse_and_capture(argv)
    for name, cells in rows.items():
        print(name, " | ".join(f"{k}: {v}" for k, v in cells.items() if k != "Name"))
    print(f"screenshot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
