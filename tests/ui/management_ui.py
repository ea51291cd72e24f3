"""Follow a broker-mode run in RabbitMQ's management UI, in a real (headless) Chromium.

Starts ``podracer train --broker ...`` for a short Pendulum run, waits until the
generator and updater services consume their queues, then logs in to the management UI,
opens Queues, filters on the experiment's namespace, shows the Consumers column and
saves a screenshot. Then it has the run's pod refuse one message: it publishes an
``Initialization`` for an env that is not the run's (SAC on CartPole) to the
``generator`` queue, waits until the pod has dead-lettered it to
``generator.dead``, opens that queue's page and uses "Get messages" with the ack mode
"Nack message requeue true" (nothing is consumed) to show its ``x-podracer-*``
headers; a second screenshot; and ``podracer dead-letters`` lists it afterwards.
``tests/ui/test_management_ui.py`` asserts on what the pages show; run as a script it
makes the docs' screenshots::

    python tests/ui/management_ui.py --out docs/img/management_ui_queues.png \
        --dead-letter-out docs/img/management_ui_dead_letter.png

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
from collections.abc import Callable, Iterator
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
WIDTH, HEIGHT = 1280, 560
"""Chromium's window (the screenshots are as wide; full-page ones longer)."""
QUEUES = ("generator", "updater", "generator.dead", "updater.dead")
"""Short names of the queues a person looks for (``podracer.<experiment>.<short>``)."""
REFUSED_ALGORITHM, REFUSED_ENV = "sac", "torch/CartPole-v1"
"""The forged initialization: one of the run's algorithms on an env that is not the
run's, so a pod refuses it in one line before building anything."""
REFUSAL = "env 'torch/CartPole-v1' is not this experiment's ('torch/Pendulum-v1')"
"""What the pod's reason for refusing it says (``agents.pod.service.Pod.refusal``)."""


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
        from broker.core.topology import Topology  # run as a script: imported late

        topology = Topology(experiment)
        for queue in topology.queues:
            self._call("DELETE", f"queues/%2F/{queue}")
        for exchange in topology.exchanges:
            self._call("DELETE", f"exchanges/%2F/{exchange}")


def wait_for_queue(api: Management, queue: str, run: subprocess.Popen[bytes],
                   condition: Callable[[dict[str, Any]], bool], what: str,
                   timeout: float = 90.0) -> dict[str, Any]:
    """Poll the HTTP API's view of ``queue`` until ``condition`` holds for it; return the
    view. ``RuntimeError`` naming ``what`` if the run exits or the time is up first. (The
    API's message counts lag the broker by up to its stats interval, 5 s.)"""
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise RuntimeError(f"podracer train exited with {run.returncode} while waiting "
                               f"for {what}")
        view = api.queue(queue) or {}
        if condition(view):
            return view
        time.sleep(0.5)  # polling a condition with a deadline, not a guess at timing
    counts = {k: view.get(k) for k in ("messages", "messages_unacknowledged", "consumers")}
    raise RuntimeError(f"no {what} after {timeout:.0f} s ({queue}: {counts})")


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


def _env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


@contextlib.contextmanager
def broker_run(amqp_url: str, experiment: str, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A short broker-mode Pendulum run (PPO and SAC, one pod, no target) in its own
    session; stopped with SIGINT on exit, as a person would press Ctrl-C."""
    argv = [sys.executable, "-m", "podracer", "train", "--broker", amqp_url,
            "--name", experiment, "--env", "torch/Pendulum-v1", "--algos", "ppo,sac",
            "--pods", "1", "--budget", "180s", "--round-budget", "10s", "--threads", "1",
            "--quiet", "--run-dir", str(out)]
    with (out.parent / f"{out.name}-train.log").open("wb") as log:
        run = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
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


@contextlib.contextmanager
def logged_in(api: Management, chromium: str = CHROMIUM,
              timeout_s: float = 60.0) -> Iterator[Any]:
    """A page of a fresh headless Chromium, logged in to the management UI."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="podracer-chromium-") as profile, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, args=list(CHROMIUM_ARGS), headless=True,
            viewport={"width": WIDTH, "height": HEIGHT})
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout_s * 1000)
            page.goto(f"{api.url}/")
            page.fill("input[name=username]", api.user)
            page.fill("input[name=password]", api.password)
            page.click("input[type=submit]")
            page.wait_for_selector("#tabs a[href='#/queues']")
            yield page
        finally:
            browser.close()


