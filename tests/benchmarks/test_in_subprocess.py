"""A benchmark's run ends with the benchmark (``tournament_runs.in_subprocess``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks.tournament_runs import in_subprocess
from tests.processes import alive

ROOT = Path(__file__).resolve().parents[2]

BENCHMARK = textwrap.dedent("""
    import sys, time
    from benchmarks.tournament_runs import in_subprocess
    from tests.benchmarks.test_in_subprocess import wait_forever
    in_subprocess(wait_forever, sys.argv[1])
""")


def wait_forever(pid_file: str) -> None:
    """A run that never ends by itself: it writes its pid and waits."""
    Path(pid_file).write_text(str(os.getpid()))
    while True:
        time.sleep(1)


def test_the_run_answers_in_the_caller() -> None:
    assert in_subprocess(os.getpid) != os.getpid()


def test_a_killed_benchmark_takes_its_run_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "run.pid"
    bench = subprocess.Popen([sys.executable, "-c", BENCHMARK, str(pid_file)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert bench.poll() is None, "the benchmark ended before its run started"
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        run = int(pid_file.read_text())
        assert alive(run)
        bench.send_signal(signal.SIGKILL)
        bench.wait()
        deadline = time.monotonic() + 10
        while alive(run):
            assert time.monotonic() < deadline, "the run outlived its benchmark by 10 s"
            time.sleep(0.05)
    finally:
        bench.kill()
        bench.wait()