def show_queues(page: Any, experiment: str, screenshot: Path,
                timeout_s: float = 60.0) -> dict[str, dict[str, str]]:
    """Open Queues, filter on the experiment's work and dead-letter queues, add the
    Consumers column, wait until both work queues show a consumer, save ``screenshot``;
    return the table as the page shows it."""
    prefix = f"podracer.{experiment}."
    page.click("#tabs a[href='#/queues']")
    page.wait_for_selector("#queues-name")  # the Queues page, not the one before it
    # the list shows no consumer count by default: tick it in the "+/-" chooser
    page.click("#main .popup-options-link")
    page.check("input[name=queues-consumers]")
    # the chooser is taller than the window: its Close link lies below the fold
    page.get_by_text("Close", exact=True).dispatch_event("click")
    page.wait_for_selector(".form-popup-options", state="hidden")
    # only the work and dead-letter queues: the per-subscriber event queues
    # (podracer.<exp>.events.<role>.<host>-<pid>.<random>) would push them apart
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


def refuse_one(api: Management, amqp_url: str, experiment: str,
               run: subprocess.Popen[bytes], timeout: float = 90.0) -> str:
    """Have the run's pod refuse one message: publish the forged initialization
    (``REFUSED_ALGORITHM`` on ``REFUSED_ENV``) to the ``generator`` queue and wait until
    ``generator.dead`` holds a message (HTTP API). Returns the initialization's id."""
    import asyncio
    import concurrent.futures

    from broker.core.schemas import Budget, Initialization
    from broker.transports.connect import connect

    prefix = f"podracer.{experiment}."
    # Publish only once a pod holds a round: before its first round the generator drains
    # the queue (it acks what an earlier generator left there), and would take this one.
    wait_for_queue(api, prefix + "generator", run,
                   lambda view: (view.get("messages_unacknowledged") or 0) >= 1,
                   "round held by a pod", timeout)
    forged = Initialization(experiment=experiment, algorithm=REFUSED_ALGORITHM,
                            env=REFUSED_ENV, hparams={}, budget=Budget(seconds=10.0), seed=0)

    async def publish() -> None:
        async with connect(amqp_url, experiment=experiment) as transport:
            await transport.publish("generator", forged)

    # in a thread of its own: playwright's sync API keeps an event loop in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(publish())).result(timeout=60)
    # the pod takes it when its current round ends, and refuses it while building
    wait_for_queue(api, prefix + "generator.dead", run,
                   lambda view: (view.get("messages") or 0) >= 1,
                   f"dead letter (the pod's refusal of {forged.id})", timeout)
    return forged.id


MESSAGE_JS = """() => {
  const out = {};
  const wrapper = document.querySelector('#msg-wrapper');
  if (!wrapper) return out;
  for (const th of wrapper.querySelectorAll('table.mini th')) {
    const td = th.nextElementSibling;
    if (!td || td.querySelector('table')) continue;  // "headers:" nests a table of its own
    out[th.innerText.trim().replace(/:$/, '')] = td.innerText.trim();
  }
  return out;
}"""
"""Reads the message "Get messages" shows: property or header name -> value."""


def _section(page: Any, title: str, visible: bool) -> Any:
    """The queue page's collapsible section ``title``, opened or closed (a click on its
    heading toggles it; the UI remembers the choice per section)."""
    from playwright.sync_api import expect

    section = page.locator("#main > div").filter(
        has=page.get_by_role("heading", name=title, exact=True))
    state = "section-visible" if visible else "section-invisible"
    if state not in (section.get_attribute("class") or "").split():
        section.get_by_role("heading", name=title, exact=True).click()
    expect(section).to_have_class(re.compile(rf"(^|\s){state}(\s|$)"))
    return section


def show_dead_letter(page: Any, experiment: str, screenshot: Path) -> dict[str, str]:
    """From the Queues page, open ``generator.dead``, "Get messages" with the ack mode
    "Nack message requeue true" (the message goes back: nothing is consumed), save
    ``screenshot`` from the page's top to the message; return what the page shows of
    the message (property or header name -> value)."""
    queue = f"podracer.{experiment}.generator.dead"
    # a refresh redraws the page and would drop the message shown under "Get messages"
    page.select_option("#update-every", value="")
    page.get_by_role("link", name=queue, exact=True).click()
    page.wait_for_selector(f"#main h1:has-text('{queue}')")
    _section(page, "Overview", visible=False)  # its charts would push the message down
    section = _section(page, "Get messages", visible=True)
    section.locator("select[name=ackmode]").select_option(label="Nack message requeue true")
    section.locator("input[name=count]").fill("1")
    section.locator("input[type=submit]").click()
    # the UI slides the result in (jQuery): wait until it is there and the slide is
    # over, or for its "Queue is empty" popup
    page.wait_for_function("""() => {
      const wrapper = document.querySelector('#msg-wrapper');
      return document.querySelector('.form-popup-info') !== null
          || (wrapper !== null && wrapper.innerText.trim() !== ''
              && !(window.jQuery && window.jQuery(wrapper).is(':animated')));
    }""")
    shown: dict[str, str] = page.evaluate(MESSAGE_JS)
    if not shown:
        said = page.locator(".form-popup-info, #msg-wrapper").first.inner_text()
        raise RuntimeError(f"Get messages on {queue} showed no message: {said[:200]!r}")
    page.evaluate("window.scrollTo(0, 0)")  # box coordinates are then the page's
    box = page.locator("#msg-wrapper").bounding_box()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot), full_page=True,
                    clip={"x": 0, "y": 0, "width": WIDTH,
                          "height": box["y"] + box["height"] + 16})
    return shown


def list_dead_letters(amqp_url: str, experiment: str) -> str:
    """``podracer dead-letters <experiment> --queue generator``: its output."""
    argv = [sys.executable, "-m", "podracer", "dead-letters", experiment, "--queue",
            "generator", "--broker", amqp_url]
    done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"podracer dead-letters exited with {done.returncode}: "
                           f"{done.stderr.strip()[-500:]}")
    return done.stdout


@dataclass(frozen=True)
class Capture:
    """What a capture saw."""

    queues: dict[str, dict[str, str]]
    """The Queues page's table while the run goes: queue name -> {column: cell text}."""
    refused_id: str
    """Id of the forged initialization the pod refused."""
    dead_letter: dict[str, str]
    """What ``generator.dead``'s page showed under "Get messages": property or header
    name -> value (``message_id``, ``x-podracer-reason``, ...)."""
    listed: str
    """``podracer dead-letters <experiment> --queue generator``, run after the page."""
    queues_png: Path
    """The Queues page's screenshot."""
    dead_letter_png: Path
    """The dead letter's screenshot (its queue's page, down to the message)."""


def capture(amqp_url: str, experiment: str, screenshot: Path, workdir: Path,
            management_url: str = "http://127.0.0.1:15672", chromium: str = CHROMIUM,
            dead_letter_screenshot: Path | None = None) -> Capture:
    """Start a run, show its queues in the management UI, have its pod refuse a message
    and show the dead letter, list it with ``podracer dead-letters``; stop the run."""
    api = Management.from_amqp(amqp_url, management_url)
    dead_shot = dead_letter_screenshot or screenshot.with_name(
        screenshot.stem + "_dead_letter" + screenshot.suffix)
    try:
        with broker_run(amqp_url, experiment, workdir / "run") as run:
            wait_for_consumers(api, experiment, run)
            with logged_in(api, chromium) as page:
                rows = show_queues(page, experiment, screenshot)
                refused = refuse_one(api, amqp_url, experiment, run)
                shown = show_dead_letter(page, experiment, dead_shot)
            listed = list_dead_letters(amqp_url, experiment)
        return Capture(rows, refused, shown, listed, screenshot, dead_shot)
    finally:
        api.delete_experiment(experiment)


def parse_and_capture(argv: list[str] | None = None) -> Capture:
    """The command line's work: parse ``argv``, capture (the test calls this with the
    documented flags)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default=os.environ.get(
        "PODRACER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--management", default="http://127.0.0.1:15672")
    parser.add_argument("--name", default="ui-demo", help="experiment name")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--out", default=str(REPO / "docs/img/management_ui_queues.png"),
                        help="screenshot of the Queues page")
    parser.add_argument("--dead-letter-out",
                        default=str(REPO / "docs/img/management_ui_dead_letter.png"),
                        help="screenshot of the dead letter on its queue's page")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="podracer-ui-") as workdir:
        return capture(args.broker, args.name, Path(args.out), Path(workdir),
                       args.management, args.chromium, Path(args.dead_letter_out))


def main(argv: list[str] | None = None) -> int:
    """``python tests/ui/management_ui.py --out FILE --dead-letter-out FILE``: the docs'
    screenshots."""
    got = parse_and_capture(argv)
    for name, cells in got.queues.items():
        print(name, " | ".join(f"{k}: {v}" for k, v in cells.items() if k != "Name"))
    for name, value in got.dead_letter.items():
        print(f"{name}: {value}")
    print(got.listed, end="")
    print(f"screenshots: {got.queues_png} {got.dead_letter_png}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # run as a script: broker.* from this checkout
    sys.exit(main())
